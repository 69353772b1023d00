"""Adapter files written the ways users write them for their own models (tests/adapters): tuples,
dicts and dataclasses out of forward, log-probabilities, bfloat16 weights, sequence-first models,
KV caches (in place, sized for a batch, or run step by step), dict vocabularies, ids as tensors and
arrays, PAD not 0, a [CLS] classifier. Each is traced with exactly the maps its model computed, the
audit passes the correct ones and names the planted bugs, and bad input is one line, exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from attnscope.cli import main
from attnscope.core.analysis import audit as AU
from attnscope.core.errors import InputError, ModelLoadError
from attnscope.core.families.adapter import load_adapter
from attnscope.core.traces.trace import AttentionTrace

# PyTorch's notes on the translation tutorial's nn.Transformer use (the CLI filters them too)
pytestmark = pytest.mark.filterwarnings(
    "ignore:enable_nested_tensor is True:UserWarning",
    "ignore:Support for mismatched key_padding_mask:UserWarning",
)
ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ROOT / "tests" / "adapters"

# name -> (two inputs, their targets or None)
STYLES = {
    "bentrevett_seq2seq": (["the man sees a dog", "a cat"], ["a man sees the dog", "cat"]),
    "torch_translation_seqfirst": (
        ["ein mann sieht einen hund", "die katze"],
        ["a man sees a dog", "the cat"],
    ),
    "hf_style_decoder": (["hello world", "abc"], ["xy", "z"]),
    "hf_style_decoder_kvsteps": (["hello world", "abc"], ["xy", "z"]),
    "llama_bf16": (["hello", "ab"], ["wor", "d"]),
    "fairseq_lm_seqfirst": (["the cat sat", "a dog"], ["on the mat", "ran"]),
    "bert_cls_pooled": (["the movie was good", "boring"], None),
    "tutorial_bf16": (["hello world", "abc"], ["dlrow olleh", "cba"]),
    "sliced_attention": (["abc", "hedcab"], None),
    "tutorial_gru_attention": (["abc", "hed cab"], ["ab", "cd e"]),
}


@pytest.fixture(scope="module")
def lms():
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_adapter(ADAPTERS / f"{name}.py")
        return cache[name]

    return get


def _failed(report) -> set[str]:
    return {v.name for v in report.failed}


def _holder(model: nn.Module):
    """The module that keeps the model's own record of its maps (``computed``, ``reset()``)."""
    return next(m for m in model.modules() if hasattr(m, "computed"))


def _own_maps(lm, tr: AttentionTrace) -> dict[str, list[torch.Tensor]]:
    """The maps the model itself recorded on the trace's ids, per kind in call order (float32)."""
    holder = _holder(lm.model)
    holder.reset()
    src = torch.tensor(np.array([tr.src_ids])) if len(tr.src_tokens) else None
    tgt = torch.tensor(np.array([tr.tgt_ids])) if tr.tgt_ids is not None and len(tr.tgt_ids) else None
    with torch.no_grad():
        lm.module.forward(lm.model, src, tgt)
    out: dict[str, list[torch.Tensor]] = {}
    for kind, probs in holder.computed:
        out.setdefault(kind, []).append(probs[0].float())
    return out


def _trace_cli(tmp_path, name: str, text: str, target: str | None) -> AttentionTrace:
    out = tmp_path / f"{name}.npz"
    argv = ["trace", "--model", str(ADAPTERS / f"{name}.py"), text, "--out", str(out)]
    assert main(argv + (["--target", target] if target else [])) == 0
    return AttentionTrace.load(out)


# -- the trace holds exactly the maps the model computed -------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["bentrevett_seq2seq", "hf_style_decoder", "fairseq_lm_seqfirst", "bert_cls_pooled", "tutorial_bf16",
     "tutorial_gru_attention"],
)  # fmt: skip
def test_trace_is_exactly_what_the_model_computed(name, lms, tmp_path):
    texts, targets = STYLES[name]
    tr = _trace_cli(tmp_path, name, texts[0], targets[0] if targets else None)
    own = _own_maps(lms(name), tr)
    assert set(own) == set(tr.kinds)
    for kind, maps in own.items():
        assert tr.probs(kind).shape[0] == len(maps) == (1 if name == "tutorial_gru_attention" else 2)
        for layer, probs in enumerate(maps):
            np.testing.assert_allclose(tr.probs(kind)[layer], probs.numpy(), atol=1e-6, rtol=0)


