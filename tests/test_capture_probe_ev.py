"""Styles the probes of this round found (code ported from other frameworks), each with its ground truth kept inside
the model.

- soskek's Chainer Transformer, ported to torch: heads folded head-major into the batch by ``split`` + ``cat`` over
  channels-first (B, C, L) tensors, the NaN rows of fully masked queries set to 0 after the softmax
  (``where(isnan(a), 0, a)``), and the values weighted element by element and summed over the keys, either through
  ``F.broadcast`` (``torch.broadcast_tensors``) or by implicit broadcasting. The record held the softmax's NaN rows
  where the model multiplied zeros; and where the head size equals the key length, the weighted sum (the attention's
  output, of the weights' own shape) was taken for the weights changed again, and recorded as them, exact.
- stepik-dl-nlp's ``my_multihead_attention`` (weights laid out (B, q, k, H), softmax over dim 2, values weighted by a
  broadcast product summed over the keys), two layers in a row: the first was flagged as talking-heads attention
  (nothing mixes its heads) and the second as lineage lost. The product's sum over the keys is now followed as a
  product by ``bmm`` is: the query's position, the values' features.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

BATCHES = range(1, 7)
HEADS = (1, 2, 3, 4, 8)


class ChainerMHA(nn.Module):
    """soskek's ``MultiHeadAttention`` (Chainer) in torch: 1x1 conv projections over (B, C, L), heads folded
    head-major into the batch, NaN rows set to 0 after the softmax, values weighted by a broadcast product."""

    def __init__(self, n_units: int, h: int, explicit: bool):
        super().__init__()
        self.W_QKV = nn.Conv1d(n_units, 3 * n_units, 1, bias=False)
        self.h, self.explicit = h, explicit
        self.used: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.h
        Q, K, V = torch.split(self.W_QKV(x), x.shape[1], dim=1)
        batch, n_units, _ = Q.shape
        bQ = torch.cat(torch.split(Q, n_units // h, dim=1), dim=0)
        bK = torch.cat(torch.split(K, n_units // h, dim=1), dim=0)
        bV = torch.cat(torch.split(V, n_units // h, dim=1), dim=0)
        mask = torch.cat([mask] * h, dim=0)
        A = torch.bmm(bQ.transpose(1, 2), bK) * (n_units // h) ** -0.5
        A = torch.where(mask, A, torch.full(A.shape, -np.inf))
        A = F.softmax(A, dim=2)
        A = torch.where(torch.isnan(A.data), torch.zeros(A.shape), A)
        self.used = A.detach().clone()  # (h * B, q, k), head-major
        if self.explicit:  # F.broadcast(A[:, None], bV[:, :, None])
            bA, bV2 = torch.broadcast_tensors(A[:, None], bV[:, :, None])
            C = torch.sum(bA * bV2, dim=3)
        else:
            C = torch.sum(A[:, None] * bV[:, :, None], dim=3)  # (h * B, d, q)
        return torch.cat(torch.split(C, batch, dim=0), dim=1)


def _chainer_case(batch: int, heads: int, head_size: int, explicit: bool) -> None:
    torch.manual_seed(batch * 10 + heads)
    n = 6
    model = ChainerMHA(head_size * heads, heads, explicit).eval()
    x = torch.randn(batch, head_size * heads, n)
    valid = torch.ones(batch, n, dtype=torch.bool)
    if batch > 1:  # the last sequence padded (query and key padding: NaN rows)
        valid[-1, 4:] = False
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, valid[:, None, :] & valid[:, :, None])
    assert model.used is not None
    [rec] = cap.records
    want = model.used.view(heads, batch, n, n).transpose(0, 1)
    assert rec.exact and rec.flag is None and rec.kind == "enc_self", (batch, heads, rec.flag)
    assert not rec.probs.isnan().any(), (batch, heads)
    torch.testing.assert_close(rec.probs, want, rtol=0, atol=1e-6)


def test_nan_rows_set_to_zero_then_broadcast_against_the_values_are_recorded_as_zeros():
    for explicit in (True, False):
        for batch in BATCHES:
            for heads in HEADS:
                _chainer_case(batch, heads, 4, explicit)


def test_the_weighted_sum_of_the_weights_own_shape_is_never_recorded_as_the_weights():
    """A head size equal to the key length (6): the sum over the keys is (h * B, 6, 6), as the weights are."""
    for explicit in (True, False):
        for batch in BATCHES:
            for heads in HEADS:
                _chainer_case(batch, heads, 6, explicit)


class StepikAttention(nn.Module):
    """stepik-dl-nlp's self-attention layer around ``my_multihead_attention``."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.h = h
        self.queries_proj, self.keys_proj, self.values_proj = (
            nn.Linear(d, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
        )
        self.used: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, pad: torch.Tensor, dep: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q = self.queries_proj(x).view(B, L, self.h, -1)
        k = self.keys_proj(x).view(B, L, self.h, -1)
        v = self.values_proj(x).view(B, L, self.h, -1)
        relevances = torch.einsum("bvhs,bkhs->bvkh", (q, k))
        relevances.masked_fill_(pad[:, None, :, None].expand_as(relevances), float("-inf"))
        relevances = relevances + dep[None, :, :, None].expand_as(relevances)
        normed_rels = F.softmax(relevances, dim=2)
        normed_rels = F.dropout(normed_rels, 0.0, self.training)
        self.used = normed_rels.detach().clone()  # (B, q, k, H)
        return (normed_rels.unsqueeze(-1) * v.unsqueeze(1)).sum(2).view(B, L, D)


class StepikTwo(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.emb = nn.Embedding(50, 8 * h)
        self.a1, self.a2 = StepikAttention(8 * h, h), StepikAttention(8 * h, h)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor, dep: torch.Tensor) -> torch.Tensor:
        return self.a2(self.a1(self.emb(ids), pad, dep), pad, dep)


def test_two_layers_that_sum_a_broadcast_product_over_the_keys_are_both_exact():
    n = 5
    dep = torch.triu(torch.full((n, n), float("-inf")), 1)
    for batch in BATCHES:
        for heads in HEADS:
            torch.manual_seed(batch * 10 + heads)
            model = StepikTwo(heads).eval()
            pad = torch.zeros(batch, n, dtype=torch.bool)
            pad[-1, 3:] = batch > 1
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randint(1, 50, (batch, n)), pad, dep)
            assert [r.name for r in cap.records] == ["a1", "a2"], (batch, heads)
            for rec, layer in zip(cap.records, (model.a1, model.a2), strict=True):
                assert layer.used is not None
                assert rec.exact and rec.flag is None and rec.kind == "dec_self", (batch, heads, rec.flag)
                torch.testing.assert_close(rec.probs, layer.used.permute(0, 3, 1, 2), rtol=0, atol=1e-6)
            assert not cap.notes, (batch, heads, [str(x) for x in cap.notes])


