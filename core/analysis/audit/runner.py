"""Mask audit, the runner: the static checks on a run's traces plus the leak tests, in one report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from attnscope.core.analysis import bugs as B
from attnscope.core.analysis.audit.leaks import (
    EXTRA_PAD,
    ProbeBatch,
    batch_from_traces,
    dynamic_checks,
    forward_fn,
)
from attnscope.core.analysis.audit.static import AuditReport, Verdict, static_checks
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer.attention import Intervention


def _same_batch(a: ProbeBatch, b: ProbeBatch) -> bool:
    pairs = ((a.src, b.src), (a.src_real, b.src_real), (a.tgt, b.tgt), (a.tgt_real, b.tgt_real))
    return all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y)) for x, y in pairs
    )


class _PendingTraces(Sequence):
    """The traces ``later()`` will give, as a sequence: the leak tests read them only to name the head
    behind a failure, so they can start before the traced pass has finished. ``later`` is called once."""

    def __init__(self, later: Callable[[], Sequence[AttentionTrace]]):
        self._later = later
        self._traces: list[AttentionTrace] | None = None

    def get(self) -> list[AttentionTrace]:
        if self._traces is None:
            self._traces = list(self._later())
        return self._traces

    def __len__(self) -> int:
        return len(self.get())

    def __getitem__(self, i):
        return self.get()[i]


def run_audit(
    lm,
    sources: list[str],
    targets: list[str] | None = None,
    bug: B.Bug | str | None = None,
    interv: Intervention | None = None,
    extra_pad: int = EXTRA_PAD,
    traces: list[AttentionTrace] | None = None,
    probe: list[AttentionTrace] | None = None,
    later: Callable[[], Sequence[AttentionTrace]] | None = None,
    concurrent: bool | None = None,
) -> AuditReport:
    """Static checks on the traces of ``sources`` plus the leak tests, with ``bug`` injected if given.
    ``traces``: this run's traces when the caller already has them: ``lm.trace(sources, targets)``,
    or with a bug or ablation ``attnscope.core.analysis.bugs.trace_with_bug(lm, sources, bug, targets, interv)``.
    ``probe`` and ``later``: traces of the same inputs with the same token ids (the correct model's,
    for a bug teacher-forced on its output), from which the leak tests' batch is built, and a function
    that returns this run's traces (e.g. a Future's ``result`` of the traced pass running in another
    thread): the leak tests run here first, then ``later()`` is called. If its ids are not the probe's,
    the leak tests run again on its own batch. ``concurrent``: run the sequences alone in a second
    thread beside the leak tests (see dynamic_checks); default: when the model is thread_safe. A caller that already
    keeps the cores busy (the Mask lab audits two models at once) passes False."""
    if concurrent is None:  # a forward that keeps no state: two threads may run it at once
        concurrent = lm.thread_safe
    bug = B.get(bug) if isinstance(bug, str) else bug
    if (bug is not None or interv is not None) and not lm.injectable:
        raise ValueError("mask bugs and head ablation can only be injected into core models")
    if traces is not None:
        if len(traces) != len(sources):
            raise ValueError(f"{len(traces)} traces for {len(sources)} sources")
    elif bug is not None or interv is not None:
        trace = partial(B.trace_with_bug, lm, sources, bug, targets, interv)
    else:
        trace = partial(lm.trace, sources, targets)
    if probe is not None and len(probe) != len(sources):
        raise ValueError(f"{len(probe)} probe traces for {len(sources)} sources")
    f = lm.audit_facts()
    fwd = forward_fn(lm, bug, interv)

    def batch_of(trs: Sequence[AttentionTrace]) -> ProbeBatch:
        return batch_from_traces(list(trs), f["pad_id"], extra_pad, f["max_len"], lm.device)

    def leak_tests(b: ProbeBatch, seen: Sequence[AttentionTrace]) -> list[Verdict]:
        return dynamic_checks(
            fwd, b, f["pad_id"], seen, f["vocab"], f["skip_ids"], lm.masks_from_ids, concurrent=concurrent
        )  # core: its forward keeps no state

    if traces is None and probe is not None and later is not None:
        pending = _PendingTraces(later)
        batch = batch_of(probe)
        dynamic = leak_tests(batch, pending)
        traces = pending.get()
        own = batch_of(traces)
        if not _same_batch(own, batch):  # the probe's ids were not these traces' ids: test these
            batch = own
            dynamic = leak_tests(batch, traces)
    else:
        traces = trace() if traces is None else traces
        batch = batch_of(traces)
        dynamic = leak_tests(batch, traces)
    verdicts = static_checks(traces, f["pad_id"]) + dynamic
    meta = {"model": lm.name, "n_inputs": len(sources), "extra_pad": batch.extra_pad}
    return AuditReport(verdicts, traces, bug.name if bug else None, meta)
