"""Cached runs of the analysis pages (mask audit, mask lab, head analytics, compare).

Everything that runs a model here is cached, keyed on a ``loaders.TraceKey`` (model name, device,
weights version, inputs, bug name, heads switched off), with a bounded number of entries, so a widget that only changes what is shown (kind, layer, head, sequence...) never runs
the model again. Models come from ``loaders.load_model`` (shared by every session: read-only).
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor

import streamlit as st
import torch

from attnscope.core.analysis import analytics, audit, bugs
from attnscope.core.analysis.audit import AuditReport
from attnscope.core.traces.trace import KIND_LABELS, AttentionTrace
from attnscope.dashboard import loaders, trace_cache
from attnscope.dashboard.loaders import Heads, TraceKey
from attnscope.models import registry

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


def _intervention(lm, off: Heads):
    return analytics.ablation(lm.cfg, list(off)) if off else None


@_audit_cache(spinner="Auditing the masks…")
def audit_report(key: TraceKey) -> AuditReport:
    """attnscope.core.analysis.audit.run_audit of the key's model on its inputs (with its bug injected /
    heads switched off).

    The report's traces are what the static checks read: without a bug or ablation, the
    model's own traces; with one, the buggy run teacher-forced on the correct model's output.
    Raises attnscope.core.errors.InputError (bad input) or ValueError (a bug this model cannot take).
    """
    lm = key.model()
    own = None if key.bug is not None or key.off else _sidebar_traces(lm, key)
    return audit.run_audit(
        lm, list(key.sources), key.target_list, bug=key.bug, interv=_intervention(lm, key.off), traces=own
    )


def _sidebar_traces(lm, key: TraceKey) -> list[AttentionTrace] | None:
    """The model's own traces of these inputs from the sidebar's cache (loaders.compute_traces), when
    they are the run an audit makes (not a decoder generating, not truncated); else None."""
    if key.targets is None and lm.arch == "decoder":
        return None
    try:
        cached = list(loaders.compute_traces(key.plain()))
    except Exception:  # noqa: BLE001 (the audit's own run says what is wrong, in its words)
        return None
    return None if any(t.meta.get("warnings") for t in cached) else cached  # nothing truncated


def _at_once(here, there) -> tuple:
    """(here(), there()), computed at the same time: ``there`` in a worker thread with this thread's
    intra-op thread count (torch releases the GIL; the model's forward keeps no state). Its errors
    (InputError, ValueError) are raised here once ``here`` is done."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lab-pair") as pool:
        other = pool.submit(audit.with_threads, torch.get_num_threads(), there)
        try:
            mine = here()
        finally:
            theirs = other.result()
    return mine, theirs


@_audit_cache(spinner="Tracing with and without the bug…")
def lab_traces(key: TraceKey) -> tuple[tuple[AttentionTrace, ...], tuple[AttentionTrace, ...]]:
    """(traces with the correct masks, traces with the key's bug injected, teacher-forced on the
    correct model's output): what the Mask lab draws, and what its two audits check.

    The correct traces come from the correct audit when it is cached (another bug on an input already
    audited); else the two traced passes run at once, the buggy one in a worker thread with the app's
    intra-op thread count (torch releases the GIL; the forward keeps no state), the correct one here
    (from the sidebar's trace cache when the lab's batch is the sidebar's input). Raises
    attnscope.core.errors.InputError (bad input) or ValueError (a bug this model cannot take).
    """
    bug = _bug_of(key)
    lm, srcs, tgts = key.model(), list(key.sources), key.target_list
    ok = audit_report.cached(key.plain())
    if ok is not None:
        return _with_cached_correct(lm, ok, srcs, tgts, bug)
    correct, bad = _at_once(
        lambda: _sidebar_traces(lm, key) or lm.trace(srcs, tgts),
        functools.partial(bugs.trace_with_bug, lm, srcs, bug, tgts),
    )
    return tuple(correct), tuple(bad)


def _with_cached_correct(lm, ok: AuditReport, sources: list[str], targets: list[str] | None, bug: str):
    """lab_traces' value when the correct audit is cached: its traces, and the bug traced now."""
    return tuple(ok.traces), tuple(bugs.trace_with_bug(lm, sources, bug, targets))


def _bug_of(key: TraceKey) -> str:
    if key.bug is None:
        raise ValueError("the Mask lab's runs need a bug in their key")
    return key.bug


