"""attnscope.core.families.capture on attention over feature maps, as vision code writes it: SAGAN's
self-attention with 1x1 convs applied to a feature map handed in from outside (a backbone's), the
non-local block's max-pooled keys, PVT's spatial reduction (keys from a strided conv of the queries'
own map), a generator that upsamples with ``ConvTranspose2d`` before its attention, and FlexAttention,
whose weights capture cannot see. Each model keeps what it computed, so every record is checked
against the model itself, for several batch sizes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention


def _captured(model, *inputs):
    model.seen = []
    with torch.no_grad(), capture_attention(model) as cap:
        out = model(*inputs)
    return cap, out


class SelfAttn(nn.Module):
    """SAGAN (Zhang et al.): query/key/value 1x1 convs, ``bmm``, softmax over the last axis; ``pool``
    max-pools the keys and values 2x2 first (the non-local block of BigGAN)."""

    def __init__(self, ch: int = 16, pool: bool = False):
        super().__init__()
        self.query_conv, self.key_conv = nn.Conv2d(ch, ch // 4, 1), nn.Conv2d(ch, ch // 4, 1)
        self.value_conv = nn.Conv2d(ch, ch, 1)
        self.gamma, self.pool = nn.Parameter(torch.tensor(0.5)), pool
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        b, c, h, w = x.shape
        q = self.query_conv(x).view(b, -1, h * w).permute(0, 2, 1)  # (B, N, C')
        k, v = self.key_conv(x), self.value_conv(x)
        if self.pool:
            k, v = F.max_pool2d(k, 2), F.max_pool2d(v, 2)
        k, v = k.flatten(2), v.flatten(2)  # (B, C', M), (B, C, M)
        attention = torch.softmax(torch.bmm(q, k), dim=-1)  # (B, N, M)
        self.seen.append(attention)
        out = torch.bmm(v, attention.permute(0, 2, 1)).view(b, c, h, w)
        return self.gamma * out + x


@pytest.mark.parametrize("pool", [False, True])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_convolutions_of_a_feature_map_from_outside_are_self_attention(pool, batch):
    """The query and key convs read one tensor handed in from outside: the same positions, so the
    map is self-attention, exact; max-pooled keys are positions pooled from the same map."""
    torch.manual_seed(batch)
    model = SelfAttn(pool=pool).eval()
    cap, _ = _captured(model, torch.randn(batch, 16, 4, 4))
    assert not cap.notes, cap.notes
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self"
    assert torch.equal(rec.probs, model.seen[0][:, None])


def test_two_feature_maps_from_outside_are_cross_attention():
    """Queries from one map and keys from another (each handed in): other positions, cross."""

    class Across(SelfAttn):
        def forward(self, x, y):
            b, c, h, w = x.shape
            q = self.query_conv(x).view(b, -1, h * w).permute(0, 2, 1)
            k = self.key_conv(y).flatten(2)
            a = torch.softmax(torch.bmm(q, k), dim=-1)
            self.seen.append(a)
            return torch.bmm(self.value_conv(y).flatten(2), a.permute(0, 2, 1))

    torch.manual_seed(0)
    model = Across().eval()
    cap, _ = _captured(model, torch.randn(2, 16, 4, 4), torch.randn(2, 16, 4, 4))
    (rec,) = cap.records
    assert rec.exact and rec.kind == "cross" and torch.equal(rec.probs, model.seen[0][:, None])


class SpatialReduction(nn.Module):
    """PVT's attention with sr_ratio 2: tokens of an image, keys and values from a strided conv of the
    same tokens laid back out as a map (``x.permute(0, 2, 1).reshape(B, C, H, W)``)."""

    def __init__(self, dim: int = 16, heads: int = 2, sr: int = 2):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 2, 2)
        self.q, self.kv, self.proj = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.sr, self.norm, self.heads = nn.Conv2d(dim, dim, sr, sr), nn.LayerNorm(dim), heads
        self.seen: list[torch.Tensor] = []

    def forward(self, img):
        x = self.patch(img)
        b, c, h, w = x.shape
        x = x.flatten(2).transpose(1, 2)  # (B, N, C)
        q = self.q(x).reshape(b, h * w, self.heads, c // self.heads).permute(0, 2, 1, 3)
        x_ = self.norm(self.sr(x.permute(0, 2, 1).reshape(b, c, h, w)).reshape(b, c, -1).permute(0, 2, 1))
        k, v = self.kv(x_).reshape(b, -1, 2, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) * (c // self.heads) ** -0.5).softmax(dim=-1)
        self.seen.append(attn)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, h * w, c))


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_keys_from_a_strided_conv_of_the_queries_own_map_are_self_attention(batch):
    """PVT and SegFormer call it self-attention over fewer keys: the keys are pooled from the
    queries' own positions."""
    torch.manual_seed(batch)
    model = SpatialReduction().eval()
    cap, _ = _captured(model, torch.randn(batch, 3, 8, 8))
    assert not cap.notes, cap.notes
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and rec.probs.shape == (batch, 2, 16, 4)
    assert torch.equal(rec.probs, model.seen[0])
    assert rec.key_labels == tuple(f"<pooled {i}>" for i in range(4))  # no key is one of the tokens


