"""What attention moves, for models seen through capture: the values each record's weights multiply and,
where lineage finds the projection that reads the heads merged back, its slice per head. Exact: for every
style in tests/usermodels whose projection is found, sum_h sum_j alpha_ij f_h(x_j) + b_O equals that
projection's output; nn.MultiheadAttention (and adapters built on nn.Transformer) likewise."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnscope
from attnscope.core.families import values as V
from attnscope.core.families.capture import capture_attention

ROOT = Path(__file__).resolve().parents[1]


def _styles() -> list[str]:
    import usermodels

    names = [m.name for m in pkgutil.iter_modules(usermodels.__path__)]
    return sorted(n for n in names if hasattr(_style(n), "build") and hasattr(_style(n), "sample_batch"))


def _style(name: str):
    return importlib.import_module(f"usermodels.{name}")


def _seen(modules, run, inputs: bool = False) -> tuple[object, list[tuple[nn.Module, torch.Tensor]]]:
    """``run()``, and each call of ``modules`` during it, in call order: (module, its output), or
    (module, its first input) with ``inputs``."""
    seen: list[tuple[nn.Module, torch.Tensor]] = []
    if inputs:
        hooks = [m.register_forward_pre_hook(lambda m, a: seen.append((m, a[0].detach()))) for m in modules]
    else:
        hooks = [m.register_forward_hook(lambda m, _a, o: seen.append((m, o.detach()))) for m in modules]
    try:
        result = run()
    finally:
        for h in hooks:
            h.remove()
    return result, seen


def _captured(model: nn.Module, *args, **kwargs):
    """The capture of ``model(*args, **kwargs)`` (no gradients)."""
    with torch.no_grad(), capture_attention(model) as cap:
        model(*args, **kwargs)
    return cap


def _linear_outputs(model: nn.Module, run) -> tuple[object, list[torch.Tensor]]:
    result, seen = _seen([m for m in model.modules() if isinstance(m, nn.Linear)], run)
    return result, [o for _, o in seen]


def _has(rec) -> bool:
    """The record kept values that could be confirmed (they are made on first use)."""
    return rec.values is not None and rec.values.values is not None


def _rebuilt(rec) -> torch.Tensor:
    """sum_h sum_j alpha_ij f_h(x_j) + b_O, (B, q, D)."""
    hv = rec.values
    out = torch.einsum("bhqk,bhkd->bqd", rec.probs.float(), hv.vectors().float())
    return out + hv.b_o.float() if hv.b_o is not None else out


STYLES = _styles()


@pytest.mark.parametrize("name", STYLES)
def test_every_found_projection_is_rebuilt_exactly(name):
    mod = _style(name)
    model = mod.build()
    batch = mod.sample_batch()

    cap, outs = _linear_outputs(model, lambda: _captured(model, *batch))
    # a projection written as an einsum over a kernel (a Flax port's "bqhk,hkd->bqd"): its module's output
    seen_outs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _a, o: seen_outs.append(o.detach()) if isinstance(o, torch.Tensor)
                                     else None) for m in model.modules() if not isinstance(m, nn.Linear)]  # fmt: skip
    try:
        with torch.no_grad():
            model(*batch)
    finally:
        for h in hooks:
            h.remove()
    outs = [*outs, *seen_outs]
    # (MultiheadAttention applies its out_proj with F.linear, not the module, and Keras' projection is an
    # einsum plus a bias inside its module: each is checked on its own below)
    with_wo = [r for r in cap.records if _has(r) and r.values.w_o is not None
               and r.source != "nn.MultiheadAttention" and name != "keras_port_einsum"]  # fmt: skip
    for rec in with_wo:
        want = _rebuilt(rec)
        hits = [
            o
            for o in outs
            if tuple(o.shape) == tuple(want.shape) and torch.allclose(o.float(), want, atol=1e-5)
        ]
        hits += [o for o in outs if o.dim() == 3 and tuple(o.transpose(0, 1).shape) == tuple(want.shape)
                 and torch.allclose(o.transpose(0, 1).float(), want, atol=1e-5)]  # fmt: skip
        assert hits, f"{name} {rec.name}: no projection output equals the decomposition"
    for rec in cap.records:
        if _has(rec):  # the norms are the vectors' norms
            np.testing.assert_allclose(rec.values.norms().numpy(), rec.values.vectors().float().norm(dim=-1).numpy(),
                                       rtol=1e-4, atol=1e-5)  # fmt: skip


def test_most_styles_find_their_output_projection_and_residual():
    found, missing, residual = [], [], []
    for name in STYLES:
        mod = _style(name)
        model, batch = mod.build(), mod.sample_batch()
        cap = _captured(model, *batch)
        recs = [r for r in cap.records if r.exact]
        (
            found
            if recs and all(r.values is not None and r.values.w_o is not None for r in recs)
            else missing
        ).append(name)
        if name in found and all(r.residual is not None for r in recs):
            residual.append(name)
    assert len(found) >= 37, (found, missing)  # grouped- and multi-query, einsum, keys-first, Transformer-XL
    assert len(residual) >= 31, sorted(set(found) - set(residual))  # the norm-based rollout is offered


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_is_rebuilt_exactly_with_padding(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    x = torch.randn(3, 6, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 2 + [True] * 4])
    xin = x if batch_first else x.transpose(0, 1)
    with torch.no_grad(), capture_attention(mha) as cap:
        out, _ = mha(xin, xin, xin, key_padding_mask=pad, need_weights=False)
    (rec,) = cap.records
    assert rec.values is not None and rec.values.scope == V.WITH_WO
    got = out if batch_first else out.transpose(0, 1)
    torch.testing.assert_close(_rebuilt(rec), got, atol=1e-5, rtol=1e-5)


def test_an_adapter_trace_carries_value_norms():
    lm = attnscope.load(str(ROOT / "examples" / "my_adapter.py"))
    tr = lm.trace(["hello", "abc"], ["olleh", "cba"])[1]
    for kind in tr.kinds:
        norms = tr.value_norms(kind)
        assert norms is not None and norms.shape == (*tr.probs(kind).shape[:2], tr.probs(kind).shape[-1])
        assert tr.value_norms_scope(kind) == V.WITH_WO
    rows = tr.moves("cross", normalize=True).sum(-1)
    np.testing.assert_allclose(rows, 1.0, atol=1e-5)
    # nn.Transformer's MultiheadAttention output is followed to the residual sum: the norm rollout is offered
    from attnscope.core.analysis.analytics import has_norms, trace_rollout

    assert has_norms(tr, "enc_self") and tr.residual_norms("enc_self").shape == tr.probs("enc_self").shape[
        :1
    ] + (len(tr.src_tokens),)
    np.testing.assert_allclose(
        trace_rollout(tr, valid=tr.src_real, method="norm")[-1].sum(-1), 1.0, atol=1e-6
    )


def test_a_captured_trace_keeps_its_scope_in_the_file(tmp_path):
    from usermodels import nanogpt

    model, batch = nanogpt.build(), nanogpt.sample_batch()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*batch)
    (ids,) = batch
    tr = cap.trace(0, tgt_tokens=[str(i) for i in ids[0].tolist()])
    path = tr.save(tmp_path / "t.npz")
    back = attnscope.AttentionTrace.load(path)
    for kind in tr.kinds:
        assert back.value_norms_scope(kind) == tr.value_norms_scope(kind)
        np.testing.assert_allclose(back.value_norms(kind), tr.value_norms(kind), rtol=1e-6)


def test_a_second_term_after_the_weights_leaves_no_values():
    """Shaw's relative attention adds sum_j alpha_ij a_ij to the heads' output: what moves from a key is
    not its value vector alone, so no value norms are claimed."""
    from usermodels import shaw_relative

    model, batch = shaw_relative.build(), shaw_relative.sample_batch()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*batch)
    assert cap.records and not any(_has(r) for r in cap.records)


def test_sdpa_output_projection_is_followed():
    """SDPA returns the weights times the values: the projection that reads its heads merged back is
    found from lineage, so nanoGPT's c_proj gives each head's W_O slice and the decomposition rebuilds
    c_proj's output."""
    from usermodels import nanogpt

    model, batch = nanogpt.build(), nanogpt.sample_batch()

    cap, outs = _linear_outputs(model, lambda: _captured(model, *batch))
    assert cap.records
    for rec in cap.records:
        assert rec.source == "sdpa" and rec.values is not None and rec.values.scope == V.WITH_WO
        want = _rebuilt(rec)
        assert any(tuple(o.shape) == tuple(want.shape) and torch.allclose(o, want, atol=1e-5) for o in outs)


