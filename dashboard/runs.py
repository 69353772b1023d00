"""Cached runs of the analysis pages (mask audit, mask lab, head analytics, compare).

Everything that runs a model here is cached, keyed on hashable inputs (model name,
device, weights version, input tuples, bug name, heads switched off), with a bounded number of
entries, so a widget that only changes what is shown (kind, layer, head, sequence...) never runs
the model again. Models come from ``loaders.load_model`` (shared by every session: read-only).
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import streamlit as st
import torch

from core import analytics, audit, bugs
from core.audit import AuditReport
from core.trace import KIND_LABELS, AttentionTrace
from dashboard import loaders, trace_cache
from models import registry

CACHE_ENTRIES = 16
# Audits carry traces: shared objects (dashboard/trace_cache.py), never pickled per rerun (a lab pair at
# 512 tokens is ~600 MB of maps), at most this many MB of arrays, least recently used out first.
AUDIT_CACHE_MB = 1536
_audit_cache = functools.partial(
    trace_cache.shared_cache,
    AUDIT_CACHE_MB,
    CACHE_ENTRIES,
    loaders.TRACE_CACHE_TTL_S,
    env="ATTNSCOPE_AUDIT_CACHE_MB",
)
Heads = tuple[tuple[str, int, int], ...]  # (kind, layer, head) switched off


def _intervention(lm, off: Heads):
    return analytics.ablation(lm.cfg, list(off)) if off else None


@_audit_cache(spinner="Auditing the masks…")
def audit_report(
    name: str,
    device: str,
    version: float,
    sources: tuple[str, ...],
    targets: tuple[str, ...] | None = None,
    bug: str | None = None,
    off: Heads = (),
) -> AuditReport:
    """core.audit.run_audit of the sidebar's model (with ``bug`` injected / heads ``off``).

    The report's traces are what the static checks read: without a bug or ablation, the
    model's own traces; with one, the buggy run teacher-forced on the correct model's output.
    Raises core.runner.InputError (bad input) or ValueError (a bug this model cannot take).
    """
    lm = loaders.load_model(name, device, version)
    own = None  # the model's own traces: the sidebar's cached ones, not a second run, when they are
    if bug is None and not off and (targets is not None or lm.arch != "decoder"):  # the same run
        try:
            cached = list(loaders.compute_traces(name, device, version, sources, targets))
        except Exception:  # noqa: BLE001 (the audit's own run says what is wrong, in its words)
            cached = None
        if cached is not None and not any(t.meta.get("warnings") for t in cached):  # nothing truncated
            own = cached
    return audit.run_audit(
        lm,
        list(sources),
        None if targets is None else list(targets),
        bug=bug,
        interv=_intervention(lm, off),
        traces=own,
    )


def _in_thread(threads: int, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a worker thread with the app's intra-op thread count (a new thread
    starts with torch's default, not the app's: see loaders)."""
    torch.set_num_threads(threads)
    return fn(*args, **kwargs)


class _ThreadsPool:
    """submit() runs the function in ``pool`` with the app's intra-op thread count."""

    def __init__(self, pool: ThreadPoolExecutor, threads: int):
        self._pool, self._threads = pool, threads

    def submit(self, fn, *args):
        return self._pool.submit(_in_thread, self._threads, fn, *args)


@_audit_cache(spinner="Auditing with and without the bug…")
def lab_reports(
    name: str,
    device: str,
    version: float,
    sources: tuple[str, ...],
    targets: tuple[str, ...] | None,
    bug: str,
) -> tuple[AuditReport, AuditReport]:
    """(audit with the correct masks, audit with ``bug`` injected): the Mask lab's two reports.

    The work is spread over two threads (each with the app's intra-op thread count; torch releases
    the GIL; the model's forward keeps no state, so two threads may run it at once). A new input: the
    buggy audit runs in a worker while this thread audits the correct masks, so on two cores the lab
    waits for about one audit, not two. Another bug on an input already audited (the correct report
    is cached): the buggy audit's traced pass runs in one thread while its leak tests run in the
    other, on a batch built from the correct traces (the same token ids).
    """
    lm = loaders.load_model(name, device, version)
    tgts = None if targets is None else list(targets)
    threads = torch.get_num_threads()
    ok = audit_report.cached(name, device, version, sources, targets)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="lab-bug") as pool:
        if ok is not None:
            return ok, audit.run_audit(
                lm, list(sources), tgts, bug=bug, probe=ok.traces, pool=_ThreadsPool(pool, threads)
            )
        buggy = pool.submit(_in_thread, threads, audit.run_audit, lm, list(sources), tgts, bug=bug)
        try:
            ok = audit_report(name, device, version, sources, targets)
        finally:
            bad = buggy.result()  # (re-raises the worker's InputError / ValueError here)
    return ok, bad