class SerializedPatches(nn.Module):
    """Point Transformer V3's serialized attention: the points of every cloud in one flat (N, 3) tensor, sorted by
    a z-order-like code of their grid cells, cut into patches of K points, attention within each patch."""

    def __init__(self, heads: int, k: int = 3):
        super().__init__()
        self.h, self.k = heads, k
        self.stem, self.qkv = nn.Linear(3, 4 * heads), nn.Linear(4 * heads, 12 * heads)
        self.used: torch.Tensor | None = None

    def forward(self, coord: torch.Tensor, feat: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        grid = torch.div(coord - coord.min(0)[0], 0.5, rounding_mode="trunc").long()
        order = torch.argsort(batch << 12 | grid[:, 0] << 8 | grid[:, 1] << 4 | grid[:, 2])
        x = self.stem(feat)[order]
        n, c = x.shape
        q, k, v = self.qkv(x).reshape(n // self.k, self.k, 3, self.h, -1).permute(2, 0, 3, 1, 4).unbind(0)
        self.used = (q @ k.transpose(-2, -1) * (c // self.h) ** -0.5).softmax(-1)
        out = torch.empty_like(x)
        out[order] = (self.used @ v).transpose(1, 2).reshape(n, c)
        return out


def test_patches_of_a_flat_point_cloud_are_said_to_be_parts_of_the_one_input_not_its_clouds():
    """The clouds are one flat (N, 3) tensor: no batch axis tells them apart, so every patch row is a part of that
    one input. The trace of row b says so, where it drew patch b as if it were cloud b's, with no word."""
    for clouds in BATCHES:
        for heads in HEADS:
            torch.manual_seed(clouds * 10 + heads)
            model = SerializedPatches(heads).eval()
            batch = torch.arange(clouds).repeat_interleave(6)
            coord = torch.randn(6 * clouds, 3)
            with torch.no_grad(), capture_attention(model) as cap:
                model(coord, torch.randn(6 * clouds, 3), batch)
            assert model.used is not None
            [rec] = cap.records
            assert rec.exact and rec.kind == "enc_self"
            torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)
            found = cap.rows_of(rec)
            assert found is not None and found[1] == 1 and not found[0].any(), (clouds, heads, found)
            last = 2 * clouds - 1
            t = cap.trace(last)
            assert t.enc_self is not None
            np.testing.assert_allclose(t.enc_self[0], model.used[last].numpy(), rtol=0, atol=1e-6)
            said = " ".join(t.meta["capture_notes"])
            assert f"over {2 * clouds} rows for the 1 sequence(s) given" in said, (clouds, heads, said)
            assert f"row {last}, drawn here, reads positions of sequence 0" in said


def _to_dense_batch(x: torch.Tensor, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PyG's ``to_dense_batch``: the nodes of every graph at a row of their own, padded with a fill value."""
    graphs = int(batch.max()) + 1
    counts = torch.zeros(graphs, dtype=torch.long).scatter_add_(0, batch, batch.new_ones(x.size(0)))
    most = int(counts.max())
    starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])
    idx = torch.arange(batch.size(0)) - starts[batch] + batch * most
    out = torch.as_tensor(0.0).to(x.dtype).repeat([graphs * most, *x.shape[1:]])
    out[idx] = x
    mask = torch.zeros(graphs * most, dtype=torch.bool)
    mask[idx] = True
    return out.view(graphs, most, *x.shape[1:]), mask.view(graphs, most)


class DenseGlobalAttention(nn.Module):
    """GraphGPS's global attention: every layer pads the flat node features into a dense batch anew."""

    def __init__(self, heads: int):
        super().__init__()
        self.node_encoder = nn.Embedding(16, 4 * heads)
        self.attns = nn.ModuleList(
            nn.MultiheadAttention(4 * heads, heads, batch_first=True) for _ in range(2)
        )

    def forward(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        h = self.node_encoder(x)
        for attn in self.attns:
            dense, mask = _to_dense_batch(h, batch)
            h = h + attn(dense, dense, dense, key_padding_mask=~mask, need_weights=False)[0][mask]
        return h


def test_layers_that_pad_the_graphs_anew_each_time_are_one_graphs_layers():
    """The padding cells are new tensors in each layer: a padded graph's layers read the same nodes, and the trace
    draws both, where it drew the first and said the second held other positions."""
    for graphs in range(2, 7):
        for heads in HEADS:
            torch.manual_seed(graphs * 10 + heads)
            sizes = [3 + (g % 3) for g in range(graphs)]
            batch = torch.cat([torch.full((n,), g) for g, n in enumerate(sizes)])
            model = DenseGlobalAttention(heads).eval()
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randint(0, 16, (sum(sizes),)), batch)
            assert [r.name for r in cap.records] == ["attns.0", "attns.1"]
            for g in range(graphs):
                t = cap.trace(g, src_tokens=[f"n{i}" for i in range(max(sizes))])
                assert t.enc_self is not None and t.enc_self.shape[0] == 2, (graphs, heads, g)
                for layer, rec in enumerate(cap.records):
                    np.testing.assert_allclose(t.enc_self[layer], rec.probs[g].numpy(), rtol=0, atol=1e-6)
                assert not any("other positions" in n for n in t.meta.get("capture_notes", [])), (
                    graphs,
                    heads,
                    g,
                )


class KnnMemory(nn.Module):
    """A Memorizing Transformer's kNN memory: each query's top-3 memories of the last segment (by ``topk`` and
    indexing) all joined before the keys, one head."""

    def __init__(self, d: int = 4):
        super().__init__()
        self.emb = nn.Embedding(30, d)
        self.to_q, self.to_kv = nn.Linear(d, d, bias=False), nn.Linear(d, 2 * d, bias=False)
        self.db: tuple[torch.Tensor, torch.Tensor] | None = None
        self.used: torch.Tensor | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        b, n, d = x.shape
        q = F.normalize(self.to_q(x).view(b, n, 1, d).transpose(1, 2), dim=-1)
        k, v = self.to_kv(x).chunk(2, dim=-1)
        k = F.normalize(k, dim=-1)
        kk, vv = k[:, None], v[:, None]
        if self.db is not None:
            mk, mv = self.db
            idx = torch.einsum("bhid,bmd->bhim", q, mk).topk(3, dim=-1).indices  # (b, h, i, 3)
            at = torch.arange(b)[:, None, None, None]
            kk = torch.cat((mk[at, idx].flatten(2, 3), kk), dim=-2)
            vv = torch.cat((mv[at, idx].flatten(2, 3), vv), dim=-2)
        sim = torch.einsum("bhid,bhjd->bhij", q, kk) * 8.0
        i, j = sim.shape[-2:]
        self.used = sim.masked_fill(torch.ones(i, j, dtype=torch.bool).triu(j - i + 1), -1e9).softmax(dim=-1)
        self.db = (k.detach(), v.detach())
        return x + (self.used @ vv).transpose(1, 2).reshape(b, n, d)


def test_keys_that_hold_a_position_more_than_once_are_never_drawn_under_the_tokens():
    """Every query's memories joined: positions of the last segment among the keys more than once, in the order
    the data picked them. The trace drew the 4 x 16 map under 16 tokens ("4 of the sequence's 16 positions ask");
    it is left out and said."""
    repeated = 0
    for batch in BATCHES:
        for seed in range(4):
            torch.manual_seed(seed)
            model = KnnMemory().eval()
            segs = torch.randint(1, 30, (2, batch, 4))
            with torch.no_grad(), capture_attention(model) as cap:
                model(segs[0])
                model(segs[1])
            rec = cap.records[-1]
            assert model.used is not None and rec.key_positions is not None
            torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)
            if not rec.exact:  # (rows picked by data across the batch: flagged, and said)
                assert rec.flag, (batch, seed)
                continue
            for b in range(batch):
                keys = rec.key_positions[b]
                if int(keys.unique().numel()) == int(keys.numel()):
                    continue  # (every memory picked once: drawn, as other tests say)
                repeated += 1
                try:
                    t = cap.trace(b, tgt_tokens=[f"w{i}" for i in range(16)])
                except ValueError as e:
                    assert "the keys of row" in str(e) and "left out of the trace" in str(e)
                else:
                    assert t.dec_self is None or t.dec_self.shape[-1] != 16, (batch, seed, b)
    assert repeated >= 4  # (exact records whose keys repeat a position, at several batch sizes)


class TiedRowThenColumn(nn.Module):
    """The MSA Transformer's axial layer (fair-esm): tied row attention, its scores summed over every row of the
    alignment (``einsum("rinhd,rjnhd->hnij")``), then column attention over the rows of each column."""

    def __init__(self, heads: int, d: int = 4):
        super().__init__()
        e = d * heads
        self.h, self.d = heads, d
        self.emb = nn.Embedding(12, e)
        self.row_q, self.row_k, self.row_v = nn.Linear(e, e), nn.Linear(e, e), nn.Linear(e, e)
        self.col_q, self.col_k, self.col_v = nn.Linear(e, e), nn.Linear(e, e), nn.Linear(e, e)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, R, C)
        x = self.emb(tokens).permute(1, 2, 0, 3)  # R x C x B x E
        r, c, b, e = x.shape
        q = self.row_q(x).view(r, c, b, self.h, self.d) * (self.d**-0.5 / r**0.5)
        k = self.row_k(x).view(r, c, b, self.h, self.d)
        probs = torch.einsum("rinhd,rjnhd->hnij", q, k).softmax(-1)
        x = x + torch.einsum("hnij,rjnhd->rinhd", probs, self.row_v(x).view(r, c, b, self.h, self.d)).reshape(
            r, c, b, e
        )
        q = self.col_q(x).view(r, c, b, self.h, self.d) * self.d**-0.5
        k = self.col_k(x).view(r, c, b, self.h, self.d)
        probs = torch.einsum("icnhd,jcnhd->hcnij", q, k).softmax(-1)
        out = torch.einsum("hcnij,jcnhd->icnhd", probs, self.col_v(x).view(r, c, b, self.h, self.d))
        return x + out.reshape(r, c, b, e)


