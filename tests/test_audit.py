"""Mask audit: the correct model passes every check; each injected mask bug makes a check fail."""

from __future__ import annotations

import dataclasses
import random
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from attnscope.core.analysis import audit as AU
from attnscope.core.analysis import bugs as B
from attnscope.core.families.native import LoadedModel
from attnscope.core.transformer.attention import Intervention
from attnscope.core.transformer.config import tiny
from attnscope.core.transformer.model import Transformer
from attnscope.core.transformer.tokenizer import CharTokenizer
from attnscope.dashboard.plots import audit as P

LAB_SOURCES, LAB_TARGETS = ["abcdefg", "abc"], ["gfedcba", "cba"]  # the lab's 2-line batch

# Which checks each bug must fail on the lab batch (others may fail too): the audit's table.
CATCHES = {
    "inverted": {"masked_mass[enc_self]", "masked_mass[dec_self]", "masked_mass[cross]", "row_sums[enc_self]",
                 "causal_leak", "padding_leak[src]", "padding_leak[tgt]"},
    "causal_diag_masked": {"row_sums[dec_self]", "fully_masked[dec_self]", "declared_mask[dec_self]"},
    "causal_next_visible": {"masked_mass[dec_self]", "declared_mask[dec_self]", "causal_leak"},
    "pad_on_queries": {"masked_mass[enc_self]", "masked_mass[cross]", "declared_mask[cross]", "padding_leak[src]"},
    "cross_no_src_pad": {"masked_mass[cross]", "declared_mask[cross]", "padding_leak[src]"},
    "neg_inf_fill": {"finite", "fully_masked[enc_self]", "finite_outputs", "batch_invariance"},
    "wrong_broadcast": {"masked_mass[enc_self]", "declared_mask[enc_self]", "padding_leak[src]"},
}  # fmt: skip
# On one text (no PAD in the trace) the leak tests, which append PAD columns, still catch every bug.
CATCHES_ONE_TEXT = {
    "inverted": {"causal_leak", "padding_leak[src]"},
    "causal_diag_masked": {"row_sums[dec_self]"},
    "causal_next_visible": {"causal_leak"},
    "pad_on_queries": {"padding_leak[src]"},
    "cross_no_src_pad": {"padding_leak[src]"},
    "neg_inf_fill": {"finite_outputs"},
    "wrong_broadcast": {"padding_leak[src]"},
}


def make_lm(**changes) -> LoadedModel:
    tok = CharTokenizer.fit(["abcdefgh"])
    torch.manual_seed(0)
    cfg = tiny(len(tok), max_len=16, **changes)
    model = Transformer(cfg).eval()
    return LoadedModel("tiny", None, cfg, model, tok, None if cfg.is_encoder_only else tok)


@pytest.fixture(scope="module")
def lm() -> LoadedModel:
    return make_lm()


@pytest.fixture(scope="module")
def clf() -> LoadedModel:
    return make_lm(n_dec_layers=0, n_classes=2, pos_encoding="learned")


def failed(report) -> set[str]:
    return {v.name for v in report.failed}


def test_registry_names_descriptions():
    assert set(B.names()) == set(CATCHES)
    for bug in B.BUGS.values():
        assert bug.description and "\n" not in bug.description
    with pytest.raises(B.UnknownBugError, match="choose one of"):
        B.get("nope")


@pytest.mark.parametrize(
    "sources,targets", [(LAB_SOURCES, LAB_TARGETS), (["abcd"], None), (["abcdefgh", "a"], None)]
)
def test_correct_model_passes_every_check(lm, sources, targets):
    report = AU.run_audit(lm, sources, targets)
    assert report.passed, report.lines()
    statuses = {v.name: v.status for v in report.verdicts}
    assert statuses["causal_leak"] == "pass" and statuses["padding_leak[src]"] == "pass"
    assert {"masked_mass[enc_self]", "masked_mass[dec_self]", "masked_mass[cross]", "finite"} <= set(statuses)


def test_given_traces_give_the_same_report_as_the_audits_own_run(lm):
    """The dashboard hands the audit traces it already has (the sidebar's, the Mask lab's): the same
    verdicts as the audit's own run, with and without a bug; traces from another run change the
    static verdicts (they are what is read)."""
    own = AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS)
    given = AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, traces=lm.trace(LAB_SOURCES, LAB_TARGETS))
    assert [(v.name, v.status, v.detail) for v in given.verdicts] == [
        (v.name, v.status, v.detail) for v in own.verdicts
    ]
    buggy = B.trace_with_bug(lm, LAB_SOURCES, "inverted", LAB_TARGETS)
    read = AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, traces=buggy)
    assert "masked_mass[enc_self]" in failed(read)  # the static checks read the given traces
    with_bug = AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, bug="inverted", traces=buggy)
    assert [(v.name, v.status, v.detail) for v in with_bug.verdicts] == [
        (v.name, v.status, v.detail)
        for v in AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, bug="inverted").verdicts
    ]
    assert with_bug.traces[0] is buggy[0] and with_bug.bug == "inverted"
    with pytest.raises(ValueError, match="1 traces for 2 sources"):
        AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, traces=buggy[:1])


