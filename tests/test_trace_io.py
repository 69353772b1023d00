"""Tokenizers, checkpoints, the runner and AttentionTrace files."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import torch

from attnscope.core.errors import InputError, TokenizerError, TraceFormatError
from attnscope.core.families.native import load_folder, resolve_device
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer import checkpoint
from attnscope.core.transformer.config import tiny
from attnscope.core.transformer.model import Transformer
from attnscope.core.transformer.tokenizer import CharTokenizer, Tokenizer, WordTokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny untrained char-level seq2seq model saved as a model folder."""
    tok = CharTokenizer.fit(["abcdefghijklmnopqrstuvwxyz"])
    torch.manual_seed(0)
    cfg = tiny(vocab_size=len(tok), max_len=24).replace(name="tiny-test")
    model = Transformer(cfg).eval()
    path = tmp_path_factory.mktemp("model")
    checkpoint.save(path, model, tok, tok, card="# tiny\n\nA tiny untrained model.\n", meta={"task": "none"})
    return path


# -- tokenizers --------------------------------------------------------------------


def test_char_tokenizer_round_trip_and_unknowns(tmp_path):
    tok = CharTokenizer.fit(["hello world"])
    assert tok.itos[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    ids = tok.encode("hold")
    assert tok.decode(ids) == "hold"
    assert tok.decode(ids + [tok.eos_id] + ids) == "hold"  # stops at EOS
    assert tok.unknown("hat x!") == ["a", "t", "x", "!"]
    with pytest.raises(TokenizerError, match="'a'"):
        tok.encode("hat")
    assert tok.encode("hat", strict=False)[1] == tok.unk_id
    tok.save(tmp_path / "v.json")
    again = Tokenizer.load(tmp_path / "v.json")
    assert isinstance(again, CharTokenizer) and again.itos == tok.itos


def test_word_tokenizer_round_trip(tmp_path):
    tok = WordTokenizer.fit(["one thousand nine hundred eighty-seven"])
    ids = tok.encode("nine hundred")
    assert tok.tokens(ids) == ["nine", "hundred"]
    assert tok.decode(ids) == "nine hundred"
    tok.save(tmp_path / "w.json")
    assert isinstance(Tokenizer.load(tmp_path / "w.json"), WordTokenizer)
    (tmp_path / "bad.json").write_text('{"kind": "char", "tokens": ["a"]}')
    with pytest.raises(TokenizerError, match="must start with"):
        Tokenizer.load(tmp_path / "bad.json")


# -- checkpoints --------------------------------------------------------------------


def test_checkpoint_round_trip_rebuilds_same_model(folder):
    lm = load_folder(folder)
    files = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "src_vocab.json", "card.md"} <= files
    assert not any(n.endswith((".pt", ".pth", ".bin", ".pkl")) for n in files)
    cfg, model, *_ = checkpoint.load_parts(folder)
    src = torch.tensor([[5, 6, 7, 2]])
    tgt = torch.tensor([[1, 8, 9]])
    a = lm.model(src, tgt).logits
    b = model(src, tgt).logits
    assert torch.equal(a, b)
    # tied weights stay tied after loading
    assert lm.model.generator.weight.data_ptr() == lm.model.src_embed.tok.weight.data_ptr()


