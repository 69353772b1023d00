"""Capture from lineage: the layout of every recorded softmax comes from where each element came
from, not from its shape. Styles that used to be split wrong or not recorded at all (head-major
folds with batch = heads, chunk + cat folds, keys-first scores, learned keys, text-to-image
cross-attention of equal lengths) are recorded exactly, for every batch size and head count;
what cannot be followed is flagged with its reason, never shown as exact."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families import lineage
from attnscope.core.families.capture import capture_attention

PAD = 0


def _style(name: str):
    return importlib.import_module(f"usermodels.{name}")


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _captured(model, batch):
    model.reset()
    with torch.no_grad():
        torch.manual_seed(0)  # the same dropout draws, where a style trains
        plain = model(*batch)
        model.reset()
        torch.manual_seed(0)
        with capture_attention(model) as cap:
            out = model(*batch)
    assert _same(plain, out), "capture changed the model's output"
    return cap, list(model.computed)


def _assert_exact(cap, computed):
    assert not cap.notes, cap.notes
    assert len(cap.records) == len(computed) > 0, [(r.name, r.kind) for r in cap.records]
    for i, (rec, (kind, probs)) in enumerate(zip(cap.records, computed, strict=True)):
        assert rec.exact and rec.flag is None, (i, rec.name, rec.flag)
        assert rec.probs.shape == probs.shape, (i, rec.name, rec.probs.shape, probs.shape)
        torch.testing.assert_close(rec.probs, probs, atol=1e-6, rtol=0, msg=f"call {i} {rec.name}")
        assert rec.kind == kind, (i, rec.name, rec.kind, kind)


def _ids(batch: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, vocab, (batch, length), generator=g)
    for i in range(batch):
        x[i, max(length - i, 2) :] = PAD  # every sequence a different length: PAD shows in the maps
    return x


def _headmajor(heads: int):
    mod = _style("headmajor")
    torch.manual_seed(heads)
    return mod.Classifier(d_model=8 * heads, d_inner=16, n_head=heads).eval(), mod.VOCAB_SIZE


def _kyubyong(heads: int):
    mod = _style("kyubyong")
    return mod.build(seed=heads, heads=heads), mod.VOCAB_SIZE


def _keys_first(heads: int):
    mod = _style("keys_first")
    return mod.build(seed=heads, heads=heads), mod.VOCAB_SIZE


FOLDS = {"headmajor": _headmajor, "kyubyong": _kyubyong, "keys_first": _keys_first}


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("fold", list(FOLDS))
def test_every_batch_size_and_head_count_is_split_exactly(fold, heads):
    """Head-major (H*B) folds by view and by chunk + cat, and keys-first scores: batch sizes 1 to 6
    against heads 1, 2, 3, 4 and 8, so batch = heads occurs; each map equals the model's own."""
    model, vocab = FOLDS[fold](heads)
    for batch in range(1, 7):
        cap, computed = _captured(model, (_ids(batch, 7, vocab, seed=batch),))
        _assert_exact(cap, computed)
        assert {r.kind for r in cap.records} == {"enc_self"}
        for rec in cap.records:  # a PAD key gets no weight from any head of its own sequence
            assert rec.probs.shape[:2] == (batch, heads)


def _all_styles() -> list[str]:
    import pkgutil

    import usermodels

    names = [m.name for m in pkgutil.iter_modules(usermodels.__path__)]
    return sorted(n for n in names if hasattr(_style(n), "build") and hasattr(_style(n), "sample_batch"))


STYLE_NAMES = _all_styles()
OWN_RECORD = [n for n in STYLE_NAMES if n != "torch_transformer"]  # nn.Transformer: checked against its MHA


def test_there_are_at_least_forty_styles():
    assert len(STYLE_NAMES) >= 40, STYLE_NAMES


@pytest.mark.parametrize("name", OWN_RECORD)
def test_every_style_is_captured_exactly(name):
    """Every model in tests/usermodels, as its authors write it: each map equals the one the model
    computed, with its kind, recorded as exact, and nothing flagged."""
    mod = _style(name)
    cap, computed = _captured(mod.build(), mod.sample_batch())
    _assert_exact(cap, computed)


def test_learned_keys_are_labelled_and_encoder_attention_stays_enc_self():
    """A [CLS] parameter prepended to the tokens, memory key/values joined to the keys, a null key
    appended: recorded with every key, the learned ones labelled, and still encoder self-attention."""
    mod = _style("learned_keys")
    (ids,) = mod.sample_batch()
    cap, computed = _captured(mod.build(), (ids,))
    _assert_exact(cap, computed)
    first, last = cap.records
    n = ids.shape[1]
    assert [r.kind for r in cap.records] == ["enc_self", "enc_self"]
    assert first.query_labels == ("<cls_token 0>", *[None] * n)
    assert first.key_labels == ("<mem_k 0>", "<mem_k 1>", "<cls_token 0>", *[None] * n)
    assert last.key_labels == ("<mem_k 0>", "<mem_k 1>", "<cls_token 0>", *[None] * n, "<null_k 0>")
    # the mask hides each sequence's PAD tokens and nothing learned
    real = torch.nn.functional.pad(ids != PAD, (3, 0), value=True)
    assert torch.equal(first.mask, real[:, None, :].expand(ids.shape[0], n + 1, n + 3))


def test_text_to_image_attention_of_equal_length_is_cross():
    """Six patches, six text tokens, modules named mix1/mix2: lineage alone says which is which."""
    mod = _style("captioning")
    image, ids = mod.sample_batch()
    assert image.shape[-2] // 4 * image.shape[-1] // 4 == ids.shape[1]  # the lengths are equal
    cap, computed = _captured(mod.build(), (image, ids))
    _assert_exact(cap, computed)
    assert [r.kind for r in cap.records] == ["dec_self", "cross"] * 2
    assert [r.name.rsplit(".", 1)[-1] for r in cap.records] == ["mix1", "mix2"] * 2


