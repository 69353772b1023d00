"""Capture under the conditions real training and inference code runs in.

- "Let's build GPT"'s one module per head with attention dropout while training: every head's record
  holds the dropped weights its product took, not only the first head's.
- PyTorch's language-model tutorial: an ``nn.TransformerEncoder`` run with a causal mask is
  ``dec_self`` (the layer class says encoder; the mask says a language model), without one ``enc_self``.
- ``torch.inference_mode()``: records and residual norms as under ``no_grad``, and a later capture with
  gradients on is not handed inference tensors remembered from it.
- Learned queries reading another parameter's positions (Crossformer's router) are ``cross``.
- Every TorchScript submodule is named in the one note, not only the first.
- Internal steps that cannot follow an op (a zero-width part joined, a complex einsum of Fourier
  features) leave no internal error among the notes.
- A model, or its blocks, compiled with ``torch.compile`` runs eagerly inside the capture, so its
  attention is recorded under the model's own module names.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from attnscope.core.families.capture import capture_attention

VOCAB = 30


def _ids(batch: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(batch)
    return torch.randint(1, VOCAB, (batch, n), generator=g)


class Head(nn.Module):
    def __init__(self, d: int, hs: int, n: int):
        super().__init__()
        self.key, self.query, self.value = (nn.Linear(d, hs, bias=False) for _ in range(3))
        self.register_buffer("tril", torch.tril(torch.ones(n, n)))
        self.dropout = nn.Dropout(0.3)
        self.used: torch.Tensor | None = None

    def forward(self, x):
        _, t, _ = x.shape
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril[:t, :t] == 0, float("-inf"))
        wei = self.dropout(F.softmax(wei, dim=-1))
        self.used = wei.detach().clone()
        return wei @ self.value(x)


class GPT(nn.Module):
    def __init__(self, heads: int, n: int = 8, layers: int = 2):
        super().__init__()
        d = 4 * heads
        self.tok = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({"heads": nn.ModuleList(Head(d, 4, n) for _ in range(heads)),
                                                   "proj": nn.Linear(d, d)}) for _ in range(layers))  # fmt: skip

    def forward(self, ids):
        x = self.tok(ids)
        for block in self.blocks:
            x = x + block["proj"](torch.cat([h(x) for h in block["heads"]], dim=-1))
        return x


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(("batch", "heads"), [(1, 3), (2, 2), (2, 4)])
def test_dropout_in_each_head_module_is_in_each_heads_record(grad, batch, heads):
    torch.manual_seed(0)
    model = GPT(heads).train()
    with torch.set_grad_enabled(grad), capture_attention(model) as cap:
        model(_ids(batch, 7))
    assert len(cap.records) == 2 and not cap.notes
    for rec, block in zip(cap.records, model.blocks, strict=True):
        used = torch.stack([h.used for h in block["heads"]], dim=1)
        assert rec.exact and rec.kind == "dec_self"
        assert bool((used.sum(-1) > 1.01).any())  # dropout rescaled what it kept
        torch.testing.assert_close(rec.probs, used, atol=1e-6, rtol=0)


class LanguageModel(nn.Module):
    """PyTorch's "Language Modeling with nn.Transformer" tutorial: sequence-first, a causal src_mask."""

    def __init__(self, causal: str, batch_first: bool):
        super().__init__()
        self.causal, self.batch_first = causal, batch_first
        self.embedding = nn.Embedding(VOCAB, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=batch_first)
        self.transformer_encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, ids):
        x = self.embedding(ids) if self.batch_first else self.embedding(ids).transpose(0, 1)
        n = ids.shape[1]
        if self.causal == "none":
            return self.transformer_encoder(x)
        mask = nn.Transformer.generate_square_subsequent_mask(n)
        if self.causal == "log_tril":  # pytorch/examples word_language_model
            mask = torch.log(torch.tril(torch.ones(n, n)))
        return self.transformer_encoder(x, mask=mask, is_causal=self.causal == "is_causal")


@pytest.mark.parametrize(
    ("causal", "kind"),
    [("mask", "dec_self"), ("is_causal", "dec_self"), ("log_tril", "dec_self"), ("none", "enc_self")],
)
@pytest.mark.parametrize("batch_first", [True, False])
def test_an_encoder_stack_run_with_a_causal_mask_is_a_language_model(causal, kind, batch_first):
    model = LanguageModel(causal, batch_first).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(3, 6))
    assert [r.kind for r in cap.records] == [kind, kind]
    assert all(r.exact for r in cap.records)


def test_kinds_given_by_the_caller_still_decide():
    model = LanguageModel("mask", True).eval()
    with torch.no_grad(), capture_attention(model, kinds={"transformer_encoder.*": "enc_self"}) as cap:
        model(_ids(2, 6))
    assert [r.kind for r in cap.records] == ["enc_self", "enc_self"]


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.qkv, self.o = nn.Linear(8, 24), nn.Linear(8, 8)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        b, n = ids.shape
        x = self.emb(ids)
        q, k, v = (t.view(b, n, 2, 4).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        a = (q @ k.transpose(-1, -2) / 2).softmax(-1)
        self.used.append(a.detach().clone())
        return x + self.o((a @ v).transpose(1, 2).reshape(b, n, 8))


def test_inference_mode_captures_and_leaves_nothing_a_later_capture_cannot_use():
    torch.manual_seed(1)
    model = Encoder().eval()
    ids = _ids(2, 5)
    with torch.inference_mode(), capture_attention(model) as first:
        model(ids)
    for context in (torch.inference_mode, torch.no_grad, torch.enable_grad):
        model.used.clear()
        with context(), capture_attention(model) as cap:
            model(ids)
        assert not cap.notes, cap.notes
        assert len(cap.records) == 1 and cap.records[0].exact
        torch.testing.assert_close(cap.records[0].probs.detach(), model.used[0].detach(), atol=1e-6, rtol=0)
        assert cap.records[0].residual is not None
    torch.testing.assert_close(first.records[0].residual, cap.records[0].residual.detach())


class Router(nn.Module):
    """Crossformer's two-stage attention: learned router vectors read learned decoder positions."""

    def __init__(self):
        super().__init__()
        self.router = nn.Parameter(torch.randn(3, 8))
        self.dec_pos = nn.Parameter(torch.randn(5, 8))
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        b = ids.shape[0]
        x = self.dec_pos.unsqueeze(0).expand(b, -1, -1)
        r = self.router.unsqueeze(0).expand(b, -1, -1)
        a = torch.softmax(self.q(r) @ self.k(x).transpose(1, 2) / 8**0.5, -1)
        self.used.append(a.detach()[:, None])
        return a @ x


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_learned_queries_reading_another_parameters_positions_are_cross(batch):
    torch.manual_seed(2)
    model = Router().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 4))
    assert [r.kind for r in cap.records] == ["cross"]
    torch.testing.assert_close(cap.records[0].probs, model.used[0])


def test_every_torchscript_submodule_is_named():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 8)
            self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
                                        for _ in range(3))  # fmt: skip

        def forward(self, ids):
            x = self.emb(ids)
            for block in self.blocks:
                x = block(x)
            return x

    model = Stack().eval()
    model.blocks[0] = torch.jit.script(model.blocks[0])
    model.blocks[2] = torch.jit.script(model.blocks[2])
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 5))
    assert [r.name for r in cap.records] == ["blocks.1.self_attn"]
    note = next(n for n in cap.notes if "TorchScript" in n)
    assert "'blocks.0'" in note and "'blocks.2'" in note and "are TorchScript" in note
    assert "blocks.0.self_attn" not in note  # a scripted module's own submodules are not listed again


def test_a_zero_width_part_and_a_complex_einsum_leave_no_internal_error():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 8)
            self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)
            self.w = nn.Parameter(torch.randn(8, 8, 3, dtype=torch.cfloat))

        def forward(self, ids):
            x = self.emb(ids)
            empty = x[..., :0]
            x = torch.cat([x, empty], dim=-1)  # Emformer's memory blocks, empty at the first segment
            a = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2), -1)
            y = a @ x
            f = torch.fft.rfft(y.transpose(1, 2), dim=-1)[..., :3]  # FEDformer's frequency modes
            mixed = torch.einsum("bix,iox->box", f, self.w)
            return y, torch.fft.irfft(mixed, n=ids.shape[1], dim=-1)

    net = Odd().eval()

    with torch.no_grad(), capture_attention(net) as cap:
        net(_ids(2, 6))
    assert len(cap.records) == 1 and cap.records[0].exact
    assert not [n for n in cap.notes if "Error" in n], cap.notes


def test_a_one_token_prompt_is_the_first_step_of_a_decoder():
    """ "Let's build GPT"'s ``generate`` from a one-token context, with no KV cache: its first call is a
    1 x 1 map with no causal evidence; the later calls of the same heads show their causal mask, so the
    first is ``dec_self`` too. A model called once on one token cannot be told and stays ``enc_self``."""
    torch.manual_seed(3)
    model = GPT(2).eval()
    ids = torch.tensor([[5]])
    with torch.no_grad(), capture_attention(model) as cap:
        for _ in range(3):
            model(ids)
            ids = torch.cat([ids, torch.tensor([[7]])], dim=1)
    assert [tuple(r.probs.shape[-2:]) for r in cap.records] == [(1, 1)] * 2 + [(2, 2)] * 2 + [(3, 3)] * 2
    assert {r.kind for r in cap.records} == {"dec_self"}
    with torch.no_grad(), capture_attention(model) as once:
        model(torch.tensor([[5]]))
    assert {r.kind for r in once.records} == {"enc_self"}