class _SDPABlock(nn.Module):
    """Hand-written SDPA block: grouped-query heads (kv_heads < heads), optionally a gate on the heads'
    output before the projection."""

    def __init__(self, d=32, heads=4, kv_heads=2, gated=False):
        super().__init__()
        self.h, self.kvh, self.gated = heads, kv_heads, gated
        self.emb = nn.Embedding(40, d)
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d // heads * kv_heads)
        self.g = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, ids, pad):
        x = self.emb(ids)
        b, n, d = x.shape
        dh = d // self.h
        q = self.q(x).view(b, n, self.h, dh).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kvh, dh).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad[:, None, None, :], enable_gqa=True)
        y = y.transpose(1, 2).reshape(b, n, d)
        if self.gated:
            y = y * torch.sigmoid(self.g(x))
        return self.o(y)


@pytest.mark.parametrize("gated", [False, True])
def test_sdpa_grouped_query_heads_and_gates(gated):
    torch.manual_seed(0)
    model = _SDPABlock(gated=gated).eval()
    ids = torch.randint(0, 40, (3, 6))
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 2 + [True] * 4])
    with torch.no_grad(), capture_attention(model) as cap:
        out = model(ids, pad)
    (rec,) = cap.records
    if gated:  # what moves from a key is no longer its value vector alone
        assert rec.values is None or rec.values.w_o is None
        return
    assert rec.values is not None and rec.values.scope == V.WITH_WO
    assert tuple(rec.values.w_o.shape) == (4, 32, 8)
    torch.testing.assert_close(_rebuilt(rec), out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "name,block,seq_first",
    [
        ("nanogpt", "Block", False),
        ("nanogpt_manual", "Block", False),
        ("fairseq_seqfirst", "DecoderLayer", True),
    ],
)
def test_residual_norms_are_the_stream_the_projection_is_added_to(name, block, seq_first):
    """Each record's residual norms are ||x_i|| of the block's input (x = x + attn(ln(x))), in the record's
    (batch, query) order whether the model runs batch-first or sequence-first (SDPA and softmax alike)."""
    mod = _style(name)
    model, batch = mod.build(), mod.sample_batch()
    blocks = [m for m in model.modules() if type(m).__name__ == block]
    cap, inputs = _seen(blocks, lambda: _captured(model, *batch), inputs=True)
    assert len(cap.records) == len(inputs) >= 2
    for rec, (_, x) in zip(cap.records, inputs, strict=True):
        want = x.norm(dim=-1)
        want = want.t() if seq_first else want  # -> (B, q)
        assert rec.residual is not None, rec.name
        torch.testing.assert_close(rec.residual, want, rtol=1e-5, atol=1e-5)