def test_tuple_output_is_read_for_its_logits(lms):
    """bentrevett's model returns (logits, attention): the logits are used, the attention agrees."""
    lm = lms("bentrevett_seq2seq")
    tr = lm.trace(["the man sees a dog"], ["a man sees the dog"])[0]
    with torch.no_grad():
        logits, attention = lm.module.forward(lm.model, torch.tensor(np.array([tr.src_ids])),
                                              torch.tensor(np.array([tr.tgt_ids])))  # fmt: skip
    np.testing.assert_allclose(tr.out_probs, logits[0].softmax(-1).max(-1).values.numpy(), atol=1e-6)
    np.testing.assert_allclose(tr.probs("cross")[-1], attention[0].numpy(), atol=1e-6, rtol=0)
    assert lm.spec.pad == 1 and tr.src_real.all()  # PAD 1 (torchtext's order), and no padding here


def test_sequence_first_tutorial_maps_equal_its_multihead_attention(lms, tmp_path):
    """PyTorch's translation tutorial (sequence-first nn.Transformer): every MultiheadAttention
    called again by hand on the inputs it got, per head."""
    lm = lms("torch_translation_seqfirst")
    tr = _trace_cli(tmp_path, "torch_translation_seqfirst", "ein mann sieht einen hund", "a man sees a dog")
    calls: list[tuple[str, tuple, dict]] = []
    hooks = [
        m.register_forward_pre_hook(lambda mod, a, k, name=n: calls.append((name, a, k)), with_kwargs=True)
        for n, m in lm.model.named_modules()
        if isinstance(m, nn.MultiheadAttention)
    ]
    try:
        torch.backends.mha.set_fastpath_enabled(False)
        with torch.no_grad():
            lm.module.forward(
                lm.model, torch.tensor(np.array([tr.src_ids])), torch.tensor(np.array([tr.tgt_ids]))
            )
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
        for h in hooks:
            h.remove()
    ref: dict[str, list] = {"enc_self": [], "dec_self": [], "cross": []}
    for name, a, k in calls:
        kw = {x: k[x] for x in ("key_padding_mask", "attn_mask") if k.get(x) is not None}
        with torch.no_grad():
            _, w = lm.model.get_submodule(name).forward(
                *a[:3], need_weights=True, average_attn_weights=False, **kw
            )
        kind = "cross" if "multihead_attn" in name else ("dec_self" if ".decoder." in name else "enc_self")
        ref[kind].append(w[0])
    assert tr.src_tokens[0] == "<bos>" and "<unk>" in tr.src_tokens  # "einen" is not in the vocabulary
    for kind, maps in ref.items():
        assert len(maps) == tr.probs(kind).shape[0] == 2
        for layer, w in enumerate(maps):
            np.testing.assert_allclose(tr.probs(kind)[layer], w.numpy(), atol=1e-6, rtol=0)


def test_kv_cache_run_step_by_step_is_joined_into_full_maps(lms):
    steps, full = lms("hf_style_decoder_kvsteps"), lms("hf_style_decoder")
    a = steps.trace(["hello world", "abc"], ["xy", "z"])
    b = full.trace(["hello world", "abc"], ["xy", "z"])
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x.probs("dec_self"), y.probs("dec_self"), atol=1e-6, rtol=0)
        assert (x.mask("dec_self") == y.mask("dec_self")).all()  # causal (the steps' keys) and PAD
    # and each row is the step the model computed: (1, t + 1) per layer, in call order
    holder = _holder(steps.model)
    holder.reset()
    with torch.no_grad():
        steps.module.forward(steps.model, None, torch.tensor(np.array([a[0].tgt_ids])))
    n = len(a[0].tgt_ids)
    assert len(holder.computed) == 2 * n
    for i, (_, probs) in enumerate(holder.computed):
        t, layer = divmod(i, 2)
        np.testing.assert_allclose(
            a[0].probs("dec_self")[layer, :, t, : t + 1], probs[0, :, 0].numpy(), atol=1e-6
        )


