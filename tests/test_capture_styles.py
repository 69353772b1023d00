"""attnscope.core.families.capture on models written the way users write them (tests/usermodels): every attention map
the model computed is recorded, in call order, with its kind, equal within 1e-6 on padded batches;
the vocabulary softmax is not; outputs are bit-identical with and without capture."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

STYLES = {  # module -> what it imitates
    "tutorial": "3-D (B*H) heads, nn.Softmax(dim=2), masked_fill(-inf), one module for self and context, vocab softmax",
    "annotated": "Annotated Transformer: 4-D, torch.softmax / Tensor.softmax, mask == 0 -> -1e9, log_softmax",
    "nanogpt": "nanoGPT: F.scaled_dot_product_attention(is_causal=True)",
    "headmajor": "head-major (H*B) heads from permute(2, 0, 1, 3), mask.repeat(n_head, 1, 1)",
    "additive": "additive finfo.min mask, F.softmax, grouped-query heads by repeat_interleave",
    "sdpa_masked": "SDPA with a bool attn_mask, enable_gqa=True and scale=0.3",
}


def _style(name: str):
    return importlib.import_module(f"usermodels.{name}")


def _run(model, batch, capture: bool):
    model.reset()
    with torch.no_grad():
        if not capture:
            return model(*batch), None, list(model.computed)
        with capture_attention(model) as cap:
            out = model(*batch)
    return out, cap, list(model.computed)


@pytest.mark.parametrize("name", list(STYLES))
def test_captured_maps_equal_what_the_model_computed(name):
    mod = _style(name)
    model, batch = mod.build(), mod.sample_batch()
    plain, _, _ = _run(model, batch, capture=False)
    out, cap, computed = _run(model, batch, capture=True)
    assert torch.equal(plain, out), "capture changed the model's output"
    assert not cap.notes, cap.notes
    assert len(cap.records) == len(computed) > 0, [(r.name, r.kind) for r in cap.records]
    for i, (rec, (label, probs)) in enumerate(zip(cap.records, computed, strict=True)):
        assert rec.probs.shape == probs.shape, (i, rec.name)
        torch.testing.assert_close(rec.probs, probs, atol=1e-6, rtol=0, msg=f"{name} call {i} {rec.name}")
        assert rec.kind == label, (i, rec.name, rec.kind, label)


@pytest.mark.parametrize("name", ["tutorial", "annotated", "headmajor", "additive", "sdpa_masked"])
def test_masks_are_kept_and_scores_give_the_probabilities(name):
    """The mask kept with each record says exactly which keys the model hid (PAD keys, and the future
    in decoder self-attention), and softmax(scores, masked) gives the recorded probabilities back."""
    mod = _style(name)
    model, batch = mod.build(), mod.sample_batch()
    _, cap, _ = _run(model, batch, capture=True)
    pad = 0
    src = batch[0]
    for rec in cap.records:
        assert rec.mask is not None and rec.mask_source in ("masked_fill", "additive", "arguments"), rec
        b, h, q, k = rec.probs.shape
        keys = (batch[1] if rec.kind == "dec_self" and len(batch) > 1 else src) != pad  # (B, k)
        if name == "sdpa_masked" or (rec.kind == "dec_self"):
            causal = torch.ones(q, k, dtype=torch.bool).tril()
        else:
            causal = torch.ones(q, k, dtype=torch.bool)
        expected = keys[:, None, :k] & causal
        assert torch.equal(rec.mask, expected), (rec.name, rec.kind)
        assert (rec.probs.masked_fill(rec.mask[:, None], 0) == 0).all()  # nothing on hidden keys
        filled = rec.scores.masked_fill(~rec.mask[:, None], float("-inf"))
        torch.testing.assert_close(filled.softmax(-1), rec.probs, atol=1e-6, rtol=0)


def test_vocabulary_softmax_is_not_attention():
    mod = _style("tutorial")
    model, (src, tgt) = mod.build(), mod.sample_batch()
    _, cap, computed = _run(model, (src, tgt), capture=True)
    assert (
        len(cap.records) == len(computed) == 6
    )  # the Generator's nn.Softmax(dim=2) over 20 words is not among them
    assert all(r.probs.shape[-1] in (src.shape[1], tgt.shape[1]) for r in cap.records)
    # include= forces it in, exclude= keeps a module out
    with torch.no_grad(), capture_attention(model, include=["generator*"]) as forced:
        model(src, tgt)
    assert len(forced.records) == 7 and forced.records[-1].probs.shape == (3, 1, 6, mod.VOCAB_SIZE)
    with torch.no_grad(), capture_attention(model, exclude=["decoder*"]) as fewer:
        model(src, tgt)
    assert [r.kind for r in fewer.records] == ["enc_self", "enc_self"]


def test_one_module_called_for_self_and_context_is_two_records_with_kinds():
    mod = _style("tutorial")
    model, batch = mod.build(), mod.sample_batch()
    _, cap, _ = _run(model, batch, capture=True)
    dec = [r for r in cap.records if r.kind != "enc_self"]
    assert [r.kind for r in dec] == ["dec_self", "cross", "dec_self", "cross"]
    assert dec[0].name == dec[1].name  # the same module, two calls
    assert cap.stacks()["cross"].shape == (3, 2, 4, 6, 7)  # (B, layer, head, q, k), layers in call order


def test_kinds_override_and_layers_in_call_order():
    mod = _style("nanogpt")
    model, batch = mod.build(), mod.sample_batch()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*batch)
    assert [r.kind for r in cap.records] == ["dec_self", "dec_self"]  # is_causal=True: causal structure
    with torch.no_grad(), capture_attention(model, kinds={"*": "enc_self"}) as forced:
        model(*batch)
    assert [r.kind for r in forced.records] == ["enc_self", "enc_self"]
    assert all(r.check is not None and r.check < 1e-5 for r in cap.records)  # probs @ v reproduces SDPA


def test_torch_transformer_maps_and_bit_identical_outputs():
    mod = _style("torch_transformer")
    model, (src, tgt) = mod.build(), mod.sample_batch()
    ref = mod.reference_maps(model, src, tgt)
    with torch.enable_grad():  # PyTorch's fused fast path is not taken: outputs must be bit-identical
        plain = model(src, tgt)
        with capture_attention(model) as cap:
            out = model(src, tgt)
    assert torch.equal(plain, out)
    assert [r.kind for r in cap.records] == [label for label, _ in ref]
    for rec, (_, probs) in zip(cap.records, ref, strict=True):
        torch.testing.assert_close(rec.probs, probs, atol=1e-6, rtol=0)


def test_head_split_bug_is_recorded_as_computed():
    """The buggy model's maps are what it computed (garbage included), so the audit can see them."""
    mod = _style("tutorial")
    model, batch = mod.build(bug="headsplit"), mod.sample_batch()
    _, cap, computed = _run(model, batch, capture=True)
    for rec, (_, probs) in zip(cap.records, computed, strict=True):
        torch.testing.assert_close(rec.probs, probs, atol=1e-6, rtol=0)
    leaked = sum(float(r.probs[2, :, :, 3:].sum()) for r in cap.records if r.kind == "enc_self")
    assert leaked > 0.1  # the short sequence reads PAD keys: wrong masks reached its heads


