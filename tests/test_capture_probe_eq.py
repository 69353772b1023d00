"""Styles the probes of this round found (vision research models), each with its ground truth kept inside the model.

- MViT's pooling attention (timm's ``mvitv2``, facebookresearch/mvit) folds the heads into the batch for the conv that
  pools q, k and v (``reshape(-1, H, W, d).permute(0, 3, 1, 2)``) and unfolds them after it: each (sequence, head) row
  of the conv was taken for a sequence of its own, and the record was exact, (B * heads, 1, q, k), with no word. Rows
  that read the same positions pool to the same new ones, and a depthwise conv (MViT's, groups = channels) keeps the
  features each channel filters, as a pool does: the heads stay apart and the record is (B, heads, q, k).
- EfficientViT's cascaded group attention (timm's ``efficientvit_msra``) runs its heads one at a time, each output
  laid out features first, (B, d, H, W), and joins them along the features (``torch.cat(feats_out, 1)``): its heads
  were recorded as layers of one head each. Heads joined along any axis that lineage shows holds features are one
  layer's heads, as a join along the last axis already was. Heads that each read a run of the channels of a tensor
  handed in (``x.chunk(heads, 1)``, or ``x.chunk(heads, -1)`` features last) read its positions, not new ones each.
- Longformer's band of each query's neighbours, by offset, joined by ``torch.cat`` behind its global keys' scores
  was read as the global scores broadcast: an exact map with every column labelled the global token. A join with
  scores whose keys capture cannot place is said.
- Memory-compressed attention pads its keys in front to whole blocks (``F.pad(k, (0, 0, padding, 0))``) before a
  strided conv or a mean pools them: the pooled keys were taken for another input's, and recorded ``cross``. The
  pooled positions are the sequence's whose first real position they read, and padded cells keep the tensor's
  features, so the heads read from them stay apart.
- The FT-Transformer with Linformer key compression asks with its [CLS] alone in its last layer: the keys are
  pooled anew in every layer, so the [CLS]'s earlier row among them was not found, and it was recorded ``cross``.
  Keys pooled from the same sequence read alike.
- Hugging Face's SlidingWindowCache writes its rolled cache back with ``cache.zero_(); cache += k_out``: the keys
  were drawn under the tokens the cache held before, or as padding. A buffer zeroed in place holds nothing, and a
  sum with it holds what is added.
- PatchTST repeats its padding mask over the channels folded into the batch (``repeat_interleave(nvars, 0)``): the
  capture warned that the sequences were generate's beams. A boolean mask repeated is no copy of the sequences.
- Window attention by ``F.pad`` + ``Tensor.unfold`` with its scores a broadcast product summed over the features
  (``(q[..., None] * k_win).sum(-2)``) was said, as information only, to be a vocabulary or router softmax: the
  weights times the windows' values (``einsum("bhnw,bhndw->bhnd", p, v_win)``) are now a warning that names them.
- A one-query map whose query weighs later positions of its own sequence (Longformer's global token over every
  token) took the kind of the module's other calls where one was ``dec_self``, as a decoder's first step does.
  A query that sees ahead is no decoder's step.
- T2T-ViT's soft split (``nn.Unfold(3, stride=2, padding=1)`` of a token map, then a Linear) makes overlapping
  patches whose border ones all begin with padding: each patch was read as its first cell, so several queries were
  one position, and the map was flagged with that untrue reason. Rows that hold different positions but begin at
  the same one are each a new position pooled from theirs, as a strided conv's are.
- ConViT's gated positional attention mixes a softmax of a projection of relative offsets into its recorded map: the
  capture warned that those weights were not recorded, though the exact record holds them.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

BATCHES = (1, 2, 3, 4, 5, 6)
HEADS = (1, 2, 3, 4, 8)


class PoolingAttention(nn.Module):
    """MViTv2's pooling attention, reduced: q, k and v pooled per head by a conv (depthwise as MViT's, or dense) or
    a max pool, with the heads folded into the batch around it; a class token kept aside from the pooling."""

    def __init__(self, dim: int, heads: int, pool: str, cls: bool, hw: tuple[int, int] = (4, 4)):
        super().__init__()
        self.h, self.hw, self.d, self.mode, self.cls = heads, hw, dim // heads, pool, cls
        self.qkv = nn.Linear(dim, 3 * dim)
        groups = self.d if pool == "depthwise" else 1
        self.pools = nn.ModuleList(
            nn.Conv2d(self.d, self.d, 3, stride=2, padding=1, groups=groups, bias=False) for _ in range(3)
        )
        self.used: torch.Tensor | None = None

    def pool(self, t: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:  # t (B, heads, L, d)
        H, W = self.hw
        if self.cls:
            c, t = t[:, :, :1], t[:, :, 1:]
        t = t.reshape(-1, H, W, t.shape[-1]).permute(0, 3, 1, 2)  # the heads folded into the batch
        t = F.max_pool2d(t, 3, 2, 1) if self.mode == "max" else conv(t)
        t = t.reshape(-1, self.h, t.shape[1], t.shape[2] * t.shape[3]).transpose(2, 3)
        return torch.cat([c, t], 2) if self.cls else t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.h, -1).permute(2, 0, 3, 1, 4).unbind(0)
        q, k, v = (self.pool(t, conv) for t, conv in zip((q, k, v), self.pools, strict=True))
        attn = (q @ k.transpose(-2, -1) * self.d**-0.5).softmax(-1)
        self.used = attn
        return (attn @ v).transpose(1, 2).reshape(B, -1, C)


@pytest.mark.parametrize("cls", [False, True])
@pytest.mark.parametrize("pool", ["depthwise", "max"])
def test_heads_folded_into_the_batch_around_a_pooling_conv_are_recorded_as_heads(pool, cls):
    for batch in BATCHES:
        for heads in HEADS:
            torch.manual_seed(batch * 10 + heads)
            model = PoolingAttention(2 * heads, heads, pool, cls).eval()
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randn(batch, 16 + cls, 2 * heads))
            assert model.used is not None
            [rec] = cap.records
            assert rec.exact and rec.kind == "enc_self", (batch, heads, rec.flag)
            assert rec.probs.shape == model.used.shape, (batch, heads)
            torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)
            assert not cap.notes


def test_heads_folded_around_a_dense_conv_are_never_recorded_as_sequences():
    """A dense conv shared by the heads makes new features, the same for every head: lineage cannot tell the heads
    apart after it, so the record is flagged, never (B * heads, 1, q, k) shown as exact."""
    for batch in BATCHES:
        for heads in HEADS:
            torch.manual_seed(batch * 10 + heads)
            model = PoolingAttention(2 * heads, heads, "dense", False).eval()
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randn(batch, 16, 2 * heads))
            assert model.used is not None
            for rec in cap.records:
                if rec.exact:
                    assert rec.probs.shape == model.used.shape, (batch, heads)
                    torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)
            assert cap.records and (heads == 1 or any(not r.exact for r in cap.records) or cap.notes)


class CascadedGroupAttention(nn.Module):
    """EfficientViT's CascadedGroupAttention, reduced: a loop over the heads, head i reading its chunk of the
    channels plus head i-1's output, its own qkv conv; the outputs (B, d, H, W) joined along the channels."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.qkvs = nn.ModuleList(nn.Conv2d(self.d, 3 * self.d, 1) for _ in range(heads))
        self.proj = nn.Conv2d(dim, dim, 1)
        self.used: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        feats_in, feats_out, used = x.chunk(self.h, dim=1), [], []
        feat = feats_in[0]
        for i, qkv in enumerate(self.qkvs):
            if i > 0:
                feat = feat + feats_in[i]
            q, k, v = qkv(feat).flatten(2).split(self.d, dim=1)  # (B, d, N) each
            attn = ((q.transpose(-2, -1) @ k) * self.d**-0.5).softmax(dim=-1)
            used.append(attn)
            feat = (v @ attn.transpose(-2, -1)).view(B, self.d, H, W)
            feats_out.append(feat)
        self.used = torch.stack(used, 1)  # (B, heads, N, N)
        return self.proj(torch.cat(feats_out, 1))