class Generator(nn.Module):
    """A GAN generator: a latent upsampled by ``ConvTranspose2d`` (kernel 4, stride 2, padding 1), then
    SAGAN's attention over the upsampled map."""

    def __init__(self):
        super().__init__()
        self.up = nn.Sequential(nn.ConvTranspose2d(8, 16, 4, 2, 1), nn.BatchNorm2d(16), nn.ReLU())
        self.attn = SelfAttn()

    def forward(self, z):
        return self.attn(self.up(z.view(z.shape[0], 8, 2, 2)))


def test_attention_after_a_transposed_convolution_is_recorded():
    torch.manual_seed(0)
    model = Generator().eval()
    model.attn.seen = []
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(3, 32))
    assert not cap.notes and not cap.skipped, (cap.notes, cap.skipped)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and torch.equal(rec.probs, model.attn.seen[0][:, None])


def test_flex_attention_is_a_warning_not_an_error():
    """FlexAttention runs its own compiled code: capture says that its weights are not recorded, and
    the model's output is what it is without capture."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")

    class Flex(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(10, 16), nn.Linear(16, 48)

        def forward(self, ids):
            b, n = ids.shape
            q, k, v = (t.view(b, n, 2, 8).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))

            def causal(b, h, q_idx, kv_idx):
                return q_idx >= kv_idx

            mask = flex.create_block_mask(causal, None, None, n, n, device="cpu")
            return flex.flex_attention(q, k, v, block_mask=mask)

    torch.manual_seed(0)
    model = Flex().eval()
    ids = torch.randint(1, 10, (2, 8))
    with torch.no_grad():
        plain = model(ids)
    cap, out = _captured(model, ids)
    assert torch.equal(out, plain)
    assert not cap.records
    assert len(cap.notes) == 1 and "flex_attention" in cap.notes[0] and "not recorded" in cap.notes[0]


class ZeroShot(nn.Module):
    """CLIP's zero-shot use: an image's class token and a caption's end-of-text token, projected, and
    ``(img @ txt.T).softmax(-1)``: a distribution over the batch's captions, not attention."""

    def __init__(self):
        super().__init__()
        self.patch, self.cls = nn.Conv2d(3, 8, 2, 2), nn.Parameter(torch.randn(8))
        self.tok, self.img_proj, self.txt_proj = nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, image, text):
        x = self.patch(image).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls + torch.zeros(x.shape[0], 1, 8), x], dim=1)
        img = self.img_proj(x)[:, 0]
        t = self.txt_proj(self.tok(text))
        txt = t[torch.arange(t.shape[0]), text.argmax(dim=-1)]
        return (img @ txt.t()).softmax(dim=-1)


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_image_text_logits_over_the_batch_are_never_an_exact_map(batch):
    """The queries are each image's class token (one learned position), the keys one token of every
    caption: a distribution over the batch's captions, noted as not attention, never an exact map; with
    one caption the softmax is 1 and nothing is recorded."""
    torch.manual_seed(batch)
    text = torch.randint(1, 9, (batch, 5))
    text[:, 3] = 9  # the end-of-text token has the highest id
    cap, _ = _captured(ZeroShot().eval(), torch.randn(batch, 3, 4, 4), text)
    assert not cap.records
    if batch == 1:
        assert any("one key" in s.reason for s in cap.skipped)
        return
    assert [s.reason for s in cap.skipped] == [
        "a 2-D softmax is a distribution per row, not per-head attention"
    ]


