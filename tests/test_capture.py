"""attnscope.core.families.capture on torch.nn modules: weights equal a hand computation, outputs unchanged, modules restored."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnscope.core.families.capture import capture_attention, capture_call

D, H = 16, 4


def _hand(mha: nn.MultiheadAttention, query, key, allowed=None):
    """softmax(Q K^T / sqrt(d)) per head from the module's in_proj weights; batch-first inputs."""
    w, b = mha.in_proj_weight, mha.in_proj_bias
    q = query @ w[:D].T + b[:D]
    k = key @ w[D : 2 * D].T + b[D : 2 * D]
    bsz, lq, lk, d = q.shape[0], q.shape[1], k.shape[1], D // H
    q = q.view(bsz, lq, H, d).transpose(1, 2)
    k = k.view(bsz, lk, H, d).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if allowed is not None:
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return scores.softmax(-1)


@pytest.fixture
def mha():
    torch.manual_seed(0)
    return nn.MultiheadAttention(D, H, batch_first=True).eval()


def test_multihead_self_attention_matches_hand_computation(mha):
    x = torch.randn(2, 5, D)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])  # torch.nn: True = ignore
    with capture_attention(mha) as cap:
        out, _ = mha(x, x, x, key_padding_mask=pad)
    (rec,) = cap.records
    allowed = (~pad)[:, None, :].expand(2, 5, 5)
    assert rec.kind == "enc_self" and rec.probs.shape == (2, H, 5, 5)
    torch.testing.assert_close(rec.probs, _hand(mha, x, x, allowed), atol=1e-6, rtol=0)
    assert torch.equal(rec.mask, allowed)
    assert (rec.probs[1, :, :, 3:] == 0).all()
    # scores are before mask and softmax: masking + softmax gives the probabilities back
    filled = rec.scores.masked_fill(~allowed[:, None], float("-inf"))
    torch.testing.assert_close(filled.softmax(-1), rec.probs, atol=1e-6, rtol=0)
    torch.testing.assert_close(cap.stacks()["enc_self"][:, 0], rec.probs)


def test_cross_attention_and_seq_first(mha):
    torch.manual_seed(1)
    seq_first = nn.MultiheadAttention(D, H).eval()  # (L, B, E) inputs
    q, kv = torch.randn(3, 2, D), torch.randn(6, 2, D)
    with capture_attention(seq_first) as cap:
        seq_first(q, kv, kv)
    (rec,) = cap.records
    assert rec.kind == "cross" and rec.probs.shape == (2, H, 3, 6) and rec.mask is None
    expected = _hand(seq_first, q.transpose(0, 1), kv.transpose(0, 1))
    torch.testing.assert_close(rec.probs, expected, atol=1e-6, rtol=0)


def _transformer():
    torch.manual_seed(0)
    return nn.Transformer(
        d_model=D, nhead=H, num_encoder_layers=2, num_decoder_layers=3, dim_feedforward=32,
        dropout=0.1, batch_first=True,
    ).eval()  # fmt: skip


def test_transformer_kinds_masks_and_hand_computation():
    model = _transformer()
    src, tgt = torch.randn(2, 5, D), torch.randn(2, 4, D)
    src_pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    causal = nn.Transformer.generate_square_subsequent_mask(4)  # float, -inf above the diagonal
    inputs: dict[str, tuple] = {}
    hooks = [
        m.register_forward_pre_hook(lambda mod, args, name=n: inputs.setdefault(name, args) and None)
        for n, m in model.named_modules()
        if isinstance(m, nn.MultiheadAttention)
    ]
    try:
        with capture_attention(model) as cap:
            model(src, tgt, tgt_mask=causal, src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad,
                  tgt_is_causal=True)  # fmt: skip
    finally:
        for hk in hooks:
            hk.remove()
    stacks = cap.stacks()
    assert cap.kinds() == ("enc_self", "dec_self", "cross")
    assert stacks["enc_self"].shape == (2, 2, H, 5, 5)
    assert stacks["dec_self"].shape == (2, 3, H, 4, 4)
    assert stacks["cross"].shape == (2, 3, H, 4, 5)
    masks = cap.masks()
    tril = torch.ones(4, 4, dtype=torch.bool).tril()
    assert torch.equal(masks["dec_self"], tril.expand(2, 4, 4))
    assert torch.equal(masks["enc_self"], (~src_pad)[:, None, :].expand(2, 5, 5))
    assert torch.equal(masks["cross"], (~src_pad)[:, None, :].expand(2, 4, 5))
    for rec in cap.records:  # each map equals the hand computation on that module's actual input
        q, k = inputs[rec.name][0], inputs[rec.name][1]
        mod = model.get_submodule(rec.name)
        torch.testing.assert_close(rec.probs, _hand(mod, q, k, rec.mask), atol=1e-6, rtol=0)
    trace = cap.trace(1, src_tokens=list("abcde"), tgt_tokens=list("wxyz"))
    assert trace.kinds == ("enc_self", "dec_self", "cross") and trace.n_layers == 2
    assert trace.probs("cross").shape == (3, H, 4, 5) and trace.axes("cross") == (
        tuple("wxyz"),
        tuple("abcde"),
    )
    assert not trace.mask("enc_self")[:, 3:].any()