def test_checkpoint_errors_are_clear(tmp_path, folder):
    with pytest.raises(checkpoint.ModelLoadError, match="does not exist"):
        load_folder(tmp_path / "nope")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "src_vocab.json", "tgt_vocab.json"):
        (broken / name).write_bytes((folder / name).read_bytes())
    (broken / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:200])
    with pytest.raises(checkpoint.ModelLoadError, match="safetensors"):
        load_folder(broken)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["d_ff"] = 48  # shapes no longer match the weights
    (broken / "config.json").write_text(json.dumps(cfg))
    (broken / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(checkpoint.ModelLoadError, match="do not match"):
        load_folder(broken)
    cfg["n_heads"] = 3
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(checkpoint.ModelLoadError, match="divisible"):
        load_folder(broken)


# -- runner --------------------------------------------------------------------------


def test_runner_trace_batch_keeps_padding_visible(folder):
    lm = load_folder(folder)
    traces = lm.trace(["abc", "abcdefg"], ["xy", "xyzw"])
    assert len(traces) == 2
    t0, t1 = traces
    assert t0.src_tokens == ("a", "b", "c", "<eos>", "<pad>", "<pad>", "<pad>", "<pad>")
    assert t1.src_tokens[-1] == "<eos>" and len(t1.src_tokens) == 8
    assert t0.tgt_tokens == ("<bos>", "x", "y", "<pad>", "<pad>")
    assert t0.enc_self.shape == (2, 4, 8, 8)
    assert t0.cross.shape == (2, 4, 5, 8) and t0.dec_self.shape == (2, 4, 5, 5)
    assert not t0.enc_self_mask[:, 4:].any() and t0.enc_self_mask[:, :4].all()
    assert (t0.enc_self[..., 4:] == 0).all()
    assert t0.topk_probs.shape == (5, 5) and (np.diff(t0.topk_probs, axis=1) <= 0).all()
    assert t0.out_tokens[0] == lm.tgt_tok.itos[int(t0.topk_ids[0, 0])]
    assert t0.meta["teacher_forced"] is True and t0.meta["forward_ms"] > 0


def test_runner_generate_uses_greedy_output(folder):
    lm = load_folder(folder)
    (trace,) = lm.trace(["hello"])
    assert trace.meta["teacher_forced"] is False
    assert trace.tgt_tokens[0] == "<bos>"
    # teacher forcing on its own greedy output reproduces it: each fed-back token is the previous argmax
    assert list(trace.tgt_tokens[1:]) == list(trace.out_tokens[:-1])
    assert trace.output_text == lm.predict(["hello"])[0]


def test_runner_input_errors(folder):
    lm = load_folder(folder)
    with pytest.raises(InputError, match="empty"):
        lm.trace(["   "])
    with pytest.raises(InputError, match="'!'"):
        lm.trace(["hi!"])
    with pytest.raises(InputError, match="at most 23"):
        lm.trace(["a" * 40])
    (t,) = lm.trace(["a" * 40], truncate=True)
    assert len(t.src_tokens) == 24 and "truncated from 40 to 23" in t.meta["warnings"][0]
    with pytest.raises(InputError, match="one target per input"):
        lm.trace(["ab", "cd"], ["x"])
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA"):
            resolve_device("cuda")
    assert resolve_device("auto") in ("cpu", "cuda")


# -- trace files -----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_trace_save_load_round_trip(folder, tmp_path, suffix):
    lm = load_folder(folder)
    (trace,) = lm.trace(["abc"], ["xyz"])
    path = trace.save(tmp_path / f"t{suffix}")
    back = AttentionTrace.load(path)
    assert back.src_tokens == trace.src_tokens and back.tgt_tokens == trace.tgt_tokens
    assert back.out_tokens == trace.out_tokens and back.output_text == trace.output_text
    for kind in ("enc_self", "dec_self", "cross"):
        np.testing.assert_allclose(back.probs(kind), trace.probs(kind), atol=1e-7)
        np.testing.assert_array_equal(back.mask(kind), trace.mask(kind))
        assert back.mask(kind).dtype == bool
    assert back.meta == json.loads(json.dumps(trace.meta))


def test_trace_file_uses_documented_names_and_no_pickle(folder, tmp_path):
    lm = load_folder(folder)
    (trace,) = lm.trace(["abc"])
    path = trace.save(tmp_path / "t.npz")
    with zipfile.ZipFile(path) as z:
        names = {n.removesuffix(".npy") for n in z.namelist()}
    assert {"src_tokens", "tgt_tokens", "enc_self", "dec_self", "cross",
            "enc_self_mask", "dec_self_mask", "cross_mask"} <= names  # fmt: skip
    with np.load(path, allow_pickle=False) as data:  # loads without pickle
        assert data["enc_self"].shape[-2:] == (len(trace.src_tokens),) * 2
        assert data["cross_mask"].dtype == bool
    doc = json.loads((trace.save(tmp_path / "t.json")).read_text())
    assert np.array(doc["cross"]).shape == trace.cross.shape


def test_trace_is_immutable_and_axes_match_tensors(folder, tmp_path):
    lm = load_folder(folder)
    (trace,) = lm.trace(["abcd"], ["xy"])
    with pytest.raises(ValueError):
        trace.enc_self[0, 0, 0, 0] = 1.0
    with pytest.raises(AttributeError):
        trace.src_tokens = ("x",)
    for kind in trace.kinds:
        q, k = trace.axes(kind)
        assert trace.probs(kind).shape[-2:] == (len(q), len(k))
    with pytest.raises(KeyError):
        trace.probs("decoder")
    with pytest.raises(TraceFormatError):
        trace.save(tmp_path / "t.csv")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(TraceFormatError):
        AttentionTrace.load(tmp_path / "junk.npz")


def test_trace_budget_refuses_instead_of_running_out_of_memory(folder, monkeypatch):
    from attnscope.core.families import native as runner

    lm = load_folder(folder)
    monkeypatch.setattr(runner, "MAX_TRACE_MB", 0)
    with pytest.raises(InputError, match="MB of attention maps"):
        lm.trace(["abc"])
    monkeypatch.setattr(runner, "MAX_TRACE_MB", 2048)
    monkeypatch.setattr(runner, "MAX_BATCH", 3)
    with pytest.raises(InputError, match="limit is 3"):
        lm.trace(["abc"] * 4)
    assert len(lm.trace(["abc"] * 3, ["x"] * 3)) == 3
    assert runner.trace_bytes(6, 6, 8, 1, 512, 512) == 8 * (512 * 512 * 6 + 2 * 512 * 512 * 6) * 8


@pytest.mark.parametrize("ext", ["npz", "json"])
def test_a_trace_with_nan_weights_on_learned_keys_opens_again(tmp_path, ext):
    """A sequence with NaN in its data has NaN weights on its learned keys too (a null key): capture wrote the
    trace, and the reader refused its own file ("not probabilities"). NaN is kept there as in the map itself;
    values outside [0, 1] are still refused."""
    from torch import nn

    from attnscope.core.families.capture import capture_attention

    class NullKey(nn.Module):
        def __init__(self, d: int = 8, heads: int = 2):
            super().__init__()
            self.h = heads
            self.qkv = nn.Linear(d, 3 * d)
            self.null_k = nn.Parameter(torch.randn(1, heads, 1, d // heads))
            self.null_v = nn.Parameter(torch.randn(1, heads, 1, d // heads))

        def forward(self, x):
            b, n, d = x.shape
            q, k, v = (t.reshape(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
            k = torch.cat([self.null_k.expand(b, -1, -1, -1), k], 2)
            v = torch.cat([self.null_v.expand(b, -1, -1, -1), v], 2)
            return ((q @ k.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)

    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)
    x[1, 1, 2] = float("nan")
    model = NullKey().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    trace = cap.trace(1)
    learned = trace.learned("enc_self")[1]
    assert np.isnan(learned).any()
    back = AttentionTrace.load(trace.save(tmp_path / f"t.{ext}"))
    assert np.array_equal(back.learned("enc_self")[1], learned, equal_nan=True)
    bad = trace.replace(enc_self_learned=np.nan_to_num(learned, nan=2.0))
    with pytest.raises(TraceFormatError, match="not probabilities"):
        AttentionTrace.load(bad.save(tmp_path / f"bad.{ext}"))


def _nul_trace() -> AttentionTrace:
    """Tokens of a byte-level vocabulary: byte 0 is the token "\\x00", and a token may end in it."""
    p = np.random.default_rng(0).random((1, 2, 4, 4)).astype(np.float32)
    return AttentionTrace(
        model="bytes", config_name="", device="cpu", src_tokens=("a", "\x00", "b\x00", "\x00c"),
        enc_self=p / p.sum(-1, keepdims=True), out_tokens=("x\x00",),
    )  # fmt: skip


@pytest.mark.parametrize("ext", ["npz", "json"])
def test_tokens_that_end_in_nul_open_as_they_were_saved(tmp_path, ext):
    """A numpy string array drops the NULs that end a string: the token "\\x00" came back as "" and "b\\x00" as
    "b", with no word. Both formats now give back each token as it was."""
    trace = _nul_trace()
    back = AttentionTrace.load(trace.save(tmp_path / f"t.{ext}"))
    assert back.src_tokens == trace.src_tokens and back.out_tokens == trace.out_tokens
    data = trace.to_npz_bytes() if ext == "npz" else trace.to_json().encode()
    assert AttentionTrace.from_bytes(data, f"t.{ext}").src_tokens == trace.src_tokens
    plain = trace.replace(src_tokens=("a", "b", "c", "d"), out_tokens=("x",))
    with zipfile.ZipFile(plain.save(tmp_path / "plain.npz")) as zf:  # (written only where a token needs it)
        assert "exact_tokens" not in json.loads(str(np.load(zf.open("header.npy"))))


@pytest.mark.parametrize(
    ("exact", "says"),
    [
        ({"src_tokens": ["a", "\x00", "b\x00"]}, "not a list of 4 strings"),
        ({"src_tokens": ["a", "\x00", "b\x00", 7]}, "not a list of 4 strings"),
        ({"src_tokens": ["z", "\x00", "b\x00", "\x00c"]}, "are not the file's src_tokens"),
        ({"src_tokens": ["a", "\x00", "b\x00", "c" * 5000]}, "longer than"),
        ({"tokens": ["a"]}, "not an object of token lists"),
        (["a"], "not an object of token lists"),
    ],
)
def test_a_header_whose_exact_tokens_disagree_with_the_file_is_one_sentence(tmp_path, exact, says):
    members = {k: v for k, v in _nul_trace().to_numpy().items()}
    header = {"model": "bytes", "config_name": "", "device": "cpu", "output_text": "", "meta": {}, "format": 1,
              "exact_tokens": exact}  # fmt: skip
    path = tmp_path / "bad.npz"
    np.savez_compressed(path, header=np.array(json.dumps(header)), **members)
    with pytest.raises(TraceFormatError, match=says) as err:
        AttentionTrace.load(path)
    assert str(err.value).startswith("bad.npz") and "\n" not in str(err.value)
    doc = json.loads(_nul_trace().to_json())
    doc["exact_tokens"] = {
        "src_tokens": list(_nul_trace().src_tokens)
    }  # (a .json's lists keep them: not a field)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match="'exact_tokens'"):
        AttentionTrace.load(tmp_path / "bad.json")