class MeanPooledZeroShot(nn.Module):
    """The same with mean-pooled towers (SimCSE, sentence-transformers, ALIGN): each caption's tokens and
    each image's patches averaged into one vector per row, ``(img @ txt.T).softmax(-1)`` inside the forward."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 2, 2)
        self.tok, self.img_proj, self.txt_proj = nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, image, text):
        img = self.img_proj(self.patch(image).flatten(2).transpose(1, 2).mean(1))
        txt = self.txt_proj(self.tok(text).mean(1))
        return (img @ txt.t()).softmax(dim=-1)


@pytest.mark.parametrize("batch", [2, 3])
def test_mean_pooled_image_text_logits_are_never_an_exact_map(batch):
    """Captions mean-pooled one vector per row: the keys come from several rows of the tokens, so the
    softmax over them is no sequence's attention (flagged or noted, never exact)."""
    torch.manual_seed(batch)
    cap, _ = _captured(
        MeanPooledZeroShot().eval(), torch.randn(batch + 1, 3, 4, 4), torch.randint(1, 9, (batch, 5))
    )
    assert not [r for r in cap.records if r.exact]
    assert [r.flag for r in cap.records] == [] or all(
        "similarity across the batch" in r.flag for r in cap.records
    )
    assert cap.records or cap.skipped


class KeysAlongRows(nn.Module):
    """The SAGAN variant many GAN repositories write: ``s = bmm(f.permute(0, 2, 1), g)``, the softmax
    over dim=1 and ``bmm(h, beta)``: column j holds query j's weights."""

    def __init__(self, ch: int = 16):
        super().__init__()
        self.f, self.g, self.h = nn.Conv2d(ch, ch // 4, 1), nn.Conv2d(ch, ch // 4, 1), nn.Conv2d(ch, ch, 1)
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        b, c, h, w = x.shape
        s = torch.bmm(self.f(x).view(b, -1, h * w).permute(0, 2, 1), self.g(x).view(b, -1, h * w))
        beta = F.softmax(s, dim=1)
        self.seen.append(beta.transpose(1, 2))
        return torch.bmm(self.h(x).view(b, c, h * w), beta).view(b, c, h, w) + x


class TwoBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = SelfAttn(), KeysAlongRows()

    def forward(self, x):
        return self.second(self.first(x))


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_values_times_weights_is_followed_to_the_next_block(batch):
    """``bmm(value, attention.permute(0, 2, 1))`` multiplies values by weights (the weights second):
    its output keeps the queries' positions, so the next block's attention (keys along dim=1) is
    exact too, not lost after the first."""
    torch.manual_seed(batch)
    model = TwoBlocks().eval()
    model.first.seen, model.second.seen = [], []
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 16, 4, 4))
    assert not cap.notes, cap.notes
    first, second = cap.records
    assert first.exact and second.exact and first.kind == second.kind == "enc_self"
    assert torch.equal(first.probs, model.first.seen[0][:, None])
    assert torch.equal(second.probs, model.second.seen[0][:, None])