class CompiledLM(nn.Module):
    """A small decoder-only LM whose blocks keep the maps they multiply the values with."""

    def __init__(self, heads: int = 2, layers: int = 2):
        super().__init__()
        d = 4 * heads
        self.tok = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))

    def forward(self, ids):
        x = self.tok(ids)
        for block in self.blocks:
            x = x + block(x)
        return x


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.qkv = heads, nn.Linear(d, 3 * d)
        self.used: torch.Tensor | None = None

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        w = (
            (q @ k.transpose(-2, -1) / (d // self.h) ** 0.5)
            .masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            .softmax(-1)
        )
        self.used = w.detach().clone()
        return (w @ v).transpose(1, 2).reshape(b, n, d)


@pytest.mark.parametrize("what", ["model", "blocks"])
def test_a_model_compiled_with_torch_compile_is_seen_eagerly(what):
    """nanoGPT's ``model = torch.compile(model)``, or each block compiled: the compiled code runs where
    a mode cannot see, so the capture runs the forward eagerly; the module names are the model's own
    (no ``_orig_mod``) and the information says so. (aot_eager: the same wrapper, no C++ compiler.)"""
    torch.manual_seed(11)
    model = CompiledLM().eval()
    ids = _ids(2, 6)
    if what == "model":
        run = torch.compile(model, backend="aot_eager")
    else:
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, backend="aot_eager")
        run = model
    with torch.no_grad():
        want = run(ids)
        with capture_attention(run) as cap:
            got = run(ids)
        again = run(ids)  # compiled again after the block
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(again, want)
    assert not cap.notes, cap.notes
    assert [r.name for r in cap.records] == ["blocks.0", "blocks.1"]
    for rec, block in zip(cap.records, model.blocks, strict=True):
        assert rec.exact and rec.kind == "dec_self"
        own = getattr(block, "_orig_mod", block).used
        torch.testing.assert_close(rec.probs, own, atol=1e-6, rtol=0)
    (info,) = cap.skipped
    assert "torch.compile" in info.reason and info.module == ("(model)" if what == "model" else "blocks.0")


def test_a_submodule_captured_inside_its_parents_forward_records_its_own_attention_only():
    """``capture_attention(model.encoder)`` around ``model(src, tgt)``: the encoder's maps, under the
    encoder's own module names; the decoder's self- and cross-attention run outside it and are not
    recorded (nor noted). Attention a plain function computes outside any module is still recorded."""
    torch.manual_seed(0)
    model = nn.Transformer(8, 2, 2, 2, 16, dropout=0.0, batch_first=True).eval()
    src, tgt = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    with torch.no_grad(), capture_attention(model.encoder) as enc:
        model(src, tgt)
    assert [r.name for r in enc.records] == ["layers.0.self_attn", "layers.1.self_attn"]
    assert {r.kind for r in enc.records} == {"enc_self"} and all(r.exact for r in enc.records)
    assert not enc.notes and not enc.skipped
    with torch.no_grad(), capture_attention(model) as whole:
        model(src, tgt)
    assert len(whole.records) == 6  # 2 encoder self, 2 decoder self, 2 cross
    for a, b in zip(enc.records, whole.records[:2], strict=True):
        assert torch.equal(a.probs, b.probs)
    q, k = torch.randn(2, 2, 4, 4), torch.randn(2, 2, 4, 4)
    with torch.no_grad(), capture_attention(model.encoder) as bare:
        w = (q @ k.transpose(-2, -1)).softmax(-1)  # no module runs: this thread's attention, recorded
    assert len(bare.records) == 1 and torch.equal(bare.records[0].probs, w)


class Keywords(nn.Module):
    """Self-attention whose torch calls name their tensors by keyword (``input=``, ``other=``), as
    code generated for a reordered beam (``torch.index_select(input=k, dim=0, index=beams)``) does."""

    def __init__(self, heads: int, keyword: bool):
        super().__init__()
        self.h, self.keyword = heads, keyword
        self.emb, self.qkv = nn.Embedding(VOCAB, 4 * heads), nn.Linear(4 * heads, 12 * heads)
        self.used: list[torch.Tensor] = []

    def forward(self, ids, beams):
        b, n = ids.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, dim=-1))
        if self.keyword:
            k = torch.index_select(input=k, dim=0, index=beams)
            v = torch.index_select(input=v, dim=0, index=beams)
            s = torch.matmul(input=q, other=torch.transpose(input=k, dim0=-2, dim1=-1))
            w = torch.softmax(input=s, dim=-1)
        else:
            k, v = torch.index_select(k, 0, beams), torch.index_select(v, 0, beams)
            w = torch.softmax(torch.matmul(q, torch.transpose(k, -2, -1)), dim=-1)
        self.used.append(w)
        return w @ v