def test_heads_run_one_at_a_time_and_joined_along_channels_first_features_are_one_layer():
    for batch in BATCHES:
        for heads in HEADS:
            torch.manual_seed(batch * 10 + heads)
            model = CascadedGroupAttention(4 * heads, heads).eval()
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randn(batch, 4 * heads, 3, 3))
            assert model.used is not None
            [rec] = cap.records
            assert rec.exact and rec.kind == "enc_self", (batch, heads)
            torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)
    trace = cap.trace(0, src_tokens=[f"p{i}" for i in range(9)])
    assert trace.enc_self is not None and trace.enc_self.shape == (1, 8, 9, 9)


class PatchesJoined(nn.Module):
    """Not heads: one head's output over two halves of the positions, joined along the positions (dim 2 of a
    (B, d, N) output) stays two calls, never one layer's heads."""

    def __init__(self, d: int = 4):
        super().__init__()
        self.qkv = nn.Conv1d(d, 3 * d, 1)
        self.d = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, d, N)
        outs = []
        for part in x.chunk(2, dim=2):
            q, k, v = self.qkv(part).split(self.d, dim=1)
            attn = (q.transpose(-2, -1) @ k).softmax(-1)
            outs.append(v @ attn.transpose(-2, -1))
        return torch.cat(outs, 2)