class _OutsideQueries(nn.Module):
    """Queries sent through numpy and back: the capture cannot follow them."""

    def __init__(self):
        super().__init__()
        self.emb, self.q, self.k = nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q = torch.from_numpy(self.q(x).detach().numpy().copy())
        q = q.view(b, n, 2, 4).transpose(1, 2).reshape(b * 2, n, 4)
        k = self.k(x).view(b, n, 2, 4).transpose(1, 2).reshape(b * 2, n, 4)
        return torch.softmax(q @ k.transpose(1, 2), dim=-1)


def test_a_layout_capture_cannot_follow_is_flagged_with_its_reason():
    model = _OutsideQueries().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    (rec,) = cap.records
    assert not rec.exact and "not projected inside the captured call" in rec.flag
    assert len(cap.notes) == 1 and "could not verify" in cap.notes[0] and "(4, 3, 3)" in cap.notes[0]


def test_softmaxes_that_are_not_attention_are_noted_once_per_module():
    """The vocabulary softmax is information, not a warning, and said once per module and reason."""
    mod = _style("tutorial")
    model, batch = mod.build(), mod.sample_batch()
    model.reset()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*batch)
        model(*batch)
    assert not cap.notes
    assert [(n.level, n.module) for n in cap.skipped] == [("info", "generator.softmax")]
    assert "projection" in cap.skipped[0].reason


class _Shuffled(nn.Module):
    """Heads folded head-major but merged back batch-major: each output row mixes positions."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv, self.out = nn.Embedding(10, 8), nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q, k, v = (
            t.view(b, n, 2, 4).permute(2, 0, 1, 3).reshape(2 * b, n, 4) for t in self.qkv(x).chunk(3, -1)
        )
        w = torch.softmax(q @ k.transpose(1, 2) / 2, dim=-1)
        y = (w @ v).view(b, 2, n, 4).transpose(1, 2).reshape(b, n, 8)  # the wrong inverse
        return self.out(y)


def test_heads_merged_back_in_another_order_are_reported():
    model = _Shuffled().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]))
    (rec,) = cap.records
    assert rec.exact  # the weights are what the model computed ...
    assert len(cap.notes) == 1 and "merged back in another order" in cap.notes[0]  # ... its merge is not


def test_hugging_face_sdpa_with_left_padding_equals_eager_output_attentions():
    """GPT-2 on its default SDPA attention, a left-padded batch: the captured maps equal what the
    same weights return with eager attention and output_attentions=True."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    eager = transformers.GPT2Model(cfg).eval()
    cfg_sdpa = transformers.GPT2Config(**cfg.to_dict())
    cfg_sdpa._attn_implementation = "sdpa"
    sdpa = transformers.GPT2Model(cfg_sdpa).eval()
    sdpa.load_state_dict(eager.state_dict())
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [0, 9, 10, 11, 12, 13], [14, 15, 16, 17, 18, 19]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    eager.config._attn_implementation = "eager"
    with torch.no_grad():
        want = eager(ids, attention_mask=mask, output_attentions=True).attentions
        with capture_attention(sdpa) as cap:
            sdpa(ids, attention_mask=mask)
    assert len(cap.records) == len(want) == 2 and not cap.notes
    for rec, ref in zip(cap.records, want, strict=True):
        assert rec.source == "sdpa" and rec.kind == "dec_self"
        real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]
        got, ref = rec.probs.masked_fill(~real, 0), ref.masked_fill(~real, 0)  # PAD query rows: undefined
        np.testing.assert_allclose(got.numpy(), ref.numpy(), atol=1e-6)


def test_multihead_attention_bias_k_and_zero_attn_are_labelled_learned_keys():
    """nn.MultiheadAttention(add_bias_kv=True, add_zero_attn=True) appends a learned key and a zero
    key: recorded with their own columns, labelled, the padding mask kept for the tokens."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True, batch_first=True).eval()
    x = torch.randn(2, 4, 8)
    pad = torch.tensor([[False, False, False, True], [False, False, False, False]])
    with torch.no_grad(), capture_attention(mha) as cap:
        _, want = mha(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    (rec,) = cap.records
    assert not cap.notes and rec.probs.shape == (2, 2, 4, 6)
    torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)
    assert rec.key_labels == (None, None, None, None, "<bias_k 0>", "<zero_attn 0>")
    assert rec.mask[0, 0].tolist() == [True, True, True, False, True, True]


class _ClsViT(nn.Module):
    """torchvision's and many tutorials' ViT: a learned class token prepended to the patches, then
    nn.MultiheadAttention (self-attention, batch-first or not), learned object queries (DETR's, Mask2Former's)
    reading the tokens through another nn.MultiheadAttention."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        self.patch = nn.Conv2d(3, 8, 4, 4)
        self.class_token = nn.Parameter(torch.randn(1, 1, 8))
        self.queries = nn.Parameter(torch.randn(3, 8))
        self.attn = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        self.read = nn.MultiheadAttention(8, 2, batch_first=batch_first)

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2)  # (B, 4, 8)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        q = self.queries.expand(x.shape[0], -1, -1)
        if not self.batch_first:
            x, q = x.transpose(0, 1), q.transpose(0, 1)
        x = x + self.attn(x, x, x)[0]
        return self.read(q, x, x)[0]


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_labels_a_class_token_and_learned_queries(batch_first):
    """Learned positions among nn.MultiheadAttention's queries and keys are labelled as on the softmax path
    (they were unlabelled, so a picture showed the class token as the first patch)."""
    torch.manual_seed(0)
    model = _ClsViT(batch_first).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 3, 8, 8))
    own, read = cap.records
    cls = ("<class_token 0>", None, None, None, None)
    assert own.kind == "enc_self" and own.key_labels == cls and own.query_labels == cls
    assert read.kind == "cross" and read.key_labels == cls
    assert read.query_labels == ("<queries 0>", "<queries 1>", "<queries 2>")