@pytest.mark.parametrize("batch,heads", [(2, 2), (3, 1), (2, 4)])
def test_tensors_named_by_keyword_are_followed_as_by_position(batch, heads):
    torch.manual_seed(batch)
    ids = torch.randint(1, VOCAB, (batch, 5))
    beams = torch.arange(batch).flip(0)  # every query reads another sequence's keys: cross-attention
    got = []
    for keyword in (False, True):
        torch.manual_seed(0)  # the same weights both ways
        model = Keywords(heads, keyword).eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(ids, beams)
        assert not cap.skipped
        (rec,) = cap.records
        assert torch.equal(rec.probs, model.used[0]) and rec.kind == "cross"
        # the keys followed through index_select(input=...) to the rows they are: row b reads sequence
        # beams[b]'s keys, which a trace of sequence b would label with its own tokens, so it says so
        assert not rec.exact and f"caller's sequence {beams.tolist()}[b]" in rec.flag
        assert len(cap.notes) == 1 and rec.flag in cap.notes[0]
        got.append((rec.kind, rec.probs, rec.flag))
    assert got[0][0] == got[1][0] and torch.equal(got[0][1], got[1][1]) and got[0][2] == got[1][2]


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("batch,heads", [(1, 2), (2, 2), (3, 4)])
def test_multihead_attention_dropout_while_training_records_the_weights_it_used(need_weights, batch, heads):
    """In training, MultiheadAttention drops weights at random (by the bmm path when it returns its weights,
    inside SDPA when it does not). The record holds the dropped weights the call multiplied its values
    with, drawn again from the RNG state the call started from: they rebuild the call's output; the
    draws that follow the capture are those that follow a plain call."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(4 * heads, heads, dropout=0.3, batch_first=True).train()
    x = torch.randn(batch, 6, 4 * heads)
    torch.manual_seed(1)
    ref, _ = mha(x, x, x, need_weights=need_weights, average_attn_weights=False)
    after_plain = torch.rand(3)
    torch.manual_seed(1)
    with capture_attention(mha) as cap:
        out, w = mha(x, x, x, need_weights=need_weights, average_attn_weights=False)
    assert torch.equal(torch.rand(3), after_plain) and torch.equal(out, ref)
    (rec,) = cap.records
    assert rec.exact and not cap.notes
    assert bool((rec.probs == 0).any())  # dropped
    if need_weights:
        assert torch.equal(rec.probs, w.detach())
    d = 4
    v = F.linear(x, mha.in_proj_weight[8 * heads :], mha.in_proj_bias[8 * heads :]).view(batch, 6, heads, d)
    rebuilt = mha.out_proj((rec.probs @ v.transpose(1, 2)).transpose(1, 2).reshape(batch, 6, 4 * heads))
    torch.testing.assert_close(rebuilt, out, atol=1e-5, rtol=0)


def test_sdpa_dropout_while_training_records_the_dropped_weights():
    torch.manual_seed(0)
    v = torch.randn(2, 3, 5, 4)

    class Drop(nn.Module):
        def forward(self, x):
            return F.scaled_dot_product_attention(x, x, x, dropout_p=0.4, is_causal=True)

    model = Drop()
    torch.manual_seed(7)
    with capture_attention(model) as cap:
        out = model(v)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and not cap.notes
    torch.testing.assert_close(rec.probs @ v, out, atol=1e-6, rtol=0)
    kept = rec.probs[rec.mask.unsqueeze(1).expand_as(rec.probs)]
    assert bool((kept == 0).any()) and bool((kept > 1).any())  # dropped, the rest scaled by 1 / (1 - p)


def test_dropout_whose_draws_cannot_be_repeated_is_flagged(monkeypatch):
    """Where drawing again from the call's RNG state does not give the call's output (a GPU kernel with its
    own generator), the record is flagged, with a warning, for SDPA and MultiheadAttention alike."""
    from attnscope.core.families import capture as capture_module

    monkeypatch.setattr(capture_module, "_set_rng_state", lambda state, device: torch.manual_seed(12345))
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, dropout=0.3, batch_first=True).train()
    x = torch.randn(2, 6, 8)

    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            y = F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None], dropout_p=0.4)
            return self.mha(y[:, 0], y[:, 0], y[:, 0])[0]

    model = Both()
    with capture_attention(model) as cap:
        model(x)
    assert [r.exact for r in cap.records] == [False, False]
    assert (
        "drops weights at random" in cap.records[0].flag and "drops weights at random" in cap.records[1].flag
    )
    assert sum("could not verify" in n and "drops weights at random" in n for n in cap.notes) == 2


class StaticCacheLM(nn.Module):
    """Decoding from a one-token prompt over a preallocated cache of ``slots`` (gpt-fast's, HF's
    StaticCache): each step writes its key and value into the next slot and masks the slots not written
    yet. The first step is one query over all the slots, one of them written."""

    def __init__(self, heads: int, slots: int = 6):
        super().__init__()
        self.h, self.slots = heads, slots
        self.emb, self.qkv = nn.Embedding(VOCAB, 4 * heads), nn.Linear(4 * heads, 12 * heads)
        self.used: list[torch.Tensor] = []

    def forward(self, bos, steps: int = 3):
        b, h = bos.shape[0], self.h
        kc, vc = torch.zeros(b, h, self.slots, 4), torch.zeros(b, h, self.slots, 4)
        tok = bos
        for pos in range(steps):
            q, k, v = self.qkv(self.emb(tok)).view(b, 1, 3, h, 4).permute(2, 0, 3, 1, 4)
            kc[:, :, pos : pos + 1] = k
            vc[:, :, pos : pos + 1] = v
            s = (q @ kc.transpose(-1, -2) / 2).masked_fill(torch.arange(self.slots) > pos, float("-inf"))
            w = s.softmax(-1)
            self.used.append(w)
            tok = ((w @ vc).flatten(1) @ self.emb.weight[:, : 4 * h].T).argmax(-1, keepdim=True)
        return tok


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 2)])
def test_the_first_step_over_a_preallocated_cache_is_a_decoder_step(batch, heads):
    torch.manual_seed(batch)
    model = StaticCacheLM(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.ones(batch, 1, dtype=torch.long))
    assert [r.kind for r in cap.records] == ["dec_self"] * 3
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact and torch.equal(rec.probs, used)


class PrefixLM(nn.Module):
    """A prefix LM generating: the prompt sees itself both ways (all of it is prefix, no mask), then each
    step's query reads the cached prompt and the steps so far. ``shared``: the same module instead encodes
    a source and then runs over a target of its own under a causal mask (no cache: it reads no prompt)."""

    def __init__(self, heads: int = 2, d: int = 8):
        super().__init__()
        self.h = heads
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def attend(self, x, past=None, causal=False):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        s = q @ k.transpose(-2, -1)
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d), (k, v)

    def forward(self, prompt, shared=False):
        if shared:  # an encoder pass over the source, then a causal pass over another input
            self.attend(self.emb(prompt))
            return self.attend(self.emb(prompt.flip(1) % 7), causal=True)[0]
        y, past = self.attend(self.emb(prompt))
        tok = prompt[:, -1:]
        for _ in range(3):
            y, past = self.attend(self.emb(tok), past)
            tok = (y[:, -1] @ self.emb.weight.T).argmax(-1, keepdim=True)
        return tok


@pytest.mark.parametrize("batch", [1, 2])
def test_a_prefill_that_is_all_prefix_takes_its_decoding_steps_kind(batch):
    """Its positions are read again among the keys of the module's later causal steps (the cache): a
    decoder's prefill. The same module encoding a source and then running causally over another input
    (no cache of the source) keeps its encoder pass ``enc_self``."""
    torch.manual_seed(batch)
    model = PrefixLM().eval()
    prompt = torch.randint(1, VOCAB, (batch, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(prompt)
    assert [r.kind for r in cap.records] == ["dec_self"] * 4 and all(r.exact for r in cap.records)
    with torch.no_grad(), capture_attention(model) as cap:
        model(prompt, shared=True)
    assert [r.kind for r in cap.records] == ["enc_self", "dec_self"]


def test_attention_inside_vmap_is_said_in_one_sentence():
    """Per-example attention vmapped over the batch: capture cannot follow the wrapped tensors; it says so
    once, naming the module, leaves no internal error among the notes, and changes no output."""
    torch.manual_seed(0)

    class PerExample(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def one(self, x):  # (L, 8): one sequence
            q, k, v = self.qkv(x).chunk(3, -1)
            return (q @ k.T / 8**0.5).softmax(-1) @ v

        def forward(self, x):
            return torch.vmap(self.one)(x)

    model, x = PerExample(), torch.randn(3, 5, 8)
    with torch.no_grad():
        ref = model(x)
    with torch.no_grad(), capture_attention(model) as cap:
        out = model(x)
    assert torch.equal(out, ref) and not cap.records
    assert len(cap.notes) == 1 and "torch.vmap" in cap.notes[0] and "not recorded" in cap.notes[0]


class RotatingCache(nn.Module):
    """A sliding-window cache of ``window`` slots written at ``position % window`` and read in slot order
    (mistral-inference's reference code): once it wraps, its keys are no longer in the sequence's order."""

    def __init__(self, heads: int, window: int = 4):
        super().__init__()
        self.h, self.window = heads, window
        self.emb, self.qkv = nn.Embedding(VOCAB, 4 * heads), nn.Linear(4 * heads, 12 * heads)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        b, h, w = ids.shape[0], self.h, self.window
        kc, vc = torch.zeros(b, w, h, 4), torch.zeros(b, w, h, 4)
        for p in range(ids.shape[1]):
            q, k, v = self.qkv(self.emb(ids[:, p : p + 1])).view(b, 3, h, 4).unbind(1)
            kc[:, p % w], vc[:, p % w] = k, v
            keys, vals = kc[:, : p + 1].transpose(1, 2), vc[:, : p + 1].transpose(1, 2)  # (b, h, slots, 4)
            a = (q[:, :, None] @ keys.transpose(-2, -1) / 2).softmax(-1)
            self.used.append(a)
            a @ vals
        return kc


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 1)])
def test_a_rotating_cache_read_in_slot_order_is_flagged_once_it_wraps(batch, heads):
    torch.manual_seed(batch)
    model = RotatingCache(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 6)))
    assert len(cap.records) == 6
    for step, (rec, used) in enumerate(zip(cap.records, model.used, strict=True)):
        assert torch.equal(rec.probs, used) and rec.kind == "dec_self"
        if step < 4:  # slots in the order of the tokens
            assert rec.exact
        else:
            assert not rec.exact and "rotating cache" in rec.flag
    assert any("rotating cache" in n for n in cap.notes)


@pytest.mark.parametrize("shape", [(0, 5, 8), (2, 0, 8)])
def test_attention_over_an_empty_batch_or_sequence_leaves_no_raw_error(shape):
    """Batch size 0 or length 0: nothing to record, said once in plain words (no internal error text)."""

    class Hand(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x, sdpa=False):
            b, n, _ = x.shape
            q, k, v = (f(x).view(b, n, 2, 4).transpose(1, 2) for f in (self.q, self.k, self.v))
            if sdpa:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return (q @ k.transpose(-1, -2) / 2).softmax(-1) @ v

    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(*shape)
    for model, call in (
        (Hand(), lambda m: m(x)),
        (Hand(), lambda m: m(x, True)),
        (mha, lambda m: m(x, x, x)),
    ):
        with torch.no_grad(), capture_attention(model) as cap:
            call(model)
        assert cap.records == [] and cap.notes == []
        assert any("empty batch or sequence" in n.reason for n in cap.skipped)


def test_sdpa_whose_output_a_nan_key_spreads_over_a_masked_row_is_flagged():
    """A NaN in a key: SDPA adds its mask to the scores, NaN + -inf is NaN, and the whole row of its
    output is NaN, while weights recomputed with the key masked are finite: not the call's, flagged."""

    class A(nn.Module):
        def forward(self, q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 1, 4, 8).unbind(0)
    k[0, 0, 1, 0] = float("nan")
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    net = A()
    with torch.no_grad(), capture_attention(net) as cap:
        net(q, k, v, causal)
    (rec,) = cap.records
    assert not rec.exact and "NaN" in rec.flag
    k[0, 0, 1, 0] = 0.5  # the same call without it: exact
    net = A()
    with torch.no_grad(), capture_attention(net) as cap:
        net(q, k, v, causal)
    assert cap.records[0].exact and _only_kind_unverified(cap.notes)


def _only_kind_unverified(notes: list[str]) -> bool:
    """No note but the one that q and k handed in from outside cannot say self or cross (a test's SDPA on
    random tensors)."""
    return all("could not verify its kind: the queries were never projected" in n for n in notes)


@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")])
@pytest.mark.parametrize("mask", ["causal", "padding"])
def test_sdpa_masks_applied_as_sdpa_applies_them_whatever_the_scores(bad, mask):
    """The recomputed weights hide masked keys with -inf, bit for bit as ``where(keep, scores, -inf)``:
    adding a 0/-inf mask where every score is finite, ``where`` itself where a score is infinite or NaN
    (an infinity plus -inf is NaN, where ``where`` gives -inf)."""

    class A(nn.Module):
        def forward(self, q, k, v, m):
            if m is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 6, 8).unbind(0)
    keep = torch.ones(6, 6, dtype=torch.bool).tril() if mask == "causal" else None
    if mask == "padding":
        keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
        keep[1, ..., 4:] = False
    if bad is not None:
        k[1, 2, 5, 0] = bad  # a masked key of sequence 1 (hidden from every query but the last, or all)
    net = A()
    with torch.no_grad(), capture_attention(net) as cap:
        net(q, k, v, None if mask == "causal" else keep)
    (rec,) = cap.records
    scores = (q @ k.transpose(-2, -1)) * (1 / 8**0.5)
    want = torch.softmax(torch.where(keep, scores, float("-inf")), dim=-1)
    assert torch.equal(rec.probs.nan_to_num(7.0), want.nan_to_num(7.0))
    if bad is None:
        assert rec.exact and _only_kind_unverified(cap.notes)