@pytest.mark.parametrize("name", ["bert", "gpt2", "bart", "t5", "marian"])
def test_hugging_face_code_unchanged_equals_output_attentions(name):
    """Code nobody here wrote: transformers' eager attention (additive masks, position biases, softmax
    in float32) captured as is, each map equal to the library's own output_attentions, kinds right."""
    transformers = pytest.importorskip("transformers")
    del transformers
    from test_hf import _specs

    cls, cfg, _ = _specs()[name]
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 9, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    kw = dict(input_ids=ids, attention_mask=mask, output_attentions=True, return_dict=True)
    if cfg.is_encoder_decoder:
        kw["decoder_input_ids"] = torch.randint(5, 9, (2, 5), generator=g)
    with torch.no_grad():
        plain = model(**kw)
        with capture_attention(model) as cap:
            out = model(**kw)
    key = "logits" if hasattr(out, "logits") else "last_hidden_state"
    assert torch.equal(getattr(plain, key), getattr(out, key))
    ref = {
        "enc_self": out.encoder_attentions
        if cfg.is_encoder_decoder
        else (() if name == "gpt2" else out.attentions),
        "dec_self": out.decoder_attentions
        if cfg.is_encoder_decoder
        else (out.attentions if name == "gpt2" else ()),
        "cross": out.cross_attentions if cfg.is_encoder_decoder else (),
    }
    for kind, maps in ref.items():
        got = cap.of(kind)
        assert len(got) == len(maps), (kind, [(r.name, r.kind) for r in cap.records])
        for rec, expected in zip(got, maps, strict=True):
            torch.testing.assert_close(rec.probs, expected, atol=1e-6, rtol=0)
            assert rec.mask_source == "additive"
            if kind != "dec_self":  # keys are the source: seq 1's PAD keys are masked
                assert not rec.mask[1, :, 4:].any()