def test_outputs_joined_along_positions_are_not_taken_for_heads():
    model = PatchesJoined().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 4, 6))
    assert len(cap.records) == 2 and all(r.probs.shape == (2, 1, 3, 3) for r in cap.records)


class HeadsOfChunks(nn.Module):
    """Each head its own projection of a run of the input's features (channels first or last), outputs joined."""

    def __init__(self, dim: int, heads: int, first: bool):
        super().__init__()
        self.h, self.d, self.first = heads, dim // heads, first
        make = (
            (lambda: nn.Conv2d(self.d, 3 * self.d, 1)) if first else (lambda: nn.Linear(self.d, 3 * self.d))
        )
        self.qkvs = nn.ModuleList(make() for _ in range(heads))
        self.used: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs, used = [], []
        for part, qkv in zip(x.chunk(self.h, 1 if self.first else -1), self.qkvs, strict=True):
            if self.first:
                q, k, v = qkv(part).flatten(2).split(self.d, dim=1)  # (B, d, N)
                attn = (q.transpose(-2, -1) @ k).softmax(-1)
                outs.append(v @ attn.transpose(-2, -1))
            else:
                q, k, v = qkv(part).split(self.d, -1)  # (B, N, d)
                attn = (q @ k.transpose(-1, -2)).softmax(-1)
                outs.append(attn @ v)
            used.append(attn)
        self.used = torch.stack(used, 1)
        return torch.cat(outs, 1 if self.first else -1)


@pytest.mark.parametrize("first", [True, False])
def test_heads_that_each_read_a_run_of_the_input_features_are_one_layer(first):
    for batch in BATCHES:
        for heads in HEADS:
            torch.manual_seed(batch * 10 + heads)
            model = HeadsOfChunks(4 * heads, heads, first).eval()
            x = torch.randn(batch, 4 * heads, 3, 3) if first else torch.randn(batch, 5, 4 * heads)
            with torch.no_grad(), capture_attention(model) as cap:
                model(x)
            assert model.used is not None
            [rec] = cap.records
            assert rec.exact and rec.kind == "enc_self", (batch, heads)
            torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)


class LocalGlobal(nn.Module):
    """Longformer's local + global softmax in its simplest form: each query's 2w+1 neighbours' scores by offset,
    written into a buffer by diagonals, the global key's score column joined in front, one softmax."""

    def __init__(self, d: int = 16, h: int = 2, w: int = 1):
        super().__init__()
        self.h, self.w = h, w
        self.emb, self.qkv = nn.Embedding(50, d), nn.Linear(d, 3 * d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, n = ids.shape
        w = self.w
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2)
        band = s.new_zeros(b, self.h, n, 2 * w + 1)
        band[..., w] = s.diagonal(dim1=-2, dim2=-1)
        band[..., 1:, 0] = s.diagonal(offset=-1, dim1=-2, dim2=-1)
        band[..., :-1, 2] = s.diagonal(offset=1, dim1=-2, dim2=-1)
        band[..., 0, 0] = float("-inf")
        band[..., -1, 2] = float("-inf")
        glob = torch.einsum("bhld,bhsd->bhls", q, k[:, :, :1])  # token 0 is the global key
        p = torch.cat([glob, band], -1).softmax(-1)
        vp = F.pad(v, (0, 0, w, w))
        return p[..., :1] * v[:, :, :1] + sum(
            p[..., 1 + j, None] * vp[:, :, j : j + n] for j in range(2 * w + 1)
        )


def test_scores_joined_with_a_band_by_offset_are_said_not_drawn_as_the_global_keys():
    model = LocalGlobal().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 50, (2, 6)))
    assert not [r for r in cap.records if r.exact]
    assert any("joined the scores with others whose keys capture could not place" in n for n in cap.notes)


