"""Styles the probes of this round found, each with its ground truth kept inside the model.

- d2l's ``masked_softmax`` with 2-D ``valid_lens`` (one length per query) used as self-attention: rows that each see
  a prefix of the keys, some past their own position, are no decoder's mask, yet a mask whose rows reach a little
  further each was read as causal and recorded ``dec_self``, with no word. A decoder's rows that see later keys see
  them as a block of their own (an image block, a prefix): the block's last row sees no further.
- Scores written as a broadcast product, ``(q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1)``, are a product's scores,
  placed by lineage: past a cross-attention the decoder's stream holds the encoder's output too, and its next
  self-attention was recorded as cross-attention.
- Capturing one module leaves torch.nn's own attention outside it as it runs without capture (its fast path).
- A call that says it is causal (``is_causal=True``) over one token is a decoder's: no mask can tell there.
- A video's frames folded into the batch before a 2-D patch conv are rows of their clip, not sequences of their own.
- A cross-attention's keys from another input (an image's features) are never drawn under the tokens of the text's
  self-attention, also where they are as many.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from usermodels.d2l import DotProductAttention, transpose_qkv

from attnscope.core.families.capture import capture_attention


class D2lMultiHead(nn.Module):
    """d2l.ai's MultiHeadAttention: heads folded into the batch head-major, ``valid_lens`` repeated per head."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.num_heads, self.attention = h, DotProductAttention(0.0)  # (d2l's, its masked_softmax)
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x, valid_lens):
        q, k, v = (transpose_qkv(f(x), self.num_heads) for f in (self.W_q, self.W_k, self.W_v))
        valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        out = self.attention(q, k, v, valid_lens)
        w = self.attention.attention_weights
        self.truth = w.reshape(-1, self.num_heads, *w.shape[1:]).detach().clone()  # (B, H, q, k)
        out = out.reshape(-1, self.num_heads, out.shape[1], out.shape[2]).permute(0, 2, 1, 3)
        return self.W_o(out.reshape(out.shape[0], out.shape[1], -1))


LENGTHS = {
    # each row a prefix of the keys, some rows past their own position, each reaching a little further
    "per query": [[2, 3, 6, 6, 5, 5], [3, 4, 3, 2, 6, 3], [2, 3, 4, 5, 6, 6]],
    # a decoder's: each row its own position and those before (padding after the third token in one)
    "causal": [[1, 2, 3, 4, 5, 6], [1, 2, 3, 3, 3, 3], [1, 2, 3, 4, 5, 6]],
}


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("lengths", ["per query", "causal"])
def test_d2l_lengths_per_query_are_an_encoders_mask_unless_causal(lengths, batch, heads):
    torch.manual_seed(batch * 10 + heads)
    model = D2lMultiHead(8 * heads, heads).eval()
    x = torch.randn(batch, 6, 8 * heads)
    valid = torch.tensor(LENGTHS[lengths][:batch])
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, valid)
    assert len(cap.records) == 1
    rec = cap.records[0]
    assert rec.exact and rec.flag is None
    torch.testing.assert_close(rec.probs, model.truth, rtol=0, atol=0)
    keep = torch.arange(6)[None, None, :] < valid[:, :, None]
    assert rec.mask is not None and torch.equal(rec.mask, keep)
    assert rec.kind == ("dec_self" if lengths == "causal" else "enc_self"), (rec.kind, cap.notes)


def broadcast_attention(q, k, v, mask):
    """The Annotated Transformer's attention with its scores written as a broadcast product summed over the
    features, ``(q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1)``, in place of ``q @ k.T``."""
    scores = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) / math.sqrt(q.size(-1))  # (B, H, q, k)
    p = scores.masked_fill(mask == 0, -1e9).softmax(-1)
    return p @ v, p