def _more_families():
    import transformers as T

    small = dict(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, vocab_size=50
    )
    return {  # name -> (config, model class, kind): styles the five above do not cover
        "llama": (T.LlamaConfig(**small, num_key_value_heads=2), T.LlamaModel, "dec_self"),  # rotary, GQA
        "mistral": (
            T.MistralConfig(**small, num_key_value_heads=1, sliding_window=3),
            T.MistralModel,
            "dec_self",
        ),
        "gpt_neox": (T.GPTNeoXConfig(**small), T.GPTNeoXModel, "dec_self"),  # fused qkv, partial rotary
        "bloom": (
            T.BloomConfig(hidden_size=32, n_head=4, n_layer=2, vocab_size=50),
            T.BloomModel,
            "dec_self",
        ),  # alibi
        "distilbert": (
            T.DistilBertConfig(dim=32, n_heads=4, n_layers=2, hidden_dim=64, vocab_size=50),
            T.DistilBertModel,
            "enc_self",
        ),  # fmt: skip
        "vit": (
            T.ViTConfig(**{**small, "vocab_size": None}, image_size=16, patch_size=4),
            T.ViTModel,
            "enc_self",
        ),
    }


@pytest.mark.parametrize("name", ["llama", "mistral", "gpt_neox", "bloom", "distilbert", "vit"])
def test_more_hugging_face_families_equal_output_attentions(name):
    """Rotary positions with grouped KV heads, a sliding window, ALiBi through baddbmm, a ViT that has
    no token embedding at all: captured unchanged, equal to output_attentions, the kind from the mask.
    The padded sequence comes first, so kinds are not read off an unpadded first row."""
    pytest.importorskip("transformers")
    cfg, cls, kind = _more_families()[name]
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).eval()
    g = torch.Generator().manual_seed(0)
    if name == "vit":
        kw = dict(pixel_values=torch.randn(2, 3, 16, 16, generator=g))
    else:
        mask = torch.ones(2, 7, dtype=torch.long)
        mask[0, 4:] = 0
        kw = dict(input_ids=torch.randint(5, 40, (2, 7), generator=g), attention_mask=mask)
    with torch.no_grad():
        plain = model(**kw, output_attentions=True)
        with capture_attention(model) as cap:
            out = model(**kw)
    assert torch.equal(plain.last_hidden_state, out.last_hidden_state)
    assert [r.kind for r in cap.records] == [kind] * 2, [(r.name, r.kind) for r in cap.records]
    for rec, expected in zip(cap.records, plain.attentions, strict=True):
        torch.testing.assert_close(rec.probs, expected, atol=1e-6, rtol=0)
        if name != "vit":  # the first sequence's PAD keys are masked for its real queries
            assert rec.mask is not None and not rec.mask[0, :4, 4:].any()


class _MinGPT(torch.nn.Module):
    """minGPT: a causal buffer compared with 0 inside masked_fill, F.softmax, q @ k.T * scale."""

    def __init__(self, d=16, h=4, t=8):
        super().__init__()
        self.h, self.emb, self.c_attn = h, torch.nn.Embedding(10, d), torch.nn.Linear(d, 3 * d)
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, idx):
        x = self.emb(idx)
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / k.size(-1) ** 0.5)
        att = torch.nn.functional.softmax(
            att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1
        )
        self.ref = att
        return (att @ v).transpose(1, 2).reshape(b, t, c)