class _ClipVisual(nn.Module):
    """OpenAI CLIP's VisionTransformer: the class token made per sequence by adding the learned vector to a
    tensor of zeros (``class_embedding + torch.zeros(B, 1, C)``), positions added, sequence-first
    nn.MultiheadAttention; or the same token written by a softmax of its own (``heads`` > 0)."""

    def __init__(self, sdpa: bool):
        super().__init__()
        self.sdpa = sdpa
        self.conv1 = nn.Conv2d(3, 8, 4, 4, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(8))
        self.positional_embedding = nn.Parameter(torch.randn(5, 8))
        self.attn = nn.MultiheadAttention(8, 2)
        self.qkv = nn.Linear(8, 24)

    def forward(self, img):
        x = self.conv1(img).reshape(img.shape[0], 8, -1).permute(0, 2, 1)  # (B, 4, 8)
        zeros = torch.zeros(x.shape[0], 1, x.shape[-1], dtype=x.dtype, device=x.device)
        x = torch.cat([self.class_embedding.to(x.dtype) + zeros, x], dim=1)
        x = x + self.positional_embedding.to(x.dtype)
        if self.sdpa:
            b, n, _ = x.shape
            q, k, v = (t.view(b, n, 2, 4).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x.permute(1, 0, 2)  # NLD -> LND
        return self.attn(x, x, x, need_weights=False)[0]


@pytest.mark.parametrize("sdpa", [False, True])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_clips_class_token_made_from_zeros_is_labelled(sdpa, batch):
    """The class token was not labelled (the zeros were taken for a buffer of no positions), so the
    picture showed it as the first patch."""
    torch.manual_seed(0)
    model = _ClipVisual(sdpa).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 3, 8, 8))
    (rec,) = cap.records
    cls = ("<class_embedding 0>", None, None, None, None)
    assert rec.kind == "enc_self" and rec.exact and rec.probs.shape == (batch, 2, 5, 5)
    assert rec.key_labels == cls and rec.query_labels == cls
    trace = cap.trace(batch - 1)
    assert trace.src_tokens == ("<class_embedding 0>", "#0", "#1", "#2", "#3")


class _SdpaMemory(nn.Module):
    """x-transformers' memory key/values on its SDPA path: learned keys joined in front of k and v."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(10, 8), nn.Linear(8, 24)
        self.mem_kv = nn.Parameter(torch.randn(2, 2, 3, 4))  # (k/v, heads, memories, dim)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (t.view(b, n, 2, 4).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
        mk, mv = (m.expand(b, -1, -1, -1) for m in self.mem_kv)
        k, v = torch.cat((mk, k), dim=-2), torch.cat((mv, v), dim=-2)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_sdpa_memory_keys_are_labelled_and_stay_encoder_self_attention():
    model = _SdpaMemory().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]))
    (rec,) = cap.records
    assert rec.kind == "enc_self" and rec.probs.shape == (2, 2, 4, 7)
    assert rec.key_labels == ("<mem_kv 0>", "<mem_kv 1>", "<mem_kv 2>", None, None, None, None)


def test_torchscript_is_said_in_one_sentence_not_answered_with_an_empty_picture():
    mod = _style("kyubyong")
    with torch.no_grad():
        model = torch.jit.trace(mod.build(), mod.sample_batch(), check_trace=False)
        with capture_attention(model) as cap:
            model(*mod.sample_batch())
    assert not cap.records
    assert len(cap.notes) == 1 and "TorchScript" in cap.notes[0] and "\n" not in cap.notes[0]


def test_capture_notes_travel_in_the_trace_file(tmp_path):
    model = _OutsideQueries().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    tr = cap.trace(0, src_tokens=["a", "b", "c"])
    for suffix in ("npz", "json"):
        back = type(tr).load(tr.save(tmp_path / f"t.{suffix}"))
        assert back.meta["capture_notes"] == cap.notes and "could not verify" in back.meta["capture_notes"][0]


def test_heads_split_across_positions_are_flagged_not_regrouped():
    """The classic bug ``x.view(B * H, -1, d)`` without the transpose: every "head" row mixes
    positions. Lineage sees that the keys of one query come from different heads' features and says
    so; the maps are shown as the model laid them out, flagged, never as an exact regrouping."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "adapters"))
    mod = importlib.import_module("tutorial_headsplit_bug")
    model = mod.load().eval()
    src = torch.tensor([[5, 6, 7, 8, 9, 2], [5, 6, 2, 0, 0, 0]])
    tgt = torch.tensor([[1, 5, 6, 7], [1, 5, 0, 0]])
    model.reset()
    with torch.no_grad(), capture_attention(model) as cap:
        mod.forward(model, src, tgt)
    assert len(cap.records) == len(model.computed) == 6
    for rec, (kind, probs) in zip(cap.records, model.computed, strict=True):
        assert not rec.exact and "different heads' features" in rec.flag, (rec.name, rec.flag)
        assert rec.kind == kind and torch.equal(rec.probs, probs)  # the model's own (B*H) view, flagged
    assert len(cap.notes) == 4 and all("could not verify" in n for n in cap.notes)  # per module and reason


def test_a_forward_with_no_attention_call_at_all_is_said():
    """Attention in a compiled extension never reaches Python's torch calls: capture says that it
    saw none, instead of answering with an empty picture (a model without attention gets it too)."""
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.ReLU()).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[1, 2, 3]]))
    assert not cap.records and len(cap.notes) == 1
    assert "no softmax, scaled_dot_product_attention or MultiheadAttention call was seen" in cap.notes[0]
    assert "C++/CUDA extension" in cap.notes[0]
    assert "without a softmax (linear attention" in cap.notes[0]  # (one that has no map is not hidden)