class BroadcastMHA(nn.Module):
    def __init__(self, d: int, h: int, form: str = "unsqueeze"):
        super().__init__()
        self.h, self.form, self.proj = h, form, nn.ModuleList(nn.Linear(d, d) for _ in range(4))

    def forward(self, x, memory, mask):
        b = x.size(0)
        q, k, v = (lin(t).view(b, -1, self.h, t.size(-1) // self.h)
                   for lin, t in zip(self.proj, (x, memory, memory), strict=False))  # fmt: skip
        if self.form == "blhd":  # (B, L, H, d) kept: scores (B, q, k, H), the softmax over dim 2
            s = (q[:, :, None] * k[:, None]).sum(-1) / math.sqrt(q.size(-1))
            p = s.masked_fill(mask.unsqueeze(-1) == 0, -1e9).softmax(2)
            self.truth = p.permute(0, 3, 1, 2).detach().clone()
            y = torch.einsum("bqkh,bkhd->bqhd", p, v)
            return self.proj[3](y.reshape(b, -1, x.size(-1)))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.form == "scale inside":  # the scale a factor of the product, before the sum
            s = (q.unsqueeze(-2) * k.unsqueeze(-3) * q.size(-1) ** -0.5).sum(-1)
            p = s.masked_fill(mask.unsqueeze(1) == 0, -1e9).softmax(-1)
            y = p @ v
        else:
            y, p = broadcast_attention(q, k, v, mask.unsqueeze(1))
        self.truth = p.detach().clone()
        return self.proj[3](y.transpose(1, 2).reshape(b, -1, x.size(-1)))


class BroadcastSeq2Seq(nn.Module):
    """An encoder and two decoder layers (self-attention, then cross-attention over the encoder's output)."""

    def __init__(self, d: int, h: int, form: str = "unsqueeze"):
        super().__init__()
        self.emb, self.enc = nn.Embedding(20, d), BroadcastMHA(d, h, form)
        self.dec_self = nn.ModuleList(BroadcastMHA(d, h, form) for _ in range(2))
        self.dec_cross = nn.ModuleList(BroadcastMHA(d, h, form) for _ in range(2))

    def forward(self, src, tgt):
        src_mask = (src != 0).unsqueeze(-2)
        n = tgt.size(1)
        tgt_mask = (tgt != 0).unsqueeze(-2) & torch.ones(n, n, dtype=torch.bool).tril()
        x = self.emb(src)
        memory = x + self.enc(x, x, src_mask)
        y = self.emb(tgt)
        for sa, ca in zip(self.dec_self, self.dec_cross, strict=True):
            y = y + sa(y, y, tgt_mask)
            y = y + ca(y, memory, src_mask)
        return y


@pytest.mark.parametrize("form", ["unsqueeze", "scale inside", "blhd"])
@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 2, 4])
def test_scores_as_a_broadcast_product_are_placed_as_a_products(batch, heads, form):
    """Queries times keys broadcast against each other and summed over the features are a product's scores: the
    second decoder layer's self-attention, whose stream has read the encoder's output, stays dec_self (it was
    recorded as cross-attention, with no word, and the trace left a decoder layer out)."""
    torch.manual_seed(batch + heads)
    model = BroadcastSeq2Seq(8 * heads, heads, form).eval()
    src = torch.randint(1, 20, (batch, 7))
    tgt = torch.randint(1, 20, (batch, 6))
    src[-1, 4:] = 0
    tgt[-1, 3:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(src, tgt)
    want = {"enc": "enc_self", "dec_self.0": "dec_self", "dec_cross.0": "cross", "dec_self.1": "dec_self",
            "dec_cross.1": "cross"}  # fmt: skip
    assert [r.name for r in cap.records] == list(want)
    for rec in cap.records:
        assert rec.kind == want[rec.name] and rec.exact, (rec.name, rec.kind, rec.flag)
        torch.testing.assert_close(rec.probs, model.get_submodule(rec.name).truth, rtol=0, atol=0)
    trace = cap.trace(batch - 1)
    assert trace.dec_self is not None and trace.dec_self.shape[0] == 2 and trace.cross.shape[0] == 2


class TwoAttentions(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(48, 2, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(48, 2, batch_first=True)

    def forward(self, x, y, pad):
        h = x + self.self_attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        return y + self.cross_attn(y, h, h, key_padding_mask=pad, need_weights=False)[0]


def test_capturing_one_module_leaves_torch_attention_outside_it_as_it_runs():
    """torch.nn's own attention outside the module captured runs without capture's mode, as it runs without
    capture: under a mode torch leaves its fused fast path, and the model's output moved in its last bits."""
    torch.manual_seed(0)
    model = TwoAttentions().eval()
    x, y = torch.randn(3, 6, 48), torch.randn(3, 4, 48)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 5 + [True]])
    with torch.no_grad():
        plain = model(x, y, pad)
        with capture_attention(model.cross_attn) as cap:
            out = model(x, y, pad)
    assert torch.equal(out, plain)
    assert len(cap.records) == 1 and cap.records[0].kind == "cross"


def test_capturing_an_encoder_leaves_the_decoders_attention_as_it_runs():
    torch.manual_seed(0)
    model = nn.Transformer(32, 4, 2, 2, 64, dropout=0.0, batch_first=True).eval()
    src, tgt = torch.randn(2, 7, 32), torch.randn(2, 5, 32)
    with torch.no_grad():
        plain = model(src, tgt)
        with capture_attention(model.encoder) as cap:
            out = model(src, tgt)
    assert torch.equal(out, plain)
    assert len(cap.records) == 2 and all(r.kind == "enc_self" for r in cap.records)


class OneTokenCausal(nn.Module):
    """A language model's attention that says it is causal: SDPA's or MultiheadAttention's is_causal=True."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.emb = nn.Embedding(20, 16)
        self.qkv = nn.Linear(16, 48)
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=True), 1,
                                         enable_nested_tensor=False)  # fmt: skip

    def forward(self, ids):
        x = self.emb(ids)
        n = ids.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(n)
        if self.how == "sdpa":
            q, k, v = (t.view(*ids.shape, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, -1))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.how == "mha":
            return self.mha(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
        return self.enc(x, mask=causal, is_causal=True)


@pytest.mark.parametrize("how", ["sdpa", "mha", "encoder"])
@pytest.mark.parametrize("length", [1, 3])
def test_a_call_that_says_it_is_causal_is_a_decoders_over_one_token_too(how, length):
    """Over one token no mask tells an encoder from a decoder, but a call with is_causal=True says which it is:
    dec_self, and no note that capture could not tell (it was enc_self, with that note)."""
    torch.manual_seed(0)
    model = OneTokenCausal(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (2, length)))
    assert len(cap.records) == 1 and cap.records[0].kind == "dec_self" and cap.records[0].exact
    assert not [n for n in cap.notes if "cannot tell" in n], cap.notes


def test_another_models_torch_attention_in_the_block_runs_as_without_capture_and_is_said():
    """torch.nn's attention of another model called in the block (neither part of the model captured nor holding
    it) runs as it runs without capture too, and its attention is still said as not recorded."""

    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    torch.manual_seed(0)
    captured, other = nn.MultiheadAttention(16, 2, batch_first=True).eval(), Other().eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        plain = other(x)
        with capture_attention(captured) as cap:
            captured(x, x, x, need_weights=False)
            out = other(x)
    assert torch.equal(out, plain)
    assert len(cap.records) == 1
    assert [s for s in cap.skipped if "another model" in s.reason], cap.skipped


class FramesFolded(nn.Module):
    """A video transformer's space attention (TimeSformer's 'space_only'): the clip's frames folded into the batch
    before the 2-D patch conv, each frame's patches attending to each other."""

    def __init__(self, heads: int, fold: str):
        super().__init__()
        self.h, self.fold = heads, fold
        self.proj = nn.Conv2d(3, 8 * heads, 4, 4)
        self.qkv = nn.Linear(8 * heads, 24 * heads)

    def forward(self, video):  # (B, C, T, H, W)
        b, c, t, hh, ww = video.shape
        if self.fold == "clip-major":  # '(b t)', as einops' rearrange 'b c t h w -> (b t) c h w' makes it
            frames = video.permute(0, 2, 1, 3, 4).reshape(b * t, c, hh, ww)
        else:  # '(t b)'
            frames = video.permute(2, 0, 1, 3, 4).reshape(t * b, c, hh, ww)
        x = self.proj(frames).flatten(2).transpose(1, 2)  # (rows, patches, d)
        n, p, d = x.shape
        q, k, v = self.qkv(x).reshape(n, p, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        w = (q @ k.transpose(-2, -1) * (d // self.h) ** -0.5).softmax(-1)
        self.truth = w.detach().clone()
        return (w @ v).transpose(1, 2).reshape(n, p, d)


@pytest.mark.parametrize("fold", ["clip-major", "frame-major"])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_frames_folded_into_the_batch_before_the_patch_conv_are_rows_of_their_clip(batch, fold):
    """Each record row is one frame of one clip: ``rows_of`` says which clip (it said each frame was a sequence of
    its own), and a trace of clip b says which row it draws, never a frame of another clip as clip b's without a
    word."""
    torch.manual_seed(batch)
    model = FramesFolded(2, fold).eval()
    frames = 3
    video = torch.randn(batch, 3, frames, 8, 8)
    with torch.no_grad(), capture_attention(model) as cap:
        model(video)
    rec = cap.records[0]
    assert rec.exact
    torch.testing.assert_close(rec.probs, model.truth, rtol=0, atol=0)
    found = cap.rows_of(rec)
    assert found is not None
    rows, clips = found
    row = torch.arange(batch * frames)
    want = row // frames if fold == "clip-major" else row % batch
    assert clips == batch and torch.equal(rows.long(), want), (rows, clips)
    for b in range(batch):
        trace = cap.trace(b)
        notes = trace.meta.get("capture_notes") or []
        drawn = torch.from_numpy(np.array(trace.enc_self))[0]
        which = [r for r in range(batch * frames) if torch.equal(drawn, model.truth[r])]
        assert which, "the trace draws no row of the maps"
        if int(want[which[0]]) != b:  # (a row of another clip: said)
            assert any(f"reads positions of sequence {int(want[which[0]])}" in n for n in notes), notes


class TextThenImage(nn.Module):
    """One attention module: the text over itself, then the text asking an image's features."""

    def __init__(self):
        super().__init__()
        self.emb, self.img = nn.Embedding(50, 16), nn.Conv1d(3, 16, 3, padding=1)
        self.q, self.k, self.v = (nn.Linear(16, 16) for _ in range(3))

    def attend(self, x, memory):
        b, n, _ = x.shape
        q, k, v = (t.view(b, -1, 2, 8).transpose(1, 2) for t in (self.q(x), self.k(memory), self.v(memory)))
        w = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(-1)
        return (w @ v).transpose(1, 2).reshape(b, n, 16)

    def forward(self, ids, pixels):
        x, memory = self.emb(ids), self.img(pixels).transpose(1, 2)
        x = x + self.attend(x, x)
        return x + self.attend(x, memory)


@pytest.mark.parametrize("features", [6, 9])
def test_a_cross_attentions_keys_from_another_input_are_not_drawn_under_the_texts_tokens(features):
    """The text's self-attention is drawn over its tokens; the cross-attention's keys are the image's features,
    other positions: left out and said, also where they are as many as the tokens (they were drawn under them)."""
    torch.manual_seed(0)
    model = TextThenImage().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 50, (2, 6)), torch.randn(2, 3, features))
    assert [r.kind for r in cap.records] == ["enc_self", "cross"]
    trace = cap.trace(1, src_tokens=[f"w{i}" for i in range(6)])
    assert trace.kinds == ("enc_self",)
    assert any(n.startswith("cross (") and "left out of the trace" in n for n in trace.meta["capture_notes"])


@pytest.mark.parametrize("how", ["beams", "return_sequences"])
def test_sequences_repeated_by_generate_are_said_with_the_rows_they_are_copies_of(how):
    """Hugging Face's generate repeats each sequence for its beams (or num_return_sequences) before the model runs:
    the records' row b is copy b % k of sequence b // k, and a trace of row 1 is a copy of sequence 0. Said (it was
    drawn as sequence 1's with no word); the maps stay exact."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    ids = torch.tensor([[5, 9, 13, 17, 21, 25, 29], [7, 7, 40, 44, 48, 52, 0]])
    keep = torch.tensor([[1] * 7, [1] * 6 + [0]])
    kw = {"num_beams": 2} if how == "beams" else {"num_return_sequences": 2, "do_sample": True, "top_k": 5}
    with torch.no_grad():
        own = model(input_ids=ids, attention_mask=keep, output_attentions=True).attentions
        with capture_attention(model) as cap:
            model.generate(input_ids=ids, attention_mask=keep, max_new_tokens=2, pad_token_id=0, eos_token_id=99,
                           **({"do_sample": False} | kw))  # fmt: skip
    first = [r for r in cap.records if r.probs.shape[-2] == 7]
    assert len(first) == 2 and all(r.exact and r.probs.shape[0] == 4 for r in first)
    for layer, r in enumerate(first):  # row b is copy b % 2 of sequence b // 2 (its real rows)
        for row in range(4):
            real = keep[row // 2].bool()
            got, want = r.probs[row][:, real][:, :, real], own[layer][row // 2][:, real][:, :, real]
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    said = [n for n in cap.notes if "repeated 2 times in a row" in n]
    assert len(said) == 1 and "row b holds sequence b // 2 (its copy or beam b % 2)" in said[0]
    assert said[0] in cap.trace(1).meta["capture_notes"]


def test_a_batch_of_its_own_says_nothing_of_repeats():
    """Ids repeated but not the rows the maps have (a mask's repeat, the model run on the ids as given): no note."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    ids = torch.randint(1, 100, (2, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        ids.repeat_interleave(3, dim=0)  # (made, not given to the model)
        model(input_ids=ids)
    assert not [n for n in cap.notes if "repeated" in n]


def test_a_classifier_pooled_by_a_learned_seed_query_loads_and_draws_its_encoder():
    """The seed query of attention pooling (nn.MultiheadAttention from one learned query over the tokens) only asks:
    it is no position of the sentence. The adapter took it for one joined to the tokens (14 x 14 maps wanted for 13
    tokens), dropped every map, and refused the model with an untrue reason."""
    from pathlib import Path

    from attnscope.core.families.adapter import load_adapter

    lm = load_adapter(Path(__file__).parent / "adapters" / "seed_pooled_classifier.py")
    texts = ["great movie", "i hated it"]
    model = lm.model
    model.computed.clear()
    traces = lm.trace(texts)
    own = dict(model.computed)["enc_self"]  # (B, H, S, S) of the padded batch
    longest = max(len(t) for t in texts) + 2  # ([CLS] and [SEP]; a trace keeps the batch's padded length)
    for b, tr in enumerate(traces):
        assert tr.enc_self is not None and tr.enc_self.shape[-2:] == (longest, longest)
        assert int(np.asarray(tr.src_real).sum()) == len(texts[b]) + 2
        np.testing.assert_allclose(tr.enc_self[0], own[b].numpy(), rtol=0, atol=1e-6)
        assert any(n.startswith("pool ") and "left out of the trace" in n for n in tr.meta["capture_notes"])


class CachedStep(nn.Module):
    """Meta's llama attention decoding a token at a time: keys and values written into a cache by start_pos."""

    def __init__(self, d: int = 32, heads: int = 2, batch: int = 4, length: int = 32):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.cache_k = torch.zeros(batch, length, heads, self.hd)
        self.cache_v = torch.zeros(batch, length, heads, self.hd)
        self.kept: list[torch.Tensor] = []

    def forward(self, x, start_pos: int):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.h, self.hd) for f in (self.wq, self.wk, self.wv))
        self.cache_k[:b, start_pos : start_pos + t] = k
        self.cache_v[:b, start_pos : start_pos + t] = v
        keys = self.cache_k[:b, : start_pos + t].transpose(1, 2)
        values = self.cache_v[:b, : start_pos + t].transpose(1, 2)
        p = F.softmax(q.transpose(1, 2) @ keys.transpose(2, 3) / math.sqrt(self.hd), dim=-1)
        self.kept.append(p.detach().clone())
        return self.wo((p @ values).transpose(1, 2).reshape(b, t, -1))


class CachedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 32)
        self.layers = nn.ModuleList(CachedStep() for _ in range(2))

    def forward(self, tokens, start_pos: int):
        h = self.emb(tokens)
        for layer in self.layers:
            h = h + layer(h, start_pos)
        return h


def test_a_decoder_run_a_token_at_a_time_is_drawn_over_the_tokens_given_at_its_last_step():
    """Given the sequence's tokens, the trace draws the step whose keys are those tokens (the last, one query over
    all of them) at the row that asks; it raised that nothing could be drawn over them (the first step's 1 x 1 map
    was kept), in a message of every call's clause."""
    torch.manual_seed(0)
    model = CachedLM().eval()
    ids = torch.randint(1, 20, (2, 12))
    with torch.no_grad(), capture_attention(model) as cap:
        for t in range(12):
            model(ids[:, t : t + 1], t)
    tokens = [f"t{i}" for i in ids[1].tolist()]
    trace = cap.trace(1, src_tokens=tokens)
    drawn = torch.from_numpy(np.array(trace.dec_self))  # (layer, head, 12, 12)
    assert tuple(drawn.shape) == (2, 2, 12, 12)
    for layer in range(2):
        torch.testing.assert_close(
            drawn[layer, :, -1], model.layers[layer].kept[-1][1, :, 0], rtol=0, atol=1e-6
        )
    assert bool((drawn[:, :, :-1] == 0).all())  # (the rows that did not ask at that step: empty, said)
    with pytest.raises(ValueError) as said:
        cap.trace(1, src_tokens=[*tokens, "t?"])  # (no step's keys are these 13 tokens)
    assert len(str(said.value)) < 1200 and "more (cap.records has every map)" in str(said.value)