class _Einsum(torch.nn.Module):
    """lucidrains style: einsum scores, masked_fill(-finfo.max) with a key mask, Tensor.softmax."""

    def __init__(self, d=16, h=4):
        super().__init__()
        self.h, self.emb, self.qkv = h, torch.nn.Embedding(10, d), torch.nn.Linear(d, 3 * d, bias=False)

    def forward(self, idx):
        x, keep = self.emb(idx), idx != 0
        q, k, v = (
            z.reshape(*z.shape[:2], self.h, -1).permute(0, 2, 1, 3) for z in self.qkv(x).chunk(3, dim=-1)
        )
        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * q.shape[-1] ** -0.5
        self.ref = sim.masked_fill(~keep[:, None, None, :], -torch.finfo(sim.dtype).max).softmax(dim=-1)
        return torch.einsum("b h i j, b h j d -> b h i d", self.ref, v)


@pytest.mark.parametrize("model, kind", [(_MinGPT(), "dec_self"), (_Einsum(), "enc_self")])
def test_more_styles_mingpt_and_einsum(model, kind):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 0, 0, 0]])
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.kind == kind and rec.mask_source == "masked_fill" and not cap.notes
    torch.testing.assert_close(rec.probs, model.ref, atol=1e-6, rtol=0)
    if kind == "enc_self":
        assert rec.mask[1].tolist() == [[True] * 3 + [False] * 3] * 6
    else:
        assert torch.equal(rec.mask[0], torch.ones(6, 6, dtype=torch.bool).tril())


class _Head(torch.nn.Module):
    """ "Let's build GPT" (Karpathy): one module per head, (B, T, T) scores, a tril buffer."""

    def __init__(self, d=16, size=4, t=8):
        super().__init__()
        self.key, self.query = torch.nn.Linear(d, size, bias=False), torch.nn.Linear(d, size, bias=False)
        self.value = torch.nn.Linear(d, size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(t, t)))

    def forward(self, x):
        _, t, _ = x.shape
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        self.wei = torch.nn.functional.softmax(wei.masked_fill(self.tril[:t, :t] == 0, float("-inf")), dim=-1)
        return self.wei @ self.value(x)


class _HeadsGPT(torch.nn.Module):
    def __init__(self, d=16, n_heads=4, n_layers=2):
        super().__init__()
        self.tok = torch.nn.Embedding(10, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict({"heads": torch.nn.ModuleList(_Head(d, d // n_heads) for _ in range(n_heads)),
                                 "proj": torch.nn.Linear(d, d)})
            for _ in range(n_layers)
        )  # fmt: skip

    def forward(self, idx):
        x = self.tok(idx)
        for b in self.blocks:
            x = x + b["proj"](torch.cat([h(x) for h in b["heads"]], dim=-1))
        return x


def test_one_module_per_head_is_one_layer_of_heads():
    """A ModuleList of single-head modules is recorded as one layer with those heads, in order."""
    model = _HeadsGPT().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 0, 0]]))
    assert [(r.name, r.kind) for r in cap.records] == [
        ("blocks.0.heads", "dec_self"),
        ("blocks.1.heads", "dec_self"),
    ]
    stack = cap.stacks()["dec_self"]
    assert stack.shape == (2, 2, 4, 6, 6)  # (batch, layer, head, query, key)
    for layer, block in enumerate(model.blocks):
        for h, head in enumerate(block["heads"]):
            torch.testing.assert_close(stack[:, layer, h], head.wei, atol=1e-6, rtol=0)
    assert torch.equal(cap.records[0].mask[0], torch.ones(6, 6, dtype=torch.bool).tril())