def test_dynamic_checks_run_the_unchanged_batch_once(lm):
    """finite_outputs, batch_invariance and both padding leaks compare to one shared run of the batch."""
    calls = []

    def fwd(src, tgt, src_real, tgt_real):
        calls.append((tuple(src.shape), None if tgt is None else tuple(tgt.shape)))
        return lm.forward_outputs(src, tgt, src_real, tgt_real)

    traces = lm.trace(LAB_SOURCES, LAB_TARGETS)
    batch = AU.batch_from_traces(traces, lm.cfg.pad_id, 4, lm.cfg.max_len)
    verdicts = AU.dynamic_checks(fwd, batch, lm.cfg.pad_id, traces, (len(lm.src_tok), len(lm.tgt_tok)))
    assert all(v.status == "pass" for v in verdicts), [v.line() for v in verdicts]
    full = (tuple(batch.src.shape), tuple(batch.tgt.shape))
    # the unchanged batch once + each padding leak's changed batch (causal_leak runs row subsets)
    assert calls.count(full) == 3, calls


@pytest.mark.parametrize("encoder_only", [False, True], ids=["seq2seq", "encoder"])
def test_padding_leaks_run_the_changed_rows_beside_the_unchanged_batch(encoder_only):
    """Without extra PAD columns only the shorter text has PAD: its changed copy is appended to the
    unchanged batch and runs in the same call (the longer text is not run again), and each changed row
    is compared with its own unchanged row. A leaking model is caught at the right sequence, with the
    same verdicts as when each side's changed batch runs on its own."""
    model = make_lm(n_dec_layers=0) if encoder_only else make_lm()
    tgts = None if encoder_only else LAB_TARGETS
    calls = []

    def counted(f):
        def fwd(src, tgt, src_real, tgt_real):
            calls.append((tuple(src.shape), None if tgt is None else tuple(tgt.shape)))
            return f(src, tgt, src_real, tgt_real)

        return fwd

    traces = model.trace(LAB_SOURCES, tgts)
    batch = AU.batch_from_traces(traces, model.cfg.pad_id, 0, model.cfg.max_len)
    vocab = (len(model.src_tok), None if encoder_only else len(model.tgt_tok))
    verdicts = {v.name: v for v in AU.dynamic_checks(counted(model.forward_outputs), batch, 0, traces, vocab)}
    assert all(v.status == "pass" for v in verdicts.values() if v.status != "skip"), verdicts
    s = batch.src.shape
    rows = 2 + 1 + (0 if encoder_only else 1)  # the batch, then the short text's src (and tgt) copy
    assert calls[0] == ((rows, s[1]), None if encoder_only else (rows, batch.tgt.shape[1])), calls
    leaky = counted(partial(AU.core_forward_outputs, model, bug=B.get("pad_on_queries")))
    v = AU.dynamic_checks(leaky, batch, 0, traces, vocab)[3]
    assert v.name == "padding_leak[src]" and v.status == "fail" and v.positions[0] == 1, v.line()
    assert f"changing {int((~batch.src_real).sum())} src PAD tokens" in v.detail
    # each side on its own (the path taken when the changed rows outnumber the batch): the same verdicts
    alone = AU.check_padding_leak(leaky, batch, "src", 0, traces, vocab[0])
    assert (alone.status, alone.positions) == (v.status, v.positions) and alone.value == pytest.approx(
        v.value
    )