def test_a_sequence_all_padding_is_recorded_as_the_path_that_ran_weighs_it():
    """``nn.TransformerEncoderLayer`` runs under capture as it runs without it: its fused fast path where
    torch takes it (a sequence all padding: NaN out, NaN weights), its Python path where not (attention
    called with ``need_weights=False``, inside SDPA, where a row with every key masked gets weight 0; the
    bmm path of ``need_weights=True`` gives NaN): the record holds what the path that ran used."""
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1] = True
    with torch.no_grad():
        want_out = layer(x, src_key_padding_mask=pad)
        _, want = layer.self_attn(x[:1], x[:1], x[:1], need_weights=True, average_attn_weights=False)
    assert bool(want_out[1].isnan().all())  # the fast path: a softmax over no key
    with torch.no_grad(), capture_attention(layer) as cap:
        got_out = layer(x, src_key_padding_mask=pad)
    assert torch.equal(
        got_out.nan_to_num(7.0), want_out.nan_to_num(7.0)
    )  # the model's own output, uncaptured
    (rec,) = cap.records
    assert rec.exact and not cap.notes
    assert bool(rec.probs[1].isnan().all())
    torch.testing.assert_close(rec.probs[:1], want)
    torch.backends.mha.set_fastpath_enabled(False)  # the Python path: SDPA weighs such a row 0
    try:
        with torch.no_grad(), capture_attention(layer) as cap:
            slow_out = layer(x, src_key_padding_mask=pad)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    assert not bool(slow_out.isnan().any())
    (rec,) = cap.records
    assert torch.equal(rec.probs[1], torch.zeros(2, 5, 5))
    torch.testing.assert_close(rec.probs[:1], want)
    x_nan = x.clone()
    x_nan[0, 2] = float("nan")  # a NaN in the data (no key masked): NaN inside SDPA too, not 0
    with torch.no_grad(), capture_attention(layer) as cap:
        layer(x_nan, src_key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    assert bool(cap.records[0].probs[0].isnan().all()) and not bool(cap.records[0].probs[1].isnan().any())
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()  # the bmm path: NaN, as it returns them
    with torch.no_grad(), capture_attention(mha) as cap:
        _, got = mha(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    assert bool(cap.records[0].probs[1].isnan().all()) and bool(got[1].isnan().all())


class SortedByLength(nn.Module):
    """The batch sorted by length inside forward before attention (``lengths.sort(descending=True)``,
    ``x[perm_idx]``, as pack_padded_sequence once required), sorted back after it."""

    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        self.emb, self.qk = nn.Embedding(VOCAB, 4 * heads, padding_idx=0), nn.Linear(4 * heads, 8 * heads)

    def forward(self, ids, lengths):
        b, n = ids.shape
        lengths_sorted, perm_idx = lengths.sort(0, descending=True)
        x = self.emb(ids)[perm_idx]
        q, k = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qk(x).chunk(2, -1))
        pad = torch.arange(n)[None, :] >= lengths_sorted[:, None]
        a = (q @ k.transpose(-1, -2)).masked_fill(pad[:, None, None, :], float("-inf")).softmax(-1)
        return (a @ x[:, None]).mean(1)[perm_idx.argsort()]


@pytest.mark.parametrize(("lengths", "heads"), [((6, 4, 2, 5), 2), ((3, 5), 1), ((2, 6, 4), 4)])
def test_a_batch_sorted_inside_the_model_is_flagged_with_its_order(lengths, heads):
    """Record row b held the sorted batch's sequence b (input sequence perm_idx[b]), exact: a trace of
    sequence 1 drew another sequence's map over sequence 1's tokens."""
    torch.manual_seed(0)
    lens = torch.tensor(lengths)
    ids = torch.randint(1, VOCAB, (len(lengths), 6))
    for i, n in enumerate(lengths):
        ids[i, n:] = 0
    model = SortedByLength(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, lens)
    (rec,) = cap.records
    order = lens.sort(0, descending=True).indices.tolist()
    assert not rec.exact and f"sequence {order}[b]" in rec.flag
    assert len(cap.notes) == 1


class ShowAttendTell(nn.Module):
    """Show, Attend and Tell (sgrvinod): CNN features sorted with their captions by length
    (``encoder_out[sort_ind]``), then additive attention of a state made from them over their positions."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(3, d, 3, padding=1)
        self.enc_att, self.dec_att, self.full_att = nn.Linear(d, 6), nn.Linear(d, 6), nn.Linear(6, 1)

    def forward(self, imgs, lengths):
        _, sort_ind = lengths.sort(dim=0, descending=True)
        encoder_out = self.conv(imgs).flatten(2).transpose(1, 2)[sort_ind]  # (B, pixels, d)
        h = encoder_out.mean(1)
        att = self.full_att(torch.relu(self.enc_att(encoder_out) + self.dec_att(h).unsqueeze(1))).squeeze(2)
        alpha = nn.Softmax(dim=1)(att)
        return (encoder_out * alpha.unsqueeze(2)).sum(1)


def test_a_batch_sorted_before_additive_attention_is_flagged_with_its_order():
    """Additive attention over positions of a batch sorted inside the model: record row b's keys are the
    caller's sequence sort_ind[b] (it was exact with no note, as if row b were the caller's sequence b)."""
    torch.manual_seed(0)
    model = ShowAttendTell().eval()
    lengths = torch.tensor([3, 5, 4])
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(3, 3, 3, 3), lengths)
    (rec,) = cap.records
    assert not rec.exact and "the keys of record row b are the caller's sequence [1, 2, 0][b]" in rec.flag
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(3, 3, 3, 3), torch.tensor([5, 4, 3]))  # already in order: nothing moved
    assert cap.records[0].exact and not cap.notes


class SortedThenUnsorted(nn.Module):
    """Sorted by length inside forward, on the token ids (``self.emb(ids[perm_idx])``, before the embedding)
    or on the embeddings, attention in the sorted order, sorted back (``out[unperm_idx]``), attention again."""

    def __init__(self, sort_ids: bool, heads: int = 2):
        super().__init__()
        self.sort_ids, self.h = sort_ids, heads
        self.emb = nn.Embedding(VOCAB, 4 * heads)
        self.qkv1, self.qkv2 = nn.Linear(4 * heads, 12 * heads), nn.Linear(4 * heads, 12 * heads)

    def att(self, x, lin):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in lin(x).chunk(3, -1))
        return ((q @ k.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)

    def forward(self, ids, lengths):
        _, perm_idx = lengths.sort(0, descending=True)
        x = self.emb(ids[perm_idx]) if self.sort_ids else self.emb(ids)[perm_idx]
        out = self.att(x, self.qkv1)  # rows in the sorted order
        return self.att(out[perm_idx.argsort()], self.qkv2)  # rows in the caller's order


@pytest.mark.parametrize("sort_ids", [True, False])
def test_token_ids_sorted_before_the_embedding_are_the_callers_rows_in_another_order(sort_ids):
    """Sorting the ids made sorted row b "sequence b" for the embedding: the sorted attention was exact (its row
    0 another sequence's map) and the one back in the caller's order flagged. Both sorts now read the same."""
    torch.manual_seed(0)
    lens = torch.tensor([2, 5, 3])
    model = SortedThenUnsorted(sort_ids).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (3, 5)), lens)
    first, second = cap.records
    assert not first.exact and "sequence [1, 2, 0][b]" in first.flag
    assert second.exact


def test_a_batch_already_in_order_stays_exact():
    torch.manual_seed(0)
    lens = torch.tensor([6, 5, 3])
    ids = torch.randint(1, VOCAB, (3, 6))
    for i, n in enumerate(lens.tolist()):
        ids[i, n:] = 0
    model = SortedByLength(2).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, lens)
    assert cap.records[0].exact and not cap.notes


ROW_WAYS = {  # how the model moves the caller's rows before attention, and the caller's row in each record row
    "roll ids": (lambda ids, emb: emb(torch.roll(ids, 1, 0)), lambda b: torch.arange(b).roll(1)),
    "flip ids": (lambda ids, emb: emb(ids.flip(0)), lambda b: torch.arange(b).flip(0)),
    "ids[1:]": (lambda ids, emb: emb(ids[1:]), lambda b: torch.arange(1, b)),
    "ids[valid]": (
        lambda ids, emb: emb(ids[torch.arange(ids.shape[0]) % 2 == 1]),
        lambda b: torch.arange(1, b, 2),
    ),
    "narrow ids": (lambda ids, emb: emb(ids.narrow(0, 1, ids.shape[0] - 1)), lambda b: torch.arange(1, b)),
    "emb(ids)[1:]": (lambda ids, emb: emb(ids)[1:], lambda b: torch.arange(1, b)),
    "emb(ids)[perm]": (
        lambda ids, emb: emb(ids)[torch.arange(ids.shape[0]).roll(1)],
        lambda b: torch.arange(b).roll(1),
    ),
    "first rows": (lambda ids, emb: emb(ids[:2]), lambda b: torch.arange(2)),
    "roll by 0": (lambda ids, emb: emb(torch.roll(ids, 0, 0)), lambda b: torch.arange(b)),
    "flip positions": (lambda ids, emb: emb(ids).flip(1).flip(1), lambda b: torch.arange(b)),
}


class RowsMoved(nn.Module):
    """Self-attention over the caller's rows rolled, flipped, some dropped (``ids[valid]``, ``emb(ids)[1:]``)
    or as given; ``mha``: torch's own MultiheadAttention, whose record is made from its arguments."""

    def __init__(self, way: str, heads: int, mha: bool):
        super().__init__()
        self.way, self.h, self.mha = way, heads, mha
        self.emb, self.qk = nn.Embedding(VOCAB, 4 * heads), nn.Linear(4 * heads, 8 * heads)
        self.att = nn.MultiheadAttention(4 * heads, heads, batch_first=True)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = ROW_WAYS[self.way][0](ids, self.emb)
        if self.mha:
            y, w = self.att(x, x, x, average_attn_weights=False)
            self.used.append(w)
            return y
        b, n, _ = x.shape
        q, k = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qk(x).chunk(2, -1))
        a = (q @ k.transpose(-1, -2)).softmax(-1)
        self.used.append(a)
        return a @ x[:, None]


@pytest.mark.parametrize("mha", [False, True])
@pytest.mark.parametrize(("batch", "heads"), [(3, 2), (4, 4), (5, 1)])
@pytest.mark.parametrize("way", list(ROW_WAYS))
def test_rows_moved_or_dropped_before_attention_are_flagged_with_the_callers_rows(way, batch, heads, mha):
    """Ids rolled, flipped, narrowed or picked by a mask before the embedding were numbered as if they were
    the caller's rows in order, and rows dropped after it (``emb(ids)[1:]``) or a MultiheadAttention over a
    reordered batch went unsaid: exact records whose row 0 was another sequence, which a trace drew as
    sequence 0. Each now names the caller's row of every record row; rows as given stay exact."""
    torch.manual_seed(batch)
    ids = torch.randint(1, VOCAB, (batch, 5))
    model = RowsMoved(way, heads, mha).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    torch.testing.assert_close(rec.probs, model.used[0])
    rows = ROW_WAYS[way][1](batch)
    if torch.equal(rows, torch.arange(int(rows.numel()))):
        assert rec.exact and not cap.notes, cap.notes
        return
    assert not rec.exact and f"record row b holds the caller's sequence {rows.tolist()}[b]" in rec.flag
    assert len(cap.notes) == 1 and rec.flag in cap.notes[0]
    assert ("only some" in rec.flag) == (int(rows.numel()) < batch)


class SequenceFirstSorted(nn.Module):
    """torchtext-era code: ids (T, B), the batch sorted by length along its second axis
    (``emb(src).index_select(1, perm)``), fairseq's ``(B·H, T, d)`` fold and ``bmm``."""

    def __init__(self, heads: int, sort: bool):
        super().__init__()
        self.h, self.sort = heads, sort
        self.emb, self.qk = nn.Embedding(VOCAB, 4 * heads), nn.Linear(4 * heads, 8 * heads)
        self.used: list[torch.Tensor] = []

    def forward(self, src, lengths):
        x = self.emb(src)
        if self.sort:
            x = x.index_select(1, lengths.sort(descending=True).indices)
        t, b, _ = x.shape
        q, k = self.qk(x).chunk(2, -1)
        q = q.contiguous().view(t, b * self.h, -1).transpose(0, 1)
        k = k.contiguous().view(t, b * self.h, -1).transpose(0, 1)
        a = torch.bmm(q, k.transpose(1, 2)).softmax(-1)
        self.used.append(a.view(b, self.h, t, t))
        return a


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize(("batch", "heads"), [(3, 2), (4, 4), (2, 1)])
def test_a_sequence_first_batch_sorted_inside_the_model_is_flagged_with_its_order(sort, batch, heads):
    """Each sequence is a column of (T, B) ids: the check for a reordered batch asked for a row per
    sequence and let the sorted batch through, exact, its row 0 the longest sequence."""
    torch.manual_seed(batch)
    lengths = torch.randperm(batch) + 2
    model = SequenceFirstSorted(heads, sort).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (6, batch)), lengths)
    (rec,) = cap.records
    assert torch.equal(rec.probs, model.used[0])
    order = lengths.sort(descending=True).indices.tolist()
    if sort and order != sorted(order):
        assert not rec.exact and f"record row b holds the caller's sequence {order}[b]" in rec.flag
    else:
        assert rec.exact and not cap.notes