class MemoryHop(nn.Module):
    """End-to-end memory networks: a question and story sentences, each a bag of word embeddings
    summed, then ``softmax(bmm(m, u.unsqueeze(2)).squeeze(2))``: one question over its own story."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Embedding(10, 8), nn.Embedding(10, 8)
        self.seen: list[torch.Tensor] = []

    def forward(self, story, question):  # (B, M, words), (B, words)
        m = self.a(story).sum(2)  # (B, M, d)
        u = self.b(question).sum(1)  # (B, d)
        p = F.softmax(torch.bmm(m, u.unsqueeze(2)).squeeze(2), dim=-1)  # (B, M)
        self.seen.append(p)
        return torch.bmm(p.unsqueeze(1), m).squeeze(1) + u


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_a_2d_softmax_whose_rows_are_each_their_own_sequences_is_exact(batch):
    """Each row of the (B, M) softmax is one question over its own story's sentences: no sequence's
    positions come from several rows, so the map is exact (unlike CLIP's logits above)."""
    torch.manual_seed(batch)
    model = MemoryHop().eval()
    cap, _ = _captured(model, torch.randint(1, 10, (batch, 5, 3)), torch.randint(1, 10, (batch, 4)))
    assert not cap.notes, cap.notes
    (rec,) = cap.records
    assert (
        rec.exact and rec.probs.shape == (batch, 1, 1, 5) and torch.equal(rec.probs[:, 0, 0], model.seen[0])
    )


class SpatialTransformer(nn.Module):
    """Latent diffusion's SpatialTransformer, as its repository writes it: GroupNorm over the latent image
    handed in, a 1 x 1 conv, the pixels as a sequence, self-attention, then cross-attention to the text
    encoder's tokens, the heads folded into the batch (``(b h) n d``) and multiplied by einsum."""

    def __init__(self, heads: int, channels: int = 8, vocab: int = 30):
        super().__init__()
        d = 4 * heads
        self.h = heads
        self.text = nn.Embedding(vocab, d)
        self.norm = nn.GroupNorm(4, channels, eps=1e-6)
        self.proj_in = nn.Conv2d(channels, d, 1)
        self.q1, self.k1, self.v1 = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.q2, self.k2, self.v2 = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.used: list[torch.Tensor] = []

    def attend(self, x, context, q, k, v):
        b, h = x.shape[0], self.h
        q, k, v = (t.view(b, t.shape[1], h, -1).transpose(1, 2).reshape(b * h, t.shape[1], -1)
                   for t in (q(x), k(context), v(context)))  # fmt: skip
        w = torch.einsum("b i d, b j d -> b i j", q, k).mul(q.shape[-1] ** -0.5).softmax(-1)
        self.used.append(w.view(b, h, *w.shape[1:]))
        return x + torch.einsum("b i j, b j d -> b i d", w, v).view(b, h, x.shape[1], -1).transpose(
            1, 2
        ).flatten(2)

    def forward(self, z, tokens):
        context = self.text(tokens)
        x = self.proj_in(self.norm(z)).flatten(2).transpose(1, 2)  # (b, h*w, d)
        x = self.attend(x, x, self.q1, self.k1, self.v1)
        return self.attend(x, context, self.q2, self.k2, self.v2)


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 2)])
def test_latent_diffusion_attention_after_a_group_norm_of_the_latents_is_exact(batch, heads):
    """A GroupNorm of the latents handed in keeps them a tensor from outside (its learned scale makes no
    learned vectors of them): the pixels' self-attention and their cross-attention to the text are
    exact, as without the norm."""
    torch.manual_seed(batch)
    model = SpatialTransformer(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 8, 4, 4), torch.randint(1, 30, (batch, 5)))
    assert [r.kind for r in cap.records] == ["enc_self", "cross"]
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact and torch.equal(rec.probs, used)
    assert not cap.notes


class UnfoldedPatches(nn.Module):
    """MobileViT's block as timm and ml-cvnets write it: a feature map's patches unfolded with ``F.unfold``
    (each pixel offset in a patch one sequence over the patches), attention there (q @ k, or v2's
    separable attention: a softmax over the patches of a one-channel projection), and ``F.fold`` back."""

    def __init__(self, separable: bool, d: int = 8):
        super().__init__()
        self.d, self.separable = d, separable
        self.conv = nn.Conv2d(3, d, 1)
        self.qkv_proj = nn.Conv2d(d, 1 + 2 * d, 1)
        self.qkv = nn.Linear(d, 3 * d)
        self.used: list[torch.Tensor] = []

    def forward(self, img):
        x = self.conv(img)
        b, c, h, w = x.shape
        x = F.unfold(x, kernel_size=2, stride=2).reshape(b, c, 4, -1)  # (B, C, P, N)
        if self.separable:
            query, key, value = self.qkv_proj(x).split([1, self.d, self.d], dim=1)
            a = F.softmax(query, dim=-1)  # (B, 1, P, N): over the patches
            self.used.append(a.reshape(b * 4, 1, 1, -1))
            y = F.relu(value) * (key * a).sum(dim=-1, keepdim=True).expand_as(value)
        else:
            t = x.permute(0, 2, 3, 1).reshape(b * 4, -1, c)
            q, k, v = self.qkv(t).chunk(3, -1)
            a = (q @ k.transpose(-2, -1)).softmax(-1)
            self.used.append(a.unsqueeze(1))
            y = (a @ v).reshape(b, 4, -1, c).permute(0, 3, 1, 2)
        y = F.fold(y.reshape(b, c * 4, -1), output_size=(h, w), kernel_size=2, stride=2)
        t = y.flatten(2).transpose(1, 2)  # (B, H*W, C): one more attention over the folded pixels
        q, k, v = self.qkv(t).chunk(3, -1)
        a = (q @ k.transpose(-2, -1)).softmax(-1)
        self.used.append(a.unsqueeze(1))
        return a @ v