def _lab_job(key: TraceKey):
    """lab_reports' work as a function that touches no Streamlit, so that it can run in a worker thread:
    the model, the cached correct audit and the caches it fills are looked up here, in the script's
    thread. A new input: both traced passes run here (lab_traces), the job audits them. Another bug on
    an input already audited: nothing runs here; the job's leak tests start at once on a batch built
    from the correct traces (the same token ids) while the page traces the bug (lab_traces); the job
    takes those traces from lab_traces' cache when it needs them (or traces them itself)."""
    bug = _bug_of(key)
    lm = key.model()
    threads = torch.get_num_threads()
    srcs, tgts = list(key.sources), key.target_list
    ok = audit_report.cached(key.plain())
    if ok is not None:
        store, lab_key = lab_traces.store(), lab_traces.key(key)

        def pair() -> tuple[tuple[AttentionTrace, ...], tuple[AttentionTrace, ...]]:
            return _with_cached_correct(lm, ok, srcs, tgts, bug)

        def traced() -> list[AttentionTrace]:
            return list(store.get_or_compute(lab_key, pair)[1])

        def with_probe() -> tuple[AuditReport, AuditReport]:
            # (the page traces the bug meanwhile: the cores are busy, no second thread here)
            return ok, audit.run_audit(
                lm, srcs, tgts, bug=bug, probe=ok.traces, later=traced, concurrent=False
            )

        return functools.partial(audit.with_threads, threads, with_probe)

    ok_traces, bad_traces = lab_traces(key)
    ok_store, ok_key = audit_report.store(), audit_report.key(key.plain())

    def correct() -> AuditReport:
        # Two audits run at once (both()): no second thread inside each.
        report = audit.run_audit(lm, srcs, tgts, traces=list(ok_traces), concurrent=False)
        ok_store.put(ok_key, report)  # the Mask audit page and the next bug reuse it
        return report

    def both() -> tuple[AuditReport, AuditReport]:
        return _at_once(
            correct,
            functools.partial(
                audit.run_audit, lm, srcs, tgts, bug=bug, traces=list(bad_traces), concurrent=False
            ),
        )

    return functools.partial(audit.with_threads, threads, both)


# Workers for the lab's leak tests, so that the page draws its charts while they run.
_BACKGROUND = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lab-audit")


@_audit_cache(spinner="Running the leak tests with and without the bug…")
def lab_reports(key: TraceKey) -> tuple[AuditReport, AuditReport]:
    """(audit with the correct masks, audit with the key's bug injected): the Mask lab's two reports.

    Both audits check the traces of ``lab_traces`` (so the lab traces each run once); their leak tests
    run at the same time in two threads, and the correct audit is kept in ``audit_report``'s cache.
    """
    return _lab_job(key)()


def lab_reports_later(key: TraceKey) -> Future:
    """A Future of ``lab_reports(key)``, computed in a worker thread (a done Future when cached): the
    page calls it first, then draws the masks and attention maps of ``lab_traces`` while the leak tests
    run, and waits for the verdicts last. Call it from the script's thread (it looks up what the worker
    needs; for a new input that includes both traced passes)."""
    return lab_reports.submit(_BACKGROUND, lambda: _lab_job(key), key)


@st.cache_data(max_entries=32, show_spinner="Generating…")
def generated(key: TraceKey) -> tuple[str, ...]:
    """The model's own greedy output (text) per source, with the key's bug / heads switched off in
    every step (its targets are not used).

    Encoder-only models: their output (class label or embedding summary).
    """
    lm = key.model()
    return tuple(bugs.greedy_with_bug(lm, list(key.sources), key.bug, interv=_intervention(lm, key.off)))


@st.cache_data(max_entries=32, show_spinner=False)
def head_stats(key: TraceKey, seq: int, pad: int | None) -> tuple[dict[str, dict], list[dict]]:
    """({kind: attnscope.core.analysis.analytics.trace_head_stats}, head_records) of sequence ``seq`` of the sidebar's
    traces (the traces come from loaders' cache): a 12-layer model at 512 tokens takes about a
    second, so a click that only picks another head does not recompute them."""
    tr = loaders.compute_traces(key)[seq]
    stats = {kind: analytics.trace_head_stats(tr, kind, pad) for kind in tr.kinds}
    return stats, analytics.head_records(tr, pad, stats)


@st.cache_data(max_entries=8, show_spinner=False)
def file_head_stats(digest: str, _trace) -> tuple[dict[str, dict], list[dict]]:
    """head_stats of an opened trace file (keyed by the file's digest; its real positions are stored)."""
    stats = {kind: analytics.trace_head_stats(_trace, kind, None) for kind in _trace.kinds}
    return stats, analytics.head_records(_trace, None, stats)


def outputs(key: TraceKey, report: AuditReport) -> tuple[str, ...]:
    """What the model answers (with the key's bug / heads switched off): its greedy output (generate
    mode) or the teacher-forced argmax. Encoder-only models answer in one pass: the report's traces
    already hold that output."""
    lm = key.model()
    if key.targets is not None or not lm.injectable or not lm.has_decoder:
        return tuple(t.output_text for t in report.traces)
    return generated(key)


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
