"""Cases found by probing capture with memory and retrieval transformers (MemN2N, Fusion-in-Decoder, a
Block-Recurrent state carried in) and with models users transformed (autocast, TorchScript'ed or hooked
layers of a nested-tensor encoder, a capture nested in another)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention


class MemN2N(nn.Module):
    """One hop of an end-to-end memory network: the question and each sentence pooled by a sum of their
    word embeddings; the question's softmax over the sentences weighs their output vectors."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.A, self.B, self.C = (nn.Embedding(30, d) for _ in range(3))
        self.maps: list[torch.Tensor] = []

    def forward(self, story, q):
        b, s, w = story.shape
        u = self.B(q).sum(1)
        m = self.A(story.view(b, -1)).view(b, s, w, -1).sum(2)
        c = self.C(story.view(b, -1)).view(b, s, w, -1).sum(2)
        p = F.softmax(torch.bmm(m, u.unsqueeze(2)).squeeze(2), dim=-1)
        self.maps.append(p.detach().clone())
        return u + torch.bmm(p.unsqueeze(1), c).squeeze(1)


def test_a_question_pooled_beside_the_sentences_it_reads_has_a_label_of_its_own():
    """The question and sentence 0 were both ``<pooled 0>``: one label for two positions, so the trace drew
    sentence 0 as the question's own token. The question's label now follows the sentences'."""
    torch.manual_seed(0)
    model = MemN2N().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 30, (2, 5, 3)), torch.randint(1, 30, (2, 3)))
    (r,) = cap.records
    assert r.key_labels == tuple(f"<pooled {i}>" for i in range(5))
    assert r.query_labels == ("<pooled 5>",)
    torch.testing.assert_close(r.probs[:, 0, 0], model.maps[0], rtol=0, atol=1e-6)
    tr = cap.trace(0)
    labels, weights = tr.learned("cross")
    assert list(labels) == [f"<pooled {i}>" for i in range(5)]  # every sentence a key column
    torch.testing.assert_close(torch.as_tensor(weights[0, 0, 0]), model.maps[0][0], rtol=0, atol=1e-6)


class _Attn(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.h, self.dh = h, d // h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, xq, xkv, allowed=None):
        b, lq, _ = xq.shape
        lk = xkv.shape[1]
        q = self.q(xq).view(b, lq, self.h, self.dh).transpose(1, 2)
        k = self.k(xkv).view(b, lk, self.h, self.dh).transpose(1, 2)
        v = self.v(xkv).view(b, lk, self.h, self.dh).transpose(1, 2)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
        if allowed is not None:
            s = s.masked_fill(~allowed[:, None], float("-inf"))
        a = s.softmax(-1)
        return self.o((a @ v).transpose(1, 2).reshape(b, lq, -1))


class FusionInDecoder(nn.Module):
    """Fusion-in-Decoder: each question's passages encoded apart (batch B*P), joined into one memory that the
    decoder's cross-attention reads."""

    def __init__(self, d: int = 16, h: int = 2):
        super().__init__()
        self.emb = nn.Embedding(30, d)
        self.enc, self.dself, self.dcross = _Attn(d, h), _Attn(d, h), _Attn(d, h)

    def forward(self, passages, tgt):
        b, p, lp = passages.shape
        x = self.emb(passages.view(b * p, lp))
        mem = (x + self.enc(x, x)).view(b, p * lp, -1)
        t = tgt.shape[1]
        y = self.emb(tgt)
        y = y + self.dself(y, y, torch.ones(t, t, dtype=torch.bool).tril()[None].expand(b, -1, -1))
        return y + self.dcross(y, mem)


@pytest.mark.parametrize("index", [0, 1])
def test_passages_encoded_apart_are_not_drawn_as_a_question_s_encoder(index):
    """The encoder's rows are passages (4), the decoder's questions (2): row 1 of the encoder is question 0's
    second passage, which the trace of question 1 drew beside its decoder. It is left out and said."""
    torch.manual_seed(0)
    model = FusionInDecoder().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 30, (2, 2, 3)), torch.randint(1, 30, (2, 3)))
    tr = cap.trace(index)
    assert tr.enc_self is None and tr.dec_self is not None
    notes = tr.meta["capture_notes"]
    assert any(
        n.startswith("enc_self (enc) left out of the trace: its maps are over 4 sequences") for n in notes
    )