class _Idioms(nn.Module):
    """Three idioms in one layer: ``k.mT`` (a property, not a call), an einsum with "...", and keys
    padded in front with ``F.pad`` (local attention pads the sequence's edges so)."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(10, 12), nn.Linear(12, 36)

    def forward(self, ids):
        b, n = ids.shape
        q, k, _ = (t.view(b, n, 3, 4).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
        first = (q @ k.mT / 2).softmax(-1)
        second = torch.einsum("...id,...jd->...ij", q, k).softmax(-1)
        padded = torch.nn.functional.pad(k, (0, 0, 2, 0))
        third = (q @ padded.transpose(-1, -2)).softmax(-1)
        return first, second, third


def test_properties_ellipsis_einsums_and_padded_keys_are_followed():
    model = _Idioms().eval()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    with torch.no_grad(), capture_attention(model) as cap:
        want = model(ids)
    assert not cap.notes and [r.exact for r in cap.records] == [True] * 3
    for rec, probs in zip(cap.records, want, strict=True):
        assert torch.equal(rec.probs, probs) and rec.kind == "enc_self"
    assert cap.records[2].key_labels == ("<padding 0>", "<padding 1>", None, None, None)


def _tiny_hf(name: str):
    transformers = pytest.importorskip("transformers")
    t = transformers
    return {
        "bert": (t.BertConfig, t.BertModel, dict(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, intermediate_size=64)),
        "llama": (t.LlamaConfig, t.LlamaModel, dict(vocab_size=60, hidden_size=32, intermediate_size=64,
                                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                    max_position_embeddings=32)),
        "mistral": (t.MistralConfig, t.MistralModel, dict(vocab_size=60, hidden_size=32, intermediate_size=64,
                                                          num_hidden_layers=2, num_attention_heads=4,
                                                          num_key_value_heads=1, max_position_embeddings=32,
                                                          sliding_window=3)),
        "bart": (t.BartConfig, t.BartModel, dict(vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2,
                                                 encoder_attention_heads=4, decoder_attention_heads=4,
                                                 encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32)),
        "t5": (t.T5Config, t.T5Model, dict(vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                           num_decoder_layers=2, num_heads=4)),
    }[name]  # fmt: skip


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["bert", "llama", "mistral", "bart", "t5"])
def test_hugging_face_models_captured_equal_their_own_output_attentions(name, impl):
    """Library models as users load them (random weights): captured on eager or SDPA attention with
    a padded batch (left padding for the decoder-only ones), every map of every kind equals what the
    same weights return with eager attention and output_attentions=True, on the real query rows."""
    config_cls, model_cls, kw = _tiny_hf(name)
    torch.manual_seed(0)
    model = model_cls(config_cls(**kw, attn_implementation=impl)).eval()
    reference = model_cls(config_cls(**kw, attn_implementation="eager")).eval()
    reference.load_state_dict(model.state_dict())
    left = name in ("llama", "mistral")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 0, 5, 6, 7] if left else [5, 6, 7, 0, 0, 0]])
    inputs = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    if name in ("bart", "t5"):
        inputs["decoder_input_ids"] = torch.tensor([[1, 5, 6, 7], [1, 5, 6, 7]])
    with torch.no_grad():
        want = reference(**inputs, output_attentions=True)
        with capture_attention(model) as cap:
            model(**inputs)
    assert not cap.notes and all(r.exact for r in cap.records)
    expected = {"enc_self": want.encoder_attentions, "dec_self": want.decoder_attentions,
                "cross": want.cross_attentions} if name in ("bart", "t5") else {
                    "enc_self" if name == "bert" else "dec_self": want.attentions}  # fmt: skip
    assert {r.kind for r in cap.records} == set(expected)
    for kind, maps in expected.items():
        records = [r for r in cap.records if r.kind == kind]
        assert len(records) == len(maps) == 2
        for rec, ref in zip(records, maps, strict=True):
            assert rec.probs.shape == ref.shape
            real = (
                (ids != 0)[:, None, :, None]
                if ref.shape[-2] == ids.shape[1]
                else torch.ones(1, 1, 1, 1, dtype=torch.bool)
            )
            torch.testing.assert_close(
                rec.probs.masked_fill(~real, 0), ref.masked_fill(~real, 0), atol=1e-6, rtol=0
            )


# -- remembered codes (lineage.remember): later layers and later captures reuse them ------------------
class _Branching(nn.Module):
    """q @ k.T folded batch-major or head-major by a flag: with batch = heads the two forwards have
    the same shapes and op names everywhere, and only the fold's arguments tell them apart."""

    def __init__(self, heads: int = 2, d: int = 8):
        super().__init__()
        self.h = heads
        self.emb, self.q, self.k = nn.Embedding(20, d), nn.Linear(d, d), nn.Linear(d, d)
        self.head_major = False
        self.computed: list[tuple[str, torch.Tensor]] = []

    def reset(self):
        self.computed = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        h = self.h
        q, k = self.q(x).view(b, n, h, d // h), self.k(x).view(b, n, h, d // h)
        order = (2, 0, 1, 3) if self.head_major else (0, 2, 1, 3)
        q, k = q.permute(*order).reshape(b * h, n, d // h), k.permute(*order).reshape(b * h, n, d // h)
        p = torch.softmax(q @ k.transpose(1, 2), dim=-1)
        want = p.view(h, b, n, n).transpose(0, 1) if self.head_major else p.view(b, h, n, n)
        self.computed.append(("enc_self", want.detach().clone()))
        return p


def test_a_forward_with_other_ops_at_the_same_shapes_does_not_reuse_the_first_layout():
    """Batch-major, then head-major, then batch-major again, on the same ids (batch = heads = 2):
    every capture equals the model's own maps, never the previous forward's layout."""
    torch.manual_seed(0)
    model = _Branching().eval()
    ids = _ids(2, 5, 20, seed=1)
    seen = []
    for head_major in (False, True, False, True):
        model.head_major = head_major
        cap, computed = _captured(model, (ids,))
        _assert_exact(cap, computed)
        seen.append(cap.records[0].probs)
    assert not torch.equal(seen[0], seen[1].transpose(0, 1))  # the two folds do place heads differently
    assert torch.equal(seen[0], seen[2]) and torch.equal(seen[1], seen[3])


REMEMBERED = ["kyubyong", "keys_first", "learned_keys", "captioning", "tutorial", "einops_lucidrains", "swin_windows",
              "transfo_xl", "sdpa_masked", "keras_port_einsum", "incremental_decoding", "perceiver_latents"]  # fmt: skip


@pytest.mark.parametrize("name", REMEMBERED)
def test_remembered_codes_give_the_records_of_a_cold_capture(name):
    """A capture with every code computed afresh, then the same capture again with the codes (and
    layouts) remembered from it: the records are the same, field by field."""
    from attnscope.core.families import capture as capture_mod
    from attnscope.core.families import lineage

    assert name in STYLE_NAMES
    mod = _style(name)
    model, batch = mod.build(), mod.sample_batch()
    runs = []
    for cold in (True, False, False):
        if cold:
            lineage.forget()
            capture_mod._LAYOUTS.clear()
        cap, computed = _captured(model, batch)
        _assert_exact(cap, computed)
        runs.append(cap)
        if cold:
            assert lineage._MEMO, "nothing was remembered"
    for warm in runs[1:]:
        assert len(warm.records) == len(runs[0].records)
        for a, b in zip(runs[0].records, warm.records, strict=True):
            for f in ("name", "kind", "source", "mask_source", "exact", "flag", "key_labels", "query_labels",
                      "head_masks_differ"):  # fmt: skip
                assert getattr(a, f) == getattr(b, f), (name, f)
            for f in ("probs", "scores", "mask"):
                assert _same(getattr(a, f), getattr(b, f)), (name, f)
        assert warm.notes == runs[0].notes and warm.skipped == runs[0].skipped


class _PermutedKeys(nn.Module):
    """Memory keys joined to the tokens, then the keys put in the order of an index buffer that the
    caller changes in place between forwards (the same tensor, other values)."""

    def __init__(self, n: int, d: int = 8):
        super().__init__()
        self.emb, self.q, self.k = nn.Embedding(20, d), nn.Linear(d, d), nn.Linear(d, d)
        self.mem = nn.Parameter(torch.randn(1, 2, d))
        self.register_buffer("perm", torch.arange(n + 2))

    def forward(self, ids):
        x = self.emb(ids)
        keys = torch.cat([self.mem.expand(x.shape[0], -1, -1), x], 1).index_select(1, self.perm)
        return torch.softmax(self.q(x) @ self.k(keys).transpose(1, 2), dim=-1)


def test_an_index_changed_in_place_is_followed_not_remembered():
    torch.manual_seed(0)
    n = 4
    model = _PermutedKeys(n).eval()
    ids = _ids(2, n, 20, seed=2)
    perms = (torch.arange(n + 2), torch.tensor([2, 3, 4, 5, 1, 0]), torch.tensor([2, 1, 3, 4, 0, 5]),
             torch.arange(n + 2).flip(0))  # fmt: skip
    for perm in perms:
        model.perm.copy_(perm)  # in place: the buffer keeps its identity
        with torch.no_grad(), capture_attention(model) as cap:
            want = model(ids)
        (rec,) = cap.records
        torch.testing.assert_close(rec.probs[:, 0], want, atol=0, rtol=0)
        if perm[0] == n + 1:  # the tokens' own keys in reverse: no map to label by the tokens in order
            assert not rec.exact and "another order" in rec.flag
            continue
        assert rec.exact and not cap.notes, (rec.flag, cap.notes)
        # learned keys are named by their row of the parameter, wherever the permutation puts them
        assert rec.key_labels == tuple(f"<mem {i}>" if i < 2 else None for i in perm.tolist())


def test_remembered_codes_stay_within_their_bounds():
    from attnscope.core.families import lineage

    mod = _style("kyubyong")
    for heads in (1, 2, 4):
        model = mod.build(seed=heads, heads=heads)
        for batch in range(1, 6):
            _captured(model, (_ids(batch, 3 + batch, mod.VOCAB_SIZE, seed=batch),))
    assert 0 < len(lineage._MEMO) <= lineage.MEMO_ENTRIES
    assert 0 < lineage._memo_bytes <= lineage.MEMO_BYTES
    assert lineage._memo_bytes == sum(entry[2] for entry in lineage._MEMO.values())


class _MaskedSDPA(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x, mask):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 2, 4).transpose(1, 2) for t in self.qkv(x).split(8, dim=-1))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sdpa_rows_with_no_key_are_zero_and_the_others_are_its_softmax(kind):
    """A row that may attend to no key at all gets 0 (as SDPA gives it), every other row the softmax
    of its allowed scores; rows whose keys are all allowed are untouched by that step."""
    torch.manual_seed(0)
    model, x = _MaskedSDPA().eval(), torch.randn(2, 5, 8)
    allowed = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    allowed[1, :, 2] = False  # sequence 1, query 2: no key
    mask = allowed if kind == "bool" else torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, mask)
    (rec,) = cap.records
    assert rec.source == "sdpa" and rec.check is not None and rec.check < 1e-5
    assert torch.equal(rec.probs[1, :, 2], torch.zeros(2, 5))
    want = torch.softmax(rec.scores.masked_fill(~allowed, float("-inf")), dim=-1)
    keep = allowed.any(-1, keepdim=True)
    torch.testing.assert_close(rec.probs.masked_fill(~keep, 0), want.masked_fill(~keep, 0), atol=1e-7, rtol=0)
    assert not torch.isnan(rec.probs).any()


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("case", ["self", "padded", "cross", "kdim", "float_mask"])
def test_multihead_attention_scores_from_its_own_projection_equal_a_second_one(case, batch_first):
    """MultiheadAttention's q and k are taken where its own code hands them to SDPA (no second
    projection): its output is bit-identical to the call without capture, and the scores equal,
    bit for bit, those of projecting its inputs again the way it projects them. (A subclass: the mode
    follows its call; torch's own class runs without it, recorded from its arguments.)"""
    from attnscope.core.families import capture as capture_mod

    class Subclassed(nn.MultiheadAttention):
        pass

    torch.manual_seed(0)
    kdim = 12 if case == "kdim" else None
    mha = Subclassed(16, 4, batch_first=batch_first, kdim=kdim, vdim=kdim).eval()
    x = torch.randn(3, 7, 16)
    y = torch.randn(3, 5, kdim or 16)
    if not batch_first:
        x, y = x.transpose(0, 1), y.transpose(0, 1)
    key = x if case in ("self", "padded", "float_mask") else y
    kw: dict = {}
    if case == "padded":
        kw["key_padding_mask"] = torch.zeros(3, 7, dtype=torch.bool).index_fill(1, torch.tensor([5, 6]), True)
    if case == "float_mask":
        kw["attn_mask"] = torch.randn(7, 7)
    seen = []
    real = capture_mod._mha_scores

    def both(p, h, qk=None):
        own = real(p, h, qk)
        seen.append((qk is not None, own, real(p, h, None)))
        return own

    capture_mod._mha_scores = both
    try:  # with gradients (training): the python path of MultiheadAttention runs with or without capture
        with capture_attention(mha) as cap:
            out = mha(x, key, key, need_weights=False, **kw)[0]
    finally:
        capture_mod._mha_scores = real
    assert torch.equal(out, mha(x, key, key, need_weights=False, **kw)[0])
    _, want = mha(x, key, key, need_weights=True, average_attn_weights=False, **kw)
    want = want.detach()
    ((from_call, own, again),) = seen
    assert from_call and torch.equal(own, again)
    (rec,) = cap.records
    torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)