@pytest.mark.parametrize("separable", [False, True])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_attention_over_patches_unfolded_with_f_unfold_is_exact(separable, batch):
    """F.unfold's patches were lineage lost: the separable softmax went to cap.skipped as not attention
    (no warning), q @ k was flagged; F.fold back put the pixels where lineage reads them again."""
    torch.manual_seed(batch)
    model = UnfoldedPatches(separable).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 3, 4, 4))
    # (what moves is left out where F.fold, which capture does not follow as a move, reads the heads' output)
    assert not cap.notes and all("what attention moves" in n.reason for n in cap.skipped)
    assert len(cap.records) == 2
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact
        torch.testing.assert_close(rec.probs, used, rtol=0, atol=0)
    assert cap.records[-1].kind == "enc_self"


class OffsetAttention(nn.Module):
    """PCT's offset-attention (Strawberry-Eat-Mango/PCT_Pytorch SA_Layer) over channels-first point
    features: q and k convs share weights, ``softmax(bmm(x_q, x_k))`` over the last axis, then renormalized
    over the other (``attention / (1e-9 + attention.sum(dim=1, keepdims=True))``) and ``bmm(x_v, attention)``:
    output point j mixes the values of points i with ``attention[i, j]``. ``used`` keeps (query j, key i)."""

    def __init__(self, channels: int = 8, layers: int = 2):
        super().__init__()
        self.q = nn.ModuleList(nn.Conv1d(channels, channels // 4, 1, bias=False) for _ in range(layers))
        self.v = nn.ModuleList(nn.Conv1d(channels, channels, 1) for _ in range(layers))
        self.used: list[torch.Tensor] = []

    def forward(self, x):
        for q_conv, v_conv in zip(self.q, self.v, strict=True):
            x_q, x_k, x_v = q_conv(x).permute(0, 2, 1), q_conv(x), v_conv(x)
            attention = torch.softmax(torch.bmm(x_q, x_k), dim=-1)
            attention = attention / (1e-9 + attention.sum(dim=1, keepdims=True))
            self.used.append(attention.transpose(1, 2)[:, None].detach().clone())
            x = x + (x - torch.bmm(x_v, attention))
        return x


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_offset_attention_renormalized_over_the_queries_is_recorded_as_multiplied(batch):
    """The values are multiplied by the weights renormalized over the other axis: those are the record,
    each output point's row over the points it mixes, exact (the softmax's own rows were flagged as
    multiplied along another axis than their softmax's)."""
    torch.manual_seed(batch)
    model = OffsetAttention().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 8, 6))
    assert len(cap.records) == len(model.used) == 2 and not cap.notes
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact and rec.kind == "enc_self"
        torch.testing.assert_close(rec.probs, used, rtol=0, atol=0)


class ChannelsFirstJoinedKeys(nn.Module):
    """guided-diffusion's QKVAttention over channels-first features (heads split along the channels by
    ``reshape(b * h, ch, length)``) with a text's keys joined before the image's along the positions, the
    last axis: ``cat([ek, k], dim=-1)``; ``shared``: both made by one conv (else GLIDE's two, ``encoder_kv``
    and ``qkv``, whose heads sit at other channels in each)."""

    def __init__(self, shared: bool, heads: int = 2, ch: int = 4):
        super().__init__()
        self.shared, self.h, self.ch = shared, heads, ch
        c = heads * ch
        self.q, self.k = nn.Conv1d(c, c, 1), nn.Conv1d(c, c, 1)
        self.qkv, self.encoder_kv = nn.Conv1d(c, 3 * c, 1), nn.Conv1d(c, 2 * c, 1)
        self.used: torch.Tensor | None = None

    def forward(self, x, text):
        b, c, n = x.shape
        if self.shared:
            q = self.q(x).reshape(b * self.h, self.ch, n)
            k = torch.cat([self.k(text), self.k(x)], dim=-1).reshape(b * self.h, self.ch, -1)
        else:
            q, k, _ = self.qkv(x).reshape(b * self.h, 3 * self.ch, n).split(self.ch, dim=1)
            ek, _ = self.encoder_kv(text).reshape(b * self.h, 2 * self.ch, -1).split(self.ch, dim=1)
            k = torch.cat([ek, k], dim=-1)
        w = torch.einsum("bct,bcs->bts", q, k).softmax(-1)
        self.used = w.view(b, self.h, n, -1)
        return w