def test_a_trace_over_the_columns_draws_the_row_attention_that_fits_them_not_none():
    """The column attention's exact maps are over the alignment's rows, which are not the tokens given: the trace
    raised ("none of the attention captured can be drawn"), though the row attention's maps, flagged, are over
    exactly those columns. It draws them, with their flag said."""
    rows, cols = 3, 5
    for batch in range(1, 4):
        for heads in HEADS:
            torch.manual_seed(batch * 10 + heads)
            model = TiedRowThenColumn(heads).eval()
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randint(2, 12, (batch, rows, cols)))
            shapes = sorted(tuple(r.probs.shape[-2:]) for r in cap.records)
            assert shapes == [(rows, rows), (cols, cols)], (batch, heads, shapes)
            t = cap.trace(0, src_tokens=[f"c{i}" for i in range(cols)])
            assert t.enc_self is not None and t.enc_self.shape[-2:] == (cols, cols), (batch, heads)
            [row] = [r for r in cap.records if tuple(r.probs.shape[-2:]) == (cols, cols)]
            if not row.exact:  # (a guess is drawn with its reason said)
                assert row.flag and any(row.flag[:40] in n for n in t.meta.get("capture_notes", [])), (
                    batch,
                    heads,
                )


class ViewsOfOneCache(nn.Module):
    """EAGLE's and Medusa's KV cache: the caller hands the model views of one buffer (``data[0]``, ``data[1]``);
    the model writes its keys and values with ``view.narrow(2, cur, t).copy_(k)`` and reads ``view.narrow(2, 0,
    cur + t)``, causal."""

    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(30, 4 * heads)
        self.q, self.k, self.v = (nn.Linear(4 * heads, 4 * heads) for _ in range(3))
        self.used: torch.Tensor | None = None

    def forward(
        self, ids: torch.Tensor, k_view: torch.Tensor, v_view: torch.Tensor, cur: int
    ) -> torch.Tensor:
        b, t = ids.shape
        x = self.emb(ids)
        q, k, v = (f(x).view(b, t, self.h, 4).transpose(1, 2) for f in (self.q, self.k, self.v))
        k_view.narrow(2, cur, t).copy_(k)
        v_view.narrow(2, cur, t).copy_(v)
        keys, values = k_view.narrow(2, 0, cur + t), v_view.narrow(2, 0, cur + t)
        scores = q @ keys.transpose(-1, -2) / 2 + torch.full((t, t), float("-inf")).triu(1)
        self.used = scores.softmax(-1)
        return self.used @ values