def test_bf16_maps_are_the_models_to_its_precision(lms, tmp_path):
    """LLaMA's F.softmax(scores.float()).type_as(xq): the trace holds the float32 softmax; rounded to
    bfloat16 it is exactly the map the model multiplies with v."""
    lm = lms("llama_bf16")
    tr = _trace_cli(tmp_path, "llama_bf16", "hello", "wor")
    for layer, probs in enumerate(_own_maps(lm, tr)["dec_self"]):
        got = torch.tensor(tr.probs("dec_self")[layer]).to(torch.bfloat16).float()
        assert torch.equal(got, probs)
    assert lm.cfg.dtype == "bfloat16" and tr.tgt_ids.dtype.kind == "i"


def test_bf16_maps_exactly_within_1e6(lms, tmp_path):
    lm = lms("llama_bf16")
    tr = _trace_cli(tmp_path, "llama_bf16", "hello", "wor")
    for layer, probs in enumerate(_own_maps(lm, tr)["dec_self"]):
        np.testing.assert_allclose(tr.probs("dec_self")[layer], probs.numpy(), atol=1e-6, rtol=0)


# -- what forward returns ---------------------------------------------------------------------------


def test_bf16_probabilities_are_not_taken_for_logits(lms):
    """bfloat16 probabilities sum to 1 only within ~2e-3: they are still probabilities, not softmaxed again."""
    lm = lms("tutorial_bf16")
    tr = lm.trace(["hello world"], ["dlrow olleh"])[0]
    with torch.no_grad():
        probs = lm.module.forward(
            lm.model, torch.tensor(np.array([tr.src_ids])), torch.tensor(np.array([tr.tgt_ids]))
        )
    assert probs.dtype == torch.bfloat16 and float((probs.float().sum(-1) - 1).abs().max()) > 1e-3
    np.testing.assert_array_equal(tr.out_probs, probs[0].float().max(-1).values.numpy())


def test_log_probabilities_dict_and_dataclass_outputs(lms):
    lm = lms("fairseq_lm_seqfirst")  # log_softmax, transposed back from sequence-first
    tr = lm.trace(["the cat sat"], ["on the mat"])[0]
    with torch.no_grad():
        logp = lm.module.forward(lm.model, None, torch.tensor(np.array([tr.tgt_ids])))
    np.testing.assert_allclose(tr.out_probs, logp[0].exp().max(-1).values.numpy(), atol=1e-6)
    assert lm.spec.bos is None and tr.tgt_tokens[0] == "the"
    clf = lms("bert_cls_pooled")  # {"logits": (B, 2), ...} of a [CLS] pooler
    tr = clf.trace(["the movie was good"])[0]
    assert tr.out_tokens[0] in ("negative", "positive") and tr.out_probs.shape == (2,)
    dec = lms("hf_style_decoder")  # a @dataclass CausalLMOutputWithPast, 32 logits for 31 tokens
    with torch.no_grad():
        out = dec.module.forward(dec.model, None, torch.tensor([[0, 8, 5]]))
    assert type(out).__name__ == "CausalLMOutputWithPast" and out.logits.shape[-1] == len(dec.out_tok) + 1
    tr = dec.trace(["hello"])[0]
    assert tr.topk_ids.max() < 32 and tr.out_probs.shape == (len(tr.tgt_ids),)


# -- vocabularies, ids, specials ---------------------------------------------------------------------


def test_dict_vocabularies_tensor_ids_and_pad_not_zero(lms):
    lm = lms("torch_translation_seqfirst")  # VOCAB and TGT_VOCAB are dicts token -> id
    assert lm.src_tok.itos[:5] == ["<unk>", "<pad>", "<bos>", "<eos>", "ein"]
    assert lm.tgt_tok.itos[4] == "a" and len(lm.tgt_tok) == len(lm.module.TGT_VOCAB)
    assert lm.prepare("ein hund").ids == [2, 4, 11, 3]  # encode returned a 1-D tensor
    tr = lm.trace(["ein mann sieht einen hund", "die katze"], ["a man sees a dog", "the cat"])[1]
    assert tr.src_ids[-1] == 1 and not tr.src_real[-1]  # padded with PAD 1
    dec = lms("hf_style_decoder")  # encode returns (1, L) like return_tensors="pt"; PAD is the last id
    assert dec.prepare("hi").ids == [0, 8, 9] and dec.spec.pad == len(dec.src_tok) - 1
    assert dec.prepare_target("hi!").ids == [8, 9, 0]  # "!" is not in the vocabulary: dropped by encode
    llama = lms("llama_bf16")  # encode returns a numpy array; PAD is EOS
    assert llama.prepare("hi?").ids == [1, 9, 10, 0] and llama.spec.pad == llama.spec.eos == 2


