"""torch.nn's own attention layers run under capture as torch runs them without it.

A TorchFunctionMode on the stack turns torch's fused fast paths off (``nn.TransformerEncoderLayer``'s
``_transformer_encoder_layer_fwd``, ``nn.MultiheadAttention``'s ``_native_multi_head_attention``): the
model would compute something other than what it computes uncaptured. An ``nn.TransformerEncoderLayer``
or ``nn.MultiheadAttention`` as torch ships them run without the mode, and their record is made from the
arguments they got, by the code that records them under the mode. What the mode must still follow
(hooks on a layer's modules, attention dropout, subclasses, another mode above capture's) it follows.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from attnscope.core.families import capture as capture_mod
from attnscope.core.families.capture import capture_attention

D, H, VOCAB = 32, 4, 50


class Encoder(nn.Module):
    def __init__(self, batch_first: bool, norm_first: bool, layers: int = 2):
        super().__init__()
        self.batch_first = batch_first
        self.emb = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(
            D, H, 64, dropout=0.1, batch_first=batch_first, norm_first=norm_first
        )
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(D, VOCAB)

    def forward(self, ids, pad=None, causal=False):
        x = self.emb(ids)
        x = x if self.batch_first else x.transpose(0, 1)
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1]) if causal else None
        x = self.enc(x, mask=mask, src_key_padding_mask=pad, is_causal=True if causal else None)
        return self.out(x)


class TwoAttentions(nn.Module):
    """A self-attention, then a second one over the same tokens or over projected features."""

    def __init__(self, batch_first: bool, cross: bool):
        super().__init__()
        self.batch_first, self.cross = batch_first, cross
        self.emb, self.feat = nn.Embedding(VOCAB, D), nn.Linear(16, D)
        self.a1 = nn.MultiheadAttention(D, H, batch_first=batch_first)
        self.a2 = nn.MultiheadAttention(D, H, batch_first=batch_first)

    def forward(self, ids, feats, pad=None, need_weights=False):
        x, y = self.emb(ids), self.feat(feats)
        if not self.batch_first:
            x, y = x.transpose(0, 1), y.transpose(0, 1)
        x = x + self.a1(x, x, x, key_padding_mask=pad, need_weights=need_weights)[0]
        kv = y if self.cross else x
        h, _ = self.a2(x, kv, kv, key_padding_mask=None if self.cross else pad, need_weights=need_weights,
                       average_attn_weights=False)  # fmt: skip
        return x + h


def _pad(batch: int, n: int) -> torch.Tensor:
    pad = torch.zeros(batch, n, dtype=torch.bool)
    pad[-1, n // 2 :] = True
    return pad


def _captured(model, args, through_mode: bool):
    """The capture, and the output; ``through_mode``: every layer followed by the mode (as subclasses are)."""
    native = (capture_mod._native_layer, capture_mod._native_mha)
    if through_mode:
        capture_mod._native_layer = capture_mod._native_mha = lambda m: False
    try:
        with torch.no_grad(), capture_attention(model) as cap:
            out = model(*args)
    finally:
        capture_mod._native_layer, capture_mod._native_mha = native
    return cap, out


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _assert_same_records(got, want):
    assert len(got.records) == len(want.records) > 0
    for r, w in zip(got.records, want.records, strict=True):
        for field in ("name", "kind", "source", "mask_source", "check", "head_masks_differ", "exact", "flag",
                      "key_labels", "query_labels"):  # fmt: skip
            assert getattr(r, field) == getattr(w, field), (r.name, field)
        for field in ("probs", "scores", "mask"):
            assert _same(getattr(r, field), getattr(w, field)), (r.name, field)
        assert _same(r.values.vectors(), w.values.vectors()), r.name
        assert _same(r.residual, w.residual), r.name
    assert got.notes == want.notes
    assert [str(n) for n in got.skipped] == [str(n) for n in want.skipped]


def _layer_inputs(model) -> list[tuple[nn.Module, tuple, dict]]:
    """Every encoder layer's arguments in the uncaptured forward (a global hook, which leaves torch's fast
    path on: a hook of the layer's own would turn it off)."""
    seen: list[tuple[nn.Module, tuple, dict]] = []
    layers = {id(m) for m in model.modules() if isinstance(m, nn.TransformerEncoderLayer)}

    def hook(mod, args, kwargs, _out):
        if id(mod) in layers:
            seen.append((mod, args, kwargs))

    return seen, torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_an_encoder_runs_its_fast_path_and_records_what_each_layer_got(norm_first, causal):
    """Batch first, in eval without gradients: torch's fused layer runs, as uncaptured (the output is the
    same to the bit; the mode alone would have run the Python path, whose rounding differs), and every
    layer's record is its own MultiheadAttention's weights on the input that layer got."""
    torch.manual_seed(0)
    model = Encoder(batch_first=True, norm_first=norm_first).eval()
    ids, pad = torch.randint(1, VOCAB, (3, 9)), _pad(3, 9)
    seen, hook = _layer_inputs(model)
    try:
        with torch.no_grad():
            want_out = model(ids, pad, causal)
    finally:
        hook.remove()
    cap, out = _captured(model, (ids, pad, causal), through_mode=False)
    assert torch.equal(out, want_out)
    _, slow = _captured(model, (ids, pad, causal), through_mode=True)
    assert not torch.equal(slow, want_out)  # what the mode alone makes the model compute
    assert len(cap.records) == len(seen) == 2 and not cap.notes
    for rec, (layer, args, kwargs) in zip(cap.records, seen, strict=True):
        x = layer.norm1(args[0]) if norm_first else args[0]
        with torch.no_grad():
            _, want = layer.self_attn(x, x, x, key_padding_mask=kwargs["src_key_padding_mask"],
                                      attn_mask=kwargs["src_mask"], average_attn_weights=False)  # fmt: skip
        torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)
        assert rec.exact and rec.kind == ("dec_self" if causal else "enc_self")
        assert torch.equal(rec.mask[-1, -1], ~pad[-1])
        torch.testing.assert_close(rec.residual, args[0].norm(dim=-1))  # the stream the layer adds to