def test_keys_written_through_a_view_of_the_callers_cache_are_the_models_own():
    """The views the model reads were made before its write into their buffer (by the caller, in the block or
    before it): it read them as the buffer was, keys from outside, and recorded its causal self-attention as
    ``cross``, exact, with no word."""
    for batch in BATCHES:
        for heads in HEADS:
            for before in (False, True):
                torch.manual_seed(batch * 10 + heads)
                model = ViewsOfOneCache(heads).eval()
                ids = torch.randint(0, 30, (batch, 5))
                data = torch.zeros(2, batch, heads, 16, 4)
                with torch.no_grad():
                    views = (data[0], data[1]) if before else None
                    with capture_attention(model) as cap:
                        k_view, v_view = views if views is not None else (data[0], data[1])
                        model(ids, k_view, v_view, 0)
                [rec] = cap.records
                assert model.used is not None
                assert rec.exact and rec.kind == "dec_self", (batch, heads, before, rec.kind, rec.flag)
                torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=1e-6)


class Pooled(nn.Module):
    """Ilse et al.'s attention MIL: the instances of one bag (n, f) pooled by additive attention, the model called
    once per bag as its training loop calls it."""

    def __init__(self):
        super().__init__()
        self.features = nn.Linear(4, 16)
        self.attention_V, self.attention_w = nn.Sequential(nn.Linear(16, 8), nn.Tanh()), nn.Linear(8, 1)

    def forward(self, bag: torch.Tensor) -> torch.Tensor:
        h = self.features(bag.squeeze(0))  # (n, 16)
        a = F.softmax(torch.transpose(self.attention_w(self.attention_V(h)), 1, 0), dim=1)
        return torch.mm(a, h)


