"""attnscope.core.families.capture on more attention code written the way people write it (tests/usermodels): each map
the model computed is recorded, in call order, with its kind and the mask the model applied, on
padded batches; outputs are bit-identical with and without capture; square softmaxes that are not
attention are left out. Styles that capture got wrong before: baddbmm with the mask as its input
and head-major heads without any embedding (audio_baddbmm), AllenNLP's renormalizing masked_softmax
(allennlp), sequence-first token ids (fairseq_seqfirst), einsum scores laid out (q, k, B, H) with a
memory of past keys (transfo_xl), KV-cache decoding steps (llama_meta), index-assignment masks
(d2l: recorded via zeros before, with the masked scores as its scores).

A bilinear pointer scorer (a biaffine parser's ``(x W) @ y^T``) cannot be told from attention by
lineage (queries and keys are both activations): it is recorded, and ``exclude=`` keeps it out."""

from __future__ import annotations

import importlib

import pytest
import torch

from attnscope.core.families.capture import capture_attention

STYLES = {  # module -> the mask_source its records must have
    "bert_ext": "additive",  # inputs_embeds + ids, (1 - mask) * -10000.0 extended mask
    "nanogpt_manual": "masked_fill",  # bias buffer == 0 -> -inf, wte/wpe, tied lm_head
    "einsum_bqhd": "masked_fill",  # einsum "bqhd,bkhd->bhqk", softmax(dim=3)
    "timeseries": "masked_fill",  # no embedding: Linear input projection, bool key_padding_mask
    "t5_relbias": "masked_fill",  # relative-position bucket bias, float32 softmax
    "llama_meta": "additive",  # rotary (complex), KV cache buffers, repeat_kv, triu(-inf) mask
    "seq2seq_attn2": "where",  # cross-attention module named attn2, torch.where masks
    "megatron_baddbmm": "masked_fill",  # sequence-first, baddbmm into torch.empty, masked_fill_
    "d2l": "index",  # valid lengths, X[~mask] = -1e6
    "audio_baddbmm": "additive",  # no embedding, head-major (H*B), mask as baddbmm's input
    "allennlp": "multiplied",  # softmax(vector * mask) * mask / sum
    "fairseq_seqfirst": "additive",  # (T, B) ids, attn_weights += future mask, then masked_fill
    "pointer_gate": "masked_fill",  # + a pointer softmax and an expert router, both (B, T, T)
    "transfo_xl": "additive",  # einsum "ibnd,jbnd->ijbn", softmax(dim=1), scores - 1e30 * mask
}
PAD = 0


def _style(name: str):
    return importlib.import_module(f"usermodels.{name}")


def _main_output(out):
    return out[0] if isinstance(out, tuple) else out


def _run(model, batch, capture: bool):
    model.reset()
    with torch.no_grad():
        if not capture:
            return _main_output(model(*batch)), None, list(model.computed)
        with capture_attention(model) as cap:
            out = model(*batch)
    return _main_output(out), cap, list(model.computed)


def _causal(q: int, k: int) -> torch.Tensor:
    return torch.ones(q, k, dtype=torch.bool).tril(k - q)  # with k > q the first k - q keys are the past


def _expected_mask(name: str, batch, rec) -> torch.Tensor:
    """(B, q, k) True = what the model let this call's queries see."""
    _, _, q, k = rec.probs.shape
    if name in ("nanogpt_manual", "llama_meta", "transfo_xl"):  # causal only (padding is in the future)
        return _causal(q, k).expand(rec.probs.shape[0], q, k)
    if name == "bert_ext":
        keys = batch[1] != 0
    elif name == "timeseries":
        keys = ~batch[1]
    elif name == "t5_relbias":
        keys = batch[1] != 0
    elif name == "audio_baddbmm":
        keys = torch.arange(k)[None, :] < batch[1][:, None]
    elif name == "fairseq_seqfirst":
        keys = batch[0].t() != PAD  # (T, B) ids
    elif name == "allennlp":
        keys = (batch[0] if rec.kind == "enc_self" and k == batch[0].shape[1] else batch[1]) != PAD
    elif name in ("seq2seq_attn2", "d2l") and rec.kind == "dec_self":
        keys = (batch[-1] != PAD) if name == "seq2seq_attn2" else torch.ones_like(batch[-1], dtype=torch.bool)
    else:  # the source tokens are the keys
        keys = batch[0] != PAD
    mask = keys[:, None, :k].expand(-1, q, -1)
    return mask & _causal(q, k) if rec.kind == "dec_self" else mask


