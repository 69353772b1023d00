"""Attention capture cannot lay out, or cannot see, is said: never dropped as "not attention" in silence.

- A softmax that the shape rules leave out (a 2-D one, its rows not placed by lineage) whose weights then
  multiply values over positions (spro's Luong decoder fills its energies one sequence at a time; pyGAT's
  original concatenated pairs) is attention after all: a warning, not the information that it is not.
- Weights over positions whose slices multiply the values one at a time (uvipen's hierarchical attention
  network: ``for f1, f2 in zip(f_output, w_t)``) are said, not called a pointer network's output.
- A module whose code calls a TorchScript function (GPT-BigCode's fused softmax in half precision,
  ChatGLM's rotary) runs ops capture cannot see. ``torch.jit.script`` keeps the Python function it compiled:
  capture runs it again beside the script, on copies of the arguments, and where it gives what the script
  returned, value for value, what went through the script is followed (its maps exact). Where it does not, or
  no Python function is kept: said once, and that module's maps are flagged.
"""

from __future__ import annotations

import copy
import functools
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

VOCAB, D = 20, 8


class LoopEnergies(nn.Module):
    """practical-pytorch's Luong attention: each sequence's energies written into a zeros buffer, a softmax
    over the source, then ``bmm`` with the encoder outputs."""

    def __init__(self, fill: str):
        super().__init__()
        self.fill = fill
        self.emb, self.attn = nn.Embedding(VOCAB, D), nn.Linear(D, D)

    def forward(self, src, hidden):
        enc = self.emb(src)  # (B, S, D)
        b, n = src.shape
        energies = torch.zeros(b, n)
        for i in range(b):
            if self.fill == "element":
                for j in range(n):
                    energies[i, j] = hidden[i].dot(self.attn(enc[i, j]))
            else:
                energies[i] = self.attn(enc[i]) @ hidden[i]
        w = F.softmax(energies, dim=-1)
        return torch.bmm(w.unsqueeze(1), enc)


@pytest.mark.parametrize("fill", ["element", "row"])
def test_a_2d_softmax_whose_weights_multiply_values_is_a_warning(fill):
    torch.manual_seed(0)
    model = LoopEnergies(fill).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (3, 5)), torch.randn(3, D))
    assert not cap.records and not cap.skipped
    assert len(cap.notes) == 1 and "not recorded" in cap.notes[0] and "multiply values" in cap.notes[0]


def test_a_2d_vocabulary_softmax_stays_information():
    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(VOCAB, D), nn.Linear(D, VOCAB)

        def forward(self, ids):
            return self.out(self.emb(ids).mean(1)).softmax(-1)

    net = Classifier()

    with torch.no_grad(), capture_attention(net) as cap:
        net(torch.randint(0, VOCAB, (3, 5)))
    assert not cap.records and not [n for n in cap.notes if "not recorded" in n]


class HanLoop(nn.Module):
    """uvipen's hierarchical attention network: word weights from a context vector, applied to the GRU
    outputs one sequence at a time in a Python loop, then summed."""

    def __init__(self):
        super().__init__()
        self.emb, self.gru = nn.Embedding(VOCAB, D), nn.GRU(D, D)
        self.word_weight, self.context = nn.Parameter(torch.randn(D, D)), nn.Parameter(torch.randn(D, 1))

    def forward(self, ids):  # ids (L, B): sequence-first, as the repository feeds its GRU
        f_output, _ = self.gru(self.emb(ids))  # (L, B, D)
        u = torch.tanh(f_output @ self.word_weight)
        w_t = F.softmax((u @ self.context).squeeze(-1).permute(1, 0), dim=-1).permute(1, 0)  # (L, B)
        pieces = [f1 * f2.unsqueeze(1).expand_as(f1) for f1, f2 in zip(f_output, w_t, strict=True)]
        return torch.cat([p.unsqueeze(0) for p in pieces], 0).sum(0)


def test_weights_applied_one_slice_at_a_time_are_said():
    torch.manual_seed(0)
    model = HanLoop().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (5, 3)))
    assert not cap.records
    assert not [s for s in cap.skipped if "pointer network" in s.reason]
    assert [n for n in cap.notes if "slices multiply values one at a time" in n]


@torch.jit.script
def upcast_masked_softmax(x: torch.Tensor, mask: torch.Tensor, mask_value: torch.Tensor) -> torch.Tensor:
    x = torch.where(mask, x, mask_value)
    return torch.nn.functional.softmax(x.float(), dim=-1).to(x.dtype)