class BlockRecurrent(nn.Module):
    """A Block-Recurrent Transformer's step: the tokens read [state; tokens], and the state reads the same."""

    def __init__(self, d: int = 16, h: int = 2, ns: int = 2):
        super().__init__()
        self.ns = ns
        self.emb = nn.Embedding(30, d)
        self.state0 = nn.Parameter(torch.randn(ns, d))
        self.vert, self.horiz = _Attn(d, h), _Attn(d, h)

    def forward(self, ids, state=None):
        b, w = ids.shape
        state = self.state0[None].expand(b, -1, -1) if state is None else state
        x = self.emb(ids)
        kv = torch.cat([state, x], 1)
        sees = torch.cat(
            [torch.ones(w, self.ns, dtype=torch.bool), torch.ones(w, w, dtype=torch.bool).tril()], 1
        )
        y = x + self.vert(x, kv, sees[None].expand(b, -1, -1))
        return y, state + self.horiz(state, kv)


def test_a_state_carried_in_reading_the_tokens_is_said_to_be_undecided():
    """The carried state (rows handed in) asks over itself and the call's tokens: capture cannot tell which is
    the sequence, and says so (it labelled the tokens ``<ctx i>`` silently)."""
    torch.manual_seed(0)
    model = BlockRecurrent().eval()
    with torch.no_grad():
        _, state = model(torch.randint(1, 30, (2, 4)))
        with capture_attention(model) as cap:
            model(torch.randint(1, 30, (2, 4)), state.detach())
    horiz = next(r for r in cap.records if r.name == "horiz")
    assert horiz.key_labels is not None and horiz.key_labels[2:] == tuple(f"<ctx {i}>" for i in range(4))
    assert [n for n in cap.notes if n.startswith("horiz") and "may be the other way round" in n]


def test_an_encoder_run_under_autocast_makes_its_trace():
    """The values of what attention moves were projected in float32 from bfloat16 values: the trace raised."""
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), capture_attention(enc) as cap:
        enc(torch.randn(1, 5, 32))
    tr = cap.trace(0, src_tokens=[f"t{i}" for i in range(5)])
    assert tr.enc_self.shape == (2, 2, 5, 5)
    assert tr.value_norms("enc_self") is not None


def _nested_encoder() -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2).eval()  # (enable_nested_tensor: its default)


@pytest.mark.parametrize("change", ["script", "hook"])
def test_a_nested_tensor_encoder_capture_cannot_run_as_torch_does_is_said(change):
    """A layer TorchScript'ed, or a hook on one of the encoder's modules: capture follows the encoder under its
    mode, where torch makes no nested tensors, so the output at padding positions is computed (0 without
    capture). Said in a note (it was silent)."""
    enc = _nested_encoder()
    if change == "script":
        enc.layers[0] = torch.jit.script(enc.layers[0])
    else:
        enc.layers[1].self_attn.register_forward_hook(lambda m, a, out: (out[0] * 1.0, out[1]))
    x, pad = torch.randn(2, 5, 16), torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=pad)
        with capture_attention(enc) as cap:
            got = enc(x, src_key_padding_mask=pad)
    assert float(want[1, 3:].abs().max()) == 0.0 and float(got[1, 3:].abs().max()) > 0.0  # what the note says
    assert [n for n in cap.skipped if "nested tensors" in n.reason and "padding positions" in n.reason]