def test_encoder_that_truncates_itself_and_unknown_words(lms):
    clf = lms("bert_cls_pooled")
    tr = clf.trace(["good " * 20 + "zzz", "qqq"])
    assert len(tr[0].src_tokens) == 12 and tr[0].src_tokens[0] == "[CLS]" and tr[0].src_tokens[-1] == "[SEP]"
    assert tr[1].src_tokens[: int(tr[1].src_real.sum())] == ("[CLS]", "[UNK]", "[SEP]")


def test_load_gets_the_device_when_it_asks_for_it(lms):
    lm = lms("bentrevett_seq2seq")
    assert lm.model.device == torch.device("cpu") and lm.model.encoder.device == torch.device("cpu")


# -- batches the model cannot take at once ------------------------------------------------------------


def test_max_batch_splits_the_calls(lms):
    lm = lms("llama_bf16")  # its cache holds 4 sequences
    texts = ["hello", "ab", "world", "a", "bird", "lo", "deal"]
    together = lm.trace(texts)
    for text, tr in zip(texts, together, strict=True):
        alone = lm.trace([text])[0]
        n = len(alone.tgt_ids)
        np.testing.assert_array_equal(tr.probs("dec_self")[:, :, :n, :n], alone.probs("dec_self"))
    report = AU.run_audit(lm, *STYLES["llama_bf16"])  # the leak tests run up to 32 rows at a time
    assert report.passed, report.lines()


def test_without_max_batch_the_message_says_to_set_it(tmp_path):
    text = (ADAPTERS / "llama_bf16.py").read_text(encoding="utf-8")
    path = tmp_path / "llama_nobatch.py"
    path.write_text(
        text.replace("MAX_BATCH = llama_meta.MAX_BATCH", "").replace(
            "Path(__file__).resolve().parents[1]", repr(str(ADAPTERS.parent))
        ),
        encoding="utf-8",
    )
    lm = load_adapter(path)
    with pytest.raises(InputError, match=r"one sequence alone runs: .* set MAX_BATCH = N") as err:
        lm.trace(["hello", "ab", "world", "a", "bird"])
    assert "forward(model, None, [5, 6]) raised RuntimeError" in str(err.value)


# -- the audit ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, must_fail",
    [
        ("bentrevett_seq2seq", set()),
        ("torch_translation_seqfirst", set()),
        ("hf_style_decoder", set()),
        ("hf_style_decoder_kvsteps", set()),
        ("llama_bf16", set()),
        ("fairseq_lm_seqfirst", set()),
        ("bert_cls_pooled", set()),
        # memory_key_padding_mask left out: cross-attention reads the source's PAD
        ("torch_translation_nomemmask", {"masked_mass[cross]", "batch_invariance"}),
        # the causal bias skipped whenever an attention_mask is given
        ("hf_style_decoder_nocausal", {"masked_mass[dec_self]", "causal_leak"}),
    ],
)
def test_audit_passes_correct_styles_and_names_the_bug(name, must_fail, lms):
    base = name.replace("_nomemmask", "_seqfirst").replace("_nocausal", "")
    texts, targets = STYLES[base]
    report = AU.run_audit(lms(name), texts, targets)
    if not must_fail:
        assert report.passed, report.lines()
        statuses = {v.name: v.status for v in report.verdicts}
        assert statuses["batch_invariance"] == "pass"
        assert statuses["causal_leak"] == ("pass" if targets else "skip")
    else:
        assert must_fail <= _failed(report), report.lines()
        assert all(v.detail and "\n" not in v.detail for v in report.failed)


def test_bf16_model_passes_the_audit(lms):
    """Its maps sum to 1 only within bfloat16's precision: the row-sum check reads that from the values."""
    report = AU.run_audit(lms("tutorial_bf16"), *STYLES["tutorial_bf16"])
    assert report.passed, report.lines()
    sums = [v for v in report.verdicts if v.name.startswith("row_sums")]
    assert sums and all("bfloat16 maps" in v.detail and v.value > AU.ROW_SUM_TOL for v in sums)