class EfficientAttention(nn.Module):
    """Efficient Attention (Shen et al.): the keys' softmax over positions, the queries' over channels, the context
    ``softmax_k(K) V^T`` (channels by channels) read by the queries."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.emb = nn.Embedding(50, c)
        self.k, self.q, self.v = (nn.Conv1d(c, c, 1) for _ in range(3))

    def forward(self, ids):
        x = self.emb(ids).transpose(1, 2)  # (B, C, n)
        key = F.softmax(self.k(x), dim=2)
        query = F.softmax(self.q(x), dim=1)
        context = key @ self.v(x).transpose(1, 2)  # (B, C, C)
        return context.transpose(1, 2) @ query


def test_efficient_attentions_queries_are_said_to_read_a_context_not_a_tensor_from_outside():
    """The queries' softmax over channels weighs the context the keys' softmax made inside the call: the warning
    says so (it said the tensor came from outside the call, or past an op lineage does not follow)."""
    torch.manual_seed(0)
    model = EfficientAttention()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 50, (3, 12)))
    assert not cap.records
    assert not [n for n in cap.notes if "capture does not follow" in n], cap.notes
    assert [n for n in cap.notes if "the product of another softmax's weights with values" in n], cap.notes


class PooledAfterEncoder(nn.Module):
    """torch.nn's own encoder, then a hand-written attention pooling: the pooling captured alone."""

    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.qk = nn.Linear(16, 32)

        def forward(self, x):
            q, k = self.qk(x).view(*x.shape[:2], 2, 2, 8).permute(2, 0, 3, 1, 4)
            return ((q @ k.transpose(-1, -2)) * 8**-0.5).softmax(-1).mean(1) @ x

    def __init__(self):
        super().__init__()
        self.tenc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2)
        self.custom = PooledAfterEncoder.Pool()

    def forward(self, x, pad):
        return self.custom(self.tenc(x, src_key_padding_mask=pad))