def test_a_capture_with_another_inside_it_says_torch_nn_runs_its_python_path():
    """The inner capture's mode is above the outer's: torch.nn's own attention cannot run as torch runs it for
    the outer one (its output differs in the last bits, padding rows computed). The outer capture says so."""
    enc = _nested_encoder()
    x, pad = torch.randn(2, 5, 16), torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad(), capture_attention(enc) as outer, capture_attention(enc):
        enc(x, src_key_padding_mask=pad)
    assert [n for n in outer.skipped if "another capture is active inside this one" in n.reason]


class _Cross(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, m):
        w = (self.q(x) @ self.k(m).transpose(1, 2) / 4).softmax(-1)
        return w @ self.v(m)


class BeamSeq2Seq(nn.Module):
    """An encoder's memory repeated over two beams (``repeat_interleave``) for the decoder's cross-attention."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.e = nn.Embedding(30, d)
        self.enc, self.cross = _Cross(d), _Cross(d)
        self.maps: list[torch.Tensor] = []

    def forward(self, src, tgt):
        x = self.e(src)
        x = x + self.enc(x, x)
        return self.cross(self.e(tgt).repeat_interleave(2, 0), x.repeat_interleave(2, 0))


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_a_memory_repeated_over_beams_draws_each_beam_s_own_encoder_row(index):
    """Cross-attention row i reads encoder row i // 2: the trace of beam row i draws that encoder row (it drew
    encoder row i beside beam row i: another sequence's for i = 1, and none for i >= 2)."""
    torch.manual_seed(0)
    model = BeamSeq2Seq().eval()
    src, tgt = torch.randint(1, 30, (2, 6)), torch.randint(1, 30, (2, 3))
    with torch.no_grad(), capture_attention(model) as cap:
        model(src, tgt)
    enc = next(r for r in cap.records if r.kind == "enc_self")
    tr = cap.trace(index)
    torch.testing.assert_close(
        torch.as_tensor(tr.enc_self[0, 0]), enc.probs[index // 2, 0], rtol=0, atol=1e-6
    )
    assert any(f"its row {index // 2} is drawn" in n for n in tr.meta["capture_notes"])


def test_a_softmax_over_channels_times_a_warped_image_is_no_deformable_attention():
    """A gate over each pixel's channels (a softmax of a linear projection) times an image warped by
    ``grid_sample``: no weight is shared over the values' features, so it is no deformable attention and
    no warning (it was called one)."""

    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.offsets = nn.Linear(3, 3), nn.Conv2d(3, 2, 1)

        def forward(self, img):
            warped = F.grid_sample(img, self.offsets(img).permute(0, 2, 3, 1).tanh(), align_corners=False)
            gate = self.proj(img.permute(0, 2, 3, 1)).softmax(-1).permute(0, 3, 1, 2)
            return (gate * warped).sum(1)

    torch.manual_seed(0)
    model = Gate().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 3, 8, 8))
    assert not [n for n in cap.notes if "deformable" in n], cap.notes


def test_a_soft_cap_that_leaves_the_hidden_keys_without_weight_is_not_warned_about():
    """Swin's -100 mask, then ``tanh(s / 50) * 50``: the intermediate ``s / 50`` scores them again, but the
    softmax gives them e^-48. Judged at the softmax, not at the op."""

    class Capped(nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.qk = nn.Embedding(30, 16), nn.Linear(16, 32)

        def forward(self, ids):
            q, k = self.qk(self.e(ids)).split(16, -1)
            t = ids.shape[1]
            s = q @ k.transpose(-1, -2) / 4 + (~torch.ones(t, t, dtype=torch.bool).tril()).float() * -100.0
            return (torch.tanh(s / 50.0) * 50.0).softmax(-1)

    torch.manual_seed(0)
    model = Capped().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 30, (2, 5)))
    assert not [n for n in cap.notes if "soft-cap" in n], cap.notes


