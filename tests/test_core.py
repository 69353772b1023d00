"""Core model: masks, capture, properties, decoding, parameter count, positional encoding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnscope.core.errors import ConfigError
from attnscope.core.transformer import masks as M
from attnscope.core.transformer.attention import AttnMaps, scaled_dot_product
from attnscope.core.transformer.config import TransformerConfig, base, tiny
from attnscope.core.transformer.decode import greedy_decode
from attnscope.core.transformer.model import Masks, Transformer, count_parameters
from attnscope.core.transformer.positional import sinusoidal_table, wavelengths

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CONFIGS = {
    "post-sin-relu": {},
    "pre-learned-gelu": {"norm": "pre", "pos_encoding": "learned", "activation": "gelu"},
    "unshared": {"share_vocab": False, "tgt_vocab_size": 24},
}


def make(device: str, seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny(**changes)).to(device).eval()


def batch(device: str, tgt_vocab: int = 32):
    """A padded batch: source lengths 7, 4, 6; target lengths 5, 3, 5 (BOS first)."""
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 32, (3, 7), generator=g)
    src[0, -1] = 2
    src[1, 4:] = 0
    src[2, 6:] = 0
    tgt = torch.randint(4, tgt_vocab, (3, 5), generator=g)
    tgt[:, 0] = 1
    tgt[1, 3:] = 0
    return src.to(device), tgt.to(device)


# -- masks ------------------------------------------------------------------------


def test_masks_follow_one_convention():
    src = torch.tensor([[5, 6, 2, 0]])
    tgt = torch.tensor([[1, 7, 0]])
    assert M.padding_mask(src, 0).tolist() == [[True, True, True, False]]
    assert M.causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    enc = M.enc_self_mask(src, 0)
    assert enc.shape == (1, 4, 4) and enc.dtype == torch.bool
    assert enc[0, :, 3].tolist() == [False] * 4 and enc[0, :, :3].all()
    dec = M.dec_self_mask(tgt, 0)
    assert dec[0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    cross = M.cross_mask(tgt, src, 0)
    assert cross.shape == (1, 3, 4) and cross[0, :, 3].sum() == 0 and cross[0, :, :3].all()
    assert M.fully_masked_rows(torch.zeros(2, 3, dtype=torch.bool)).all()
    add = M.to_additive(dec[0])
    assert add[0, 1] == float("-inf") and add[1, 0] == 0


def test_fully_masked_row_gives_zeros_not_nan():
    q = torch.randn(1, 2, 3, 4)
    k = torch.randn(1, 2, 5, 4)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    mask[..., 1, :] = False
    out, probs, _ = scaled_dot_product(q, k, k, mask)
    assert not torch.isnan(out).any() and not torch.isnan(probs).any()
    assert (probs[..., 1, :] == 0).all() and (out[..., 1, :] == 0).all()
    torch.testing.assert_close(probs[..., 0, :].sum(-1), torch.ones(1, 2))
    # the -inf fill (the mask-lab bug) is what produces NaN
    out_bug, _, _ = scaled_dot_product(q, k, k, mask, neg_inf_fill=True)
    assert torch.isnan(out_bug[..., 1, :]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_masked_probabilities_equal_a_full_masked_fill_bit_for_bit(dtype):
    """Only rows with no allowed key are zeroed after the softmax: every other masked weight is
    exactly 0 already (exp(min - max) underflows), so the maps equal the formulation that fills the
    whole masked area with 0, bit for bit, also with very large scores and fully masked rows."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(3, 4, 9, 8, generator=g), torch.randn(3, 4, 11, 8, generator=g)
    q[0, 0] *= 300.0  # scores far from 0 (both signs)
    q, k = q.to(dtype), k.to(dtype)
    mask = torch.rand(3, 1, 9, 11, generator=g) > 0.5
    mask[1, :, 4] = False  # a fully masked row
    mask[2, :, 0] = True  # a row with nothing masked
    _, probs, scores = scaled_dot_product(q, k, k, mask)
    full = torch.where(mask, scores, torch.finfo(dtype).min).softmax(-1).masked_fill(~mask, 0.0)
    assert torch.equal(probs, full)
    assert (probs[1, :, 4] == 0).all() and not torch.isnan(probs).any()
    # Written into map buffers (a traced forward), masked and softmaxed in place: the same numbers.
    into = AttnMaps(scores=torch.empty_like(scores), probs=torch.empty_like(probs))
    _, probs_into, _ = scaled_dot_product(q, k, k, mask, into=into)
    assert probs_into.data_ptr() == into.probs.data_ptr() and torch.equal(probs_into, full)