def test_multihead_attention_calls_a_patched_sdpa_after_an_earlier_capture():
    """MultiheadAttention's own code is built once and built again when a global it reads was replaced
    since: a user's patched F.scaled_dot_product_attention is the one the captured call runs, and
    its q and k are still the ones recorded. (A subclass: the mode follows its call; torch's own class
    runs without it, its fused fast path where torch takes it, as uncaptured.)"""
    import torch.nn.functional as F

    class Subclassed(nn.MultiheadAttention):
        pass

    torch.manual_seed(0)
    mha = Subclassed(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        with capture_attention(mha) as first:
            mha(x, x, x, need_weights=False)
        real, calls = F.scaled_dot_product_attention, []

        def patched(*a, **k):
            calls.append(a[0].shape)
            return real(*a, **k)

        F.scaled_dot_product_attention = patched
        try:
            with capture_attention(mha) as second:
                out = mha(x, x, x, need_weights=False)[0]
        finally:
            F.scaled_dot_product_attention = real
        with capture_attention(mha) as third:
            mha(x, x, x, need_weights=False)
    assert calls == [torch.Size([2, 4, 5, 4])]  # the patched function ran, once, inside the capture
    assert torch.equal(out, mha(x, x, x, need_weights=False)[0])
    _, want = mha(x, x, x, need_weights=True, average_attn_weights=False)
    for cap in (first, second, third):
        (rec,) = cap.records
        torch.testing.assert_close(rec.probs, want.detach(), atol=1e-6, rtol=0)


def test_a_class_token_appended_to_causal_text_keeps_the_layer_a_decoders():
    """CoCa's text tower: a learned class token appended after the tokens, a causal mask over both, through
    nn.MultiheadAttention. The tokens' own rows and keys decide that it is causal: ``dec_self``, with the
    class token labelled (labelling it made the layer ``enc_self`` for a moment)."""

    class CocaText(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.cls_emb = nn.Embedding(20, 8), nn.Parameter(torch.randn(8))
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, ids):
            x = torch.cat([self.emb(ids), self.cls_emb.expand(ids.shape[0], 1, -1)], dim=1)
            n = x.shape[1]
            causal = torch.full((n, n), float("-inf")).triu(1)
            return self.attn(x, x, x, attn_mask=causal)[0]

    torch.manual_seed(0)
    model = CocaText().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 20, (2, 5)))
    (rec,) = cap.records
    assert rec.kind == "dec_self" and rec.exact
    assert rec.key_labels == (None,) * 5 + ("<cls_emb 0>",) and rec.query_labels == rec.key_labels