@pytest.mark.parametrize("name", list(STYLES))
def test_captured_maps_equal_what_the_model_computed(name):
    mod = _style(name)
    model, batch = mod.build(), mod.sample_batch()
    plain, _, _ = _run(model, batch, capture=False)
    out, cap, computed = _run(model, batch, capture=True)
    assert torch.equal(plain, out), "capture changed the model's output"
    assert not cap.notes, cap.notes
    assert len(cap.records) == len(computed) > 0, [
        (r.name, r.kind, tuple(r.probs.shape)) for r in cap.records
    ]
    for i, (rec, (label, probs)) in enumerate(zip(cap.records, computed, strict=True)):
        assert rec.probs.shape == probs.shape, (i, rec.name, tuple(rec.probs.shape), tuple(probs.shape))
        torch.testing.assert_close(rec.probs, probs, atol=1e-6, rtol=0, msg=f"{name} call {i} {rec.name}")
        assert rec.kind == label, (i, rec.name, rec.kind, label)
        assert rec.mask_source == STYLES[name], (i, rec.name, rec.mask_source)


@pytest.mark.parametrize("name", list(STYLES))
def test_masks_are_what_the_model_hid_and_scores_give_the_probabilities(name):
    mod = _style(name)
    model, batch = mod.build(), mod.sample_batch()
    _, cap, _ = _run(model, batch, capture=True)
    assert cap.records
    for rec in cap.records:
        assert torch.equal(rec.mask, _expected_mask(name, batch, rec)), (rec.name, rec.kind)
        assert not rec.head_masks_differ
        assert (rec.probs.masked_fill(rec.mask[:, None], 0) == 0).all()  # nothing on hidden keys
        filled = rec.scores.masked_fill(~rec.mask[:, None], float("-inf"))
        torch.testing.assert_close(filled.softmax(-1), rec.probs, atol=1e-6, rtol=0)


def test_cross_attention_named_attn2_with_as_many_keys_as_queries():
    """No name says "cross" and the lengths are equal: queries and keys come from different
    embedding calls (the shared embedding is called once for the source, once for the target)."""
    mod = _style("seq2seq_attn2")
    model, (src, tgt) = mod.build(), mod.sample_batch()
    _, cap, computed = _run(model, (src[:, :6], tgt), capture=True)
    assert [r.kind for r in cap.records] == [label for label, _ in computed]
    assert [r.name for r in cap.of("cross")] == ["tgt_blocks.0.attn2", "tgt_blocks.1.attn2"]


def test_kv_cache_decoding_steps_are_decoder_self_attention():
    """LLaMA's generation loop: after the prompt, each step's query attends to the cached keys and
    its own (q = 1, k = past + 1), whether the prompt ran inside the capture or before it."""
    mod = _style("llama_meta")
    model, (tokens,) = mod.build(), mod.sample_batch()
    prompt, steps = tokens[:, :4], [tokens[:, 4:5], tokens[:, 5:6]]
    model.reset()
    with torch.no_grad():
        model(prompt, 0)
        plain = model(steps[0], 4)
        model.reset()
        model(prompt, 0)
        with capture_attention(model) as cap:  # one step, the cache filled outside the capture
            out = model(steps[0], 4)
    assert torch.equal(plain, out)
    assert [(r.kind, tuple(r.probs.shape)) for r in cap.records] == [("dec_self", (3, 4, 1, 5))] * 2
    for rec, (_, probs) in zip(cap.records, model.computed[-2:], strict=True):
        torch.testing.assert_close(rec.probs, probs, atol=1e-6, rtol=0)
    model.reset()
    with torch.no_grad(), capture_attention(model) as cap:  # the whole loop: prompt, then two steps
        model(prompt, 0)
        for i, step in enumerate(steps):
            model(step, 4 + i)
    assert [(r.kind, r.probs.shape[-2:]) for r in cap.records] == [
        (kind, torch.Size(shape)) for kind, shape in [("dec_self", (4, 4))] * 2 + [("dec_self", (1, 5))] * 2
        + [("dec_self", (1, 6))] * 2
    ]  # fmt: skip
    for rec, (_, probs) in zip(cap.records, model.computed, strict=True):
        torch.testing.assert_close(rec.probs, probs, atol=1e-6, rtol=0)