def test_an_encoder_layer_recorded_from_its_arguments_equals_the_modes_record():
    """Sequence first (torch's Python path, with the mode or without): the record made from the layer's
    arguments is the mode's record to the bit, field by field: weights, scores, mask, kind, the values and
    residual norms of what attention moves, and the notes."""
    for norm_first, batch, causal, padded in itertools.product(
        [False, True], [1, 3], [False, True], [False, True]
    ):
        torch.manual_seed(batch)
        model = Encoder(batch_first=False, norm_first=norm_first).eval()
        args = (torch.randint(1, VOCAB, (batch, 7)), _pad(batch, 7) if padded else None, causal)
        got, out = _captured(model, args, through_mode=False)
        want, want_out = _captured(model, args, through_mode=True)
        assert torch.equal(out, want_out)
        _assert_same_records(got, want)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_recorded_from_its_arguments_equals_the_modes_record(
    batch_first, cross, need_weights
):
    """nn.MultiheadAttention as torch ships it runs without the mode (its fused path where torch takes it:
    batch-first self-attention in eval without gradients): its output is the uncaptured one, and its record, made from its
    arguments (the transposes of a batch-first call, its masks, self or cross by lineage), is the mode's
    record to the bit where both run the same path; after a fused one, the next call's input differs from
    the Python path's in its last bits, and so do its weights."""
    torch.manual_seed(1)
    model = TwoAttentions(batch_first, cross).eval()
    for batch, padded in itertools.product([1, 3], [False, True]):
        args = (torch.randint(1, VOCAB, (batch, 6)), torch.randn(batch, 8 if cross else 6, 16),
                _pad(batch, 6) if padded else None, need_weights)  # fmt: skip
        with torch.no_grad():
            want_out = model(*args)
        got, out = _captured(model, args, through_mode=False)
        want, _ = _captured(model, args, through_mode=True)
        assert torch.equal(out, want_out)
        if batch_first:
            assert [r.name for r in got.records] == [r.name for r in want.records]
            for r, w in zip(got.records, want.records, strict=True):
                torch.testing.assert_close(r.probs, w.probs, atol=1e-6, rtol=0)
                assert (r.kind, r.exact, r.flag) == (w.kind, w.exact, w.flag) and _same(r.mask, w.mask)
        else:
            _assert_same_records(got, want)
        assert [r.kind for r in got.records] == ["enc_self", "cross" if cross else "enc_self"]