class _RepeatedPerHead(nn.Module):
    """The input repeated once per head and projected by per-head weights in an einsum (``x.repeat(h, 1, 1,
    1)``, ``einsum("hijk,hkl->hijl")``): heads on the leading axis, every head over the same positions."""

    def __init__(self, heads: int, d: int = 8, dk: int = 4):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(20, d)
        self.wq, self.wk, self.wv = (nn.Parameter(torch.randn(heads, d, dk)) for _ in range(3))

    def forward(self, ids):
        xr = self.emb(ids).repeat(self.h, 1, 1, 1)  # (h, B, L, d)
        q, k, v = (torch.einsum("hijk,hkl->hijl", xr, w) for w in (self.wq, self.wk, self.wv))
        a = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1)  # (h, B, L, L)
        self.used = a.permute(1, 0, 2, 3)
        return a @ v


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (2, 3)])
def test_an_input_repeated_per_head_with_per_head_einsum_weights_is_split_by_head(batch, heads):
    """Each head's einsum outputs are features of their own (the weights differ along the letter the
    parameter shares with the input): the leading axis is the heads, not h x B one-head sequences."""
    torch.manual_seed(batch * 10 + heads)
    model = _RepeatedPerHead(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (batch, 5)))
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self"
    assert torch.equal(rec.probs, model.used)


class _Subsample(nn.Module):
    """LeViT's AttentionSubsample: the queries every second position of the token grid
    (``x.view(B, r, r, C)[:, ::2, ::2]``), the keys all of them."""

    def __init__(self, stride_1d: bool):
        super().__init__()
        self.stride_1d = stride_1d
        self.emb, self.q, self.kv = nn.Embedding(20, 8), nn.Linear(8, 8), nn.Linear(8, 16)

    def forward(self, ids):
        x = self.emb(ids)  # (B, 16, 8)
        b = x.shape[0]
        xq = x[:, ::2] if self.stride_1d else x.view(b, 4, 4, 8)[:, ::2, ::2].reshape(b, -1, 8)
        q = self.q(xq).view(b, -1, 2, 4).transpose(1, 2)
        k, v = (t.view(b, -1, 2, 4).transpose(1, 2) for t in self.kv(x).chunk(2, -1))
        self.used = (q @ k.transpose(-1, -2)).softmax(-1)
        return self.used @ v