def test_a_device_context_inside_the_block_is_not_a_capture_inside_it():
    """``with torch.device("cpu")`` is a mode above capture's, but torch.nn takes no fast path under it with or
    without capture: no note."""
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), capture_attention(mha) as cap, torch.device("cpu"):
        mha(x, x, x)
    assert not [n for n in cap.skipped if "capture is active inside" in n.reason]


class SplicedImages(nn.Module):
    """LLaVA's way: a vision encoder's self-attention over a batch of images, whose patches are spliced into
    the text rows that own them (row 0 text only, row 1 both images), then a causal decoder over each row."""

    def __init__(self, d: int = 16, h: int = 2, p: int = 4):
        super().__init__()
        self.h, self.p = h, p
        self.patch = nn.Conv2d(3, d, 4, 4)
        self.vqk, self.qk = nn.Linear(d, 2 * d), nn.Linear(d, 2 * d)
        self.emb = nn.Embedding(10, d)
        self.vision: list[torch.Tensor] = []

    def forward(self, text0, text1, images):
        x = self.patch(images).flatten(2).transpose(1, 2)  # (N, P, d)
        n, p, d = x.shape
        q, k = (t.view(n, p, self.h, -1).transpose(1, 2) for t in self.vqk(x).chunk(2, -1))
        a = (q @ k.transpose(-1, -2) / math.sqrt(d // self.h)).softmax(-1)
        self.vision.append(a.detach().clone())
        x = x + (a @ x.view(n, p, self.h, -1).transpose(1, 2)).transpose(1, 2).reshape(n, p, d)
        t1 = self.emb(text1)
        e = torch.stack([self.emb(text0), torch.cat([t1[:1], x[0], t1[1:2], x[1], t1[2:]], 0)])
        b, length, _ = e.shape
        q, k = (t.view(b, length, self.h, -1).transpose(1, 2) for t in self.qk(e).chunk(2, -1))
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        a = (q @ k.transpose(-1, -2)).masked_fill(~causal, -1e9).softmax(-1)
        return a @ e.view(b, length, self.h, -1).transpose(1, 2)


def test_images_spliced_into_other_rows_are_not_drawn_as_a_sequence_s_encoder():
    """Image 0 belongs to row 1, and row 0 has none: the trace of row 0 drew image 0's self-attention as its
    encoder. It is left out and said; row 1's trace draws its row and says it reads both images."""
    torch.manual_seed(0)
    model = SplicedImages().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 9, (11,)), torch.randint(0, 9, (3,)), torch.randn(2, 3, 8, 8))
    first = cap.trace(0)
    assert first.enc_self is None and first.dec_self is not None
    assert any("sequence 0 reads no row of it" in n for n in first.meta["capture_notes"])
    second = cap.trace(1)
    torch.testing.assert_close(torch.as_tensor(second.enc_self[0]), model.vision[0][1], rtol=0, atol=1e-6)
    assert any("sequence 1 reads rows 0, 1 of it" in n for n in second.meta["capture_notes"])


def test_canine_over_padded_sequences_is_not_said_undecided():
    """CANINE's deep encoder gets a key mask broadcast over its queries and keys, (B, 1, 1) where the call
    reads it: the same for every key, so no triangle. It was said to be "one token, or each query its own
    key" (undecided) though every sequence sees 3 to 8 keys."""
    from transformers import CanineConfig, CanineModel

    torch.manual_seed(0)
    cfg = CanineConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                       downsampling_rate=2, num_hash_functions=2, num_hash_buckets=64, local_transformer_stride=4,
                       max_position_embeddings=64, attn_implementation="eager")  # fmt: skip
    model = CanineModel(cfg).eval()
    ids = torch.randint(3, 200, (3, 16))
    am = torch.ones(3, 16, dtype=torch.long)
    am[1, 12:] = 0
    am[2, 5:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(input_ids=ids, attention_mask=am)
    rec = next(r for r in cap.records if r.name == "encoder.layer.0.attention.self")
    assert int(rec.mask.sum(-1).min()) > 1
    assert not [n for n in cap.notes if "is one token" in n], cap.notes