@pytest.mark.parametrize("case", ["no mask", "padding", "fully masked row", "neg_inf_fill", "autograd"])
def test_maps_written_into_given_buffers_are_the_same_numbers(case):
    """scaled_dot_product(into=...) writes scores and probabilities into the given (strided) slices
    and returns those very tensors; the numbers equal the path that allocates its own, bit for bit."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    mask = None
    if case != "no mask":
        mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
        mask[1, ..., 3:] = False
        if case != "padding":
            mask[0, ..., 2, :] = False
    if case == "autograd":
        q.requires_grad_(True)
    buf_s, buf_p = torch.full((4, 2, 3, 5, 5), 7.0), torch.full((4, 2, 3, 5, 5), 7.0)  # (layer, B, H, q, k)
    into = AttnMaps(scores=buf_s[2], probs=buf_p[2])
    fill = case == "neg_inf_fill"
    out, probs, scores = scaled_dot_product(q, k, v, mask, fill, into=into)
    ref_out, ref_probs, ref_scores = scaled_dot_product(q, k, v, mask, fill)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(buf_p[2], ref_probs.detach(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(buf_s[2], ref_scores.detach(), rtol=0, atol=0)
    assert (buf_p[[0, 1, 3]] == 7.0).all() and (buf_s[[0, 1, 3]] == 7.0).all()  # other layers untouched
    if case == "autograd":  # autograd keeps its own tensors (a detached copy goes into the buffers)
        assert probs.requires_grad and not buf_p.requires_grad
        out.sum().backward()
        assert q.grad is not None
    else:
        assert probs.data_ptr() == buf_p[2].data_ptr() and scores.data_ptr() == buf_s[2].data_ptr()


def test_traced_maps_are_one_allocation_per_kind():
    """A traced forward writes every layer's maps into one buffer per kind (no per-layer copies to
    stack): each layer's probabilities lie inside that buffer and equal a single layer's own result."""
    model = make("cpu")
    src, tgt = batch("cpu")
    with torch.no_grad():
        out = model(src, tgt, return_attn=True)
        enc = model.src_embed(src)
        _, ref = model.encoder[0](enc, out.masks.enc_self, True)
    for kind, maps in out.attn.items():
        base = maps.probs.untyped_storage().data_ptr()
        assert all(maps.probs[:, i].untyped_storage().data_ptr() == base for i in range(maps.probs.shape[1]))
        assert maps.probs.untyped_storage().nbytes() == maps.probs.numel() * maps.probs.element_size(), kind
    torch.testing.assert_close(out.attn["enc_self"].probs[:, 0], ref.probs, rtol=0, atol=0)


# -- capture -------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_outputs_identical_with_and_without_capture(device, variant):
    model = make(device, **CONFIGS[variant])
    src, tgt = batch(device, model.cfg.tgt_vocab_size)
    with torch.no_grad():
        fast = model(src, tgt)
        slow = model(src, tgt, return_attn=True)
    assert fast.attn == {}
    torch.testing.assert_close(fast.logits, slow.logits, atol=1e-5, rtol=0)
    cfg = model.cfg
    assert slow.attn["enc_self"].probs.shape == (3, cfg.n_enc_layers, cfg.n_heads, 7, 7)
    assert slow.attn["dec_self"].probs.shape == (3, cfg.n_dec_layers, cfg.n_heads, 5, 5)
    assert slow.attn["cross"].probs.shape == (3, cfg.n_dec_layers, cfg.n_heads, 5, 7)
    assert slow.attn["cross"].scores.shape == slow.attn["cross"].probs.shape


@pytest.mark.parametrize("device", DEVICES)
def test_probabilities_are_distributions_and_masked_entries_exactly_zero(device):
    model = make(device)
    src, tgt = batch(device)
    with torch.no_grad():
        out = model(src, tgt, return_attn=True)
    for kind in ("enc_self", "dec_self", "cross"):
        probs = out.attn[kind].probs  # (B, layer, H, q, k)
        mask = out.masks.get(kind)[:, None, None].expand_as(probs)
        assert (probs[~mask] == 0).all(), kind
        sums = probs.sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-6, rtol=0)
        # the captured scores really are q.k/sqrt(d) that softmax turned into probs
        masked_scores = out.attn[kind].scores.masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(masked_scores.softmax(-1), probs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_future_target_tokens_never_change_earlier_outputs(device):
    model = make(device)
    src, tgt = batch(device)
    with torch.no_grad():
        ref = model(src, tgt).logits
        for pos in range(1, tgt.shape[1]):
            changed = tgt.clone()
            changed[:, pos] = (changed[:, pos] + 5) % 28 + 4
            out = model(src, changed).logits
            torch.testing.assert_close(out[:, :pos], ref[:, :pos], atol=1e-6, rtol=0)
            assert not torch.allclose(out[0, pos:], ref[0, pos:])  # the change did reach later positions


@pytest.mark.parametrize("device", DEVICES)
def test_pad_content_never_changes_non_pad_outputs(device):
    model = make(device)
    src, tgt = batch(device)
    masks = model.make_masks(src, tgt)
    with torch.no_grad():
        ref = model(src, tgt, masks=masks)
        src2, tgt2 = src.clone(), tgt.clone()
        src2[src == 0] = 9  # new content where PAD was, same masks
        tgt2[tgt == 0] = 11
        out = model(src2, tgt2, masks=masks)
    real_t = tgt != 0
    torch.testing.assert_close(out.logits[real_t], ref.logits[real_t], atol=1e-6, rtol=0)
    real_s = src != 0
    torch.testing.assert_close(out.memory[real_s], ref.memory[real_s], atol=1e-6, rtol=0)


# -- decoding ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_steps_match_teacher_forced_trace(device):
    """Each greedy step, redone by hand as a forward pass on the prefix it had, chose the token
    greedy_decode returned and attended exactly as the teacher-forced pass on the whole output."""
    model = make(device, seed=5)
    cfg = model.cfg
    src, _ = batch(device)
    res = greedy_decode(model, src, max_len=6)
    assert res.ids.shape == res.out_ids.shape
    assert (res.ids[:, 0] == cfg.bos_id).all()
    with torch.no_grad():
        full = model(src, res.ids, return_attn=True)
        prefixes = [model(src, res.ids[:, : t + 1], return_attn=True) for t in range(res.ids.shape[1])]
    for i, n in enumerate(res.lengths):
        row = res.out_ids[i].tolist()
        assert all(tok != cfg.pad_id for tok in row[:n]) and all(tok == cfg.pad_id for tok in row[n:])
        assert cfg.eos_id not in row[: n - 1]  # steps run until EOS (or max_len), no further
        assert row[n - 1] == cfg.eos_id or n == 6
        for t in range(n):
            step = prefixes[t]  # the step's own forward pass: decoder input = BOS + tokens so far
            token_id = int(step.logits[i, t].argmax())
            assert token_id == int(full.logits[i, t].argmax())
            assert token_id == int(res.out_ids[i, t])
            torch.testing.assert_close(
                step.attn["cross"].probs[i, :, :, t].cpu(),
                full.attn["cross"].probs[i, :, :, t].cpu(),
                atol=1e-6,
                rtol=0,
            )
            dec = full.attn["dec_self"].probs[i, :, :, t, : t + 1].cpu()
            torch.testing.assert_close(
                step.attn["dec_self"].probs[i, :, :, t, : t + 1].cpu(), dec, atol=1e-6, rtol=0
            )
            if t + 1 < res.ids.shape[1] and t + 1 < res.lengths[i]:
                assert int(res.ids[i, t + 1]) == token_id  # the chosen token is fed back


def test_greedy_stops_at_eos():
    model = make("cpu", seed=1)
    with torch.no_grad():  # make EOS the only possible output
        model.generator.bias.fill_(-1e4)
        model.generator.bias[model.cfg.eos_id] = 1e4
    src, _ = batch("cpu")
    res = greedy_decode(model, src)
    assert res.lengths == [1, 1, 1]
    assert res.out_ids[:, 0].tolist() == [2, 2, 2]


def test_greedy_of_a_model_that_writes_pad_and_never_eos():
    """An untrained model (a step-0 snapshot) may predict PAD and never EOS: every step it ran counts."""
    model = make("cpu", seed=1)
    with torch.no_grad():
        model.generator.weight.zero_()
        model.generator.bias.fill_(-1e4)
        model.generator.bias[model.cfg.pad_id] = 1e4
    src, _ = batch("cpu")
    res = greedy_decode(model, src, max_len=5)
    assert res.lengths == [5, 5, 5] and res.out_ids.shape == (3, 5)
    assert (res.out_ids == model.cfg.pad_id).all()
    assert res.ids[:, 0].tolist() == [model.cfg.bos_id] * 3


# -- configuration ----------------------------------------------------------------------


def test_base_config_parameter_count_matches_paper():
    cfg = base()
    assert (cfg.n_enc_layers, cfg.d_model, cfg.n_heads, cfg.d_ff) == (6, 512, 8, 2048)
    n = count_parameters(Transformer(cfg))
    assert abs(n - 65e6) / 65e6 < 0.05, n


def test_config_rejects_impossible_values_and_round_trips(tmp_path):
    with pytest.raises(ConfigError, match="divisible"):
        TransformerConfig(d_model=10, n_heads=3)
    with pytest.raises(ConfigError):
        TransformerConfig(dropout=1.5)
    with pytest.raises(ConfigError, match="unknown config keys"):
        TransformerConfig.from_dict({"d_modle": 4})
    cfg = tiny(norm="pre")
    cfg.to_json(tmp_path / "c.json")
    assert TransformerConfig.from_json(tmp_path / "c.json") == cfg


def test_encoder_only_classifier():
    cfg = tiny(n_dec_layers=0, n_classes=2, pooling="mean")
    model = Transformer(cfg).eval()
    src, _ = batch("cpu")
    out = model(src, return_attn=True)
    assert out.logits.shape == (3, 2)
    assert set(out.attn) == {"enc_self"}
    assert model.decoder is None and model.generator is None
    # mean pooling ignores PAD positions
    masks = model.make_masks(src)
    src2 = src.clone()
    src2[src == 0] = 7
    torch.testing.assert_close(model(src2, masks=masks).logits, out.logits, atol=1e-6, rtol=0)


# -- positional encoding --------------------------------------------------------------------


def test_sinusoidal_table_is_the_papers_formula():
    pe = sinusoidal_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert math.isclose(pe[pos, 2 * i], math.sin(angle), abs_tol=1e-6)
            assert math.isclose(pe[pos, 2 * i + 1], math.cos(angle), abs_tol=1e-6)
    wl = wavelengths(16)
    assert math.isclose(wl[0], 2 * math.pi, rel_tol=1e-6) and wl[2] > wl[0] and wl[0] == wl[1]


def test_embeddings_scaled_by_sqrt_d_model_plus_positions():
    model = make("cpu")
    ids = torch.tensor([[5, 6, 7]])
    got = model.src_embed(ids)
    want = model.src_embed.tok(ids) * math.sqrt(16) + sinusoidal_table(64, 16)[:3]
    torch.testing.assert_close(got, want)


def test_explicit_masks_override_defaults():
    model = make("cpu")
    src, tgt = batch("cpu")
    default = model.make_masks(src, tgt)
    everything = Masks(
        enc_self=torch.ones_like(default.enc_self),
        dec_self=torch.ones_like(default.dec_self),
        cross=torch.ones_like(default.cross),
    )
    with torch.no_grad():
        out = model(src, tgt, return_attn=True, masks=everything)
    # with no causal mask, the first query sees later keys
    assert (out.attn["dec_self"].probs[:, :, :, 0, 1:] > 0).all()
    assert np.array_equal(out.masks.dec_self.numpy(), everything.dec_self.numpy())


def test_base_with_max_len_2048_traces_and_draws_2048_tokens(tmp_path):
    """The paper's base model built for 2,048 positions traces a 2,047-token input (+ EOS) within the
    map budget (teacher forcing: the budget counts the real target, not a guess as long as the
    source), every map row sums to 1, and the pages' figures stay bounded: the grid shows blocks
    (16 x 16 tokens a cell), the head view carries that head's exact weights."""
    from attnscope.core.transformer import checkpoint
    from attnscope.core.transformer.tokenizer import CharTokenizer
    from attnscope.dashboard.plots import attention as P
    from attnscope.models import registry

    tok = CharTokenizer.fit(["abcdefghijklmnopqrstuvwxyz"])
    torch.manual_seed(0)
    model = Transformer(base(len(tok)).replace(max_len=2048)).eval()
    lm = registry.load(str(checkpoint.save(tmp_path / "base2048", model, tok, tok)))
    assert lm.max_src_tokens == 2047
    text = "".join("abcdefghijklmnopqrstuvwxyz"[i * 7 % 26] for i in range(lm.max_src_tokens))
    tr = lm.trace([text], ["abc"])[0]
    probs = tr.probs("enc_self")
    assert probs.shape == (6, 8, 2048, 2048)
    np.testing.assert_allclose(probs[-1, -1].sum(-1), 1.0, atol=1e-4)
    q_tok, k_tok = tr.axes("enc_self")
    grid = P.grid_figure(probs, q_tok, k_tok, title="all", mask=tr.mask("enc_self"))
    z = np.asarray(grid.data[0].z)
    assert z.shape == (6 * 128, 8 * 128)  # 128 x 128 blocks a tile
    tile = z[:128, :128]
    np.testing.assert_array_equal(tile, P.quantise(P.block_max(probs[0, 0], 16, 16), log=False))
    head = P.head_heatmap(P.head_weights(probs, 5, 7), q_tok, k_tok, title="head")
    np.testing.assert_array_equal(np.asarray(head.data[0].z), probs[5, 7])