@pytest.mark.parametrize("bug", [None, "pad_on_queries", "inverted"])
def test_concurrent_runs_alone_in_a_worker_with_the_same_verdicts(bug):
    """concurrent=True (core models, whose forward keeps no state): the sequences' runs alone go in a
    worker thread beside the batch's call; every verdict equals the one-thread run's, number for number."""
    import threading

    model = make_lm()
    traces = model.trace(LAB_SOURCES, LAB_TARGETS)
    batch = AU.batch_from_traces(traces, model.cfg.pad_id, 0, model.cfg.max_len)
    vocab = (len(model.src_tok), len(model.tgt_tok))
    base = AU.forward_fn(model, B.get(bug) if bug else None)
    threads: dict[tuple, set] = {}

    def fwd(src, tgt, src_real, tgt_real):
        threads.setdefault((tuple(src.shape), tuple(tgt.shape)), set()).add(threading.get_ident())
        return base(src, tgt, src_real, tgt_real)

    one = AU.dynamic_checks(fwd, batch, 0, traces, vocab)
    assert {t for ts in threads.values() for t in ts} == {threading.get_ident()}
    threads.clear()
    two = AU.dynamic_checks(fwd, batch, 0, traces, vocab, concurrent=True)
    assert [(v.name, v.status, v.value, v.positions) for v in two] == [
        (v.name, v.status, v.value, v.positions) for v in one
    ]
    lens = [int(r.sum()) for r in batch.src_real]
    alone = {shape for shape in threads if shape[0][0] == 1 and shape[0][1] in lens}
    # (the sequences alone run in the worker; the causal-leak check runs a change alone again in this thread
    # where one moved an earlier output, at the batch's padded length, which may be a sequence's own)
    assert alone and all(threads[shape] - {threading.get_ident()} for shape in alone), threads
    leak_call = [shape for shape in threads if shape[0][0] > batch.src.shape[0]]  # the batch + changed rows
    assert leak_call and all(threads[shape] == {threading.get_ident()} for shape in leak_call), threads


def test_row_sums_allow_the_precision_of_half_precision_maps():
    """Maps computed in bfloat16 or float16 (kept as float32 in the trace) sum to 1 within their own
    precision, read from the values; a float32 map keeps 1e-5, and a row that is really off still fails."""
    g = torch.Generator().manual_seed(0)
    p32 = torch.randn(2, 3, 6, 6, generator=g).softmax(-1)
    assert AU.map_precision(p32.numpy()) == ("float32", AU.ROW_SUM_TOL)
    assert AU.map_precision(p32.bfloat16().float().numpy()) == ("bfloat16", 2.0**-7)
    assert AU.map_precision(p32.half().float().numpy())[0] == "float16"
    traces = make_lm(n_dec_layers=0).trace(["abcdef", "abc"])
    assert AU.check_row_sums(traces, "enc_self").value <= AU.ROW_SUM_TOL
    for dtype in (torch.bfloat16, torch.float16):
        half = [
            dataclasses.replace(t, enc_self=torch.tensor(t.enc_self).to(dtype).float().numpy())
            for t in traces
        ]
        v = AU.check_row_sums(half, "enc_self")
        assert v.status == "pass" and v.value > AU.ROW_SUM_TOL, v.line()  # rounding alone moves the sums
        assert f"{str(dtype).removeprefix('torch.')} maps: within" in v.detail
        off = half[0].enc_self.copy()
        off[0, 0, 1] = 0.0
        off[0, 0, 1, 0] = 0.5  # a real query row that sums to 0.5 (exactly representable in either)
        bad = AU.check_row_sums([dataclasses.replace(half[0], enc_self=off)], "enc_self")
        assert bad.status == "fail" and bad.positions == (0, 1) and bad.value == pytest.approx(0.5)


def test_one_unpadded_sequence_is_not_run_alone_again(lm):
    """One sequence with no PAD column: 'alone' is the very call that gave the batch's outputs, so
    batch_invariance compares to that run (one call in all); with PAD columns it runs the trimmed
    sequence, and a model that leaks PAD is still caught."""
    calls = []

    def fwd(src, tgt, src_real, tgt_real):
        calls.append(tuple(src.shape))
        return lm.forward_outputs(src, tgt, src_real, tgt_real)

    traces = lm.trace(["abcdef"], ["fedcba"])
    batch = AU.batch_from_traces(traces, lm.cfg.pad_id, 0, lm.cfg.max_len)
    base = batch.call(fwd)
    v = AU.check_batch_invariance(fwd, batch, traces, base)
    assert v.status == "pass" and v.value == 0.0 and calls == [tuple(batch.src.shape)]
    padded = AU.batch_from_traces(traces, lm.cfg.pad_id, 3, lm.cfg.max_len)
    calls.clear()
    assert AU.check_batch_invariance(fwd, padded, traces).status == "pass"
    assert calls == [tuple(padded.src.shape), (1, padded.src.shape[1] - 3)]
    leaky = partial(AU.core_forward_outputs, lm, bug=B.get("cross_no_src_pad"))
    assert AU.check_batch_invariance(leaky, padded, traces).status == "fail"