class Bucketed(nn.Module):
    """Sequences sorted by length, run in buckets of 2 (``x[idx, :L]``, each cut to its longest), put back."""

    def __init__(self):
        super().__init__()
        self.emb, self.qk = nn.Embedding(VOCAB, 8), nn.Linear(8, 16)
        self.used: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, ids, lengths):
        x = self.emb(ids)
        out = torch.zeros_like(x)
        for idx in lengths.argsort(descending=True).split(2):
            n = int(lengths[idx].max())
            q, k = self.qk(x[idx, :n]).chunk(2, -1)
            p = (q @ k.transpose(1, 2)).softmax(-1)
            self.used.append((idx, p))
            out[idx, :n] = p @ x[idx, :n]
        return out


def test_buckets_of_the_batch_are_put_back_in_the_callers_rows():
    torch.manual_seed(0)
    lengths = torch.tensor([7, 5, 7, 6])  # buckets: rows [0, 2] (7 tokens), then [3, 1] (6)
    model = Bucketed().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (4, 7)), lengths)
    (rec,) = cap.records  # lineage places every bucket's rows: row b is the caller's sequence b
    assert rec.exact and not cap.notes
    want = torch.zeros(4, 1, 7, 7)
    for idx, p in model.used:
        n = p.shape[-1]
        want[idx, 0, :n, :n] = p
    torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)
    assert rec.mask is not None and torch.equal(rec.mask, want[:, 0] > 0)  # what no call computed is hidden


class CrossOverRolledImages(nn.Module):
    """ALBEF's negatives: each caption cross-attends to another image's patches (``torch.roll(img, 1, 0)``)."""

    def __init__(self, roll: int):
        super().__init__()
        self.roll = roll
        self.emb, self.q, self.k = nn.Embedding(VOCAB, 8), nn.Linear(8, 8), nn.Linear(6, 8)

    def forward(self, ids, img):
        keys = torch.roll(img, self.roll, 0)
        return (self.q(self.emb(ids)) @ self.k(keys).transpose(1, 2)).softmax(-1) @ keys


@pytest.mark.parametrize("roll", [1, 0])
def test_cross_attention_over_another_items_keys_says_whose_keys(roll):
    torch.manual_seed(0)
    model = CrossOverRolledImages(roll).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (3, 5)), torch.randn(3, 4, 6))
    (rec,) = cap.records
    assert rec.kind == "cross"
    if roll:
        assert not rec.exact and "the keys of record row b are the caller's sequence [2, 0, 1][b]" in rec.flag
    else:
        assert rec.exact and not cap.notes


class CrossOverPickedImages(nn.Module):
    """Each caption cross-attends to its image, picked by index (``img[pick]``: two captions of one image)."""

    def __init__(self):
        super().__init__()
        self.emb, self.q, self.k = nn.Embedding(VOCAB, 8), nn.Linear(8, 8), nn.Linear(6, 8)

    def forward(self, ids, img, pick):
        keys = self.k(img)[pick]
        return (self.q(self.emb(ids)) @ keys.transpose(1, 2)).softmax(-1) @ keys


@pytest.mark.parametrize(
    "pick, flagged",
    [
        ([2, 0, 2], True),
        ([1, 1, 1], True),
        ([0, 1, 2], False),
        ([0, 0, 1, 1, 2, 2], False),
        ([0, 1, 2, 0, 1, 2], False),
    ],
)
def test_cross_keys_picked_with_a_row_twice_say_whose_keys(pick, flagged):
    """Rows picked with one twice were read as beams (every row k times), and the record was exact while row 0's
    keys were image 2's patches. Beams (each image for k captions in a row, or the batch tiled) stay exact."""
    torch.manual_seed(0)
    model = CrossOverPickedImages().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (len(pick), 5)), torch.randn(3, 4, 6), torch.tensor(pick))
    (rec,) = cap.records
    assert rec.kind == "cross"
    if flagged:
        assert not rec.exact and f"the keys of record row b are the caller's sequence {pick}[b]" in rec.flag
        assert any("some twice" in n for n in cap.notes)
    else:
        assert rec.exact and not cap.notes


class PackedThenAttended(nn.Module):
    """Token ids padded to a fixed length, packed, unpacked to the longest sequence (``pad_packed_sequence``'s
    default) or to a ``total_length``, then self-attention over the unpacked steps (Kaggle's LSTM + attention)."""

    def __init__(self, total_length: int | None, batch_first: bool):
        super().__init__()
        self.total_length, self.batch_first = total_length, batch_first
        self.emb = nn.Embedding(VOCAB, 8)
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids, lengths):
        x = self.emb(ids) if self.batch_first else self.emb(ids).transpose(0, 1)
        packed = nn.utils.rnn.pack_padded_sequence(
            x, lengths, batch_first=self.batch_first, enforce_sorted=False
        )
        x, _ = nn.utils.rnn.pad_packed_sequence(
            packed, batch_first=self.batch_first, total_length=self.total_length
        )
        x = x if self.batch_first else x.transpose(0, 1)
        b, t, _ = x.shape
        q, k = self.q(x).view(b, t, 2, 4).transpose(1, 2), self.k(x).view(b, t, 2, 4).transpose(1, 2)
        w = (q @ k.transpose(-1, -2)).softmax(-1)
        self.seen.append(w)
        return w @ x[:, None]


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("total_length", [None, 7, 9])
def test_steps_unpacked_to_another_length_than_the_packed_ones_are_recorded(total_length, batch_first):
    """Unpacked to fewer steps than the ids were padded to (the longest sequence's 5 of 7) or to more (9): every
    padded step shared one padding position, so rows of a sequence repeated a position and the map was left
    out ("rows of one sequence and head see different keys")."""
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 7))
    lengths = torch.tensor([5, 3, 4])
    for i, n in enumerate(lengths.tolist()):
        ids[i, n:] = 0
    model = PackedThenAttended(total_length, batch_first).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, lengths)
    (rec,) = cap.records
    assert rec.exact and not cap.notes, cap.notes
    assert torch.equal(rec.probs, model.seen[0])


class PackedWordAttention(nn.Module):
    """sgrvinod's hierarchical attention network, word level: scores of a learned context vector computed on
    ``PackedSequence.data`` (one per real word, 1-D), ``exp(s - s.max())``, padded back by
    ``pad_packed_sequence(PackedSequence(...))`` (zeros at PAD), divided by their sums; the padded GRU outputs
    weighed by them (``(h * alphas.unsqueeze(2)).sum(1)``)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.rnn = nn.GRU(8, 4, batch_first=True, bidirectional=True)
        self.att, self.ctx = nn.Linear(8, 6), nn.Linear(6, 1, bias=False)
        self.alphas: list[torch.Tensor] = []

    def pool(self, x, lengths):
        packed, _ = self.rnn(
            nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        )
        return self.attend(packed)

    def attend(self, packed):
        e = self.ctx(torch.tanh(self.att(packed.data))).squeeze(1)
        e = torch.exp(e - e.max())
        e, _ = nn.utils.rnn.pad_packed_sequence(
            nn.utils.rnn.PackedSequence(
                e, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices
            ),
            batch_first=True,
        )
        alphas = e / e.sum(1, keepdim=True)
        self.alphas.append(alphas)
        h, _ = nn.utils.rnn.pad_packed_sequence(packed, batch_first=True)
        return (h * alphas.unsqueeze(2)).sum(1)

    def forward(self, ids, lengths):
        return self.pool(self.emb(ids), lengths)


def test_a_softmax_by_hand_on_packed_data_is_recorded_in_the_batchs_order():
    """The exp on the packed 1-D scores was never followed: alone, "no softmax was seen" (blaming linear
    attention); beside other attention, nothing at all. Its rows are the batch's in the model's order, though
    the packed data holds them sorted by length."""
    torch.manual_seed(2)
    ids = torch.randint(1, VOCAB, (4, 6))
    lengths = torch.tensor([3, 6, 2, 5])
    for i, n in enumerate(lengths.tolist()):
        ids[i, n:] = 0
    model = PackedWordAttention().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, lengths)
    (rec,) = cap.records
    assert rec.exact and not cap.notes, cap.notes
    assert rec.kind == "cross" and tuple(rec.probs.shape) == (4, 1, 1, 6)
    torch.testing.assert_close(rec.probs[:, 0, 0], model.alphas[0], atol=1e-7, rtol=0)


class PackedDocuments(PackedWordAttention):
    """Both levels of that network: documents packed over their sentences, the word level run on the packed
    sentences (``packed_docs.data``: sentences in the packed, sorted order, pooled into sentence vectors), the
    sentence level's GRU on ``PackedSequence(sentence_vectors, ...)``, and its weights padded back to the
    documents' order. The sentences' positions are numbered in the packed order, the weights' rows are in the
    documents' own."""

    def __init__(self):
        super().__init__()  # (the sentence level: its GRU over sentence vectors, its context vector)
        self.words = PackedWordAttention()

    def forward(self, docs, sentences, words):
        packed_docs = nn.utils.rnn.pack_padded_sequence(
            docs, sentences, batch_first=True, enforce_sorted=False
        )
        packed_words = nn.utils.rnn.pack_padded_sequence(
            words, sentences, batch_first=True, enforce_sorted=False
        )
        vecs = self.words(packed_docs.data, packed_words.data)
        seq = nn.utils.rnn.PackedSequence(vecs, packed_docs.batch_sizes, packed_docs.sorted_indices,
                                          packed_docs.unsorted_indices)  # fmt: skip
        packed, _ = self.rnn(seq)
        return self.attend(packed)


def test_sentence_weights_over_sentences_pooled_in_packed_order_keep_the_documents_order():
    """The sentence-level record took its rows in the order the sentences' positions were numbered (the
    packed, sorted one), not the order the weights hold them: documents' maps under other documents."""
    torch.manual_seed(4)
    sentences = torch.tensor([2, 4, 1, 3])
    words = torch.zeros(4, 4, dtype=torch.long)
    docs = torch.zeros(4, 4, 5, dtype=torch.long)
    for b, s in enumerate(sentences.tolist()):
        for j in range(s):
            n = int(torch.randint(1, 6, ()))
            words[b, j] = n
            docs[b, j, :n] = torch.randint(1, VOCAB, (n,))
    model = PackedDocuments().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(docs, sentences, words)
    word, sentence = cap.records
    assert word.exact and sentence.exact and not cap.notes, cap.notes
    torch.testing.assert_close(word.probs[:, 0, 0], model.words.alphas[0], atol=1e-7, rtol=0)
    torch.testing.assert_close(sentence.probs[:, 0, 0], model.alphas[0], atol=1e-7, rtol=0)