@pytest.mark.parametrize("shared", [True, False])
def test_channels_first_keys_joined_along_the_positions(shared):
    """Joined along their last axis, channels-first keys are joined positions, not features: with one conv
    the record is exact, the text's keys labelled; with two whose heads sit at other channels the flag
    says so among its readings."""
    torch.manual_seed(0)
    model = ChannelsFirstJoinedKeys(shared).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 8, 5), torch.randn(2, 8, 3))
    (rec,) = cap.records
    if shared:
        assert rec.exact and tuple(rec.probs.shape) == (2, 2, 5, 8)
        torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=0)
    else:
        assert not rec.exact and "keys of two projections joined" in rec.flag


class PromptedImage(nn.Module):
    """SAM's mask decoder: the image embedding (1, C, h, w) repeated for each of P prompts and added to the
    dense prompt embeddings (P, C, h, w), flattened into (P, h·w, C) keys; the prompt tokens attend to them."""

    def __init__(self, heads: int, how: str, d: int = 8):
        super().__init__()
        self.h, self.how = heads, how
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.seen: list[torch.Tensor] = []

    def forward(self, image, dense, tokens):
        p = tokens.shape[0]
        if self.how == "repeat_interleave":
            src = torch.repeat_interleave(image, p, dim=0) + dense
        elif self.how == "broadcast":
            src = dense + image
        else:
            src = image.expand(p, -1, -1, -1) * dense
        keys = src.flatten(2).permute(0, 2, 1)
        sep = lambda x: x.reshape(x.shape[0], x.shape[1], self.h, -1).transpose(1, 2)  # noqa: E731
        q, k, v = sep(self.q_proj(tokens)), sep(self.k_proj(keys)), sep(self.v_proj(keys))
        w = torch.softmax(q @ k.permute(0, 1, 3, 2) / math.sqrt(q.shape[-1]), dim=-1)
        self.seen.append(w)
        return (w @ v).transpose(1, 2).flatten(2)