class MemoryCompressed(nn.Module):
    """lucidrains' memory-compressed attention, reduced: keys and values padded in front to whole blocks of 3, then
    pooled by a strided conv (grouped by heads, as its ConvCompress) or a mean; causal over the blocks if asked."""

    def __init__(self, heads: int, pool: str, causal: bool, d: int = 16):
        super().__init__()
        self.h, self.pool, self.causal, self.d = heads, pool, causal, d
        self.emb, self.qkv = nn.Embedding(50, d), nn.Linear(d, 3 * d)
        self.conv = nn.Conv1d(d, d, 3, stride=3, groups=heads)
        self.used: torch.Tensor | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
        padding = -t % 3
        k, v = (F.pad(x, (0, 0, padding, 0)) for x in (k, v))
        if self.pool == "conv":
            k, v = (self.conv(x.transpose(1, 2)).transpose(1, 2) for x in (k, v))
        else:
            k, v = (x.reshape(b, -1, 3, self.d).mean(2) for x in (k, v))
        q, k, v = (x.reshape(b, x.shape[1], self.h, -1).transpose(1, 2) for x in (q, k, v))
        s = q @ k.transpose(-1, -2)
        if self.causal:  # a query sees the blocks that begin at or before it
            begin = torch.arange(k.shape[2]) * 3 - padding
            s = s.masked_fill(begin[None, :] > torch.arange(t)[:, None], float("-inf"))
        self.used = s.softmax(-1)
        return (self.used @ v).transpose(1, 2).flatten(2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pool", ["conv", "mean"])
def test_keys_padded_in_front_then_pooled_are_the_sequences_own(pool, causal):
    for batch in BATCHES:
        for heads in (1, 2, 4, 8):
            torch.manual_seed(batch * 10 + heads)
            model = MemoryCompressed(heads, pool, causal).eval()
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randint(1, 50, (batch, 11)))
            assert model.used is not None
            [rec] = cap.records
            assert rec.exact and rec.kind == ("dec_self" if causal else "enc_self"), (batch, heads, rec.kind)
            torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)
            assert rec.key_labels is not None and all(
                str(lab).startswith("<pooled") for lab in rec.key_labels
            )


