"""One capture block around several runs of the model: each run's attention is one forward's layers.

Two forwards in one block (two micro-batches of gradient accumulation, a generation loop that calls the
model once per step over a fixed-size buffer) make maps of the same shape; stacked, they would draw as a
model twice as deep, with nothing to say so. The block knows where each run of the model began
(``Captured.calls``), a trace draws one run's layers and says what it left out, and ``stacks`` refuses.
A layer captured on its own and called once per layer by the model around it (weights shared across
layers) runs once per forward of that model: its calls stay layers.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

D, H, VOCAB = 16, 2, 50


class Block(nn.Module):
    """Pre-norm self-attention, heads split by view and transpose, the weights written by a softmax."""

    def __init__(self, causal: bool = False):
        super().__init__()
        self.causal = causal
        self.qkv, self.o, self.norm = nn.Linear(D, 3 * D), nn.Linear(D, D), nn.LayerNorm(D)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, H, D // H).transpose(1, 2) for t in self.qkv(self.norm(x)).split(D, dim=2))
        s = q @ k.transpose(-2, -1) / math.sqrt(D // H)
        if self.causal:
            s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        w = s.softmax(dim=-1)
        return x + self.o((w @ v).transpose(1, 2).reshape(b, n, D))


class Stack(nn.Module):
    def __init__(self, layers: int = 2, causal: bool = False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block(causal) for _ in range(layers))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Shared(nn.Module):
    """One block applied ``depth`` times (ALBERT's weight sharing)."""

    def __init__(self, depth: int = 3):
        super().__init__()
        self.depth = depth
        self.emb, self.block = nn.Embedding(VOCAB, D), Block()

    def forward(self, ids):
        x = self.emb(ids)
        for _ in range(self.depth):
            x = self.block(x)
        return x


def _maps(model, ids):
    with capture_attention(model) as cap:
        model(ids)
    return torch.stack([r.probs for r in cap.records], dim=1)  # (B, layer, head, q, k)


@pytest.mark.parametrize("batch", [1, 2])
def test_two_forwards_in_one_block_draw_one_forwards_layers(batch):
    torch.manual_seed(0)
    model = Stack(layers=2).eval()
    first, second = torch.randint(0, VOCAB, (2, batch, 7))
    with torch.no_grad(), capture_attention(model) as cap:
        model(first)
        model(second)
    assert len(cap.records) == 4 and len(cap.calls) == 2
    assert [cap.call_of(r) for r in cap.records] == [0, 0, 1, 1]
    trace = cap.trace(batch - 1)
    assert trace.enc_self.shape[0] == 2  # the model's 2 layers, not 4
    with torch.no_grad():
        want = _maps(model, second)[batch - 1]
    torch.testing.assert_close(torch.from_numpy(trace.enc_self.copy()), want, rtol=0, atol=0)
    notes = trace.meta["capture_notes"]
    assert any("ran 2 times" in n and "draws the last of them, its 2 layer(s)" in n for n in notes), notes
    with pytest.raises(ValueError, match="2 runs of the model"):
        cap.stacks()


def test_one_forward_has_no_runs_note_and_stacks():
    torch.manual_seed(0)
    model = Stack(layers=3).eval()
    ids = torch.randint(0, VOCAB, (2, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    assert len(cap.calls) == 1 and {cap.call_of(r) for r in cap.records} == {0}
    assert cap.stacks()["enc_self"].shape == (2, 3, H, 5, 5)
    assert not any("times in the capture block" in n for n in cap.trace(0).meta.get("capture_notes", []))


def test_generation_loop_over_a_fixed_buffer_draws_its_last_step():
    """Greedy decoding without a cache over a fixed-size buffer (every step's maps 8 x 8): the steps are
    runs of the model, not layers."""
    torch.manual_seed(1)
    model = Stack(layers=2, causal=True).eval()
    buf = torch.zeros(1, 8, dtype=torch.long)
    buf[0, 0] = 3
    with torch.no_grad(), capture_attention(model) as cap:
        for t in range(4):
            buf[0, t + 1] = model(buf)[0, t].argmax()
    assert len(cap.calls) == 4
    trace = cap.trace(0)
    assert trace.dec_self.shape == (2, H, 8, 8)
    # the last step ran over the buffer as it was then: its last token not yet written
    before = buf.clone()
    before[0, 4] = 0
    with torch.no_grad():
        want = _maps(model, before)[0]
    torch.testing.assert_close(torch.from_numpy(trace.dec_self.copy()), want, rtol=0, atol=0)
    assert any("ran 4 times" in n for n in trace.meta["capture_notes"])


def test_a_shared_layer_captured_alone_keeps_its_calls_as_layers():
    torch.manual_seed(2)
    model = Shared(depth=3).eval()
    ids = torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad(), capture_attention(model.block) as cap:
        model(ids)
    assert len(cap.records) == 3 and len(cap.calls) == 1
    trace = cap.trace(0)
    assert trace.enc_self.shape[0] == 3
    assert not any("times in the capture block" in n for n in trace.meta.get("capture_notes", []))
    with torch.no_grad(), capture_attention(model.block) as cap:
        model(ids)
        model(ids.flip(1))
    assert len(cap.calls) == 2 and [cap.call_of(r) for r in cap.records] == [0, 0, 0, 1, 1, 1]
    assert cap.trace(0).enc_self.shape[0] == 3


def test_parts_called_one_by_one_are_one_run():
    """The model's parts called once each from outside it (the blocks one after another, then the head):
    one run, and the records stack as before."""
    torch.manual_seed(3)
    model = Stack(layers=2).eval()
    ids = torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        x = model.emb(ids)
        for block in model.blocks:
            x = block(x)
        F.linear(x, model.head.weight)
    assert len(cap.calls) == 1 and {cap.call_of(r) for r in cap.records} == {0}
    assert cap.trace(0).enc_self.shape[0] == 2


class Seq2Seq(nn.Module):
    """graykode's nlp-tutorial Transformer: an encoder and a decoder (self-attention, then cross-attention
    over the encoder's output), decoded greedily by calling ``model.decoder`` once per step over a
    fixed-size buffer."""

    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.decoder = Decoder()


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.block = nn.Embedding(VOCAB, D), Block()

    def forward(self, ids):
        return self.block(self.emb(ids))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.self_attn, self.q, self.kv = (
            nn.Embedding(VOCAB, D),
            Block(causal=True),
            nn.Linear(D, D),
            nn.Linear(D, 2 * D),
        )
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids, memory):
        x = self.self_attn(self.emb(ids))
        k, v = self.kv(memory).chunk(2, dim=-1)
        w = (self.q(x) @ k.transpose(-2, -1) / math.sqrt(D)).softmax(-1)
        return self.head(x + w @ v)


def test_a_greedy_loop_over_the_decoder_draws_its_last_step():
    """``model.encoder`` once, then ``model.decoder`` once per step (same shapes every step): each step
    is a run; the encoder's layer is drawn once, the decoder's maps are the last step's, and said so."""
    torch.manual_seed(4)
    model = Seq2Seq().eval()
    src = torch.randint(1, VOCAB, (1, 6))
    buf = torch.zeros(1, 5, dtype=torch.long)
    with torch.no_grad(), capture_attention(model) as cap:
        memory = model.encoder(src)
        for t in range(4):
            buf[0, t + 1] = model.decoder(buf, memory)[0, t].argmax()
    assert len(cap.calls) == 4
    assert [cap.call_of(r) for r in cap.records] == [0, 0, 0, 1, 1, 2, 2, 3, 3]
    trace = cap.trace(0)
    assert trace.enc_self.shape[0] == 1 and trace.dec_self.shape[0] == 1 and trace.cross.shape[0] == 1
    notes = trace.meta["capture_notes"]
    assert any(n.startswith("dec_self") and "ran 4 times" in n for n in notes), notes
    assert not any(n.startswith("enc_self") for n in notes)
    last = cap.records[-2:]  # the last step's self- and cross-attention
    torch.testing.assert_close(torch.from_numpy(trace.dec_self[0].copy()), last[0].probs[0], rtol=0, atol=0)
    torch.testing.assert_close(torch.from_numpy(trace.cross[0].copy()), last[1].probs[0], rtol=0, atol=0)


class LoopInside(nn.Module):
    """A greedy decoding loop inside the model's one forward (graykode's ``greedy_decoder`` moved into the
    model, a tutorial's ``generate``): every step embeds the whole fixed-size buffer again and runs the
    layers over it, so every step's maps have the same shape as a layer's."""

    def __init__(self, layers: int = 2, steps: int = 3):
        super().__init__()
        self.stack, self.steps = Stack(layers, causal=True), steps

    def forward(self, start):
        buf = torch.zeros(start.shape[0], 5, dtype=torch.long)
        buf[:, 0] = start
        for t in range(self.steps):
            buf[:, t + 1] = self.stack(buf)[:, t].argmax(-1)
        return buf


class KVStepper(nn.Module):
    """Decoding a token at a time inside one forward with a cache that grows (queries at new positions each
    step, keys the earlier ones too): SDPA reads every step's query at its own position."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv, self.head = nn.Embedding(VOCAB, D), nn.Linear(D, 3 * D), nn.Linear(D, VOCAB)

    def forward(self, ids, steps: int = 3):
        ks, vs, tok = [], [], ids
        for _ in range(steps):
            q, k, v = (
                t.view(1, -1, H, D // H).transpose(1, 2) for t in self.qkv(self.emb(tok)).split(D, dim=2)
            )
            ks.append(k)
            vs.append(v)
            y = F.scaled_dot_product_attention(q, torch.cat(ks, 2), torch.cat(vs, 2))
            tok = self.head(y.transpose(1, 2).reshape(1, -1, D))[:, -1:].argmax(-1)
        return tok


def test_a_decoding_loop_inside_the_forward_draws_its_last_steps_layers():
    """The steps of a loop inside one forward are one run; with maps of one shape they drew as a model
    three times as deep, with no note. Each step reads new positions (a new embedding of the buffer),
    which layers of one forward never do: the trace draws the last step's layers and says so, and
    ``stacks`` refuses."""
    torch.manual_seed(5)
    model = LoopInside().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([3, 7]))
    assert len(cap.records) == 6 and len(cap.calls) == 1
    trace = cap.trace(1)
    assert trace.dec_self.shape[0] == 2
    for drawn, rec in zip(trace.dec_self, cap.records[-2:], strict=True):
        torch.testing.assert_close(torch.from_numpy(drawn.copy()), rec.probs[1], rtol=0, atol=0)
    assert any("read other query positions" in n for n in trace.meta["capture_notes"])
    with pytest.raises(ValueError, match="other query positions"):
        cap.stacks()


def test_a_shared_layer_reads_the_same_positions_every_call():
    """ALBERT's layer applied three times reads the same positions each time: three layers, no note."""
    torch.manual_seed(6)
    model = Shared(depth=3).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (2, 6)))
    assert all(r.query_positions is not None for r in cap.records)
    trace = cap.trace(0)
    assert trace.enc_self.shape[0] == 3 and not trace.meta.get("capture_notes")
    assert cap.stacks()["enc_self"].shape[1] == 3