def test_what_the_mode_must_follow_it_follows():
    """A hook on a layer's attention that changes what it gets, and a layer whose attention block is
    overridden, are followed op by op: their records are the weights of what the attention got."""
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, D)
    hook = layer.self_attn.register_forward_pre_hook(lambda mod, args: (args[0] * 3, args[1] * 3, args[2]))
    try:
        with torch.no_grad(), capture_attention(layer) as cap:
            layer(x)
        with torch.no_grad():
            _, want = layer.self_attn(x, x, x, average_attn_weights=False)  # the hook scales q and k
    finally:
        hook.remove()
    (rec,) = cap.records
    torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)
    with torch.no_grad():
        _, plain = layer.self_attn(x, x, x, average_attn_weights=False)
    assert not torch.allclose(rec.probs, plain, atol=1e-3)

    class Sharper(nn.TransformerEncoderLayer):
        def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
            return super()._sa_block(x * 2, attn_mask, key_padding_mask, is_causal)

    sharper = Sharper(D, H, 64, dropout=0.0, batch_first=True).eval()
    sharper.load_state_dict(layer.state_dict())
    with torch.no_grad(), capture_attention(sharper) as cap:
        sharper(x)
    with torch.no_grad():
        _, want = layer.self_attn(2 * x, 2 * x, 2 * x, average_attn_weights=False)
    torch.testing.assert_close(cap.records[0].probs, want, atol=1e-6, rtol=0)


def test_attention_dropout_while_training_is_followed_by_the_mode():
    """Weights dropped at random: the layer runs under the mode, which repeats the call's draws."""
    torch.manual_seed(3)
    layer = nn.TransformerEncoderLayer(D, H, 64, dropout=0.5, batch_first=True).train()
    x = torch.randn(2, 5, D)
    with capture_attention(layer) as cap:
        layer(x)
    (rec,) = cap.records
    assert rec.exact
    assert bool((rec.probs == 0).any())  # the dropped weights, not the softmax's


def test_another_mode_above_capture_keeps_seeing_the_layer():
    """A mode the user entered inside the capture block is above capture's: the layer runs under both
    (nothing is set aside), the user's mode sees its ops, and the record is made."""
    torch.manual_seed(4)
    layer = nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, D)
    names: list[str] = []

    class Counting(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            names.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), capture_attention(layer) as cap:
        with Counting():
            layer(x)
    assert "multi_head_attention_forward" in names and len(cap.records) == 1
    with torch.no_grad():
        _, want = layer.self_attn(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(cap.records[0].probs, want, atol=1e-6, rtol=0)


def test_an_error_inside_a_layer_gives_the_mode_back():
    """A layer that raises (a mask of the wrong shape) leaves capture's mode where it was: the block goes on
    recording, and after it no mode and no hook is left behind."""
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, D)
    with torch.no_grad(), capture_attention(layer) as cap:
        with pytest.raises(Exception):  # noqa: B017 (torch says it in its own words)
            layer(x, src_key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))
        layer(x)
        layer(x[:1])
    assert [tuple(r.probs.shape) for r in cap.records] == [(2, H, 5, 5), (1, H, 5, 5)]
    assert torch._C._len_torch_function_stack() == 0
    assert not torch.nn.modules.module._global_forward_hooks
    assert not torch.nn.modules.module._global_forward_pre_hooks


def test_an_empty_batch_through_an_encoder_layer():
    """Batch size 0 or length 0: the layer runs as uncaptured (under the mode alone torch's Python path
    raises at batch 0), and capture says in one sentence that there was nothing to record."""
    layer = nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, batch_first=True).eval()
    for shape in ((0, 5, D), (2, 0, D)):
        x = torch.randn(*shape)
        with torch.no_grad(), capture_attention(layer) as cap:
            out = layer(x)
        assert out.shape == x.shape and not cap.records and not cap.notes
        assert [n.reason for n in cap.skipped] == [
            "an attention call over an empty batch or sequence: it has no weights to record"
        ]