def test_softmaxes_the_block_runs_outside_the_model_are_recorded_only_where_they_weigh_values():
    """Code in the block after the forward (MiniLM's value-relation distillation target ``softmax(V V^T)``,
    CLIP's label probabilities): its weights multiply nothing, so it is not the model's attention and only a
    note says it ran. A plain function's attention in the block over the model's output, whose weights do
    multiply values, is recorded as before."""
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 8)
    with capture_attention(model) as cap:  # (gradients on: the layer's Python path, its maps recorded)
        h = model(x)
        v = h.view(2, 5, 2, 4).transpose(1, 2)
        relation = (v @ v.transpose(-1, -2) / 2.0).softmax(-1)  # a distillation target: weighs nothing
        loss = -(relation * relation.log()).sum()
    assert [r.name for r in cap.records] == ["self_attn"]
    (note,) = [s for s in cap.skipped if s.module == "(outside the model)"]
    assert "multiplied no values" in note.reason and note.shape == (2, 2, 5, 5)
    assert loss.requires_grad
    with capture_attention(model) as cap:
        h = model(x)
        w = (h @ h.transpose(-1, -2)).softmax(-1)
        y = w @ h  # a plain function's attention over the model's output: it weighs values
    assert [r.name for r in cap.records] == ["self_attn", ""]
    assert cap.records[1].exact and torch.equal(cap.records[1].probs[:, 0], w.detach())
    assert y.shape == h.shape


def test_a_forward_without_self_called_directly_is_the_models_and_outside_attention_that_weighs_stays():
    """A forward patched in as ``def forward(module, x)`` and called as ``model.forward(x)`` (no frame holds a
    ``self``): its attention is the model's, never dropped as the block's own. Attention the block computes
    after the model returned whose weights weigh values by a broadcast product and a sum, or whose output is
    gated before a projection, is recorded too."""
    import types

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.o = nn.Linear(8, 24), nn.Linear(8, 8)
            self.rel = nn.Parameter(torch.randn(6, 6, 4))

    def forward(module, x):  # Music Transformer's relative values: the weights multiply more than v
        b, n, _ = x.shape
        q, k, v = module.qkv(x).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
        p = (q @ k.transpose(-1, -2) / 2).softmax(-1)
        out = p @ v + torch.einsum("bhqk,qkd->bhqd", p, module.rel)
        return module.o(out.transpose(1, 2).reshape(b, n, 8))

    torch.manual_seed(0)
    model = Block().eval()
    model.forward = types.MethodType(forward, model)
    with torch.no_grad(), capture_attention(model) as cap:
        model.forward(torch.randn(2, 6, 8))
    assert len(cap.records) == 1 and not [s for s in cap.skipped if s.module == "(outside the model)"]
    model = nn.Linear(8, 8)
    x = torch.randn(2, 5, 8)
    with torch.no_grad(), capture_attention(model) as cap:
        h = model(x)
        w = (h @ h.transpose(-1, -2)).softmax(-1)
        (w.unsqueeze(-1) * h.unsqueeze(1)).sum(2)  # weights times values by broadcast
    assert len(cap.records) == 1 and not [s for s in cap.skipped if s.module == "(outside the model)"]


def test_the_hooks_that_tell_the_models_call_returned_are_the_models_own_and_go_with_the_block():
    """Where no torch.nn encoder layer of the model looks for hooks, whether the model's call has returned is
    told by hooks on the model alone (every other module's call stays on torch's path without hooks): a
    softmax the block runs after the call that weighs nothing is noted, not recorded, and the hooks are gone
    after the block, also when it raises."""

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
            return ((q @ k.transpose(-1, -2) / 2).softmax(-1) @ v).transpose(1, 2).reshape(b, n, 8)

    torch.manual_seed(0)
    model = nn.Sequential(Attention(), nn.Linear(8, 8)).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad(), capture_attention(model) as cap:
        assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
        assert not torch.nn.modules.module._global_forward_hooks
        h = model(x)
        (h @ h.transpose(-1, -2)).softmax(-1)  # after the call: the caller's, weighing nothing
    assert [r.name for r in cap.records] == ["0"] and cap.records[0].exact
    assert [s.shape for s in cap.skipped if s.module == "(outside the model)"] == [(2, 1, 5, 5)]
    assert not model._forward_pre_hooks and not model._forward_hooks
    with pytest.raises(RuntimeError, match="stop"), capture_attention(model):
        model(x)
        raise RuntimeError("stop")
    assert not model._forward_pre_hooks and not model._forward_hooks
    scripted = torch.jit.script(nn.Sequential(nn.Linear(8, 8)))  # takes no hook of its own: global ones
    with torch.no_grad(), capture_attention(scripted) as cap:
        scripted(x)
    assert any("TorchScript" in n for n in cap.notes) and not torch.nn.modules.module._global_forward_hooks


class PackedRegions(nn.Module):
    """ruotianluo's captioning TopDown: region features through pack_padded_sequence and pad_packed_sequence
    (``pack_wrapper``), then additive attention of a state over them, renormalized over the real regions."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb = nn.Linear(10, d)
        self.h2att, self.ctx2att, self.alpha_net = nn.Linear(d, 5), nn.Linear(d, 5), nn.Linear(5, 1)

    def forward(self, feats, lengths, mask):
        from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(feats, lengths, batch_first=True, enforce_sorted=False)
        x, _ = pad_packed_sequence(
            PackedSequence(
                self.emb(packed.data), packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices
            ),
            batch_first=True,
        )
        dot = self.alpha_net(torch.tanh(self.ctx2att(x) + self.h2att(x.sum(1)).unsqueeze(1))).squeeze(2)
        w = torch.softmax(dot, dim=1) * mask
        self.used = w / w.sum(1, keepdim=True)
        return torch.bmm(self.used.unsqueeze(1), x)


@pytest.mark.parametrize("lengths", [(3, 5), (5, 3, 4)])
def test_padding_in_other_places_per_sequence_labels_no_key_as_padding(lengths):
    """pad_packed_sequence pads each sequence to the longest: the first sequence's padded slots were the
    record's key labels for every sequence, so a trace of a longer one drew its real keys as learned
    padding columns. A padded slot is a position of its sequence (as its PAD token is): no key is labelled."""
    torch.manual_seed(0)
    lens = torch.tensor(lengths)
    mask = (torch.arange(5)[None] < lens[:, None]).float()
    model = PackedRegions().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(len(lengths), 5, 10) * mask[..., None], lens, mask)
    (rec,) = cap.records
    assert rec.exact and rec.key_labels is None
    torch.testing.assert_close(rec.probs[:, 0, 0], model.used, atol=1e-7, rtol=0)
    for b in range(len(lengths)):
        tr = cap.trace(b)
        assert tr.probs(rec.kind).shape[-1] == 5 and tr.learned(rec.kind) is None


class ShowAttendTellSteps(ShowAttendTell):
    """The decoding loop: at step t only the captions still running (``batch_size_t``, the first rows of the
    sorted batch) attend, ``encoder_out[:batch_size_t]``."""

    def forward(self, imgs, lengths):
        lengths, sort_ind = lengths.sort(dim=0, descending=True)
        encoder_out = self.conv(imgs).flatten(2).transpose(1, 2)[sort_ind]
        h = encoder_out.mean(1)
        outs = []
        for t in range(int(lengths.max())):
            bt = int((lengths > t).sum())
            enc = encoder_out[:bt]
            att = self.full_att(torch.relu(self.enc_att(enc) + self.dec_att(h[:bt]).unsqueeze(1))).squeeze(2)
            alpha = nn.Softmax(dim=1)(att)
            outs.append((enc * alpha.unsqueeze(2)).sum(1))
        return outs


def test_the_steps_of_a_sorted_batch_that_shrinks_keep_their_flag():
    """Every step whose rows are some of the sorted batch's holds other sequences than the caller's at its
    rows: flagged like the first step (the steps after the batch shrank were exact)."""
    torch.manual_seed(0)
    model = ShowAttendTellSteps().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(3, 3, 3, 3), torch.tensor([2, 4, 3]))
    by_rows = {int(r.probs.shape[0]): r for r in cap.records}
    assert sorted(by_rows) == [1, 2, 3]
    # sorted [1, 2, 0]; then the first two, [1, 2]; then the first, [1]
    assert not by_rows[3].exact and not by_rows[2].exact and not by_rows[1].exact
    assert "sequence [1, 2][b]" in by_rows[2].flag and "sequence [1][b]" in by_rows[1].flag


EXEC_SOURCE = """
import torch
from torch import nn


def attend(q, k, v):
    return (q @ k.transpose(-1, -2)).softmax(-1) @ v


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.q, self.k = nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, ids):
        x = self.emb(ids)
        return attend(self.q(x), self.k(x), x)