def test_transformer_xl_memory_keys_are_self_attention_with_the_causal_mask():
    """The second segment attends over 5 remembered positions and its own 6 (k = 11 > q = 6)."""
    mod = _style("transfo_xl")
    model, (data,) = mod.build(), mod.sample_batch()
    with torch.no_grad():
        _, mems = model(data)
        model.reset()
        plain, _ = model(data, mems)
        model.reset()
        with capture_attention(model) as cap:
            out, _ = model(data, mems)
    assert torch.equal(plain, out) and not cap.notes
    assert [(r.kind, tuple(r.probs.shape)) for r in cap.records] == [("dec_self", (3, 4, 6, 11))] * 2
    for rec, (_, probs) in zip(cap.records, model.computed, strict=True):
        torch.testing.assert_close(rec.probs, probs, atol=1e-6, rtol=0)
        assert torch.equal(rec.mask, _causal(6, 11).expand(3, 6, 11))


def test_square_softmaxes_that_are_not_attention_are_left_out():
    """The pointer distribution and the expert router are (B, T, T) like self-attention, but both
    come out of an nn.Linear: only the encoder's attention is recorded; include= forces one in."""
    mod = _style("pointer_gate")
    model, batch = mod.build(), mod.sample_batch()
    out, cap, _ = _run(model, batch, capture=True)
    assert out.shape == (3, 7, 7) and mod.N_EXPERTS == 7  # square: shapes alone cannot tell
    assert [r.name for r in cap.records] == ["encoder"]
    with torch.no_grad(), capture_attention(model, include=["moe"]) as forced:
        model(*batch)
    assert [r.name for r in forced.records] == ["encoder", "moe"]


class _Biaffine(torch.nn.Module):
    """A biaffine dependency parser's arc scorer: ``(dep @ W) @ head^T`` softmaxed over head words."""

    def __init__(self, d=16):
        super().__init__()
        self.embed, self.arc_dep, self.arc_head = (
            torch.nn.Embedding(10, d), torch.nn.Linear(d, d), torch.nn.Linear(d, d)
        )  # fmt: skip
        self.W = torch.nn.Parameter(torch.randn(d, d) / d)

    def forward(self, words):
        x = self.embed(words)
        return ((self.arc_dep(x) @ self.W) @ self.arc_head(x).transpose(1, 2)).softmax(-1)


def test_bilinear_pointer_scores_are_recorded_unless_excluded():
    """Two activations multiplied, like q @ k.T: lineage cannot tell these from attention (the
    documented limit); exclude= keeps the scorer out."""
    model, words = _Biaffine(), torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    with torch.no_grad(), capture_attention(model) as cap:
        model(words)
    with torch.no_grad(), capture_attention(model, exclude=[""]) as excluded:
        model(words)
    assert [tuple(r.probs.shape) for r in cap.records] == [(2, 1, 4, 4)] and not excluded.records


def test_autograd_function_and_checkpoint_recomputation_in_training():
    """Attention inside a custom autograd.Function, blocks checkpointed: the forward's maps are
    recorded once (backward's recomputation adds none), outputs and gradients are bit-identical."""
    mod = _style("checkpointed")
    model, batch = mod.build(), mod.sample_batch()

    def step(capture: bool):
        model.reset()
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout draws
        with capture_attention(model) if capture else torch.enable_grad() as cap:
            out = model(*batch)
            forward_maps = list(model.computed)
            out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()], cap, forward_maps

    plain, plain_grads, _, _ = step(capture=False)
    out, grads, cap, forward_maps = step(capture=True)
    assert torch.equal(plain, out)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, grads, strict=True))
    assert len(model.computed) == 2 * len(forward_maps) == 4  # the model itself ran each block twice
    assert not cap.notes and [r.kind for r in cap.records] == ["enc_self", "enc_self"]
    for rec, (_, probs) in zip(cap.records, forward_maps, strict=True):
        torch.testing.assert_close(rec.probs, probs, atol=1e-6, rtol=0)
        assert torch.equal(rec.mask, (batch[0] != PAD)[:, None, :].expand(3, 7, 7))