@pytest.mark.parametrize("targets", [LAB_TARGETS, None], ids=["teacher-forced", "generated"])
def test_leak_tests_beside_the_traced_pass_give_the_same_report(lm, targets):
    """probe= and later=: the leak tests run on a batch built from the correct model's traces while the
    buggy traced pass runs in another thread; every bug's report equals the one run step by step. A
    probe with other token ids is noticed and the leak tests run again on the traces' own batch."""
    from concurrent.futures import ThreadPoolExecutor

    ok = AU.run_audit(lm, LAB_SOURCES, targets)
    with ThreadPoolExecutor(max_workers=1) as pool:

        def later(name):
            return pool.submit(B.trace_with_bug, lm, LAB_SOURCES, name, targets).result

        for name in B.names():
            alongside = AU.run_audit(lm, LAB_SOURCES, targets, bug=name, probe=ok.traces, later=later(name))
            assert alongside.lines() == AU.run_audit(lm, LAB_SOURCES, targets, bug=name).lines(), name
            for a, b in zip(alongside.traces, ok.traces, strict=True):
                np.testing.assert_array_equal(a.src_ids, b.src_ids)
        other = AU.run_audit(lm, ["hgfe", "dd"], ["efgh", "d"]).traces  # two inputs, other ids
        name = "cross_no_src_pad"
        got = AU.run_audit(lm, LAB_SOURCES, targets, bug=name, probe=other, later=later(name))
        assert got.lines() == AU.run_audit(lm, LAB_SOURCES, targets, bug=name).lines()
    with pytest.raises(ValueError, match="probe traces"):
        AU.run_audit(lm, LAB_SOURCES, targets, bug="inverted", probe=ok.traces[:1], later=list)


@pytest.mark.parametrize("name", list(CATCHES))
def test_each_bug_is_caught_on_the_lab_batch(lm, name):
    report = AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, bug=name)
    assert not report.passed and report.bug == name
    missing = CATCHES[name] - failed(report)
    assert not missing, f"{name}: expected failures {missing} not seen; got {failed(report)}"


@pytest.mark.parametrize("name", list(CATCHES_ONE_TEXT))
def test_each_bug_is_caught_on_one_text(lm, name):
    report = AU.run_audit(lm, ["abcdef"], ["fedcba"], bug=name)
    assert CATCHES_ONE_TEXT[name] <= failed(report), report.lines()


def test_failure_details_name_where_and_how_much(lm):
    r = AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, bug="causal_next_visible")
    v = next(v for v in r.verdicts if v.name == "causal_leak")
    b, i, j = v.positions
    assert j > i and v.value > AU.LEAK_TOL and v.kind == "dec_self"
    assert v.layer is not None and f"position {j}" in v.detail
    m = next(v for v in r.verdicts if v.name == "masked_mass[dec_self]")
    b, q, k = m.positions
    assert k == q + 1 and m.value == pytest.approx(
        r.traces[b].probs("dec_self")[m.layer, m.head, q, k:].sum()
    )
    leak = next(v for v in AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, bug="cross_no_src_pad").verdicts
                if v.name == "padding_leak[src]")  # fmt: skip
    assert leak.kind == "cross" and leak.value > AU.LEAK_TOL and "dec output" in leak.detail


def test_neg_inf_fill_needs_a_fully_masked_row(lm):
    """The -inf fill alone changes nothing when no row is fully masked; the bug's 2-D mask makes one."""
    src, tgt = B.batch_ids(lm, LAB_SOURCES, LAB_TARGETS)
    ok = B.reference_masks(src != 0, tgt != 0)
    plain = lm.model(src, tgt, masks=ok).logits
    inf_only = lm.model(src, tgt, masks=ok, interv=Intervention(neg_inf_fill=True)).logits
    torch.testing.assert_close(inf_only, plain)
    bug = B.get("neg_inf_fill")
    masks, iv = bug.apply(ok)
    assert iv.neg_inf_fill and masks.enc_self[1, -1].sum() == 0  # PAD query row of the short text
    assert torch.isnan(lm.model(src, tgt, masks=masks, interv=iv).logits[1]).all()  # spread to real rows


def test_wrong_broadcast_is_the_literal_broadcast(lm):
    src_real = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    scores = torch.zeros(2, 4, 4, 4)  # (B, H, S, S)
    buggy = src_real.unsqueeze(1).unsqueeze(-1)  # (B, 1, S, 1)
    right = src_real.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, S)
    m = B.get("wrong_broadcast").masks(src_real).enc_self
    torch.testing.assert_close(m, torch.broadcast_to(buggy, scores.shape)[:, 0])
    torch.testing.assert_close(
        B.reference_masks(src_real).enc_self, torch.broadcast_to(right, scores.shape)[:, 0]
    )