@pytest.mark.parametrize("how", ["repeat_interleave", "broadcast", "expand_mul"])
@pytest.mark.parametrize(("prompts", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_an_image_from_outside_combined_with_prompts_before_its_keys_is_exact(how, prompts, heads):
    """Tensors from outside added or multiplied channels-first before any projection say nothing about
    which axis holds features: the keys are tagged where the projection reads them, and the map is exact
    (it was flagged as mixing positions, reading the channels as positions)."""
    torch.manual_seed(prompts * 10 + heads)
    model = PromptedImage(heads, how).eval()
    image, dense, tokens = torch.randn(1, 8, 3, 4), torch.randn(prompts, 8, 3, 4), torch.randn(prompts, 5, 8)
    cap, _ = _captured(model, image, dense, tokens)
    assert not cap.notes, cap.notes
    (rec,) = cap.records
    assert rec.exact and rec.kind == "cross" and torch.equal(rec.probs, model.seen[0])


class ChunkedAttention(nn.Module):
    """Sub-quadratic attention (AUTOMATIC1111's, diffusers' SubQuadraticCrossAttnProcessor): heads folded
    into the batch, the queries taken a chunk at a time by slicing, each chunk's ``baddbmm`` (beta=0),
    softmax and ``bmm``, the chunks joined by ``torch.cat`` on the queries; self-attention over the pixels,
    then cross-attention from the pixels to each image's own caption."""

    def __init__(self, heads: int, chunk: int, d: int = 8):
        super().__init__()
        self.h, self.chunk = heads, chunk
        self.to_q, self.to_k, self.to_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.seen: list[torch.Tensor] = []

    def forward(self, x, ctx):
        b, n, d = x.shape
        fold = lambda t: t.unflatten(-1, (self.h, -1)).transpose(1, 2).flatten(end_dim=1)  # noqa: E731
        q, k, v = fold(self.to_q(x)), fold(self.to_k(ctx)), fold(self.to_v(ctx))
        outs, maps = [], []
        for start in range(0, n, self.chunk):
            qc = q[:, start : start + self.chunk]
            w = torch.baddbmm(
                torch.zeros(1, 1, 1), qc, k.transpose(1, 2), alpha=(d // self.h) ** -0.5, beta=0
            )
            w = w.softmax(-1)
            maps.append(w)
            outs.append(torch.bmm(w, v))
        self.seen.append(torch.cat(maps, 1).unflatten(0, (b, self.h)))
        return torch.cat(outs, 1).unflatten(0, (b, self.h)).transpose(1, 2).flatten(2)


class QueryChunks(nn.Module):
    def __init__(self, heads: int, chunk: int, d: int = 8):
        super().__init__()
        self.text = nn.Embedding(30, d)
        self.attn1, self.attn2 = ChunkedAttention(heads, chunk, d), ChunkedAttention(heads, chunk, d)

    def forward(self, pixels, caption):
        x = self.attn1(pixels, pixels)
        return self.attn2(x, self.text(caption))


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_chunk_of_queries_at_a_time_is_one_exact_map_and_cross_attention_pieces_are_said(batch, heads):
    """Self-attention's chunks are one exact layer (the queries are the keys' own positions). Cross-attention's
    chunks look to lineage like a decoder's steps written inline (queries from another input, a part at a time
    over the same keys), which are not one layer: each piece is exact and a note says why they stay apart."""
    torch.manual_seed(batch * 10 + heads)
    model = QueryChunks(heads, chunk=4).eval()
    model.attn1.seen, model.attn2.seen = [], []
    cap, _ = _captured(model, torch.randn(batch, 10, 8), torch.randint(0, 30, (batch, 5)))
    first, *pieces = cap.records
    assert (first.kind, first.exact) == ("enc_self", True) and torch.equal(first.probs, model.attn1.seen[0])
    assert [(r.kind, r.exact, r.probs.shape[2]) for r in pieces] == [
        ("cross", True, 4),
        ("cross", True, 4),
        ("cross", True, 2),
    ]
    assert torch.equal(torch.cat([r.probs for r in pieces], 2), model.attn2.seen[0])
    assert any("hold queries from outside those keys' sequence" in n for n in cap.notes)


def test_a_chunked_layer_called_twice_stacks_as_two_layers():
    """The chunks' joined record keeps each sequence's query and key positions, so a layer whose weights are
    shared (called twice over the same positions) stacks as two layers (it was refused as steps or layers)."""
    torch.manual_seed(0)

    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = ChunkedAttention(2, 4)

        def forward(self, x):
            return self.attn(self.attn(x, x), self.attn(x, x))

    model = Shared().eval()
    model.attn.seen = []
    cap, _ = _captured(model, torch.randn(2, 10, 8))
    assert [(r.exact, tuple(r.probs.shape)) for r in cap.records] == [(True, (2, 2, 10, 10))] * 3
    assert torch.equal(cap.records[0].query_positions, cap.records[2].query_positions)
    assert tuple(cap.stacks()["enc_self"].shape) == (2, 3, 2, 10, 10)


class InlineSteps(nn.Module):
    """A Luong decoder written inline (course notebooks): an LSTM cell a step at a time in one forward, each
    step's ``bmm`` of its state over the encoder's outputs and softmax, the outputs stacked after the loop."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.src, self.tgt = nn.Embedding(30, d), nn.Embedding(30, d)
        self.cell, self.w_a = nn.LSTMCell(d, d), nn.Linear(d, d, bias=False)
        self.seen: list[torch.Tensor] = []

    def forward(self, src, tgt):
        enc = self.src(src)
        emb = self.tgt(tgt)
        h = c = enc.new_zeros(tgt.shape[0], enc.shape[-1])
        outs = []
        for t in range(tgt.shape[1]):
            h, c = self.cell(emb[:, t], (h, c))
            a = torch.bmm(self.w_a(h).unsqueeze(1), enc.transpose(1, 2)).softmax(-1)
            self.seen.append(a)
            outs.append(torch.cat([torch.bmm(a, enc).squeeze(1), h], -1))
        return torch.stack(outs, dim=1)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_decoders_steps_written_inline_stay_one_record_each(batch):
    """Each step's query is a new position over the same keys, as a chunk of queries would be: the steps are
    not joined into one map (a join took them for chunks and left one record where there were four)."""
    torch.manual_seed(batch)
    model = InlineSteps().eval()
    cap, _ = _captured(model, torch.randint(0, 30, (batch, 5)), torch.randint(0, 30, (batch, 4)))
    assert len(cap.records) == 4
    for rec, want in zip(cap.records, model.seen, strict=True):
        assert rec.exact and rec.kind == "cross" and torch.equal(rec.probs, want[:, None])