def test_hugging_face_sdpa_decoding_steps_with_grouped_heads_packed_into_the_query_axis():
    """transformers' SDPA path for one new token under a padding mask packs each KV head's query heads
    into the query axis ((B, H_kv, H / H_kv, d), no repeat_kv): the rows of a slice are heads, not
    positions. Lineage places them: every decoding step is (B, H, 1, keys), equal to the eager twin's
    output_attentions, left padding and all."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, pad_token_id=0, eos_token_id=2,
                                   bos_token_id=1)  # fmt: skip
    models = {}
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        c = transformers.LlamaConfig.from_dict(cfg.to_dict())
        c._attn_implementation = impl
        models[impl] = transformers.LlamaForCausalLM(c).eval()
        models[impl].generation_config.update(pad_token_id=0, eos_token_id=2, min_new_tokens=3)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [3, 4, 5, 6, 7, 9]])
    mask = (ids != 0).long()
    kw = dict(attention_mask=mask, max_new_tokens=3, do_sample=False)
    with torch.no_grad(), capture_attention(models["sdpa"]) as cap:
        models["sdpa"].generate(ids, **kw)
    with torch.no_grad():
        ref = models["eager"].generate(ids, **kw, output_attentions=True, return_dict_in_generate=True)
    steps = [a for step in ref.attentions[1:] for a in step]  # the decoding steps, layer by layer
    got = [r for r in cap.records if r.probs.shape[-2] == 1]
    assert len(got) == len(steps) == 4
    for rec, want in zip(got, steps, strict=True):
        assert (
            rec.exact
            and rec.kind == "dec_self"
            and tuple(rec.probs.shape) == tuple(want.shape) == (2, 4, 1, rec.probs.shape[-1])
        )
        torch.testing.assert_close(rec.probs, want, atol=1e-5, rtol=0)
    assert not cap.notes


def test_query_rows_packed_over_keys_from_outside_the_call_are_flagged():
    """The same packing over a cache handed in from outside the call: lineage cannot tell which axis of
    those keys holds the heads, so the record says it could not place the rows, never guesses."""
    b, h, hkv, d, s = 2, 4, 2, 8, 5
    torch.manual_seed(0)
    proj = nn.Linear(h * d, h * d)

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = proj

        def forward(self, x, k, v, keep):
            q = self.q(x).view(b, 1, h, d).transpose(1, 2).reshape(b, hkv, h // hkv, d)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])

    keep = torch.ones(b, s, dtype=torch.bool)
    keep[1, :2] = False
    step = Step()
    with torch.no_grad(), capture_attention(step) as cap:
        step(torch.randn(b, 1, h * d), torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d), keep)
    (rec,) = cap.records
    assert not rec.exact and "packed into its query axis" in rec.flag
    assert any("packed into its query axis" in n for n in cap.notes)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("static", [False, True])
def test_a_hugging_face_decode_step_after_a_prefill_outside_the_block(impl, static):
    """The prompt run before the block, one step inside with its past key values (a DynamicCache, or a
    StaticCache made before): on the eager path with grouped heads the step was flagged "the heads of one
    sequence see different keys" (the past keys were one position per element, so each key head's
    slots were other positions), and no trace could draw it. Now the step is exact, equal to eager
    ``output_attentions``, the past keys ``<cache i>``, a static cache's empty slots padding."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=32)  # fmt: skip
    models = {}
    for name in ("eager", impl):
        torch.manual_seed(0)
        c = transformers.LlamaConfig.from_dict(cfg.to_dict())
        c._attn_implementation = name
        models[name] = transformers.LlamaForCausalLM(c).eval()
    ids = torch.randint(0, 50, (2, 5))

    def prefill(model):
        if not static:
            return model(ids, use_cache=True), {}
        try:
            cache = transformers.StaticCache(config=cfg, max_batch_size=2, max_cache_len=8)
        except TypeError:  # (newer releases take the batch from the first write)
            cache = transformers.StaticCache(config=cfg, max_cache_len=8)
        out = model(ids, past_key_values=cache, use_cache=True, cache_position=torch.arange(5))
        return out, {"cache_position": torch.tensor([5])}

    with torch.no_grad():
        out, kw = prefill(models["eager"])
        nxt = out.logits[:, -1:].argmax(-1)
        want = models["eager"](
            nxt, past_key_values=out.past_key_values, output_attentions=True, **kw
        ).attentions
        out, kw = prefill(models[impl])
        with capture_attention(models[impl]) as cap:
            models[impl](nxt, past_key_values=out.past_key_values, **kw)
    assert not cap.notes, cap.notes
    assert len(cap.records) == 2
    slots = 8 if static else 6
    for rec, w in zip(cap.records, want, strict=True):
        assert rec.exact and rec.kind == "dec_self" and tuple(rec.probs.shape) == (2, 4, 1, slots)
        torch.testing.assert_close(rec.probs, w, atol=1e-5, rtol=0)
        assert rec.key_labels[:6] == (*(f"<cache {i}>" for i in range(5)), None)
        assert all(lab.startswith("<padding") for lab in rec.key_labels[6:])
    trace = cap.trace(1)
    assert trace.dec_self.shape == (2, 4, 1, 1)
    assert trace.meta["learned_keys"]["dec_self"][:5] == [f"<cache {i}>" for i in range(5)]