def test_apply_matches_masks_from_real_vectors(lm):
    src, tgt = B.batch_ids(lm, LAB_SOURCES, LAB_TARGETS)
    ok = lm.model.make_masks(src, tgt)
    ref = B.reference_masks(src != 0, tgt != 0)
    for kind in ("enc_self", "dec_self", "cross"):
        torch.testing.assert_close(ref.get(kind), ok.get(kind))
    for bug in B.BUGS.values():
        applied, _ = bug.apply(ok)
        direct = bug.masks(src != 0, tgt != 0)
        changed = []
        for kind in ("enc_self", "dec_self", "cross"):
            torch.testing.assert_close(applied.get(kind), direct.get(kind))
            if not torch.equal(direct.get(kind), ok.get(kind)):
                changed.append(kind)
        assert set(changed) <= set(bug.kinds), bug.name


def test_trace_with_bug_lines_up_with_the_correct_trace(lm):
    ok = lm.trace(LAB_SOURCES)
    none = B.trace_with_bug(lm, LAB_SOURCES, None)
    buggy = B.trace_with_bug(lm, LAB_SOURCES, "causal_next_visible")
    for a, b, c in zip(ok, none, buggy, strict=True):
        np.testing.assert_array_equal(a.tgt_ids, c.tgt_ids)  # same decoder input
        np.testing.assert_allclose(a.dec_self, b.dec_self, atol=1e-6)
        assert not np.allclose(a.dec_self, c.dec_self)
        np.testing.assert_array_equal(a.enc_self_mask, c.enc_self_mask)
    assert B.greedy_with_bug(lm, LAB_SOURCES, None) == lm.predict(LAB_SOURCES)
    assert all(isinstance(t, str) for t in B.greedy_with_bug(lm, LAB_SOURCES, "neg_inf_fill"))


def test_encoder_only_classifier(clf):
    assert AU.run_audit(clf, ["abcdefg", "ab"]).passed
    r = AU.run_audit(clf, ["abcdefg", "ab"], bug="wrong_broadcast")
    assert {"masked_mass[enc_self]", "padding_leak[src]"} <= failed(r)
    assert {v.status for v in r.verdicts if v.name in ("causal_leak", "padding_leak[tgt]")} == {"skip"}
    with pytest.raises(ValueError, match="needs a decoder"):
        AU.run_audit(clf, ["abc"], bug="causal_next_visible")


def test_head_ablation_keeps_masks_correct(lm):
    from attnscope.core.analysis.analytics import ablation

    iv = ablation(lm.cfg, [("enc_self", 0, 1), ("dec_self", 1, 3)])
    assert AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, interv=iv).passed


# -- a model that is not core: only trace() and, optionally, forward_outputs -------------------------


class BlackBox:
    """A model with the common interface that is not injectable (like an HF or adapter model):
    its forward_outputs may hide a mask bug that its traces do not show."""

    family = "adapter"
    injectable = False
    thread_safe = False
    masks_from_ids = False

    def __init__(self, lm: LoadedModel, bug: str | None = None):
        self._lm, self.cfg, self.name, self.has_decoder = lm, lm.cfg, "blackbox", lm.has_decoder
        self.device, self._bug = lm.device, bug and B.get(bug)

    def audit_facts(self):
        return self._lm.audit_facts()

    def forward_outputs(self, *a):
        return AU.core_forward_outputs(self._lm, *a, bug=self._bug)

    def trace(self, sources, targets=None):
        return self._lm.trace(sources, targets)


def test_black_box_model_is_audited_but_never_injected(lm):
    r = AU.run_audit(BlackBox(lm), LAB_SOURCES, LAB_TARGETS)
    assert r.passed
    assert {v.status for v in r.verdicts if "leak" in v.name or v.name == "batch_invariance"} == {"pass"}
    with pytest.raises(ValueError, match="core models"):
        AU.run_audit(BlackBox(lm), LAB_SOURCES, bug="inverted")


def test_black_box_leak_tests_see_what_traces_hide(lm):
    leaky = AU.run_audit(BlackBox(lm, bug="cross_no_src_pad"), LAB_SOURCES, LAB_TARGETS)
    # its traces are correct: only the black-box tests see it (PAD content, and the sequence alone)
    assert failed(leaky) == {"padding_leak[src]", "batch_invariance"}


# -- static checks on hand-made traces ----------------------------------------------------------------


