"""Adapter files in the styles users write (tests/adapters): the audit passes the correct models and
fails the classic bugs with the check that names them; the trace holds exactly the model's maps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnscope.cli import main
from attnscope.core.analysis import audit as AU
from attnscope.core.errors import ModelLoadError
from attnscope.core.families.adapter import load_adapter
from attnscope.core.traces.trace import AttentionTrace

ADAPTERS = Path(__file__).resolve().parent / "adapters"
TEXTS = ["hello world", "abc"]
TARGETS = ["dlrow olleh", "cba"]


def _failed(report) -> set[str]:
    return {v.name for v in report.failed}


@pytest.mark.parametrize(
    "name, targets, must_fail",
    [
        ("tutorial_seq2seq", TARGETS, set()),
        ("gpt_decoder", TARGETS, set()),
        ("bert_encoder", None, set()),
        ("bert_classifier", None, set()),  # an encoder classifier (LABELS): one output per sequence
        # view(B*H, -1, d) without the transpose and the mask repeated head-major: heads read PAD
        ("tutorial_headsplit_bug", TARGETS, {"masked_mass[enc_self]", "batch_invariance"}),
        # SDPA with is_causal=False: the decoder sees the future
        ("gpt_decoder_no_causal", TARGETS, {"masked_mass[dec_self]", "causal_leak"}),
        # hand-written attention with a padding mask but no causal mask
        ("gpt_decoder_manual_nocausal", TARGETS, {"masked_mass[dec_self]", "causal_leak"}),
    ],
)
def test_audit_passes_correct_models_and_names_the_bug(name, targets, must_fail):
    lm = load_adapter(ADAPTERS / f"{name}.py")
    report = AU.run_audit(lm, TEXTS, targets)
    if not must_fail:
        assert report.passed, report.lines()
        statuses = {v.name: v.status for v in report.verdicts}
        assert statuses["batch_invariance"] == "pass"
        if lm.has_decoder:
            assert statuses["causal_leak"] == "pass"
    else:
        assert must_fail <= _failed(report), report.lines()
        for v in report.failed:
            assert v.detail and "\n" not in v.detail  # one sentence, naming where
    future = next(v for v in report.verdicts if v.name == "causal_leak")
    if "causal_leak" in must_fail:
        assert "moved by" in future.detail and "when position" in future.detail


def test_cli_trace_of_a_tutorial_adapter_is_exactly_what_it_computed(tmp_path):
    out = tmp_path / "t.npz"
    path = ADAPTERS / "tutorial_seq2seq.py"
    assert (
        main(["trace", "--model", str(path), "hello world", "--target", "dlrow olleh", "--out", str(out)])
        == 0
    )
    tr = AttentionTrace.load(out)
    lm = load_adapter(path)  # the same seeded weights, run once more with its own record of its maps
    lm.model.reset()
    with torch.no_grad():
        lm.module.forward(lm.model, torch.tensor([tr.src_ids]), torch.tensor([tr.tgt_ids]))
    computed = list(lm.model.computed)
    for kind in ("enc_self", "dec_self", "cross"):
        mine = [p[0].numpy() for label, p in computed if label == kind]
        assert len(mine) == tr.probs(kind).shape[0] == 2
        for layer, probs in enumerate(mine):
            np.testing.assert_allclose(tr.probs(kind)[layer], probs, atol=1e-6, rtol=0)
    assert tr.meta["mask_sources"]["enc_self"] == "masked_fill"


def test_classifier_adapter_traces_like_core_classifiers():
    lm = load_adapter(ADAPTERS / "bert_classifier.py")
    assert lm.labels == ["negative", "neutral", "positive"] and lm.cfg.n_classes == 3
    tr = lm.trace(TEXTS)[1]
    assert tr.out_tokens[0] in lm.labels and tr.out_probs.shape == (3,) and abs(tr.out_probs.sum() - 1) < 1e-6
    assert tr.meta["labels"] == lm.labels and tr.output_text == tr.out_tokens[0]
    assert tr.kinds == ("enc_self",) and tr.src_real.sum() == len(lm.prepare("abc").ids)
    assert lm.predict(TEXTS) == [t.output_text for t in lm.trace(TEXTS)]


def test_decoder_adapter_continues_the_prompt():
    lm = load_adapter(ADAPTERS / "gpt_decoder.py")
    tr = lm.trace_continuation(["hello"])[0]
    n_prompt = len(lm.prepare("hello").ids)
    assert tr.meta["prompt_len"] == n_prompt and tr.src_tokens == () and tr.kinds == ("dec_self",)
    new = tr.tgt_ids[n_prompt:]
    assert len(new) == tr.meta["generated"] >= 1
    # each generated token is the model's argmax at the position before it
    assert list(new) == list(tr.topk_ids[n_prompt - 1 : len(tr.tgt_ids) - 1, 0])


@pytest.mark.parametrize(
    "name, message",
    [
        ("broken_raises", "load() raised RuntimeError: weights file missing"),
        ("broken_missing_forward", "lacks forward"),
        ("broken_shapes", "forward returned"),
    ],
)
def test_broken_adapters_are_one_sentence(name, message, capsys):
    with pytest.raises(ModelLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_adapter(ADAPTERS / f"{name}.py")
    assert main(["predict", "--model", str(ADAPTERS / f"{name}.py"), "abc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_decoder_that_prepends_a_learned_vector_traces_and_audits():
    """A decoder-only model that joins a learned [CLS] before its tokens: loading it ran its predictions' top-k
    through the side's row labelling (one label per position), which raised on a row of k ids ("zip() argument
    2 is longer than argument 1"), so no trace or audit could run. The top-k ids are vocabulary tokens."""
    lm = load_adapter(ADAPTERS / "gpt_decoder_cls.py")
    (tr,) = lm.trace(["hello"])
    assert tr.tgt_tokens[0].startswith("<cls") and tr.tgt_tokens[1:] == ("<bos>", *"hello"), tr.tgt_tokens
    vocab = ["<pad>", "<bos>", "<eos>", "<unk>", *"abcdefghijklmnopqrstuvwxyz "]
    assert tr.topk_tokens is not None and set(tr.topk_tokens.reshape(-1)) <= set(vocab), tr.topk_tokens
    assert [vocab[i] for i in tr.topk_ids[:, 0]] == list(tr.topk_tokens[:, 0])
    report = AU.run_audit(lm, ["hello", "ab"])
    assert report.verdicts and not any(v.name == "declared_mask[dec_self]" and not v.passed for v in report)


def test_the_declared_mask_check_names_heads_masked_differently():
    """A per-head mask repeated in the wrong order (``repeat`` for ``repeat_interleave``): the declared-mask
    check's failure named positions only, though the trace knew which layers' heads were masked differently."""
    lm = load_adapter(ADAPTERS / "mha_repeat_mask_bug.py")
    report = AU.run_audit(lm, ["hello world", "abc", "masks"])
    (declared,) = [v for v in report.verdicts if v.name == "declared_mask[enc_self]"]
    assert not declared.passed and "were masked differently" in declared.detail, declared.line()
    assert "\n" not in declared.detail


def test_the_audit_command_says_what_capture_could_not_verify(capsys):
    """The traces the audit reads carry capture's notes (a layer flagged or left out is not checked): the
    audit command printed the verdicts alone; it says the notes on stderr, as trace and predict do."""
    code = main(["audit", "--model", str(ADAPTERS / "flagged_outside_queries.py"), "abc", "ab"])
    out = capsys.readouterr()
    assert code in (0, 1) and "declared_mask" in out.out
    assert "warning: capture's notes on the model's attention" in out.err, out.err
    assert "could not verify" in out.err, out.err