"""


def test_a_model_built_by_exec_whose_functions_name_no_module_is_captured():
    """Code generated at run time (``exec`` in a namespace without ``__name__``): its functions'
    ``__module__`` is None, and capture raised AttributeError on entry."""
    namespace: dict = {}
    exec(EXEC_SOURCE, namespace)  # noqa: S102 (the test's own source)
    assert namespace["attend"].__module__ is None
    model = namespace["Model"]().eval()
    ids = torch.randint(0, 10, (2, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    x = model.emb(ids)
    torch.testing.assert_close(rec.probs[:, 0], (model.q(x) @ model.k(x).transpose(-1, -2)).softmax(-1))
    assert rec.exact and rec.kind == "enc_self"


class BeamSteps(nn.Module):
    """A KV-cached decoder step by step, the cache reordered by the beams kept (``index_select(0, beam_idx)``)."""

    def __init__(self, heads: int = 2, d_head: int = 4):
        super().__init__()
        self.h, self.dh = heads, d_head
        self.emb = nn.Embedding(20, heads * d_head)
        self.q, self.k, self.v = (nn.Linear(heads * d_head, heads * d_head) for _ in range(3))
        self.used: list[torch.Tensor] = []

    def step(self, tok, cache):
        x = self.emb(tok)

        def heads(t):
            return t.view(t.size(0), -1, self.h, self.dh).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        if cache:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        p = (q @ k.transpose(-1, -2) / self.dh**0.5).softmax(-1)
        self.used.append(p)
        return p @ v, (k, v)

    def forward(self, tok, reorders):
        ys = tok
        _, cache = self.step(ys[:, -1:], None)
        for beam_idx in reorders:
            cache = tuple(c.index_select(0, beam_idx) for c in cache)
            ys = torch.cat([ys.index_select(0, beam_idx), (ys[:, -1:] * 3 + 1) % 20], dim=1)
            _, cache = self.step(ys[:, -1:], cache)


@pytest.mark.parametrize("second", [[1, 0, 2, 3], [0, 1, 2, 3], [3, 3, 0, 1]])
def test_beam_steps_whose_histories_weigh_the_same_stay_exact(second):
    """Rows were grouped by a sum linear in their keys' positions: after the reorders [0, 1, 0, 1] then
    [1, 0, 2, 3], row 0 read source rows (1, 1, 0) and row 1 (0, 0, 1), 1*1 + 2*1 = 3*1, and the step was
    flagged "rows of one sequence and head see different keys … (a guess)"."""
    torch.manual_seed(0)
    model = BeamSteps().eval()
    reorders = [torch.tensor([0, 1, 0, 1]), torch.tensor(second)]
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[3], [5], [7], [11]]), reorders)
    assert len(cap.records) == 3 and not cap.notes, cap.notes
    for rec, want in zip(cap.records, model.used, strict=True):
        assert rec.exact and torch.equal(rec.probs, want)
    # row b's keys: the rows its beam came from at each step, then its own new position
    came = [torch.arange(4)]
    for r in reorders:
        came = [c[r] for c in came] + [torch.arange(4)]
    want_keys = torch.stack([c + 4 * i for i, c in enumerate(came)], -1)
    assert torch.equal(cap.records[-1].key_positions, want_keys)


class SequenceFirstDrop(nn.Module):
    """OpenNMT-py's decoding: ids (S, B), the encoder batch-first, its memory bank kept (S, B, D), finished
    sentences dropped by ``memory_bank.index_select(1, select_indices)`` with indices from a score's top-k,
    then a cross-attention step over what is left."""

    def __init__(self, heads: int = 2, d_head: int = 4):
        super().__init__()
        self.h, self.dh, d = heads, d_head, heads * d_head
        self.src_emb, self.tgt_emb = nn.Embedding(20, d), nn.Embedding(20, d)
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
        self.used: list[torch.Tensor] = []

    def attend(self, x, mem):
        n = x.size(0)

        def heads(t):
            return t.view(n, -1, self.h, self.dh).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(mem)), heads(self.v(mem))
        p = torch.softmax(q @ k.transpose(2, 3) / self.dh**0.5, -1)
        self.used.append(p)
        return (p @ v).transpose(1, 2).reshape(n, -1, self.h * self.dh)

    def forward(self, src, tgt):
        x = self.src_emb(src).transpose(0, 1)
        memory_bank = (x + self.attend(x, x)).transpose(0, 1)
        select = memory_bank.sum((0, 2)).topk(src.size(1) - 1).indices.sort().values
        memory_bank = memory_bank.index_select(1, select)
        y = self.tgt_emb(tgt.index_select(1, select)).transpose(0, 1)
        return self.attend(y, memory_bank.transpose(0, 1))


@pytest.mark.parametrize("batch", [2, 3, 5])
def test_whole_sentences_dropped_from_a_sequence_first_memory_pick_no_positions(batch):
    """A sequence of (S, B) ids is a column: dropping whole columns by indices from the data was taken for
    positions picked from each row, and every record, the encoder's before any drop too, was flagged
    "the keys are some of a sequence's positions, picked by indices the model computed from its data"."""
    torch.manual_seed(batch)
    model = SequenceFirstDrop().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (6, batch)), torch.randint(0, 20, (1, batch)))
    enc, step = cap.records
    assert torch.equal(enc.probs, model.used[0]) and torch.equal(step.probs, model.used[1])
    assert enc.exact and enc.kind == "enc_self" and not any("picked by indices" in n for n in cap.notes)
    assert step.kind == "cross" and tuple(step.probs.shape) == (batch - 1, 2, 1, 6)


class PickedThenAsk(nn.Module):
    """Image tokens kept by a score's top-k (EViT; tomesd merges them before ``attn2``), then cross-attention
    from the kept tokens to a caption; ``pick`` False: every image token asks."""

    def __init__(self, pick: bool):
        super().__init__()
        self.pick = pick
        self.img, self.txt, self.score = nn.Linear(6, 8), nn.Embedding(30, 8), nn.Linear(8, 1)
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)
        self.used: list[torch.Tensor] = []

    def forward(self, patches, ids):
        x = self.img(patches)
        if self.pick:
            idx = self.score(x).squeeze(-1).topk(4, dim=1).indices
            x = x.gather(1, idx[..., None].expand(-1, -1, 8))
        ctx = self.txt(ids)
        a = (self.q(x) @ self.k(ctx).transpose(1, 2)).softmax(-1)
        self.used.append(a)
        return a @ ctx


@pytest.mark.parametrize("pick", [True, False])
@pytest.mark.parametrize("batch", [1, 3])
def test_cross_attention_from_queries_picked_by_the_data_is_flagged(pick, batch):
    """Self-attention over tokens a score picked was flagged; cross-attention from them was exact, its rows
    drawn as #0, #1, … though they are the patches the score chose, in its order."""
    torch.manual_seed(batch)
    model = PickedThenAsk(pick).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 9, 6), torch.randint(0, 30, (batch, 5)))
    (rec,) = cap.records
    assert rec.kind == "cross" and torch.equal(rec.probs[:, 0], model.used[0])
    if pick:
        assert not rec.exact and rec.flag.startswith("the queries are some of a sequence's positions")
    else:
        assert rec.exact and not cap.notes


class SingleKeyHead(nn.Module):
    """Multi-query attention with its one key head kept as an axis of one, ``(b, 1, n, d)``, broadcast over
    the query heads by an einsum (lucidrains' ``'... i d, ... j d -> ... i j'``) or by matmul."""

    def __init__(self, heads: int, how: str):
        super().__init__()
        self.h, self.how = heads, how
        self.emb, self.q, self.kv = (
            nn.Embedding(VOCAB, 4 * heads),
            nn.Linear(4 * heads, 4 * heads),
            nn.Linear(4 * heads, 8),
        )
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, 4).transpose(1, 2)
        k, v = self.kv(x).unsqueeze(1).chunk(2, dim=-1)
        sim = q @ k.transpose(-1, -2) if self.how == "matmul" else torch.einsum(self.how, q, k)
        a = sim.softmax(-1)
        self.used.append(a)
        return a @ v