def test_the_note_of_several_runs_counts_them_and_says_which_share_a_shape():
    torch.manual_seed(0)
    model = Pooled().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        for n in (3, 5, 3):
            model(torch.randn(1, n, 4))
    said = " ".join(cap.trace(0).meta.get("capture_notes", []))
    assert "the model ran 3 times in the capture block, 2 of its runs with maps of this shape" in said, said
    assert "each run's maps of the same shape" not in said


class ChunkedSoftmaxWithPairBias(nn.Module):
    """OpenFold's low-memory attention (``_lma``) with a bias per head made from the pair representation by a
    Linear (its triangle bias): the softmax computed over key chunks, each chunk's exp rescaled by its max."""

    def __init__(self, heads: int, c: int = 8):
        super().__init__()
        self.h = heads
        self.emb, self.bias = nn.Embedding(20, c), nn.Linear(c, heads)
        self.q, self.k, self.v = (nn.Linear(c, 4 * heads) for _ in range(3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.emb(ids)
        b, n, _ = e.shape
        bias = self.bias(e[:, :, None] + e[:, None, :]).permute(0, 3, 1, 2)  # (B, H, L, L)
        q, k, v = (f(e).view(b, n, self.h, 4).transpose(1, 2) for f in (self.q, self.k, self.v))
        maxes, sums, outs = [], [], []
        for s in range(0, n, 2):
            a = torch.einsum("bhqd,bhkd->bhqk", q, k[:, :, s : s + 2]) + bias[..., s : s + 2]
            top = a.max(-1, keepdim=True).values
            w = torch.exp(a - top)
            outs.append(torch.einsum("bhqk,bhkd->bhqd", w, v[:, :, s : s + 2]))
            sums.append(w.sum(-1, keepdim=True))
            maxes.append(top)
        top = torch.stack(maxes).max(0).values
        scale = [torch.exp(m - top) for m in maxes]
        total = sum(s * c for s, c in zip(sums, scale, strict=True))
        return sum(o * c for o, c in zip(outs, scale, strict=True)) / total


def test_a_softmax_by_chunks_beside_a_one_head_bias_is_said_as_that_alone():
    """With one head the bias is a projection to one feature, which capture takes for additive energies: it added
    that the weights were "made from energies without a softmax". They are query-key scores under a softmax
    computed block by block, which the other note says."""
    for batch in (1, 2, 4):
        for heads in (1, 2, 4):
            torch.manual_seed(batch * 10 + heads)
            model = ChunkedSoftmaxWithPairBias(heads).eval()
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randint(0, 20, (batch, 5)))
            assert not cap.records
            assert any("exp of query-key scores" in n for n in cap.notes), (batch, heads, cap.notes)
            assert not any("without a softmax" in n for n in cap.notes), (batch, heads, cap.notes)


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4))
    f = pos.float()[:, None] * inv
    cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    return x * cos + torch.cat([-x[..., 2:], x[..., :2]], -1) * sin