def test_decoding_steps_with_a_growing_cache_each_read_their_own_position():
    """SDPA's query positions come from the codes of its query argument: each step's own token."""
    torch.manual_seed(7)
    model = KVStepper().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (1, 4)))
    pos = [r.query_positions for r in cap.records]
    assert [tuple(p.shape) for p in pos] == [(1, 4), (1, 1), (1, 1)]
    assert not torch.equal(pos[1], pos[2])


class SharedDepth(nn.Module):
    """A Universal Transformer: one torch.nn attention applied at every depth, as ``nn.MultiheadAttention``
    in a residual block or an ``nn.TransformerEncoderLayer`` (both batch-first, so torch's forward
    transposes the query where capture is set aside)."""

    def __init__(self, native: bool, depth: int = 3, d: int = 8):
        super().__init__()
        self.depth, self.native = depth, native
        self.emb = nn.Embedding(VOCAB, d)
        self.layer = nn.TransformerEncoderLayer(d, 2, 16, dropout=0.0, batch_first=True)
        self.mha = nn.MultiheadAttention(d, 2, batch_first=True)

    def forward(self, ids):
        x = self.emb(ids)
        for _ in range(self.depth):
            x = self.layer(x) if self.native else x + self.mha(x, x, x)[0]
        return x


@pytest.mark.parametrize("native", [False, True], ids=["MultiheadAttention", "TransformerEncoderLayer"])
def test_torch_nn_attention_shared_across_depth_reads_the_tokens_each_time(native):
    """Every call's queries are the tokens' positions (lineage through the view torch's forward makes), so
    the three calls stack as three layers with no note (they read positions made up afresh at every call,
    and a trace drew the last as a decoder's step)."""
    torch.manual_seed(0)
    model = SharedDepth(native).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (2, 5)))
    assert len(cap.records) == 3
    want = torch.arange(10).view(2, 5)
    assert all(torch.equal(r.query_positions, want) for r in cap.records)
    tr = cap.trace(0)
    assert tr.probs("enc_self").shape == (3, 2, 5, 5) and not tr.meta.get("capture_notes")
    assert cap.stacks()["enc_self"].shape == (2, 3, 2, 5, 5)