def test_an_interrupt_inside_a_layer_gives_the_mode_back():
    """An exception torch's module call does not catch (KeyboardInterrupt) runs no hook after the layer:
    the block gives the mode back as it ends, and a later capture records as before."""

    class Interrupted(nn.Linear):
        def forward(self, x):
            raise KeyboardInterrupt

    torch.manual_seed(6)
    layer = nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, batch_first=True).train()  # its Python path
    x = torch.randn(2, 5, D)
    real = layer.linear1
    layer.linear1 = Interrupted(D, 64)
    with pytest.raises(KeyboardInterrupt), capture_attention(layer):
        layer(x)
    assert torch._C._len_torch_function_stack() == 0
    assert not torch.nn.modules.module._global_forward_hooks
    layer.linear1 = real
    with capture_attention(layer) as cap:
        layer(x)
    with torch.no_grad():
        _, want = layer.self_attn(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(cap.records[0].probs, want, atol=1e-6, rtol=0)


def test_a_call_hidden_from_modes_stays_hidden():
    """A call the model makes with torch functions disabled (a reference computed beside the real one) is
    not seen by capture's mode, and so not recorded by its hooks either: one record, the real call's."""
    torch.manual_seed(7)
    mha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    layer = nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, batch_first=True).eval()

    class WithReference(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha, self.layer = mha, layer

        def forward(self, x):
            with torch._C.DisableTorchFunction():
                self.mha(x, x, x, average_attn_weights=False)  # a reference, hidden
                self.layer(x)
            return self.layer(self.mha(x, x, x, need_weights=False)[0])

    x, model = torch.randn(2, 5, D), WithReference()
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    assert [r.name for r in cap.records] == ["mha", "layer.self_attn"]


@pytest.mark.parametrize("final_norm", [False, True])
def test_an_encoder_over_nested_tensors_is_recorded_per_sequence(final_norm):
    """nn.TransformerEncoder's default (batch first, eval, a padding mask, nested tensors enabled) turns a
    padded batch into nested tensors, which torch makes only where no mode is active: it runs so under
    capture, its output the uncaptured one to the bit (the padding's rows 0). Each layer's record holds,
    on a sequence's real rows, the weights of that sequence alone; the padding's rows, which nothing
    computed, are 0 and see no key."""
    torch.manual_seed(8)
    layer = nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D) if final_norm else None).eval()
    x = torch.randn(3, 7, D)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 4:], pad[2, 2:] = True, True
    with torch.no_grad():
        want_out = enc(x, src_key_padding_mask=pad)
        with capture_attention(enc) as cap:
            out = enc(x, src_key_padding_mask=pad)
    assert torch.equal(out, want_out) and bool((out[2, 2:] == (enc.norm.bias if final_norm else 0)).all())
    assert len(cap.records) == 2 and not cap.notes and not cap.skipped
    for b in range(3):
        n = int((~pad[b]).sum())
        h = x[b : b + 1, :n]
        for rec, lay in zip(cap.records, enc.layers, strict=True):
            with torch.no_grad():
                _, want = lay.self_attn(h, h, h, average_attn_weights=False)
                h = lay(h)
            torch.testing.assert_close(rec.probs[b : b + 1, :, :n, :n], want, atol=1e-6, rtol=0)
            assert bool((rec.probs[b, :, n:] == 0).all()) and bool((rec.probs[b, :, :n, n:] == 0).all())
            assert not bool(rec.mask[b, n:].any()) and bool(rec.mask[b, :n, :n].all())
            assert rec.kind == "enc_self" and rec.exact
            assert bool((rec.residual[b, n:] == 0).all())  # the stream the layer read: 0 at the padding


def test_one_heads_row_with_no_key_leaves_the_other_heads_rows_as_they_are():
    """A per-head mask (B·H, q, k) that hides every key from one head's row makes that query's output row
    NaN (the head's softmax over no key, spread by the output projection): the record, made from the
    call's arguments, is NaN in that head's row alone, as the mode's record of the same call is."""
    torch.manual_seed(9)
    mha = nn.MultiheadAttention(16, 4).eval()  # sequence first: its Python path, with the mode or without
    x = torch.randn(6, 2, 16)
    hide = torch.zeros(2 * 4, 6, 6, dtype=torch.bool)  # True: masked, as MultiheadAttention reads it
    hide[1, 3] = True  # sequence 0, head 1, query 3: no key
    got, out = _captured(mha, (x, x, x, None, True, hide, False), through_mode=False)
    want, want_out = _captured(mha, (x, x, x, None, True, hide, False), through_mode=True)
    assert bool(out[0][3, 0].isnan().all()) and torch.equal(
        out[0].nan_to_num(7.0), want_out[0].nan_to_num(7.0)
    )
    (rec,) = got.records
    assert bool(rec.probs[0, 1, 3].isnan().all())
    assert not bool(rec.probs[0, [0, 2, 3], 3].isnan().any()) and not bool(rec.probs[1].isnan().any())
    assert _same(rec.probs, want.records[0].probs) and rec.head_masks_differ