class SinksAndWindow(nn.Module):
    """StreamingLLM's cache (mit-han-lab/streaming-llm): keys kept before rotary, the first 4 (attention sinks) and
    a recent window after eviction, rotary applied again at their places in the cache."""

    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(30, 4 * heads)
        self.q, self.k = nn.Linear(4 * heads, 4 * heads), nn.Linear(4 * heads, 4 * heads)
        self.maps: list[tuple[list[int], torch.Tensor]] = []  # (the key positions, the map)

    def forward(self, ids: torch.Tensor, past: torch.Tensor | None, kept: list[int]):
        b, n = ids.shape
        x = self.emb(ids)
        q = self.q(x).view(b, n, self.h, 4).transpose(1, 2)
        k = self.k(x).view(b, n, self.h, 4).transpose(1, 2)
        p = 0 if past is None else past.shape[2]
        k = k if past is None else torch.cat([past, k], 2)
        s = _rope(q, torch.arange(p, p + n)) @ _rope(k, torch.arange(p + n)).transpose(-1, -2) / 2
        if n > 1:
            s = s + torch.full((n, p + n), torch.finfo(s.dtype).min).triu(p + 1)
        w = s.softmax(-1)
        self.maps.append((list(kept), w))
        return w @ k, k


def test_keys_past_an_evicted_gap_are_never_drawn_under_the_tokens_the_gap_held():
    """After eviction each step's keys are positions 0-3 and the last three: the trace of the first 7 tokens drew
    the last step's map (keys 0, 1, 2, 3, 6, 7, 8) under tokens 0-6, keys 6-8 under tokens 4-6, with no word."""
    for batch in range(1, 4):
        for heads in HEADS:
            torch.manual_seed(batch * 10 + heads)
            model = SinksAndWindow(heads).eval()
            seq = torch.randint(1, 30, (batch, 9))
            with torch.no_grad(), capture_attention(model) as cap:
                kept = list(range(5))
                _, past = model(seq[:, :5], None, kept)
                for t in range(5, 9):
                    if past.shape[2] > 6:  # StartRecentKVCache(start_size=4, recent_size=2)
                        past, kept = torch.cat([past[:, :, :4], past[:, :, -2:]], 2), kept[:4] + kept[-2:]
                    kept = kept + [t]
                    _, past = model(seq[:, t : t + 1], past, kept)
            try:
                t = cap.trace(0, tgt_tokens=[f"t{i}" for i in range(7)])
            except ValueError as e:
                assert "none of the attention captured can be drawn over the tokens given" in str(e), (
                    batch,
                    heads,
                )
                continue
            assert t.dec_self is not None
            row = t.meta["query_rows"]["dec_self"][0]
            drawn = torch.from_numpy(t.dec_self[-1, :, row].copy())
            [keys] = [
                k for k, w in model.maps if w.shape[-1] == 7 and torch.allclose(w[0, :, 0], drawn, atol=1e-6)
            ]
            assert keys == list(range(7)), (batch, heads, keys)