def test_outputs_identical_with_and_without_capture():
    model = _transformer()
    src, tgt = torch.randn(2, 5, D), torch.randn(2, 4, D)
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    src_pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    kwargs = dict(tgt_mask=causal, src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad)
    # grad enabled: PyTorch's fast path is not taken, the same python path runs in both
    plain = model(src, tgt, **kwargs)
    with capture_attention(model):
        captured = model(src, tgt, **kwargs)
    assert torch.equal(plain, captured)
    # no grad, eval: the fast path may run outside the capture; capture_call returns that output
    with torch.no_grad():
        fast = model(src, tgt, **kwargs)
        out, cap = capture_call(model, src, tgt, **kwargs)
        with capture_attention(model):
            slow = model(src, tgt, **kwargs)
    assert torch.equal(out, fast) and len(cap.records) == 2 + 3 * 2
    torch.testing.assert_close(slow, fast, atol=1e-5, rtol=0)  # same math, fused vs python path


def test_training_mode_dropout_draws_unchanged():
    model = _transformer().train()
    src, tgt = torch.randn(2, 5, D), torch.randn(2, 4, D)
    torch.manual_seed(123)
    plain = model(src, tgt)
    torch.manual_seed(123)
    with capture_attention(model):
        captured = model(src, tgt)
    assert torch.equal(plain, captured)


def _assert_untouched(model, flag):
    for m in model.modules():
        assert "forward" not in m.__dict__
        assert not m._forward_hooks and not m._forward_pre_hooks
    assert torch.backends.mha.get_fastpath_enabled() is flag


def test_model_is_never_modified_even_when_forward_raises():
    model = _transformer()
    flag = torch.backends.mha.get_fastpath_enabled()
    with pytest.raises(RuntimeError):
        with capture_attention(model) as cap:
            _assert_untouched(model, flag)  # no patched methods, no hooks, global flag as it was
            model(torch.randn(2, 5, D), torch.randn(2, 4, D + 1))  # wrong width: raises inside
    _assert_untouched(model, flag)
    assert cap.records == [] or all(r.kind == "enc_self" for r in cap.records)
    with capture_attention(model) as cap:
        model(torch.randn(1, 3, D), torch.randn(1, 2, D))
    _assert_untouched(model, flag)
    assert len(cap.records) == 2 + 3 * 2
    # after the block nothing is recorded any more
    model(torch.randn(1, 3, D), torch.randn(1, 2, D))
    assert len(cap.records) == 2 + 3 * 2


def test_fast_path_comes_back():
    """The encoder's nested-tensor fast path runs under capture as without it (its output the same to the
    bit, 0 at PAD positions), and runs again after it; the maps hold each layer's weights on the real
    rows, and 0 on the PAD rows, which that path never computes."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, dim_feedforward=32, batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).eval()
    x = torch.randn(2, 5, D)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        fast = enc(x, src_key_padding_mask=pad)
        with capture_attention(enc) as cap:
            captured = enc(x, src_key_padding_mask=pad)
        again = enc(x, src_key_padding_mask=pad)
    maps = cap.stacks()["enc_self"]
    assert maps.shape == (2, 2, H, 5, 5)
    with torch.enable_grad():  # the python path, by hand: each layer's own weights on its own input
        h, want = x, []
        for layer_ in enc.layers:
            want.append(
                layer_.self_attn(h, h, h, key_padding_mask=pad, average_attn_weights=False)[1].detach()
            )
            h = layer_(h, src_key_padding_mask=pad).detach()
    want_maps = torch.stack(want, dim=1)
    torch.testing.assert_close(maps[0], want_maps[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(maps[1, :, :, :3], want_maps[1, :, :, :3], atol=1e-6, rtol=0)
    assert (maps[1, :, :, :, 3:] == 0).all()  # no weight on the second sequence's PAD keys
    assert (maps[1, :, :, 3:] == 0).all()  # nor from its PAD rows, which the nested path never computes
    assert (fast[1, 3:] == 0).all() and torch.equal(captured, fast) and torch.equal(again, fast)


def test_nested_captures_both_record(mha):
    x = torch.randn(1, 4, D)
    with capture_attention(mha) as outer:
        with capture_attention(mha) as inner:
            mha(x, x, x)
        mha(x, x, x)
    assert len(inner.records) == 1 and len(outer.records) == 2
    torch.testing.assert_close(inner.records[0].probs, outer.records[0].probs, atol=0, rtol=0)


def test_bare_causal_self_attention_is_dec_self(mha):
    x = torch.randn(1, 4, D)
    with capture_attention(mha) as cap:
        mha(x, x, x, attn_mask=nn.Transformer.generate_square_subsequent_mask(4), need_weights=False)
    (rec,) = cap.records
    assert rec.kind == "dec_self"
    assert (rec.probs[0].triu(1) == 0).all()


def test_capture_is_thread_local(mha):
    """A capture records only its own thread's calls: another session running the same model at the
    same time is neither recorded nor changed (TorchFunctionMode is per thread; nothing is patched)."""
    import threading

    x = torch.randn(2, 5, D)

    def session_in_a_thread(while_main_captures: bool) -> list[torch.Tensor]:
        # The reference runs in a fresh thread too: a new thread's intra-op thread count can differ
        # from the main thread's (conftest sets 1), which changes float rounding, not the capture.
        inside, done, outputs = threading.Event(), threading.Event(), []

        def other_session():
            inside.wait()
            for _ in range(5):
                outputs.append(mha(x, x, x, need_weights=False)[0])
            done.set()

        t = threading.Thread(target=other_session)
        t.start()
        if while_main_captures:
            with capture_attention(mha) as cap:
                inside.set()
                done.wait(30)  # the other thread runs the model 5 times while this capture is open
                mha(x, x, x)
            assert len(cap.records) == 1  # only this thread's call
        else:
            inside.set()
        t.join()
        return outputs

    ref = session_in_a_thread(False)
    other_outputs = session_in_a_thread(True)
    assert len(other_outputs) == 5 and all(torch.equal(o, r) for o, r in zip(other_outputs, ref, strict=True))