# -- the command line: bad input is one line, exit code 2 ---------------------------------------------


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("bentrevett_seq2seq", "", "the input text is empty"),
        ("bert_cls_pooled", "   ", "the input text is empty"),
        ("fairseq_lm_seqfirst", "the zebra", "cannot be encoded: KeyError"),
        ("llama_bf16", "hello world and more", "this model takes at most 16"),
        ("torch_translation_seqfirst", " ".join(["ein hund"] * 20), "this model takes at most 40"),
    ],
)
def test_bad_text_is_one_line(name, text, message, capsys, tmp_path):
    for argv in (["predict"], ["trace", "--out", str(tmp_path / "t.npz")], ["audit"]):
        assert main([*argv, "--model", str(ADAPTERS / f"{name}.py"), text]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_cli_runs_the_tutorial_without_noise_or_traceback():
    """A fresh process: no traceback, and PyTorch's warnings about the tutorial's nn.Transformer use
    (sequence-first, mixed mask types) are not printed on every command."""
    path = str(ADAPTERS / "torch_translation_seqfirst.py")
    run = [sys.executable, "-m", "attnscope"]
    ok = subprocess.run([*run, "predict", "--model", path, "ein mann sieht einen hund"], capture_output=True,
                        text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert ok.returncode == 0 and ok.stdout.strip() and ok.stderr == "", ok.stderr
    bad = subprocess.run([*run, "trace", "--model", path, "ein hund", "--target", "", "--out", "x.npz"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1
    assert "the target text is empty" in bad.stderr and "Traceback" not in bad.stderr


# -- adapter files that cannot work: one sentence each ------------------------------------------------

CLF = (ADAPTERS / "bert_cls_pooled.py").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("    return [BOS, *ids, EOS]", "    [BOS, *ids, EOS]", "encode('the movie was good') returned NoneType"),
        ("    return [BOS, *ids, EOS]", "    return text.split()", "returned 'the' among its ids"),
        ("    return [BOS, *ids, EOS]", "    return torch.tensor([[BOS, *ids, EOS]] * 2)", "of shape (2, 6)"),
        ('enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *_WORDS])}', 'enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", '
         '*_WORDS]) if i != 6}', "id 6 has no token"),
        ('PAD, UNK, BOS, EOS = VOCAB["[PAD]"]', 'PAD, UNK, BOS, EOS = None', "PAD is None"),
        ('MAX_LEN = 12', 'MAX_LEN = 12\nMAX_BATCH = 0', "MAX_BATCH must be an integer of at least 1"),
        ('return {"logits": self.classifier(pooled)', 'return {"scores": self.classifier(pooled)',
         "a dict without 'logits' (keys 'scores', 'pooler_output')"),
        ('LABELS = ["negative", "positive"]', 'CLASSES = ["negative", "positive"]\nLABELS = None',
         "one row per sequence: a classifier sets LABELS"),
    ],
)  # fmt: skip
def test_adapter_that_cannot_work_is_one_sentence(old, new, message, tmp_path, capsys):
    assert old in CLF
    text = CLF.replace(old, new).replace("len(LABELS)", "2")
    text = text.replace("Path(__file__).resolve().parents[1]", repr(str(ADAPTERS.parent)))
    path = tmp_path / "clf.py"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ModelLoadError) as err:
        load_adapter(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert main(["predict", "--model", str(path), "good"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_sequence_first_output_not_transposed_is_named(tmp_path):
    text = (ADAPTERS / "torch_translation_seqfirst.py").read_text(encoding="utf-8")
    path = tmp_path / "tt.py"
    path.write_text(
        text.replace("    return logits.transpose(0, 1)  # (B, T, V)", "    return logits"), encoding="utf-8"
    )
    with pytest.raises(ModelLoadError, match=r"sequence-first\? transpose it to batch-first"):
        load_adapter(path)


@pytest.mark.parametrize(
    "name", ["bentrevett_seq2seq", "hf_style_decoder", "fairseq_lm_seqfirst", "tutorial_bf16",
             "bert_cls_pooled", "sliced_attention", "tutorial_gru_attention"]
)  # fmt: skip
def test_a_padded_batch_is_traced_with_the_models_own_maps(name, lms):
    """Two inputs of different lengths traced together (PAD in the shorter one's rows and columns):
    each trace's maps equal what the model itself computed on that padded batch, row for row."""
    lm = lms(name)
    texts, targets = STYLES[name]
    traces = lm.trace(texts, targets)
    sides = [("src", traces[0].src_real), ("tgt", traces[0].tgt_real)]
    assert any(r is not None and len(r) and not all(t.src_real.all() if s == "src" else t.tgt_real.all()
                                                   for t in traces) for s, r in sides)  # fmt: skip
    holder = _holder(lm.model)
    holder.reset()
    src = torch.tensor(np.stack([t.src_ids for t in traces])) if len(traces[0].src_tokens) else None
    tgt = torch.tensor(np.stack([t.tgt_ids for t in traces])) if traces[0].tgt_ids is not None else None
    with torch.no_grad():
        lm.module.forward(lm.model, src, tgt)
    own: dict[str, list[torch.Tensor]] = {}
    for kind, probs in holder.computed:
        own.setdefault(kind, []).append(probs.float())
    assert set(own) == set(traces[0].kinds)
    for i, tr in enumerate(traces):
        for kind, maps in own.items():
            for layer, probs in enumerate(maps):
                np.testing.assert_allclose(tr.probs(kind)[layer], probs[i].numpy(), atol=1e-6, rtol=0,
                                           err_msg=f"{name} input {i} {kind} layer {layer}")  # fmt: skip


def test_attention_in_slices_and_a_logsumexp_softmax_are_traced_whole(lms):
    """diffusers-style slices of the batch x heads fold are joined into one layer, and
    exp(s - logsumexp(s)) is a softmax: both layers are in the trace, nothing noted."""
    traces = lms("sliced_attention").trace(["abc", "hedcab"])
    for tr in traces:
        assert tr.probs("enc_self").shape == (2, 2, 6, 6)
        assert "capture_notes" not in tr.meta


def test_slices_that_cannot_be_joined_are_left_out_with_a_note_not_a_crash(tmp_path):
    """Slices of 3 rows of a (2 sequences x 2 heads) fold mix sequences: capture flags them and cannot
    join them into one layer, so the trace leaves them out, says why, and keeps the other layer."""
    text = (ADAPTERS / "sliced_attention.py").read_text(encoding="utf-8")
    path = tmp_path / "sliced3.py"
    path.write_text(
        text.replace("HEADS, DIM, SLICE = 2, 8, 1", "HEADS, DIM, SLICE = 2, 8, 3"), encoding="utf-8"
    )
    traces = load_adapter(path).trace(["abc", "hedcab"])
    assert traces[0].probs("enc_self").shape == (1, 2, 6, 6)  # the logsumexp layer
    notes = traces[1].meta["capture_notes"]
    assert any("layers.0" in n and "left out of the trace" in n and "sequence(s)" in n for n in notes), notes
    assert any("could not verify" in n for n in notes), notes


LINFORMER = '''
import torch
from torch import nn

VOCAB = ["<pad>", "<unk>"] + list("abcdefgh")
PAD, BOS, EOS = 0, 1, 1
ARCH = "encoder"
EXAMPLES = ["abcdef", "hedcab"]
MAX_LEN = 6


class Linformer(nn.Module):
    """Keys and values projected along the sequence to 3 learned mixtures of its positions."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(len(VOCAB), 8), nn.Linear(8, 24)
        self.E, self.F = nn.Parameter(torch.randn(MAX_LEN, 3)), nn.Parameter(torch.randn(MAX_LEN, 3))
        self.out = nn.Linear(8, len(VOCAB))

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
        k, v = torch.einsum("bnd,nk->bkd", k, self.E[:n]), torch.einsum("bnd,nk->bkd", v, self.F[:n])
        q, k, v = (t.reshape(b, -1, 2, 4).transpose(1, 2) for t in (q, k, v))
        w = (q @ k.transpose(-1, -2)).softmax(-1)
        return self.out((w @ v).transpose(1, 2).reshape(b, n, 8))


def encode(text):
    return [VOCAB.index(c) if c in VOCAB else 1 for c in text]


def load():
    torch.manual_seed(0)
    return Linformer().eval()


def forward(model, src, tgt):
    return model(src)
'''


def test_attention_over_no_token_keys_is_said_as_such_not_as_no_attention(tmp_path):
    """Linformer's every key is a mixture of positions: capture records its map, exact, but none of
    it is over the tokens a trace draws. The loading check says so, and why, in one sentence."""
    path = tmp_path / "linformer.py"
    path.write_text(LINFORMER, encoding="utf-8")
    with pytest.raises(ModelLoadError) as err:
        load_adapter(path)
    text = str(err.value)
    assert "computed 1 attention map(s), none of them over this input's tokens" in text
    assert "left out of the trace" in text and "no attention found" not in text and "\n" not in text


def test_layers_pruned_to_other_head_counts_draw_the_most_and_say_the_rest(lms, tmp_path):
    """Heads pruned per layer (4, 2, 4): one head count per kind in a trace, so the two 4-head layers are
    drawn, exactly as the model computed them, and the 2-head layer is said (the trace was refused)."""
    lm = lms("pruned_heads")
    tr = _trace_cli(tmp_path, "pruned_heads", "hello", None)
    assert tr.n_layers == 2 and tr.n_heads == 4
    own = _own_maps(lm, tr)["enc_self"]
    assert [m.shape[0] for m in own] == [4, 2, 4]
    np.testing.assert_allclose(tr.probs("enc_self"), np.stack([own[0].numpy(), own[2].numpy()]), atol=1e-6)
    said = [n for n in tr.meta["capture_notes"] if "left out of the trace" in n]
    assert len(said) == 1 and said[0].startswith("enc_self (layers.1): 1 call(s) left out"), said


def test_a_model_whose_weights_went_nan_traces_to_a_file_that_opens(tmp_path):
    """A checkpoint whose training blew up (a NaN in the last layer's value projection): the maps are the
    model's, what attention moves is left out and said (its norms are NaN, which the reader refuses as no
    norms), and the trace opens."""
    lm = load_adapter(ADAPTERS / "bert_encoder.py")
    with torch.no_grad():
        lm.model.layer[1].attention.value.weight[0, 0] = float("nan")
    tr = lm.trace(["hello"])[0]
    assert tr.value_norms("enc_self") is None and tr.residual_norms("enc_self") is None
    said = [n for n in tr.meta["capture_notes"] if "what attention moves is left out of the trace" in n]
    assert said == [
        "enc_self: what attention moves is left out of the trace, its values hold NaN or infinity"
    ]
    assert "enc_self" not in (tr.meta.get("value_norms") or {})
    back = AttentionTrace.load(tr.save(tmp_path / "nan.npz"))
    np.testing.assert_array_equal(back.probs("enc_self"), tr.probs("enc_self"))
    assert np.isfinite(back.probs("enc_self")).all()


def test_residual_norms_alone_not_finite_leave_out_only_the_residual(tmp_path):
    """Every family's trace keeps the rule Captured.trace keeps: a residual stream that overflowed (inf)
    leaves its norms out and says so, while the values' finite norms are kept (they were dropped too)."""
    from attnscope.core.families.interface import Side, package_trace

    probs = torch.full((1, 2, 2, 3, 3), 1 / 3)
    side = Side(
        torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.bool), lambda ids: [f"t{i}" for i in ids]
    )
    value = np.ones((2, 2, 3), dtype=np.float32)
    residual = np.ones((2, 3), dtype=np.float32)

    def traced(res):
        return package_trace(0, model="m", config_name="c", device="cpu", src=side, tgt=None,
                             maps={"enc_self": (probs, None, None)}, output_text="",
                             meta={"value_norms": {"enc_self": "with the output projection"}},
                             enc_self_value_norms=value.copy(), enc_self_residual_norms=res.copy())  # fmt: skip

    whole = traced(residual)
    assert whole.residual_norms("enc_self") is not None and not whole.meta.get("capture_notes")
    residual[1, 2] = np.inf
    tr = traced(residual)
    np.testing.assert_array_equal(tr.value_norms("enc_self"), value)
    assert tr.residual_norms("enc_self") is None
    assert tr.meta["value_norms"] == {"enc_self": "with the output projection"}
    assert tr.meta["capture_notes"] == [
        "enc_self: the residual stream's share of what attention moves is left out of the trace, the "
        "residual stream holds NaN or infinity"
    ]
    back = AttentionTrace.load(tr.save(tmp_path / "inf.npz"))
    np.testing.assert_array_equal(back.value_norms("enc_self"), value)