def test_static_checks_on_hand_made_traces(lm):
    tr = lm.trace(LAB_SOURCES, LAB_TARGETS)[1]  # short text: PAD at the end
    assert all(v.passed for v in AU.static_checks([tr], pad_id=0))
    enc = tr.enc_self.copy()
    enc[0, 2, 0, -1] += 0.25  # mass on a PAD key, and a row that no longer sums to 1
    bad = tr.replace(enc_self=enc)
    names = {v.name for v in AU.static_checks([bad], pad_id=0) if not v.passed}
    assert names == {"masked_mass[enc_self]", "row_sums[enc_self]"}
    v = AU.check_masked_mass([bad], "enc_self", 0)
    assert (v.layer, v.head, v.positions) == (
        0,
        2,
        (0, 0, len(tr.src_tokens) - 1),
    ) and v.value == pytest.approx(0.25)
    nan = tr.dec_self.copy()
    nan[1, 0, 2] = np.nan
    v = AU.check_finite([tr.replace(dec_self=nan)])
    assert not v.passed and v.kind == "dec_self" and v.layer == 1
    no_mask = tr.replace(cross_mask=None)
    assert AU.check_declared_mask([no_mask], "cross", 0).status == "skip"
    # pad id unknown: PAD found by token text
    assert AU.check_masked_mass([bad], "enc_self").passed is False


@pytest.mark.parametrize("bug", [None, *B.names()])
def test_masked_mass_reads_the_forbidden_block_with_the_full_maps_numbers(lm, bug):
    """check_masked_mass reads only the rows and columns holding a forbidden pair: it fails exactly when
    some real query row puts mass on a forbidden key in the full maps (masked_mass_per_head, NaN as inf),
    its value is the largest such mass (up to float32 rounding: fewer terms, another summation order),
    and the (query, key) it names are in the full map: a forbidden pair, the row's largest."""
    traces = (
        lm.trace(LAB_SOURCES, LAB_TARGETS)
        if bug is None
        else B.trace_with_bug(lm, LAB_SOURCES, bug, LAB_TARGETS)
    )
    for kind in traces[0].kinds:
        v = AU.check_masked_mass(traces, kind, 0)
        per_head = [np.nan_to_num(AU.masked_mass_per_head(tr, kind, 0), nan=np.inf) for tr in traces]
        worst = max(float(m.max()) for m in per_head)
        assert v.passed == (worst == 0), (bug, kind, v.line())
        if v.passed:
            continue
        assert v.value == pytest.approx(worst, rel=1e-6)  # the same numbers, summed in another order
        b, q, k = v.positions
        q_real, ok = AU.expected_mask(traces[b], kind, 0)
        assert q_real[q] and not ok[q, k]
        row = traces[b].probs(kind)[v.layer, v.head, q]
        forbidden = np.where(~ok[q], np.nan_to_num(row, nan=np.inf), -1.0)
        assert k == int(np.argmax(forbidden))


def test_map_precision_reads_only_informative_values():
    """Zeros fit every precision: a map of zeros (every key masked) is float32, not bfloat16, and so is
    a map whose strided sample holds only zeros but whose other values are float32 numbers. A strided
    view (one sequence of a batch) of bfloat16 values is bfloat16."""
    assert AU.map_precision(np.zeros((2, 3, 8, 8), np.float32)) == ("float32", AU.ROW_SUM_TOL)
    g = torch.Generator().manual_seed(1)
    batch = torch.randn(2, 2, 3, 64, 64, generator=g).softmax(-1).bfloat16().float().numpy()
    seq = batch[:, 1]  # (layer, head, q, k), not contiguous
    assert not seq.flags.c_contiguous and AU.map_precision(seq) == ("bfloat16", 2.0**-7)
    sparse = np.zeros((1, 1, 4096, 4096), np.float32)  # the sample (every 4096th value) reads column 0
    sparse[0, 0, :, 1] = 0.1  # not a bfloat16 number
    assert AU.map_precision(sparse)[0] == "float32"
    late = np.full((1, 1, 2048, 2048), 0.5, np.float32)  # a bfloat16 number everywhere...
    late[0, 0, -1, -1] = 0.1  # ...but one, past the sample and the first chunks
    assert AU.map_precision(late)[0] == "float32"
    assert AU.map_precision(late[..., :-1, :])[0] == "bfloat16"


def test_real_positions_keep_a_pad_decoder_start(lm):
    tr = lm.trace(["abc"], ["cba"])[0]
    # a trace file without stored real positions: derived from the ids, position 0 always real
    t5_like = tr.replace(
        tgt_ids=np.array([0, 5, 6, 0, 0]), tgt_tokens=("<pad>", "a", "b", "<pad>", "<pad>"), tgt_real=None
    )
    np.testing.assert_array_equal(AU.real_positions(t5_like, "tgt", 0), [1, 1, 1, 0, 0])
    # positions the model stored win over the ids
    stored = t5_like.replace(tgt_real=np.array([1, 1, 0, 0, 0], dtype=bool))
    np.testing.assert_array_equal(AU.real_positions(stored, "tgt", 0), [1, 1, 0, 0, 0])