@pytest.mark.parametrize("stride_1d", [False, True])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_queries_at_every_second_position_are_exact(stride_1d, batch):
    """A fixed stride of the positions, the same in every sequence and in order, is no pick by index (it
    was flagged as Informer's top-u queries, at batch 1 too)."""
    torch.manual_seed(batch)
    model = _Subsample(stride_1d).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (batch, 16)))
    (rec,) = cap.records
    assert rec.exact and not cap.notes and torch.equal(rec.probs, model.used)


class _PaddedWindows(nn.Module):
    """Swin's detection backbone: the token map padded with ``F.pad`` to whole windows, partitioned into
    windows folded into the batch, plain window attention (no shift, no mask)."""

    def __init__(self, window: int):
        super().__init__()
        self.ws = window
        self.patch, self.qkv = nn.Conv2d(3, 8, 2, 2), nn.Linear(8, 24)

    def forward(self, img):
        x = self.patch(img).permute(0, 2, 3, 1)  # (B, H, W, C)
        b, h, w, c = x.shape
        pad_r, pad_b = (self.ws - w % self.ws) % self.ws, (self.ws - h % self.ws) % self.ws
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        hp, wp = h + pad_b, w + pad_r
        win = x.view(b, hp // self.ws, self.ws, wp // self.ws, self.ws, c).permute(0, 1, 3, 2, 4, 5)
        win = win.reshape(-1, self.ws * self.ws, c)
        q, k, v = self.qkv(win).reshape(win.shape[0], -1, 3, 2, 4).permute(2, 0, 3, 1, 4)
        self.used = (q @ k.transpose(-2, -1)).softmax(-1)
        return self.used @ v


@pytest.mark.parametrize("batch", [1, 2])
def test_a_map_padded_to_whole_windows_labels_each_padded_cell(batch):
    """A 3 x 3 map padded to one 4 x 4 window: each padded cell is a position of its own (F.pad's
    padding was one position, which a window held 7 times), labelled, and the map is exact."""
    torch.manual_seed(batch)
    model = _PaddedWindows(4).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 3, 6, 6))
    (rec,) = cap.records
    assert rec.exact and torch.equal(rec.probs, model.used)
    labels = rec.key_labels
    assert labels is not None and [i for i, lab in enumerate(labels) if lab is None] == [
        0,
        1,
        2,
        4,
        5,
        6,
        8,
        9,
        10,
    ]
    assert [lab for lab in labels if lab] == [f"<padding {i}>" for i in range(7)]


def test_windows_padded_in_different_places_are_flagged_for_that_reason():
    """Windows of a padded map hold padding in different places (the edge ones only): flagged with that
    reason, the values as the model used them (it said rows see different keys)."""
    torch.manual_seed(0)
    model = _PaddedWindows(2).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 3, 6, 6))
    (rec,) = cap.records
    assert not rec.exact and "padding keys in different places" in rec.flag
    assert torch.equal(rec.probs, model.used)


class TokenTyped(nn.Module):
    """ViLT's image side: patches projected from outside, a learned [CLS] before them, a token type looked
    up at an id the model makes (``token_type_embeddings(torch.full_like(image_masks, 1))``) added to
    every position; ``shuffle`` picks the patches in another order first (ViLT's sampled patches)."""

    def __init__(self, shuffle: bool, heads: int, d: int = 8, segments: bool = False):
        super().__init__()
        self.shuffle, self.h, self.segments = shuffle, heads, segments
        self.proj = nn.Linear(6, d * heads)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d * heads))
        self.token_type_embeddings = nn.Embedding(2, d * heads)
        self.qkv = nn.Linear(d * heads, 3 * d * heads)

    def forward(self, feats):
        x = self.proj(feats)
        if self.shuffle:
            x = x[:, torch.tensor([2, 0, 4, 1, 3])]
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1)
        image_masks = torch.ones(x.shape[:2], dtype=torch.long)
        if self.segments:  # two segments the model writes itself, the first made by a float factory
            types = torch.cat([torch.zeros(x.shape[0], 1).long(), torch.full_like(image_masks[:, 1:], 1)], 1)
        else:
            types = torch.full_like(image_masks, 1)
        x = x + self.token_type_embeddings(types)
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        self.used = (q @ k.transpose(-1, -2)).softmax(-1)
        return self.used @ v


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_token_type_added_keeps_the_sequences_positions(batch, heads):
    """The token type's lookup has one id at every position: its positions are not the sequence's, so the
    [CLS] stays labelled and patches put in another order stay flagged (the lookup's positions replaced the
    sequence's: the [CLS] lost its label, and shuffled patches were exact, drawn as if in order)."""
    torch.manual_seed(0)
    for shuffle, segments in ((False, False), (True, False), (False, True), (True, True)):
        lineage.forget()  # (what a capture decides is remembered per codes: each case decides afresh too)
        model = TokenTyped(shuffle, heads, segments=segments).eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randn(batch, 5, 6))
        (rec,) = cap.records
        if shuffle:
            assert not rec.exact and "another order" in rec.flag
        else:
            assert rec.exact and torch.equal(rec.probs, model.used)
            assert rec.key_labels == ("<cls_token 0>", None, None, None, None, None)
            assert rec.key_positions is not None and rec.key_positions[:, 1:].tolist() == [
                list(range(5 * i, 5 * i + 5)) for i in range(batch)
            ]