@pytest.mark.parametrize("how", ["... i d, ... j d -> ... i j", "bhid,bhjd->bhij", "matmul"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_a_key_head_broadcast_by_einsum_is_recorded(how, batch, heads):
    """The einsum's map took the key's axis of one as the heads' and raised IndexError inside capture: the
    map was lost behind a note naming neither module nor reason."""
    torch.manual_seed(batch)
    model = SingleKeyHead(heads, how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert not cap.notes, cap.notes
    assert rec.exact and rec.kind == "enc_self" and torch.equal(rec.probs, model.used[0])


class OneSentence(nn.Module):
    """A port of NumPy or Keras code, one sentence of ids ``(n,)``: scores by ``tensordot`` (NumPy's
    ``np.tensordot(q, k, axes=([1], [1]))``), by ``addmm`` with a relative bias (``alpha`` the scale), or
    by ``@``; the weights times the values by ``tensordot`` too."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.emb, self.q, self.k = nn.Embedding(VOCAB, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.rel = nn.Parameter(torch.randn(6, 6))
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        q, k = self.q(x), self.k(x)
        n = ids.shape[0]
        if self.how == "tensordot":
            s = torch.tensordot(q, k, dims=([1], [1])) / 8**0.5
        elif self.how == "tensordot k.T":
            s = torch.tensordot(q, k.T, dims=1) / 8**0.5
        elif self.how == "addmm":
            s = torch.addmm(self.rel[:n, :n], q, k.T, alpha=8**-0.5)
        else:
            s = q @ k.T / 8**0.5 + (self.rel[:n, :n] if self.how == "@ + bias" else 0)
        a = s.softmax(-1)
        self.used.append(a)
        return torch.tensordot(a, x, dims=([1], [0]))


@pytest.mark.parametrize("how", ["tensordot", "tensordot k.T", "addmm", "@", "@ + bias"])
def test_scores_by_tensordot_or_addmm_are_scores(how):
    """``tensordot(q, k, dims=([1], [1]))`` is ``q @ k.T``: its softmax was skipped as "a softmax over a
    projection's output" though it weighs the values (silence); ``addmm(bias, q, k.T)`` was read as a
    projection, and the map was warned of with a false reason. Both are recorded as ``@`` is."""
    torch.manual_seed(0)
    model = OneSentence(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (6,)))
    (rec,) = cap.records
    assert not cap.notes and not cap.skipped, (cap.notes, cap.skipped)
    assert rec.exact and rec.kind == "enc_self" and torch.equal(rec.probs[0, 0], model.used[0])


def test_bookkeeping_that_fails_names_its_module_and_what_is_lost(monkeypatch):
    """An internal error while following an op was a bare note (``softmax: IndexError: ...``)."""
    from attnscope.core.families import lineage

    def broken(*args, **kwargs):
        raise IndexError("index 2 is out of bounds")

    monkeypatch.setattr(lineage, "einsum_map", broken)
    model = SingleKeyHead(2, "bhid,bhjd->bhij").eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (2, 5)))
    assert cap.notes and all("capture could not follow its einsum (IndexError" in n for n in cap.notes[:1])
    assert "attention computed from what it returned is not recorded" in cap.notes[0]


class BufferedScores(nn.Module):
    """Megatron's memory-saving core attention: scores written in place into a preallocated buffer
    (``buf.baddbmm_(q, k.T, beta=0, alpha)``), the context into another (``torch.bmm(p, v, out=ctx)``)."""

    def __init__(self, inplace: bool, ctx_out: bool):
        super().__init__()
        self.inplace, self.ctx_out = inplace, ctx_out
        self.emb, self.qkv = nn.Embedding(VOCAB, 8), nn.Linear(8, 24)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        b, s = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4).reshape(3, b * 2, s, 4)
        scores = torch.empty(b * 2, s, s)
        if self.inplace:
            scores.baddbmm_(q, k.transpose(1, 2), beta=0.0, alpha=0.5)
        else:
            scores = torch.baddbmm(scores, q, k.transpose(1, 2), beta=0.0, alpha=0.5)
        probs = torch.softmax(scores, -1)
        self.used.append(probs.view(b, 2, s, s))
        if self.ctx_out:
            ctx = torch.empty(b * 2, s, 4)
            torch.bmm(probs, v, out=ctx)
            return ctx
        return probs @ v


@pytest.mark.parametrize(("inplace", "ctx_out"), [(True, False), (True, True), (False, True)])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_scores_written_in_place_by_baddbmm_are_scores(inplace, ctx_out, batch):
    """``buf.baddbmm_(q, k.T)`` was no product of queries and keys to capture: no record, and a warning
    with a false reason, or with ``bmm(out=)`` nothing but a note calling it a projection's softmax."""
    torch.manual_seed(batch)
    model = BufferedScores(inplace, ctx_out).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert not cap.notes and not cap.skipped, (cap.notes, cap.skipped)
    assert rec.exact and torch.equal(rec.probs, model.used[0])


class GatheredKeys(nn.Module):
    """Context parallelism on one process: each rank's keys and values all-gathered the way
    ``dist.all_gather`` fills its list (``torch.empty_like`` buffers, ``copy_``), then causal attention of
    the last rank's queries; ``flip``: the keys copied reversed into one buffer."""

    def __init__(self, flip: bool, ranks: int = 2):
        super().__init__()
        self.flip, self.ranks = flip, ranks
        self.emb, self.q, self.k = nn.Embedding(VOCAB, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        q, k = self.q(x), self.k(x)
        if self.flip:
            buf = torch.empty_like(k)
            buf.copy_(k.flip(1))
            a = (q @ buf.transpose(1, 2)).softmax(-1)
            self.used.append(a)
            return a @ buf
        n = ids.shape[1] // self.ranks
        parts = [torch.empty_like(k[:, :n]) for _ in range(self.ranks)]
        for r, part in enumerate(parts):
            part.copy_(k[:, r * n : (r + 1) * n])
        keys = torch.cat(parts, 1)
        mine = q[:, -n:]
        allowed = torch.ones(n, keys.shape[1], dtype=torch.bool).tril(keys.shape[1] - n)
        a = (mine @ keys.transpose(1, 2)).masked_fill(~allowed, float("-inf")).softmax(-1)
        self.used.append(a)
        return a @ keys


@pytest.mark.parametrize("flip", [False, True])
def test_buffers_filled_by_copy_hold_what_was_copied(flip):
    """``torch.empty_like(k)`` kept the positions of ``k`` after ``copy_`` wrote something else into it:
    gathered keys were numbered as the local ones (an exact record with wrong key positions, called an
    encoder), and keys copied reversed were exact in the wrong order."""
    torch.manual_seed(0)
    model = GatheredKeys(flip).eval()
    ids = torch.randint(1, VOCAB, (2, 6))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert torch.equal(rec.probs[:, 0], model.used[0])
    if flip:  # positions in another order inside a sequence: flagged, as without the buffer
        assert not rec.exact
    else:
        assert rec.exact and rec.kind == "dec_self"
        assert torch.equal(rec.key_positions, torch.arange(12).view(2, 6))


class SplitAndPadded(nn.Module):
    """Graphs (point clouds) of several sizes concatenated into one tensor, cut by ``torch.split`` and padded
    by ``pad_sequence`` (batch first or not, padded on the right or left), then one attention."""

    def __init__(self, batch_first: bool, side: str):
        super().__init__()
        self.batch_first, self.side = batch_first, side
        self.emb, self.qk = nn.Embedding(12, 8), nn.Linear(8, 16)
        self.used: list[torch.Tensor] = []

    def forward(self, z, counts):
        x = pad_sequence(
            torch.split(self.emb(z), counts.tolist()), batch_first=self.batch_first, padding_side=self.side
        )
        if not self.batch_first:
            x = x.transpose(0, 1)
        n = x.shape[1]
        pos = torch.arange(n)[None, :]
        real = pos < counts[:, None] if self.side == "right" else pos >= n - counts[:, None]
        q, k = self.qk(x).chunk(2, -1)
        a = (q @ k.transpose(1, 2)).masked_fill(~real[:, None, :], float("-inf")).softmax(-1)
        self.used.append(a)
        return a @ x


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_sequence_over_split_pieces_keeps_each_sequences_positions(batch_first, side):
    """pad_sequence was followed position-wise: every row took the longest piece's positions, so the
    pieces' records were wrong in their positions, and layers over equal pieces one call each were joined
    as layers of one sequence."""
    torch.manual_seed(0)
    counts = torch.tensor([3, 5, 2])
    model = SplitAndPadded(batch_first, side).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 12, (10,)), counts)
    (rec,) = cap.records
    assert rec.exact and not cap.notes, cap.notes
    assert torch.equal(rec.probs[:, 0], model.used[0])
    starts = [0, 3, 8]
    for b, (start, n) in enumerate(zip(starts, counts.tolist(), strict=True)):
        real = rec.query_positions[b, :n] if side == "right" else rec.query_positions[b, 5 - n :]
        assert real.tolist() == list(range(start, start + n))
    assert rec.query_labels is None and rec.key_labels is None  # (padding in other places in each row)


class DenseBatch(nn.Module):
    """PyG's ``to_dense_batch`` by hand: the nodes of several graphs, one tensor with a ``batch`` vector,
    written into a zeros buffer at (graph, position) by index assignment or ``index_put_``, then attention
    with the padding masked."""

    def __init__(self, how: str, heads: int = 2):
        super().__init__()
        self.how, self.h = how, heads
        self.emb, self.qk = nn.Embedding(11, 4 * heads), nn.Linear(4 * heads, 8 * heads)
        self.used: list[torch.Tensor] = []

    def forward(self, z, batch):
        h = self.emb(z)
        b = int(batch.max()) + 1
        counts = torch.bincount(batch, minlength=b)
        ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        pos = torch.arange(batch.numel()) - ptr[batch]
        n = int(counts.max())
        mask = torch.zeros(b, n, dtype=torch.bool)
        mask[batch, pos] = True
        x = h.new_zeros(b, n, h.shape[-1])
        if self.how == "index_put_":
            x.index_put_((batch, pos), h)
        else:
            x[batch, pos] = h
        q, k = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qk(x).chunk(2, -1))
        a = (q @ k.transpose(-1, -2)).masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)
        self.used.append(a)
        return (a @ x[:, None])[mask[:, None].expand(-1, self.h, -1)]


@pytest.mark.parametrize("how", ["setitem", "index_put_"])
def test_nodes_written_into_a_dense_batch_by_index_put_are_followed(how):
    """``index_put_`` lost the lineage the same write by ``x[batch, pos] = h`` keeps: nothing recorded."""
    torch.manual_seed(0)
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor([4, 3, 5]))
    model = DenseBatch(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 11, (12,)), batch)
    (rec,) = cap.records
    assert rec.exact and not cap.notes, cap.notes
    assert torch.equal(rec.probs, model.used[0])
    assert rec.query_positions[:, 0].tolist() == [0, 4, 7]  # each graph's first node


class RowsThroughMHA(nn.Module):
    """Equal-size sets attended one call each through torch's ``nn.MultiheadAttention``
    (``attn(x[i:i+1], ...)`` in a loop over the batch), as the same loop over a hand-written attention."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.attns = nn.ModuleList(nn.MultiheadAttention(8, 2, batch_first=True) for _ in range(2))
        self.used: list[list[torch.Tensor]] = [[], []]

    def forward(self, ids):
        x = self.emb(ids)
        for layer, attn in enumerate(self.attns):
            rows = []
            for i in range(ids.shape[0]):
                y, w = attn(x[i : i + 1], x[i : i + 1], x[i : i + 1], average_attn_weights=False)
                self.used[layer].append(w)
                rows.append(y)
            x = x + torch.cat(rows)
        return x


@pytest.mark.parametrize("batch", [2, 3])
def test_multihead_attention_called_a_row_at_a_time_is_one_record_per_layer(batch):
    """Its records (from the call's arguments, no keys' positions) were never joined: one record per row,
    and a trace drew the last row's map as sequence 0's."""
    torch.manual_seed(batch)
    model = RowsThroughMHA().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 4)))
    assert [tuple(r.probs.shape) for r in cap.records] == [(batch, 2, 4, 4)] * 2, cap.notes
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact
        torch.testing.assert_close(rec.probs, torch.cat(used))


class TwoLayerEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(VOCAB, 8), nn.ModuleList(nn.Linear(8, 24) for _ in range(2))

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.qkv:
            q, k, v = layer(x).chunk(3, -1)
            x = x + (q @ k.transpose(1, 2)).softmax(-1) @ v
        return x


@pytest.mark.parametrize("order", ["captured first", "other first"])
def test_another_model_called_in_the_block_is_said_and_not_recorded_as_the_models(order):
    """``capture_attention(a)`` around ``a(x); b(x)``: b's maps were the root's, exact, two more layers of a.
    They are b's, not a's: left out and said; the block's own attention (a plain function, torch.nn's
    stateless softmax) is still the caller's, recorded."""
    torch.manual_seed(0)
    a, b = TwoLayerEncoder().eval(), TwoLayerEncoder().eval()
    ids = torch.randint(1, VOCAB, (2, 5))
    with torch.no_grad(), capture_attention(a) as cap:
        out = {id(model): model(ids) for model in ((a, b) if order == "captured first" else (b, a))}
        h = out[id(a)]
        w = nn.Softmax(dim=-1)(h @ h.transpose(1, 2))  # the block's own attention over a's output
        w @ h
    assert len(cap.records) == 3  # a's two layers, then the block's own map over a's output
    with torch.no_grad():
        x = a.emb(ids)
        for rec, layer in zip(cap.records, a.qkv, strict=False):
            q, k, v = layer(x).chunk(3, -1)
            want = (q @ k.transpose(1, 2)).softmax(-1)
            x = x + want @ v
            assert rec.kind == "enc_self" and rec.exact and torch.equal(rec.probs[:, 0], want)
        assert torch.equal(cap.records[2].probs[:, 0], (x @ x.transpose(1, 2)).softmax(-1))
    said = [n for n in cap.skipped if "attention of another model called in the block" in n.reason]
    assert len(said) == 1 and said[0].module == "TwoLayerEncoder" and said[0].level == "info"
    assert not [n for n in cap.notes if "no softmax" in n]