def _weights_that_rebuild(
    mha: nn.MultiheadAttention, x: torch.Tensor, out: torch.Tensor, masks
) -> torch.Tensor:
    """The (B, H, q, k) weights, of each candidate bool mask (True = hidden), whose product with the values
    and output projection rebuilds ``out``: which reading of its mask the call used (batch-first self-attention)."""
    b, n, e = x.shape
    h, d = mha.num_heads, e // mha.num_heads
    q, k, v = (t.view(b, n, h, d).transpose(1, 2)
               for t in nn.functional.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, -1))  # fmt: skip
    scores = q @ k.transpose(-1, -2) / d**0.5
    found = []
    for hidden in masks:
        w = scores.masked_fill(hidden, float("-inf")).softmax(-1)
        y = mha.out_proj((w @ v).transpose(1, 2).reshape(b, n, e))
        if torch.allclose(y, out, atol=1e-5):
            found.append(w)
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize(("heads", "given"), [(2, "float tril"), (3, "anti-causal"), (2, "anti-causal")])
def test_is_causal_with_a_mask_records_the_mask_the_call_used(heads, given):
    """``is_causal=True`` with a mask, no padding mask and no weights asked: torch's Python path drops the mask
    for SDPA's causal one (a float mask never takes the fused path; nor do odd head counts), and its fused path
    (even heads, a bool mask) uses the mask as given. The record holds the weights that rebuild the output."""
    torch.manual_seed(heads)
    n = 5
    mha = nn.MultiheadAttention(4 * heads, heads, batch_first=True).eval()
    x = torch.randn(2, n, 4 * heads)
    mask = torch.ones(n, n).tril() if given == "float tril" else torch.ones(n, n, dtype=torch.bool).tril(-1)
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    with torch.no_grad():
        out = mha(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)[0]
        with capture_attention(mha) as cap:
            mha(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
        candidates = [future] + ([mask] if mask.dtype == torch.bool else [])
        used = _weights_that_rebuild(mha, x, out, candidates)
    (rec,) = cap.records
    assert rec.exact and not cap.notes, (rec.flag, cap.notes)
    torch.testing.assert_close(rec.probs, used, atol=1e-6, rtol=0)
    assert rec.kind == ("dec_self" if torch.equal(used.tril(), used) else "enc_self")


@pytest.mark.parametrize("heads", [2, 3])
@pytest.mark.parametrize("mask_kind", ["src_mask", "padding"])
def test_an_encoder_layer_given_a_float_0_1_mask_records_what_its_path_made_of_it(heads, mask_kind):
    """A float mask of 0s and 1s (``triu(1).float()``, or Hugging Face's ``attention_mask.float()`` as the padding
    mask): torch's fused encoder layer (eval, no gradients, even heads) reads it as a bool one, every 1 hiding
    its key; its Python path (odd heads) adds it. The record holds the reading the layer computed with."""
    torch.manual_seed(heads)
    n, e = 6, 4 * heads
    layer = nn.TransformerEncoderLayer(e, heads, 2 * e, dropout=0.0, batch_first=True).eval()
    x = torch.randn(3, n, e)
    keep = torch.ones(3, n)
    keep[1, 4:] = 0
    keep[2, 5:] = 0
    kw = {"src_mask": torch.ones(n, n).triu(1)} if mask_kind == "src_mask" else {"src_key_padding_mask": keep}
    with torch.no_grad():
        layer(x, **kw)  # (the layer as it runs uncaptured: warm)
        with capture_attention(layer) as cap:
            layer(x, **kw)
    (rec,) = cap.records
    assert rec.exact, rec.flag
    if heads % 2 == 0:  # read as a bool mask: it hides keys, nothing to say
        assert not cap.notes, cap.notes
    else:  # added: it hides nothing, and a warning says so
        (note,) = cap.notes
        assert "0s and 1s" in note and "hides no key" in note
        assert ("key_padding_mask" in note) == (mask_kind == "padding")
    mha = layer.self_attn
    b, _, _ = x.shape
    q, k, v = (t.view(b, n, heads, 4).transpose(1, 2)
               for t in nn.functional.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, -1))  # fmt: skip
    scores = q @ k.transpose(-1, -2) / 2.0
    m = kw.get("src_mask", keep[:, None, None, :] if mask_kind == "padding" else None)
    if heads % 2 == 0:  # fused: every nonzero value hides its key (a row that sees no key is NaN there)
        want = scores.masked_fill(m.bool(), float("-inf")).softmax(-1)
    else:  # Python path: added
        want = (scores + m).softmax(-1)
    torch.testing.assert_close(rec.probs, want, atol=1e-5, rtol=0, equal_nan=True)
    if mask_kind == "src_mask":  # a causal mask, hiding the future or (added) broken: a decoder's either way
        assert rec.kind == "dec_self"