def test_a_captured_encoder_trace_offers_the_norm_rollout():
    from attnscope.core.analysis.analytics import has_norms, trace_rollout

    mod = _style("annotated")
    model, batch = mod.build(), mod.sample_batch()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*batch)
    tr = cap.trace(0)
    assert has_norms(tr, "enc_self")
    assert (
        tr.residual_norms("enc_self").shape
        == tr.probs("enc_self").shape[:1] + tr.probs("enc_self").shape[2:3]
    )
    roll = trace_rollout(tr, method="norm")
    np.testing.assert_allclose(roll[-1].sum(-1), 1.0, atol=1e-6)


def test_no_residual_where_the_projection_output_is_not_added_as_is():
    """A gate on the projection's output before the sum: the residual is not claimed."""

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv, self.o, self.g = (
                nn.Embedding(20, 16),
                nn.Linear(16, 48),
                nn.Linear(16, 16),
                nn.Linear(16, 16),
            )

        def forward(self, ids):
            x = self.emb(ids)
            b, n, d = x.shape
            q, k, v = (t.view(b, n, 4, 4).transpose(1, 2) for t in self.qkv(x).split(16, dim=-1))
            y = (q @ k.transpose(-1, -2) / 2).softmax(-1) @ v
            return x + self.o(y.transpose(1, 2).reshape(b, n, d)) * torch.sigmoid(self.g(x))

    torch.manual_seed(0)
    model = Gated().eval()
    (rec,) = _captured(model, torch.randint(0, 20, (2, 5))).records
    assert rec.values is not None and rec.values.w_o is not None and rec.residual is None


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_residual_is_the_layers_input(batch_first):
    """nn.TransformerEncoderLayer adds MultiheadAttention's output (after dropout) to the layer's input:
    that input's norms are each record's residual, (batch, query), with padding, either layout."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=batch_first)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 6, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 2 + [True] * 4])
    run = lambda: _captured(enc, x if batch_first else x.transpose(0, 1), src_key_padding_mask=pad)  # noqa: E731
    cap, inputs = _seen(enc.layers, run, inputs=True)
    assert len(cap.records) == len(inputs) == 2
    for rec, (_, inp) in zip(cap.records, inputs, strict=True):
        want = inp.norm(dim=-1)
        torch.testing.assert_close(rec.residual, want if batch_first else want.t(), rtol=1e-5, atol=1e-5)


class _ParallelBlock(nn.Module):
    """GPT-J / GPT-NeoX / Falcon style: attention and MLP read the same normed input, and their outputs
    are summed with the stream in the order ``order`` says."""

    def __init__(self, order: str):
        super().__init__()
        self.order = order
        self.emb, self.ln = nn.Embedding(20, 16), nn.LayerNorm(16)
        self.qkv, self.o = nn.Linear(16, 48), nn.Linear(16, 16)
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, ids):
        x = self.emb(ids)
        h = self.ln(x)
        b, n, d = h.shape
        q, k, v = (t.view(b, n, 4, 4).transpose(1, 2) for t in self.qkv(h).split(16, dim=-1))
        attn = self.o(((q @ k.transpose(-1, -2)) / 2).softmax(-1).matmul(v).transpose(1, 2).reshape(b, n, d))
        mlp = self.fc2(F.gelu(self.fc1(h)))
        if self.order == "stream first":  # x + attn + mlp: the stream is what the attention's output meets
            return x + attn + mlp
        if self.order == "mlp first":  # GPT-NeoX: mlp + attn + x
            return mlp + attn + x
        mlp += attn  # Falcon: in place on the MLP's output
        return mlp + x


@pytest.mark.parametrize("order", ["stream first", "mlp first", "in place"])
def test_a_parallel_blocks_mlp_output_is_never_taken_for_the_residual(order):
    torch.manual_seed(0)
    model = _ParallelBlock(order).eval()
    ids = torch.randint(0, 20, (2, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.values is not None and rec.values.w_o is not None
    if order == "stream first":
        torch.testing.assert_close(rec.residual, model.emb(ids).norm(dim=-1))
    else:  # the attention's output meets the MLP's first: no residual is claimed
        assert rec.residual is None


class _EinsumHeadsLast(nn.Module):
    """Heads kept beside the features, products written as einsums ("bhqk,bkhd->bqhd"); as many heads
    as tokens, so a reading through the wrong axes would have the right shapes."""

    def __init__(self, d=16, heads=4):
        super().__init__()
        self.h = heads
        self.emb, self.qkv, self.o = nn.Embedding(20, d), nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, d // self.h) for t in self.qkv(x).split(d, dim=-1))
        w = torch.einsum("bqhd,bkhd->bhqk", q, k).softmax(dim=-1)
        return x + self.o(torch.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, n, d))


def test_an_einsum_product_in_another_layout_is_read_through_its_own_axes():
    torch.manual_seed(0)
    model = _EinsumHeadsLast().eval()
    ids = torch.randint(0, 20, (3, 4))  # 4 tokens, 4 heads

    cap, outs = _linear_outputs(model, lambda: _captured(model, ids))
    (rec,) = cap.records
    assert rec.values is not None and rec.values.w_o is not None
    torch.testing.assert_close(_rebuilt(rec), outs[-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rec.residual, model.emb(ids).norm(dim=-1))


def test_an_einsum_output_projection_gives_each_heads_slice():
    """Keras' EinsumDense ("abcd,cde->abe" with a (heads, d, D) kernel) reads the heads unmerged: each
    head's W_O slice comes from the kernel, and the decomposition plus the layer's bias is its output."""
    mod = _style("keras_port_einsum")
    model, batch = mod.build(), mod.sample_batch()
    attn = {m: n for n, m in model.named_modules() if type(m).__name__ == "MultiHeadAttention"}
    cap, outs = _seen(attn, lambda: _captured(model, *batch))
    assert len(cap.records) == len(outs) == len(attn) >= 2
    for rec, (owner, out) in zip(cap.records, outs, strict=True):
        assert rec.name == attn[owner] or rec.name.startswith(
            attn[owner] + "."
        )  # one call per module, in order
        assert rec.values is not None and rec.values.scope == V.WITH_WO
        want = out - owner.output_bias.detach()
        torch.testing.assert_close(_rebuilt(rec), want, atol=1e-5, rtol=1e-5)


def test_renormalized_weights_are_followed_into_their_product():
    """AllenNLP's masked_softmax (softmax, times the mask, divided by the sums): the record holds the
    renormalized weights, and their product with the values reaches the output projection."""
    mod = _style("allennlp")
    model, batch = mod.build(), mod.sample_batch()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*batch)
    selfs = [r for r in cap.records if r.kind == "enc_self"]
    assert len(selfs) == 2 and all(r.mask_source == "multiplied" or r.mask is not None for r in selfs)
    for rec in selfs:
        assert rec.values is not None and rec.values.scope == V.WITH_WO
        np.testing.assert_allclose(
            rec.probs.sum(-1)[rec.mask.any(-1)[:, None].expand(-1, rec.probs.shape[1], -1)].numpy(),
            1.0,
            atol=1e-5,
        )


def test_a_stream_changed_in_place_after_the_sum_claims_no_residual():
    """The residual norms are taken when a trace asks: a stream the model changed in place since the
    sum gives none, never the changed numbers."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv, self.o = nn.Embedding(20, 16), nn.Linear(16, 48), nn.Linear(16, 16)

        def forward(self, ids):
            x = self.emb(ids) * 1.0
            b, n, d = x.shape
            q, k, v = (t.view(b, n, 4, 4).transpose(1, 2) for t in self.qkv(x).split(16, dim=-1))
            y = x + self.o(
                ((q @ k.transpose(-1, -2)) / 2).softmax(-1).matmul(v).transpose(1, 2).reshape(b, n, d)
            )
            x.mul_(3.0)  # the old stream, changed after it was added
            return y + x

    torch.manual_seed(0)
    model = Block().eval()
    (rec,) = _captured(model, torch.randint(0, 20, (2, 5))).records
    assert rec.values is not None and rec.values.w_o is not None and rec.residual is None