class MultiQueryPooler(nn.Module):
    """lucidrains' CoCa: learned queries pool the image features by multi-query attention (one key and value
    head, ``einsum("b h i j, b j d -> b h i d", attn, v)``, the values with no head axis), then the text
    cross-attends to the pooled queries (no residual carries their positions)."""

    def __init__(self, heads: int, d: int = 8):
        super().__init__()
        self.h, self.d = heads, d
        self.token_emb = nn.Embedding(30, d * heads)
        self.lat = nn.Parameter(torch.randn(4, d * heads))
        self.to_q, self.to_kv = nn.Linear(d * heads, d * heads, bias=False), nn.Linear(10, 2 * d, bias=False)
        self.q2, self.k2 = nn.Linear(d * heads, d * heads), nn.Linear(d * heads, d * heads)

    def forward(self, text, img):
        b = img.shape[0]
        q = self.to_q(self.lat.expand(b, -1, -1)).view(b, 4, self.h, self.d).transpose(1, 2)
        k, v = self.to_kv(img).chunk(2, dim=-1)
        self.pool = torch.einsum("b h i d, b j d -> b h i j", q, k).softmax(-1)
        out = torch.einsum("b h i j, b j d -> b h i d", self.pool, v)
        pooled = out.transpose(1, 2).reshape(b, 4, self.h * self.d)
        self.text = (self.q2(self.token_emb(text)) @ self.k2(pooled).transpose(-1, -2)).softmax(-1)
        return self.text @ pooled


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (4, 4), (3, 2)])
def test_multi_query_values_with_no_head_axis_keep_the_outputs_lineage(batch, heads):
    """The product of the weights with values that have no head axis is followed as the values broadcast over
    the heads: the pooled queries keep their positions, so the text's attention over them is recorded, exact,
    keys labelled (it was not recorded: "its last axis is not a sequence length")."""
    torch.manual_seed(0)
    model = MultiQueryPooler(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 30, (batch, 6)), torch.randn(batch, 7, 10))
    pool, text = cap.records
    assert pool.exact and torch.equal(pool.probs, model.pool) and not cap.notes
    assert text.exact and text.kind == "cross" and torch.equal(text.probs[:, 0], model.text)
    assert text.key_labels == ("<lat 0>", "<lat 1>", "<lat 2>", "<lat 3>")


IMG = 9


class Spliced(nn.Module):
    """Image features written over ``<image>`` placeholder tokens: by a boolean index (``x[ids == IMG] =
    feats``: InternVL's flat ``input_embeds[selected] = vit_embeds``, Qwen-VL's glue) or by masked_scatter
    (HF LLaVA since 4.45), then causal self-attention over the mixed sequence."""

    def __init__(self, how: str, heads: int):
        super().__init__()
        self.how, self.h = how, heads
        self.emb, self.proj = nn.Embedding(10, 4 * heads), nn.Linear(3, 4 * heads)
        self.qk = nn.Linear(4 * heads, 8 * heads)
        self.used: list[torch.Tensor] = []

    def forward(self, ids, feats):
        x = self.emb(ids)
        f = self.proj(feats)
        if self.how == "index_put":
            x[ids == IMG] = f.reshape(-1, x.shape[-1])
        elif self.how == "flat":
            flat = x.reshape(-1, x.shape[-1])
            flat[(ids == IMG).reshape(-1)] = f.reshape(-1, x.shape[-1])
        else:
            x = x.masked_scatter((ids == IMG).unsqueeze(-1).expand_as(x), f)
        b, n, _ = x.shape
        q, k = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qk(x).chunk(2, -1))
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        a = (q @ k.transpose(-1, -2)).masked_fill(~causal, float("-inf")).softmax(-1)
        self.used.append(a)
        return a @ x[:, None]


@pytest.mark.parametrize("how", ["index_put", "flat", "masked_scatter"])
@pytest.mark.parametrize(("batch", "heads"), [(2, 1), (3, 2), (4, 4)])
def test_features_spliced_over_placeholders_at_other_places_in_each_row_are_those_slots(how, batch, heads):
    """With the placeholders at different places in each row (left padding, another prompt), the boolean
    index write gave the slots the features' positions, and the keys were flagged as "some of a sequence's
    positions, picked differently in each sequence" though nothing was picked: exact as masked_scatter is."""
    torch.manual_seed(batch)
    ids = torch.randint(1, IMG, (batch, 6))
    for b in range(batch):
        ids[b, b % 3 + 1 : b % 3 + 3] = IMG  # two image tokens, placed by the row
    model = Spliced(how, heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, torch.randn(batch, 2, 3))
    (rec,) = cap.records
    assert not cap.notes, cap.notes
    assert rec.exact and rec.kind == "dec_self" and torch.equal(rec.probs, model.used[0])
    assert torch.equal(rec.query_positions, torch.arange(batch * 6).view(batch, 6))


class MergedIntoZeros(nn.Module):
    """A sequence assembled in a ``torch.zeros`` buffer (HF LLaVA's ``_merge_input_ids_with_image_features``):
    each sample written at the end of its row, the slots before left as the buffer's zeros (left padding)."""

    def __init__(self):
        super().__init__()
        self.emb, self.qk = nn.Embedding(10, 8), nn.Linear(8, 16)
        self.used: list[torch.Tensor] = []

    def forward(self, ids, lengths):
        b, n = ids.shape
        e = self.emb(ids)
        x = torch.zeros(b, n, 8)
        for i in range(b):
            x[i, n - int(lengths[i]) :] = e[i, : int(lengths[i])]
        q, k = self.qk(x).chunk(2, -1)
        keep = torch.arange(n)[None, :] >= (n - lengths)[:, None]
        a = (q @ k.transpose(-1, -2)).masked_fill(~keep[:, None, :], -1e9).softmax(-1)
        self.used.append(a)
        return a @ x


@pytest.mark.parametrize("lengths", [[6, 4], [3, 6, 5], [6, 6], [4, 4]])
def test_slots_of_a_made_buffer_left_unwritten_are_padding_of_their_row(lengths):
    """The unwritten slots shared one padding position, so a row with several was "one position is several
    queries": the map was flagged, and with heads not recorded at all. Each slot is a position of its own
    now, labelled by none where rows differ (as a PAD token)."""
    torch.manual_seed(len(lengths))
    model = MergedIntoZeros().eval()
    lens = torch.tensor(lengths)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 10, (len(lengths), 6)), lens)
    (rec,) = cap.records
    assert not cap.notes, cap.notes
    assert rec.exact and torch.equal(rec.probs[:, 0], model.used[0])
    if lengths == [4, 4]:  # the same slots empty in every row: labelled as such
        assert rec.key_labels == ("<empty 0>", "<empty 1>", None, None, None, None)
    else:  # a row's own tokens, or slots empty in some rows only: no label
        assert rec.key_labels is None