class CompressedFTT(nn.Module):
    """rtdl's FT-Transformer with Linformer key compression: feature tokens, a [CLS] appended last, keys and values
    pooled over the tokens by a linear layer in every layer, the last layer asking with the [CLS] alone."""

    def __init__(self, features: int = 4, d: int = 8, heads: int = 2):
        super().__init__()
        self.h, self.d = heads, d
        self.weight, self.bias = (
            nn.Parameter(torch.randn(features, d)),
            nn.Parameter(torch.randn(features, d)),
        )
        self.cls = nn.Parameter(torch.randn(d))
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(2))
        self.compress = nn.ModuleList(
            nn.Linear(features + 1, (features + 1) // 2, bias=False) for _ in range(2)
        )

    def forward(self, x_num: torch.Tensor) -> torch.Tensor:
        x = self.weight[None] * x_num[..., None] + self.bias[None]
        x = torch.cat([x, self.cls.view(1, 1, -1).expand(len(x), 1, -1)], dim=1)
        for i, (qkv, compress) in enumerate(zip(self.qkv, self.compress, strict=True)):
            x_q = x[:, [-1]] if i == 1 else x
            q = qkv(x_q)[..., : self.d]
            k, v = qkv(x)[..., self.d :].chunk(2, -1)
            k, v = (compress(t.transpose(1, 2)).transpose(1, 2) for t in (k, v))
            b, nq = q.shape[:2]
            q, k, v = (t.reshape(b, t.shape[1], self.h, -1).transpose(1, 2) for t in (q, k, v))
            y = ((q @ k.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(b, nq, self.d)
            x = x_q + y
        return x[:, -1]


def test_a_cls_row_over_keys_pooled_anew_in_each_layer_stays_the_encoders():
    for batch in BATCHES:
        torch.manual_seed(batch)
        model = CompressedFTT().eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randn(batch, 4))
        assert [r.kind for r in cap.records] == ["enc_self", "enc_self"] and all(r.exact for r in cap.records)


class ZeroedCache(nn.Module):
    """A decoding loop over a rolling cache of 3 slots, rolled by indexing and written back as Hugging Face's
    SlidingWindowCache did (``cache.zero_(); cache += k_out``); the step each slot holds is kept."""

    def __init__(self):
        super().__init__()
        self.emb, self.q, self.k, self.v = (
            nn.Embedding(50, 8),
            nn.Linear(8, 8),
            nn.Linear(8, 8),
            nn.Linear(8, 8),
        )
        self.slots: list[list[int]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, n = ids.shape
        cache_k, cache_v = torch.zeros(b, 3, 8), torch.zeros(b, 3, 8)
        slots, outs = [-1] * 3, []
        for t in range(n):
            x = self.emb(ids[:, t : t + 1])
            at = min(t, 2)
            idx = (torch.ones(3, dtype=torch.long).cumsum(0) + int(t >= 2) - 1) % 3
            k_out, v_out = cache_k[:, idx], cache_v[:, idx]
            k_out[:, at], v_out[:, at] = self.k(x)[:, 0], self.v(x)[:, 0]
            slots = [slots[i] for i in idx.tolist()]
            slots[at] = t
            self.slots.append(list(slots))
            cache_k.zero_()
            cache_k += k_out
            cache_v.zero_()
            cache_v += v_out
            outs.append((self.q(x) @ k_out.transpose(1, 2)).softmax(-1) @ v_out)
        return torch.cat(outs, 1)


def test_a_cache_zeroed_and_added_to_holds_the_keys_added():
    model = ZeroedCache().eval()
    ids = torch.randint(1, 50, (2, 6))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    last = cap.records[-1]
    assert last.exact and last.key_positions is not None
    steps = [r.query_positions[0, 0].item() for r in cap.records if r.query_positions is not None]
    assert len(steps) == 6  # (each step's query: the position of its token)
    assert last.key_positions[0].tolist() == [steps[s] for s in model.slots[-1]]


class ChannelsInBatch(nn.Module):
    """PatchTST's channel independence: each variate's patches a sequence of the batch, a per-sample patch padding
    mask (True = pad) repeated over the variates."""

    def __init__(self, channels: int = 3, patch: int = 4, d: int = 8, heads: int = 2):
        super().__init__()
        self.c, self.p, self.h = channels, patch, heads
        self.embed, self.qkv = nn.Linear(patch, d), nn.Linear(d, 3 * d)
        self.used: torch.Tensor | None = None

    def forward(
        self, x: torch.Tensor, padded: torch.Tensor
    ) -> torch.Tensor:  # x (B, L, C), padded (B, L // P)
        u = self.embed(x.permute(0, 2, 1).unfold(-1, self.p, self.p))  # (B, C, n, d)
        u = u.reshape(-1, u.shape[2], u.shape[3])
        kpm = padded.repeat_interleave(self.c, dim=0)
        q, k, v = (
            t.view(u.shape[0], -1, self.h, u.shape[-1] // self.h).transpose(1, 2)
            for t in self.qkv(u).chunk(3, -1)
        )
        s = (q @ k.transpose(-1, -2)).masked_fill(kpm[:, None, None], float("-inf"))
        self.used = s.softmax(-1)
        return self.used @ v


def test_a_padding_mask_repeated_over_channels_in_the_batch_is_no_beam_search():
    model = ChannelsInBatch().eval()
    padded = torch.zeros(2, 3, dtype=torch.bool)
    padded[1, -1] = True
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 12, 3), padded)
    [rec] = cap.records
    assert rec.exact and model.used is not None
    torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)
    assert not [n for n in cap.notes if "beam" in n]


class UnfoldWindows(nn.Module):
    """Sliding-window attention by ``F.pad`` and ``Tensor.unfold``: scores of each query over its 2w+1 neighbours as
    a broadcast product summed over the features, the values' windows weighed by an einsum."""

    def __init__(self, w: int = 2, d: int = 16, h: int = 2):
        super().__init__()
        self.w, self.h = w, h
        self.emb, self.qkv = nn.Embedding(50, d), nn.Linear(d, 3 * d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, n = ids.shape
        w = self.w
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        kk, vv = (F.pad(t, (0, 0, w, w)).unfold(2, 2 * w + 1, 1) for t in (k, v))  # (b, h, n, d, 2w+1)
        s = (q[..., None] * kk).sum(-2) / math.sqrt(q.shape[-1])
        seen = F.pad(ids != 0, (w, w), value=False).unfold(1, 2 * w + 1, 1)
        p = s.masked_fill(~seen[:, None], float("-inf")).softmax(-1)
        return torch.einsum("bhnw,bhndw->bhnd", p, vv)


def test_weights_over_unfolded_windows_times_their_values_are_a_warning():
    for batch in (1, 2, 5):
        model = UnfoldWindows().eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randint(1, 50, (batch, 10)))
        assert not cap.records
        assert any("windows of keys cut by F.unfold or Tensor.unfold" in n for n in cap.notes), cap.notes
        assert not [n for n in cap.skipped if "vocabulary" in n.reason]


class GatedPositional(nn.Module):
    """ConViT's GPSA: ``(1 - sigmoid(g)) * softmax(q k^T) + sigmoid(g) * softmax(pos_proj(rel_indices))``,
    renormalized, times the values."""

    def __init__(self, dim: int = 8, heads: int = 2, side: int = 3):
        super().__init__()
        self.h, self.scale = heads, (dim // heads) ** -0.5
        self.qk, self.v = nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.pos_proj = nn.Linear(3, heads)
        self.gating = nn.Parameter(torch.randn(heads))
        ind = torch.arange(side).view(1, -1) - torch.arange(side).view(-1, 1)
        indx, indy = ind.repeat(side, side), ind.repeat_interleave(side, 0).repeat_interleave(side, 1)
        self.register_buffer("rel", torch.stack([indx, indy, indx**2 + indy**2], -1).float()[None])
        self.used: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k = self.qk(x).reshape(B, N, 2, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        pos = self.pos_proj(self.rel.expand(B, -1, -1, -1)).permute(0, 3, 1, 2).softmax(-1)
        patch = ((q @ k.transpose(-2, -1)) * self.scale).softmax(-1)
        g = torch.sigmoid(self.gating.view(1, -1, 1, 1))
        attn = (1.0 - g) * patch + g * pos
        attn = attn / attn.sum(-1, keepdim=True)
        self.used = attn
        v = self.v(x).reshape(B, N, self.h, C // self.h).permute(0, 2, 1, 3)
        return (attn @ v).transpose(1, 2).reshape(B, N, C)


def test_a_positional_softmax_mixed_into_a_recorded_map_is_not_said_unrecorded():
    for batch in BATCHES:
        torch.manual_seed(batch)
        model = GatedPositional().eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randn(batch, 9, 8))
        [rec] = cap.records
        assert rec.exact and model.used is not None
        torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)
        assert not [n for n in cap.notes if "not recorded" in n], cap.notes


class GlobalRowBesideCausal(nn.Module):
    """One module: a causal self-attention, and its first token's row over every token (a global token's)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(50, d), nn.Linear(d, 3 * d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
        s = q @ k.transpose(-1, -2)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        local = s.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        glob = (q[:, :1] @ k.transpose(-1, -2)).softmax(-1)
        return torch.cat([glob @ v, local[:, 1:]], 1)


def test_one_query_that_sees_later_positions_is_no_decoders_first_step():
    for batch in BATCHES:
        model = GlobalRowBesideCausal().eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randint(1, 50, (batch, 6)))
        kinds = {tuple(r.probs.shape[-2:]): r.kind for r in cap.records}
        assert kinds == {(6, 6): "dec_self", (1, 6): "enc_self"}, kinds


class SoftSplit(nn.Module):
    """T2T-ViT's tokens-to-token step: the tokens laid out as a map, cut into overlapping 3x3 patches by
    ``nn.Unfold(stride=2, padding=1)``, each patch projected to q, k and v."""

    def __init__(self, heads: int, d: int = 4):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(50, d)
        self.unfold = nn.Unfold(3, stride=2, padding=1)
        self.qkv = nn.Linear(9 * d, 3 * 2 * heads)
        self.used: torch.Tensor | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids (B, 16): a 4 x 4 map of tokens
        x = self.emb(ids)
        b, n, d = x.shape
        patches = self.unfold(x.transpose(1, 2).reshape(b, d, 4, 4)).transpose(1, 2)  # (B, 4, 9 d)
        q, k, v = (t.view(b, 4, self.h, -1).transpose(1, 2) for t in self.qkv(patches).chunk(3, -1))
        self.used = (q @ k.transpose(-1, -2)).softmax(-1)
        return self.used @ v


def test_overlapping_patches_of_the_tokens_are_positions_of_their_own():
    for batch in BATCHES:
        for heads in HEADS:
            torch.manual_seed(batch * 10 + heads)
            model = SoftSplit(heads).eval()
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randint(1, 50, (batch, 16)))
            assert model.used is not None
            [rec] = cap.records
            assert rec.exact and rec.kind == "enc_self", (batch, heads, rec.flag)
            torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)
            assert rec.key_labels == tuple(f"<pooled {i}>" for i in range(4))