@st.cache_data(max_entries=32, show_spinner="Generating…")
def generated(
    name: str,
    device: str,
    version: float,
    sources: tuple[str, ...],
    bug: str | None = None,
    off: Heads = (),
) -> tuple[str, ...]:
    """The model's own greedy output (text) per source, with ``bug`` / heads ``off`` in every step.

    Encoder-only models: their output (class label or embedding summary).
    """
    lm = loaders.load_model(name, device, version)
    return tuple(bugs.greedy_with_bug(lm, list(sources), bug, interv=_intervention(lm, off)))


@st.cache_data(max_entries=32, show_spinner=False)
def head_stats(
    name: str,
    device: str,
    version: float,
    sources: tuple[str, ...],
    targets: tuple[str, ...] | None,
    seq: int,
    pad: int | None,
) -> tuple[dict[str, dict], list[dict]]:
    """({kind: core.analytics.trace_head_stats}, head_records) of sequence ``seq`` of the sidebar's
    traces (the traces come from loaders' cache): a 12-layer model at 512 tokens takes about a
    second, so a click that only picks another head does not recompute them."""
    tr = loaders.compute_traces(name, device, version, sources, targets)[seq]
    stats = {kind: analytics.trace_head_stats(tr, kind, pad) for kind in tr.kinds}
    return stats, analytics.head_records(tr, pad, stats)


@st.cache_data(max_entries=8, show_spinner=False)
def file_head_stats(digest: str, _trace) -> tuple[dict[str, dict], list[dict]]:
    """head_stats of an opened trace file (keyed by the file's digest; its real positions are stored)."""
    stats = {kind: analytics.trace_head_stats(_trace, kind, None) for kind in _trace.kinds}
    return stats, analytics.head_records(_trace, None, stats)


def outputs(
    sel, sources: tuple[str, ...], targets: tuple[str, ...] | None, report: AuditReport, bug=None, off=()
) -> tuple[str, ...]:
    """What the model answers: its greedy output (generate mode) or the teacher-forced argmax.
    Encoder-only models answer in one pass: the report's traces already hold that output."""
    lm = loaders.load_model(sel.name, sel.device, sel.version)
    if targets is not None or not lm.injectable or not lm.has_decoder:
        return tuple(t.output_text for t in report.traces)
    return generated(sel.name, sel.device, sel.version, sources, bug, off)


def shorter_copy(text: str, char_level: bool) -> str | None:
    """The first half of ``text`` (characters, or words for word-level tokenizers); None if too short."""
    parts = list(text) if char_level else text.split()
    half = len(parts) // 2
    if half < 1:
        return None
    return ("" if char_level else " ").join(parts[:half])


def lab_batch(
    lm, sources: tuple[str, ...], targets: tuple[str, ...] | None, add_copy: bool
) -> tuple[tuple[str, ...], tuple[str, ...] | None, bool]:
    """The lab's batch: the sidebar's inputs, plus (single input, ``add_copy``) a shorter copy so
    there is padding. Returns (sources, targets, whether a copy was added)."""
    if not add_copy or len(sources) != 1:
        return sources, targets, False
    char = lm.src_tok.kind == "char"
    src = shorter_copy(sources[0], char)
    if src is None:
        return sources, targets, False
    if targets is None:
        return (sources[0], src), None, True
    tgt_char = lm.tgt_tok.kind == "char"
    tgt = shorter_copy(targets[0], tgt_char) or targets[0]
    return (sources[0], src), (targets[0], tgt), True


def head_options(lm) -> list[tuple[str, int, int]]:
    """Every (kind, layer, head) of a core model, in kind order."""
    return [
        (kind, ly, h)
        for kind, (n_layers, n_heads) in analytics.head_shapes(lm.cfg).items()
        for ly in range(n_layers)
        for h in range(n_heads)
    ]


def head_label(option: tuple[str, int, int]) -> str:
    kind, ly, h = option
    return f"{KIND_LABELS[kind]} · layer {ly} · head {h}"


@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner="Replaying the training snapshots…")
def replay(
    base: str, device: str, version: float, source: str, target: str | None
) -> tuple[tuple[int, ...], tuple[AttentionTrace, ...]]:
    """(snapshot steps, the trace of ``source`` at each) for zoo model ``base``: every snapshot
    run on the same input, teacher-forced on ``target`` when given (so every step's maps have the
    same queries). Snapshots are loaded here, not in the shared model cache (a dozen per model)."""
    del version  # only part of the cache key (history.json's mtime)
    steps, traces = [], []
    for snap in registry.snapshots(base):
        lm = registry.load(f"{base}@{snap['step']}", device)
        traces.append(lm.trace([source], None if target is None else [target])[0])
        steps.append(snap["step"])
    return tuple(steps), tuple(traces)
