"""What attention moves: the value-weighted decomposition is exact.

For every attention call, sum_h sum_j alpha_ij f_h(x_j) + b_O must equal the attention module's output,
with f_h(x) = (x W_V,h + b_V,h) W_O,h; the traces' value norms must be ||f_h(x_j)||; and trace files
carry them (format 3), checked on reading."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnscope
from attnscope.core.errors import TraceFormatError
from attnscope.core.traces.trace import VALUE_NORMS, AttentionTrace
from attnscope.core.transformer.attention import MultiHeadAttention, head_value_norms
from attnscope.models import registry
from attnscope.models.pretrained import minilm_available


def _calls(lm, sources, targets=None):
    """Every MultiHeadAttention call of a traced run: (module, value input, output, maps)."""
    seen = []

    def hook(mod, args, kwargs, out):
        value = args[2] if len(args) > 2 else kwargs["value"]
        if out[1] is not None:  # the traced pass (greedy decoding runs the model without maps first)
            seen.append((mod, value.detach(), out[0].detach(), out[1]))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in lm.model.modules()
               if isinstance(m, MultiHeadAttention)]  # fmt: skip
    try:
        traces = lm.trace(sources, targets)
    finally:
        for h in handles:
            h.remove()
    return traces, seen


@torch.no_grad()
def _decomposition(
    mod: MultiHeadAttention, value: torch.Tensor, probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_h sum_j alpha_ij f_h(x_j) + b_O, ||f_h(x_j)||) from the full vectors f_h(x_j) (B, H, L, D)."""
    b, n, d = value.shape
    v = mod.w_v(value).view(b, n, mod.n_heads, mod.d_head).transpose(1, 2)  # (B, H, L, dh)
    w = mod.w_o.weight.view(d, mod.n_heads, mod.d_head)  # (D, H, dh)
    f = torch.einsum("bhle,dhe->bhld", v, w)  # what each head moves from each key, per unit weight
    out = torch.einsum("bhqk,bhkd->bqd", probs, f)
    if mod.w_o.bias is not None:
        out = out + mod.w_o.bias
    return out, f.norm(dim=-1)


MODELS = ["reverse", "dates", "brackets", *(["minilm"] if minilm_available() else [])]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("padded", [False, True], ids=["alone", "padded batch"])
def test_the_decomposition_reproduces_every_attention_output(name, padded):
    lm = registry.load(name)
    first = registry.first_input(name) or "hello"
    sources = [first, first[: max(1, len(first) // 2)]] if padded else [first]
    traces, calls = _calls(lm, sources)
    assert calls
    for mod, value, out, maps in calls:
        recon, norms = _decomposition(mod, value, maps.probs)
        torch.testing.assert_close(recon, out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(maps.value_norms, norms, atol=1e-5, rtol=1e-4)
    # and the traces hold those norms, per kind, layer, head and key
    for tr in traces:
        for kind in tr.kinds:
            norms = tr.value_norms(kind)
            assert norms is not None and norms.shape == (*tr.probs(kind).shape[:2], tr.probs(kind).shape[-1])
            assert tr.value_norms_scope(kind) == "with the output projection"
    by_module = {}
    for mod, value, _, maps in calls:
        by_module.setdefault(id(mod), (mod, value, maps))
    tr = traces[-1]
    kind = tr.kinds[0]
    mod, value, maps = next(iter(by_module.values()))
    _, norms = _decomposition(mod, value, maps.probs)
    np.testing.assert_allclose(tr.value_norms(kind)[0], norms[-1].detach().numpy(), atol=1e-5, rtol=1e-4)


def test_moves_is_weight_times_norm_and_rows_scale_to_one():
    tr = registry.load("reverse").trace(["attention"])[0]
    m = tr.moves("enc_self")
    want = tr.probs("enc_self") * tr.value_norms("enc_self")[:, :, None, :]
    np.testing.assert_allclose(m, want, rtol=1e-6)
    rows = tr.moves("enc_self", normalize=True).sum(-1)
    np.testing.assert_allclose(rows, 1.0, atol=1e-5)
    assert tr.replace(enc_self_value_norms=None).moves("enc_self") is None


def test_a_switched_off_head_moves_nothing():
    v = torch.randn(2, 4, 5, 8)
    w = torch.randn(32, 32)
    keep = torch.tensor([1.0, 0.0, 1.0, 1.0])
    norms = head_value_norms(v, w, keep)
    assert torch.all(norms[:, 1] == 0) and torch.all(norms[:, 0] > 0)


def test_trace_files_carry_value_norms_as_format_3(tmp_path):
    tr = attnscope.load("reverse").trace(["attention"])[0]
    for suffix in (".npz", ".json"):
        back = AttentionTrace.load(tr.save(tmp_path / f"t{suffix}"))
        for kind in tr.kinds:
            np.testing.assert_allclose(back.value_norms(kind), tr.value_norms(kind), rtol=1e-6)
    import json

    header = json.loads(np.load(tmp_path / "t.npz")["header"].item())
    assert header["format"] == 3
    old = tr.replace(**dict.fromkeys(VALUE_NORMS))
    header = json.loads(np.load(old.save(tmp_path / "old.npz"))["header"].item())
    assert header["format"] == 1  # a file is written in the oldest version that holds its members


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda n: n[..., :-1], "shaped"),
        (lambda n: -n, "negative"),
        (lambda n: n * np.nan, "non-finite"),
    ],
)
@pytest.mark.parametrize("member", ["cross_value_norms", "enc_self_residual_norms"])
def test_bad_value_norms_are_refused_in_one_sentence(tmp_path, change, message, member):
    tr = attnscope.load("reverse").trace(["attention"])[0]
    bad = tr.replace(**{member: change(getattr(tr, member).copy())})
    path = bad.save(tmp_path / "bad.npz")
    with pytest.raises(TraceFormatError, match=message):
        AttentionTrace.load(path)


@pytest.mark.parametrize("name", ["reverse", *(["minilm"] if minilm_available() else [])])
def test_residual_norms_are_the_stream_each_attention_output_joins(name):
    lm = registry.load(name)
    seen: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    encoder = lm.model.encoder
    decoder = getattr(lm.model, "decoder", None) or []
    for i, layer in enumerate(encoder):
        handles.append(layer.sub_attn.register_forward_pre_hook(
            lambda mod, args, i=i: seen.__setitem__(("enc_self", i), args[0].norm(dim=-1))))  # fmt: skip
    for i, layer in enumerate(decoder):
        for sub, kind in ((layer.sub_self, "dec_self"), (layer.sub_cross, "cross")):
            handles.append(sub.register_forward_pre_hook(
                lambda mod, args, i=i, kind=kind: seen.__setitem__((kind, i), args[0].norm(dim=-1))))  # fmt: skip
    try:
        first = registry.first_input(name) or "hello"
        tr = lm.trace([first, first[:3]])[1]  # padded: the second sequence of a batch
    finally:
        for h in handles:
            h.remove()
    for kind in tr.kinds:
        got = tr.residual_norms(kind)
        for layer in range(got.shape[0]):
            np.testing.assert_allclose(got[layer], seen[(kind, layer)][1].detach().numpy(), rtol=1e-5)