@torch.jit.script
def rotate(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]], dim=-1) * 0.5 + x


class BigCodeAttention(nn.Module):
    """GPT-BigCode's attention in half precision: its softmax runs in a TorchScript helper (``jit``), or
    ChatGLM's, whose q and k go through a TorchScript rotary (``rotary``)."""

    def __init__(self, where: str):
        super().__init__()
        self.where = where
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 2, D // 2).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        if self.where == "rotary":
            q, k = rotate(q), rotate(k)
        s = q @ k.transpose(-1, -2)
        if self.where == "jit":
            w = upcast_masked_softmax(s, causal, torch.full([], -1e4))
        else:
            w = s.masked_fill(~causal, -1e4).softmax(-1)
        self.kept = w.detach().clone()  # (the weights the model used: the tests' ground truth)
        return self.c_proj((w @ v).transpose(1, 2).reshape(b, n, D))


class Lm(nn.Module):
    def __init__(self, where: str):
        super().__init__()
        self.wte, self.attn, self.lm_head = (
            nn.Embedding(VOCAB, D),
            BigCodeAttention(where),
            nn.Linear(D, VOCAB),
        )

    def forward(self, ids):
        return self.lm_head(self.attn(self.wte(ids))).softmax(-1)  # (a sampling softmax over the vocabulary)


@pytest.fixture
def unfollowed():
    """The TorchScript functions here with no Python function kept (a script loaded from a file, or made by
    ``torch.jit.trace``, keeps none): capture cannot follow them, and says so."""
    with pytest.MonkeyPatch.context() as mp:
        for fn in (upcast_masked_softmax, rotate):
            mp.setattr(fn, "_torchdynamo_inline", None)
        yield


def _lm_said(where: str):
    """A capture of ``Lm(where)`` and its notes that name TorchScript, one of which names module 'attn'."""
    torch.manual_seed(0)
    model = Lm(where).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (2, 5)))
    said = [n for n in cap.notes if "TorchScript" in n]
    assert len(said) == 1 and "'attn'" in said[0]
    return cap, said


@pytest.mark.parametrize("where", ["jit", "rotary"])
def test_a_torchscript_helper_in_a_module_is_said_and_its_maps_flagged(where, unfollowed):
    cap, said = _lm_said(where)
    name = "upcast_masked_softmax" if where == "jit" else "rotate"
    assert name in said[0]
    assert all(not r.exact for r in cap.records)
    assert bool(cap.records) == (where == "rotary")


def python_softmax(x: torch.Tensor, mask: torch.Tensor, mask_value: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, mask_value).softmax(-1)


softmax_fn = python_softmax  # rebound below, between two captures of the same class


def _causal_heads(module: BigCodeAttention, x: torch.Tensor, softmax) -> torch.Tensor:
    """BigCodeAttention's heads with the masked softmax ``softmax`` (a Python or a TorchScript function)."""
    b, n, _ = x.shape
    q, k, v = (t.view(b, n, 2, D // 2).transpose(1, 2) for t in module.c_attn(x).split(D, dim=2))
    w = softmax(q @ k.transpose(-1, -2), torch.ones(n, n, dtype=torch.bool).tril(), torch.full([], -1e4))
    return module.c_proj((w @ v).transpose(1, 2).reshape(b, n, D))


class Rebinding(BigCodeAttention):
    """Its softmax is whatever the global ``softmax_fn`` is when it runs."""

    def forward(self, x):
        return _causal_heads(self, x, softmax_fn)


def _scripted_note(model) -> list[str]:
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 5, D))
    return [n for n in cap.notes if "TorchScript" in n]


def test_a_global_rebound_to_torchscript_after_a_first_capture_is_said(monkeypatch, unfollowed):
    """What a class's code calls is found again where a global it reads was rebound (or its forward patched)
    since its first capture: a TorchScript softmax there is said, never left out with no word."""
    model = Rebinding("none").eval()
    assert _scripted_note(model) == []  # (the class's first capture: plain Python, recorded)
    monkeypatch.setitem(globals(), "softmax_fn", upcast_masked_softmax)
    assert (
        len(_scripted_note(model)) == 1
        and "upcast_masked_softmax" in _scripted_note(Rebinding("none").eval())[0]
    )
    monkeypatch.setitem(globals(), "softmax_fn", python_softmax)
    assert _scripted_note(model) == []

    def scripted_forward(self, x):
        return _causal_heads(self, x, upcast_masked_softmax)

    monkeypatch.setattr(Rebinding, "forward", scripted_forward)  # the class's forward patched
    assert len(_scripted_note(model)) == 1
    monkeypatch.undo()
    model.forward = scripted_forward.__get__(model)  # a forward set on the instance alone
    assert len(_scripted_note(model)) == 1
    assert _scripted_note(Rebinding("none").eval()) == []