class _NoProjection(nn.Module):
    """Attention whose heads are merged back and returned with no output projection of its own (``between``:
    a dropout or nothing before ``out``, the projection that follows)."""

    def __init__(self, d: int = 8, heads: int = 2, out: bool = False, between: str = ""):
        super().__init__()
        self.h, self.qkv = heads, nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d) if out else None
        self.drop = nn.Dropout(0.5) if between == "dropout" else None

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        y = ((q @ k.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)
        if self.drop is not None:
            y = self.drop(y)
        return self.out(y) if self.out is not None else y


class _ThenOtherLinears(nn.Module):
    """Attention with no output projection, its heads read by the next layer's q, k and v (or by a classifier)."""

    def __init__(self, then: str, d: int = 8):
        super().__init__()
        self.then = then
        self.first = _NoProjection(d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.classifier = nn.Linear(d, 3)

    def forward(self, x):
        y = self.first(x)
        if self.then == "classifier":
            return self.classifier(y)
        q, k, v = self.q(y), self.k(y), self.v(y)
        return (q @ k.transpose(-1, -2)).softmax(-1) @ v


@pytest.mark.parametrize("then", ["next layer", "classifier"])
def test_a_projection_outside_the_attention_is_not_taken_for_its_output_projection(then):
    """An attention with no output projection: the next layer's W_Q (or a classifier) that read its heads was
    taken for its W_O, "with the output projection", and the norms were off by 60%. They are the values' own,
    said "without the output projection"."""
    torch.manual_seed(0)
    model = _ThenOtherLinears(then).eval()
    x = torch.randn(2, 5, 8)
    cap = _captured(model, x)
    rec = cap.records[0]
    assert rec.name == "first" and rec.values.scope == V.WITHOUT_WO
    v = model.first.qkv(x).view(2, 5, 3, 2, -1).permute(2, 0, 3, 1, 4)[2]
    assert torch.allclose(rec.values.norms(), v.norm(dim=-1), atol=1e-6)


@pytest.mark.parametrize("block", [False, True])
def test_dropout_in_eval_between_the_heads_and_the_output_projection_keeps_it(block):
    """Dropout in eval hands back its input: the projection after it is still the attention's own (it left no
    values). Around a module, the projection the attention module runs itself; as the whole model, the same."""
    torch.manual_seed(0)
    attn = _NoProjection(out=True, between="dropout").eval()
    model = nn.Sequential(attn, nn.Linear(8, 8)).eval() if block else attn
    x = torch.randn(2, 5, 8)
    cap = _captured(model, x)
    rec = cap.records[0]
    assert rec.values is not None and rec.values.scope == V.WITH_WO
    v = attn.qkv(x).view(2, 5, 3, 2, -1).permute(2, 0, 3, 1, 4)[2]  # (b, h, n, dv)
    w_o = attn.out.weight.view(8, 2, 4).permute(1, 2, 0)  # (h, dv, d)
    want = torch.einsum("bhkd,hde->bhke", v, w_o).norm(dim=-1)
    assert torch.allclose(rec.values.norms(), want, atol=1e-5)