@pytest.mark.parametrize("training", [False, True])
def test_torch_attention_beside_a_module_captured_that_holds_none_is_said_to_leave_its_fast_path(training):
    """Capturing a module that holds none of torch's own layers registers no hooks around every module call, so torch's
    encoder beside it in the model runs under the mode, off its fast path and nested tensors: its output moves (at
    padded positions most). Said in eval mode, where the fast path would run; nothing said while training."""
    torch.manual_seed(0)
    model = PooledAfterEncoder().train(training)
    if training:
        for layer in model.tenc.layers:  # (no dropout: the same output whatever the draws)
            layer.dropout.p = layer.dropout1.p = layer.dropout2.p = layer.self_attn.dropout = 0.0
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad(), capture_attention(model.custom) as cap:
        model(x, pad)
    said = [n for n in cap.notes if "ran under capture's mode: torch takes no fused fast path there" in n]
    assert len(said) == (0 if training else 1), cap.notes
    assert len(cap.records) == 1


class DenseGAT(nn.Module):
    """PyG's DenseGATConv: per-node scores summed into pairs, a softmax over the neighbours (dim 2 of (B, N, N, H)),
    and the weights' axes moved before the product with the values (``alpha.movedim(3, 1) @ x.movedim(2, 1)``)."""

    def __init__(self, fin: int, heads: int = 2, c: int = 8):
        super().__init__()
        self.h, self.c = heads, c
        self.lin = nn.Linear(fin, heads * c, bias=False)
        self.a_src, self.a_dst = (
            nn.Parameter(torch.randn(1, 1, heads, c)),
            nn.Parameter(torch.randn(1, 1, heads, c)),
        )

    def forward(self, x, adj):
        b, n, _ = x.shape
        x = self.lin(x).view(b, n, self.h, self.c)
        alpha = (x * self.a_src).sum(-1).unsqueeze(1) + (x * self.a_dst).sum(-1).unsqueeze(2)  # (B, N, N, H)
        alpha = F.leaky_relu(alpha, 0.2).masked_fill(adj.unsqueeze(-1) == 0, float("-inf")).softmax(dim=2)
        self.truth = alpha.permute(0, 3, 1, 2).detach().clone()
        out = torch.matmul(alpha.movedim(3, 1), x.movedim(2, 1)).movedim(1, 2)
        return out.reshape(b, n, self.h * self.c)


class TwoDenseGAT(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = DenseGAT(4), DenseGAT(16)

    def forward(self, x, adj):
        return self.c2(F.elu(self.c1(x, adj)), adj)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_dense_gat_layer_after_another_is_the_graphs_self_attention(batch):
    """The second layer's keys are the nodes the first layer's weights kept in place (self-attention over the graph):
    it was recorded as cross-attention over positions called pooled, with no word."""
    torch.manual_seed(batch)
    model = TwoDenseGAT().eval()
    x = torch.randn(batch, 5, 4)
    adj = torch.maximum((torch.rand(batch, 5, 5) < 0.5).float(), torch.eye(5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, adj)
    assert [(r.name, r.kind) for r in cap.records] == [("c1", "enc_self"), ("c2", "enc_self")]
    for rec in cap.records:
        assert rec.exact and rec.key_labels is None
        torch.testing.assert_close(rec.probs, model.get_submodule(rec.name).truth, rtol=0, atol=0)