def test_a_module_without_torchscript_says_nothing_of_it():
    model = Lm("none").eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (2, 5)))
    assert not [n for n in cap.notes if "TorchScript" in n]
    assert len(cap.records) == 1 and cap.records[0].exact


def test_a_torchscript_function_held_as_an_attribute_is_heard_and_put_back(unfollowed):
    class Held(BigCodeAttention):
        def __init__(self):
            super().__init__("none")
            self.rope = rotate  # ChatGLM-style: a scripted function kept on the module

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = (t.view(b, n, 2, D // 2).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
            w = (self.rope(q) @ self.rope(k).transpose(-1, -2)).softmax(-1)
            return w @ v

    model = Held().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(1, 5, D))
        held = model.__dict__["rope"]
        assert copy.copy(held).fn is held.fn  # (a copy of the module's wrapper works)
    assert [n for n in cap.notes if "TorchScript (rotate)" in n]
    assert cap.records and not cap.records[0].exact
    assert model.rope is rotate and isinstance(upcast_masked_softmax, torch.jit.ScriptFunction)


def _eager_core(q, k, v):
    w = torch.softmax(q @ k.transpose(-1, -2) * 0.5, dim=-1)
    return w @ v


ATTENTION_FUNCTIONS = {"eager": _eager_core, "jit": upcast_masked_softmax}


class Registry(nn.Module):
    """Hugging Face's ``ALL_ATTENTION_FUNCTIONS[config.impl]``: the attention core picked from a dict by name, the
    global registry's or one the module keeps (``self.impls``); the "jit" one a TorchScript function."""

    def __init__(self, impl: str, own: bool):
        super().__init__()
        self.impl, self.qkv = impl, nn.Linear(D, 3 * D)
        if own:
            self.impls = {"eager": _eager_core, "jit": upcast_masked_softmax}

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 2, D // 2).transpose(1, 2) for t in self.qkv(x).split(D, dim=2))
        impls = self.__dict__.get("impls", ATTENTION_FUNCTIONS)
        if self.impl == "jit":
            keep = torch.ones(n, n, dtype=torch.bool).tril()
            return impls["jit"](q @ k.transpose(-1, -2), keep, torch.full([], -1e4)) @ v
        return impls["eager"](q, k, v)


class TwoLayers(nn.Module):
    def __init__(self, own: bool):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([Registry("eager", own), Registry("jit", own)])

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = x + layer(x).transpose(1, 2).reshape(x.shape)
        return x


@pytest.mark.parametrize("own", [False, True])
def test_a_torchscript_function_picked_from_a_registry_dict_is_said(own, unfollowed):
    """A TorchScript core reached through a dict (a global registry, or one the module keeps) ran unseen: its layer
    had no record and, with another layer's softmax seen, no note. Held in a dict it is heard as a global name is, and
    the dict is put back."""
    torch.manual_seed(0)
    model = TwoLayers(own).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (2, 5)))
    assert [r.name for r in cap.records] == ["layers.0"]
    said = [n for n in cap.notes if "TorchScript (upcast_masked_softmax)" in n]
    assert len(said) == 1 and "'layers.1'" in said[0], cap.notes
    registry = model.layers[1].__dict__["impls"] if own else ATTENTION_FUNCTIONS
    assert registry["jit"] is upcast_masked_softmax