def test_special_mass_sums_with_the_rest(lm):
    tr = lm.trace(LAB_SOURCES, LAB_TARGETS)[1]
    m = AU.special_mass(tr, "cross", 0)
    assert set(m) == {"PAD", "BOS", "EOS"} and m["PAD"].max() == 0
    assert (m["EOS"] > 0).all() and (m["EOS"] <= 1).all()
    assert AU.masked_mass_per_head(tr, "cross", 0).shape == (2, 4)


def test_special_mass_equals_the_rows_first_sums_bit_for_bit(lm):
    """special_mass sums each group's keys first (a view when they are one run) and then averages the
    real query rows: the numbers of selecting the real rows first, exactly, for PAD keys (one run),
    a group scattered over the keys, and a batch member with no PAD."""
    traces = lm.trace(LAB_SOURCES, LAB_TARGETS)
    for tr in traces:
        for kind in tr.kinds:
            p = tr.probs(kind)
            q_real, _ = AU.expected_mask(tr, kind, 0)
            _, kside = AU.kind_sides(kind)
            k_pad = ~AU.real_positions(tr, kside, 0)
            got = AU.special_mass(tr, kind, 0)
            rows = p[:, :, q_real, :]
            np.testing.assert_array_equal(got["PAD"], rows[..., k_pad].sum(-1).mean(-1))
            scattered = np.zeros(p.shape[-1], dtype=bool)
            scattered[::2] = True
            np.testing.assert_array_equal(
                p[..., AU.static._columns(scattered)].sum(-1)[:, :, q_real].mean(-1),
                rows[..., scattered].sum(-1).mean(-1),
            )
    assert AU.static._columns(np.array([0, 1, 1, 0], bool)) == slice(1, 3)
    np.testing.assert_array_equal(AU.static._columns(np.array([1, 0, 1], bool)), [0, 2])
    assert len(AU.static._columns(np.zeros(3, bool))) == 0


# -- zoo models ---------------------------------------------------------------------------------------------


def _zoo():
    from attnscope.models import registry

    return registry.zoo_names()


@pytest.mark.parametrize(
    "name", _zoo() or [pytest.param("none", marks=pytest.mark.skip(reason="no zoo models yet"))]
)
def test_zoo_models_pass_and_catch_a_bug(name):
    from attnscope.models import registry
    from attnscope.models import tasks as T

    lm = registry.load(name)
    task = T.TASKS.get(lm.meta.get("task", ""))
    if task is None:
        pytest.skip(f"{name}: no task generator to draw inputs from")
    rng = random.Random(0)
    sources = []
    while len({len(s) for s in sources}) < 2:
        sources = [task.sample(rng)[0] for _ in range(2)]
    report = AU.run_audit(lm, sources)
    assert report.passed, report.lines()
    bug = "cross_no_src_pad" if lm.has_decoder else "wrong_broadcast"
    assert not AU.run_audit(lm, sources, bug=bug).passed


# -- the verdict table and mask comparison figure -----------------------------------------------------------


def test_verdict_table_and_mask_compare(lm):
    r = AU.run_audit(lm, LAB_SOURCES, LAB_TARGETS, bug="causal_next_visible")
    df = P.verdict_table(r.verdicts)
    assert len(df) == len(r.verdicts) and list(df.columns) == P.VERDICT_COLUMNS
    assert (df["status"].str.contains("fail")).sum() == len(r.failed)
    assert P.verdict_table(r.verdicts, icons=False)["status"].isin(AU.STATUSES).all()
    tr = r.traces[0]
    _, correct = AU.expected_mask(tr, "dec_self", 0)
    codes = P.compare_codes(correct, tr.mask("dec_self"))
    n = len(tr.tgt_tokens)
    assert (codes == 2).sum() == n - 1  # the next token, wrongly visible, on every row but the last
    fig = P.mask_compare_figure(correct, tr.mask("dec_self"), tr.tgt_tokens, tr.tgt_tokens, title="dec")
    assert np.asarray(fig.data[0].z).shape == (n, n)
    with pytest.raises(ValueError):
        P.mask_compare_figure(correct, correct, tr.tgt_tokens[:-1], tr.tgt_tokens, title="x")


# -- Hugging Face models (tiny, random, built here): static checks and leak tests through the library --------