@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("where", ["jit", "rotary"])
def test_a_torchscript_function_is_followed_through_the_python_it_was_compiled_from(where, batch):
    """``torch.jit.script`` keeps the Python function it compiled: run again beside the script on copies of its
    arguments, it gives what the script returned, so its ops are followed. GPT-BigCode's scripted softmax is recorded,
    ChatGLM's scripted rotary keeps the queries' and keys' lineage: exact maps, the model's own, and nothing said."""
    torch.manual_seed(0)
    model = Lm(where).eval()
    ids = torch.randint(0, VOCAB, (batch, 5))
    with torch.no_grad():
        plain = model(ids)
        with capture_attention(model) as cap:
            out = model(ids)
    assert torch.equal(out, plain)
    assert not [n for n in cap.notes if "TorchScript" in n], cap.notes
    assert len(cap.records) == 1, cap.records
    rec = cap.records[0]
    assert rec.exact and rec.flag is None and rec.kind == "dec_self" and rec.name == "attn"
    torch.testing.assert_close(rec.probs, model.attn.kept, rtol=0, atol=0)
    assert rec.mask is not None and torch.equal(rec.mask, torch.ones(batch, 5, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize("where", ["jit", "rotary"])
def test_a_torchscript_function_its_python_does_not_repeat_is_said(where, monkeypatch):
    """Where the Python function kept gives other values than the script (a fused kernel's rounding; here another
    function put in its place), the script's ops were not those capture followed: said, and a map the Python made
    is flagged, never shown as the script's."""

    def other_softmax(x, mask, mask_value):
        return torch.where(mask, x, mask_value).softmax(-1) * 0.5

    def other_rotate(x):
        return x * 2

    monkeypatch.setattr(upcast_masked_softmax, "_torchdynamo_inline", other_softmax)
    monkeypatch.setattr(rotate, "_torchdynamo_inline", other_rotate)
    cap, _ = _lm_said(where)
    assert cap.records and all(not r.exact for r in cap.records)
    if where == "jit":  # (the Python function's map: not the one the model used)
        assert "did not give what the script returned" in (cap.records[0].flag or "")


@torch.jit.script
def doubled_and_dropped(x: torch.Tensor, p: float) -> torch.Tensor:
    x.mul_(2.0)  # (its argument written in place)
    return torch.dropout(x, p, True)


class InPlaceRandom(nn.Module):
    """Queries through a TorchScript function that writes its argument in place and drops features at random."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(VOCAB, D), nn.Linear(D, 3 * D)

    def forward(self, ids):
        q, k, v = self.qkv(self.emb(ids)).split(D, dim=-1)
        q = doubled_and_dropped(q.contiguous(), 0.5)
        w = (q @ k.transpose(-1, -2)).softmax(-1)
        self.kept = w.detach().clone()
        return w @ v


def test_a_torchscript_function_that_writes_in_place_and_draws_at_random_runs_once_for_the_model():
    """The Python function runs on copies, from the random state the script's call started from: the model's
    tensors are written once (by the script), its random numbers are the ones it draws without capture, and the
    map is exact."""
    model = InPlaceRandom()
    ids = torch.randint(0, VOCAB, (3, 6))
    torch.manual_seed(1)
    plain = model(ids)
    after_plain = torch.rand(3)
    torch.manual_seed(1)
    with capture_attention(model) as cap:
        out = model(ids)
    assert torch.equal(out, plain) and torch.equal(torch.rand(3), after_plain)
    assert len(cap.records) == 1 and cap.records[0].exact, (cap.records, cap.notes)
    torch.testing.assert_close(cap.records[0].probs, model.kept[:, None], rtol=0, atol=0)
    assert not [n for n in cap.notes if "TorchScript" in n]


class KeepsWeights(nn.TransformerEncoderLayer):
    """The usual recipe to keep an encoder layer's weights: ``_sa_block`` overridden to ask for them."""

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x, self.attn_weights = self.self_attn(
            x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=True,
            average_attn_weights=False, is_causal=is_causal,
        )  # fmt: skip
        return self.dropout1(x)


@pytest.mark.parametrize("layer", [KeepsWeights, nn.TransformerEncoderLayer])
@pytest.mark.parametrize("training", [False, True])
def test_a_subclass_of_an_encoder_layer_says_it_leaves_the_fast_path(layer, training):
    """A subclass runs torch's Python path under capture, where torch may take its fused fast path without it: the
    output can differ in the last bits, and nothing said so. An information note does, in eval mode (the fast path's
    only); torch's own layer runs as without capture and says nothing."""
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(layer(D, 2, 16, 0.0, batch_first=True), 2, enable_nested_tensor=False)
    enc.train(training)
    with torch.no_grad(), capture_attention(enc) as cap:
        enc(torch.randn(2, 5, D))
    said = [n for n in cap.skipped if "a subclass of nn.TransformerEncoderLayer" in n.reason]
    assert len(cap.records) == 2 and all(r.exact for r in cap.records)
    assert len(said) == int(layer is KeepsWeights and not training), cap.skipped


class NumpyQ(nn.Module):
    """The query projection run outside torch (numpy: a port that keeps one step in numpy; a TorchScript-traced
    layer does the same to lineage): the queries reach the product never projected inside the call."""

    def __init__(self, lin: nn.Linear, traced: bool):
        super().__init__()
        self.lin = torch.jit.trace(lin, torch.randn(1, 2, lin.in_features)) if traced else lin
        self.traced = traced

    def forward(self, x):
        if self.traced:
            return self.lin(x)
        w, b = self.lin.weight.detach().numpy(), self.lin.bias.detach().numpy()
        return torch.from_numpy(x.detach().numpy() @ w.T + b)


class SelfAttentionUnseenQ(nn.Module):
    def __init__(self, heads: int, causal: bool, traced: bool, sdpa: bool):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 2 * D)
        self.q = NumpyQ(nn.Linear(2 * D, 2 * D), traced)
        self.k, self.v = nn.Linear(2 * D, 2 * D), nn.Linear(2 * D, 2 * D)
        self.h, self.causal, self.sdpa = heads, causal, sdpa

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = (
            t.view(b, n, self.h, d // self.h).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x))
        )
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        s = q @ k.transpose(-2, -1) / (d // self.h) ** 0.5
        if self.causal:
            s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        self.saved = s.softmax(-1)
        return self.saved @ v


@pytest.mark.parametrize("sdpa", [False, True])
@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_whose_queries_capture_cannot_see_made_says_its_kind_is_unverified(
    causal, traced, sdpa
):
    """Queries made where capture cannot see (numpy, a TorchScript-traced projection) have positions of their
    own, so lineage read them as another input than the keys: at one sequence and one head (a softmax's
    product has one slice, so its head axis needs no tracing) and for SDPA at any size, the record was exact
    cross-attention with no note, the trace drawing a self-attention as cross. The kind is now read from
    the lengths and the mask, and a warning says it could not be verified."""
    torch.manual_seed(0)
    for b, h in ((1, 1), (2, 2)) if sdpa else ((1, 1),):
        model = SelfAttentionUnseenQ(h, causal, traced, sdpa).eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randint(1, VOCAB, (b, 5)))
        (rec,) = cap.records
        assert rec.kind == ("dec_self" if causal else "enc_self"), (b, h, rec.kind)
        assert rec.exact and tuple(rec.probs.shape) == (b, h, 5, 5)
        if not sdpa:
            assert torch.equal(rec.probs, model.saved)
        said = [n for n in cap.notes if "could not verify its kind" in n]
        assert len(said) == 1 and "never projected inside the captured call" in said[0], cap.notes
        tr = cap.trace(0, src_tokens=list("abcde"))
        assert tr.kinds == (rec.kind,) and any(
            "could not verify its kind" in n for n in tr.meta["capture_notes"]
        )


def test_queries_projected_inside_the_call_say_nothing_of_their_kind():
    torch.manual_seed(0)
    model = SelfAttentionUnseenQ(1, False, False, False).eval()
    model.q = nn.Linear(2 * D, 2 * D)  # (projected by torch, inside the call)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (1, 5)))
    assert cap.records[0].kind == "enc_self" and not cap.notes


def test_kinds_given_as_a_list_is_one_sentence(tmp_path):
    """``kinds=["enc_self"]`` (a list where a dict of module path -> kind is meant) raised AttributeError from
    deep inside capture, and so did ``watch(capture={"kinds": [...]})``."""
    import attnscope

    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    with pytest.raises(TypeError, match="kinds must be a dict of module path"):
        with capture_attention(layer, kinds=["enc_self"]):
            layer(torch.randn(1, 3, 8))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.layer = (
                nn.Embedding(VOCAB, 8),
                nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
            )

        def forward(self, ids):
            return self.layer(self.emb(ids))

    with pytest.raises(TypeError, match="kinds must be a dict"):
        attnscope.watch(M(), torch.randint(0, VOCAB, (1, 4)), every=1, run_dir=tmp_path / "run",
                        capture={"kinds": ["enc_self"]})  # fmt: skip


class PrecomputedQK(nn.Module):
    """Attention over queries and keys handed in, already projected (a block captured alone)."""

    def forward(self, q, k, v):
        return (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1) @ v


@pytest.mark.parametrize("n_keys", [6, 9])
def test_queries_and_keys_handed_in_say_why_they_are_flagged_and_take_their_kind_from_the_lengths(n_keys):
    """q and k two tensors handed in: the first thing capture saw of k was ``k.transpose(-2, -1)``, numbered
    as a tensor of its own, so the flag said the product "multiplies features of different positions" (it does
    not). The flag says the queries were not projected inside the call, and the kind comes from the lengths."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 6, 8), torch.randn(2, 2, n_keys, 8)
    block = PrecomputedQK()
    with torch.no_grad(), capture_attention(block) as cap:
        block(q, k, k)
    (rec,) = cap.records
    assert not rec.exact and "not projected inside the captured call" in rec.flag, rec.flag
    assert not any("features of different positions" in n for n in cap.notes), cap.notes
    assert rec.kind == ("enc_self" if n_keys == 6 else "cross")
    assert torch.allclose(rec.probs, (q @ k.transpose(-2, -1) / 8**0.5).softmax(-1))


@torch.jit.script
def _softmax_last(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


@torch.jit.script
def nested_softmax(x: torch.Tensor, mask: torch.Tensor, mask_value: torch.Tensor) -> torch.Tensor:
    return _softmax_last(torch.where(mask, x, mask_value))  # (a script calling another script)


@torch.jit.script
def _masked_softmax_dim(
    x: torch.Tensor, mask: torch.Tensor, mask_value: torch.Tensor, dim: int
) -> torch.Tensor:
    return torch.softmax(torch.where(mask, x, mask_value), dim=dim)


fused_ops = types.ModuleType(
    "fused_ops"
)  # (``from . import fused_ops as ops``: a module the code reads a name of)
fused_ops.masked_softmax = upcast_masked_softmax
partial_softmax = functools.partial(_masked_softmax_dim, dim=-1)


class ReachedOtherwise(BigCodeAttention):
    """BigCodeAttention's causal heads with their masked softmax a TorchScript function reached another way."""

    class_softmax = upcast_masked_softmax  # (a script held as a class attribute)

    def __init__(self, how: str):
        super().__init__("none")
        self.how = how

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 2, D // 2).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
        causal, fill = torch.ones(n, n, dtype=torch.bool).tril(), torch.full([], -1e4)
        s = q @ k.transpose(-1, -2)
        if self.how == "nested":
            w = nested_softmax(s, causal, fill)
        elif self.how == "namespace":
            w = fused_ops.masked_softmax(s, causal, fill)
        elif self.how == "partial":
            w = partial_softmax(s, causal, fill)
        else:
            w = self.class_softmax(s, causal, fill)
        self.kept = w.detach().clone()
        return self.c_proj((w @ v).transpose(1, 2).reshape(b, n, D))


@pytest.mark.parametrize("how", ["nested", "namespace", "partial", "class"])
def test_a_torchscript_softmax_reached_otherwise_is_followed(how):
    """A script called by another script, through a module's namespace, as a partial, or held as a class attribute:
    each was run unseen (the nested one even followed as if nothing were inside it), so the layer's attention was
    missing with no word. Now followed through its Python function: the map recorded, exact."""
    torch.manual_seed(0)
    model = ReachedOtherwise(how).eval()
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        plain = model(x)
        with capture_attention(model) as cap:
            out = model(x)
    assert torch.equal(out, plain)
    assert len(cap.records) == 1 and cap.records[0].exact and not cap.notes, (cap.records, cap.notes)
    torch.testing.assert_close(cap.records[0].probs, model.kept, rtol=0, atol=0)
    assert (
        ReachedOtherwise.class_softmax is upcast_masked_softmax
        and fused_ops.masked_softmax is upcast_masked_softmax
    )


_hidden = types.SimpleNamespace(inner=_softmax_last)  # (a script behind an object's attribute: never found)


def _hidden_python(x: torch.Tensor, mask: torch.Tensor, mask_value: torch.Tensor) -> torch.Tensor:
    return _hidden.inner(torch.where(mask, x, mask_value))


def test_a_python_rerun_that_reaches_a_script_unseen_is_not_taken_for_followed(monkeypatch):
    """Where the Python function run again beside a script reaches another script capture does not find, that
    script's softmax runs unseen: the outputs agree, but the graph's softmax was not followed. Said, as a script
    capture cannot follow, never counted as followed with the layer's map missing."""
    monkeypatch.setattr(nested_softmax, "_torchdynamo_inline", _hidden_python)
    torch.manual_seed(0)
    model = ReachedOtherwise("nested").eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 5, D))
    said = [n for n in cap.notes if "TorchScript (nested_softmax)" in n]
    assert len(said) == 1 and not cap.records, (cap.records, cap.notes)