def _hf_folder(tmp_path, arch: str) -> Path:
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<pad>", "<s>", "</s>", "<unk>", "[CLS]", "[SEP]"] + "the cat sat on a mat dog ran".split()
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    template = {"bert": "[CLS] $A [SEP]", "t5": "$A </s>"}.get(arch)
    if template:
        specials = [t for t in template.split() if t != "$A"]
        tok.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(t, vocab[t]) for t in specials]
        )
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                                  bos_token="<s>", eos_token="</s>")  # fmt: skip
    t, small = transformers, dict(vocab_size=len(vocab), pad_token_id=0)
    model = {
        "bert": lambda: t.BertModel(t.BertConfig(**small, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=32, max_position_embeddings=32)),
        "gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config(**small, n_embd=16, n_layer=2, n_head=4, n_positions=32,
                                                       bos_token_id=1, eos_token_id=2)),
        "t5": lambda: t.T5ForConditionalGeneration(t.T5Config(**small, d_model=16, d_kv=4, d_ff=32, num_layers=2,
                                                              num_heads=4, eos_token_id=2, decoder_start_token_id=0)),
    }[arch]  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path / arch
    model().eval().save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("arch", ["bert", "gpt2", "t5"])
def test_hugging_face_models_pass_static_and_leak_checks(tmp_path, arch):
    from attnscope.models import registry

    lm = registry.load(str(_hf_folder(tmp_path, arch)))
    targets = ["a dog ran", "dog"] if lm.has_decoder else None
    report = AU.run_audit(lm, ["the cat sat on a mat", "the dog"], targets)
    assert report.passed, report.lines()
    ran = {v.name for v in report.verdicts if v.status == "pass"}
    assert "finite_outputs" in ran
    assert ("causal_leak" in ran) == lm.has_decoder
    with pytest.raises(ValueError, match="core models"):
        AU.run_audit(lm, ["the cat"], bug="inverted")


def test_hugging_face_wrapper_that_drops_the_attention_mask_leaks(tmp_path):
    from attnscope.models import registry

    lm = registry.load(str(_hf_folder(tmp_path, "bert")))
    lm.forward_outputs = lambda src, tgt, sr, tr: type(lm).forward_outputs(
        lm, src, tgt, torch.ones_like(sr), tr
    )
    report = AU.run_audit(lm, ["the cat sat on a mat", "the dog"])
    assert failed(report) == {"padding_leak[src]", "batch_invariance"}


def test_outputs_nan_before_and_after_a_change_did_not_move():
    """A decoder whose fully masked PAD query rows make every output NaN: the causal leak test read NaN on both
    sides as "moved by inf" and blamed the future. NaN on both sides did not move (the finite checks say the
    outputs are not numbers); NaN on one side only is still a change."""
    from attnscope.core.analysis.audit import leaks

    nan = torch.full((1, 3, 4), float("nan"))
    assert leaks._change(nan, nan.clone()).tolist() == [[0.0, 0.0, 0.0]]
    one = torch.zeros(1, 3, 4)
    one[0, 1, 2] = float("nan")
    assert leaks._change(one, torch.zeros(1, 3, 4)).tolist() == [[0.0, float("inf"), 0.0]]
    assert leaks._change(torch.ones(1, 1, 2), torch.zeros(1, 1, 2)).tolist() == [[1.0]]


def test_a_decoder_input_of_one_position_is_not_checked_and_says_so():
    """An untrained encoder-decoder generates nothing after its start token: the causal leak test had nothing to
    change and the declared-mask check passed with "future masked", a green audit of a decoder never checked. Both
    say they did not run, and how to make them run."""
    from attnscope.core.analysis.audit import leaks
    from attnscope.core.traces.trace import AttentionTrace

    batch = leaks.ProbeBatch(
        src=torch.tensor([[3, 4, 5]]), src_real=torch.ones(1, 3, dtype=torch.bool),
        tgt=torch.tensor([[1]]), tgt_real=torch.ones(1, 1, dtype=torch.bool),
    )  # fmt: skip
    verdict = leaks.check_causal_leak(lambda *a, **k: {}, batch, pad_id=0)
    assert verdict.status == "skip" and "--target" in verdict.detail
    tr = AttentionTrace(
        model="m", config_name="c", device="cpu", src_tokens=("a", "b", "c"), tgt_tokens=("<s>",),
        dec_self=np.ones((1, 1, 1, 1), np.float32), dec_self_mask=np.ones((1, 1), bool),
    )  # fmt: skip
    declared = AU.check_declared_mask([tr], "dec_self", pad_id=0)
    assert declared.status == "skip" and "not checked" in declared.detail
