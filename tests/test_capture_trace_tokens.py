"""Captured.trace draws a kind only over the tokens it is given, so every trace it makes opens again, and
watch's run files too: a kind whose maps are over other positions (keys that are some of the tokens,
``x[:, 1:]``) is left out and said in the capture notes; calls of a kind that do not stack as layers (a
decoder run step by step, layers with other head counts, pooled keys, other sequences) draw the group over
the tokens and say the rest; a side given no tokens is numbered, and a decoder-only model's tokens given as
the source label its maps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnscope
from attnscope.core.analysis.audit.static import static_checks
from attnscope.core.families.capture import capture_attention
from attnscope.core.runs.runfile import Run
from attnscope.core.traces.trace import AttentionTrace


class Pool(nn.Module):
    """Attention pooling: the [CLS] position asks, the other tokens (``x[:, 1:]``) answer."""

    def __init__(self, d: int = 32, h: int = 4):
        super().__init__()
        self.h = h
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.last: torch.Tensor | None = None

    def forward(self, x, keep):
        b, n, d = x.shape
        cls, rest = x[:, :1], x[:, 1:]
        q = self.q(cls).view(b, 1, self.h, -1).transpose(1, 2)
        k = self.k(rest).view(b, n - 1, self.h, -1).transpose(1, 2)
        v = self.v(rest).view(b, n - 1, self.h, -1).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d // self.h)).masked_fill(
            ~keep[:, None, None, 1:], float("-inf")
        )
        w = scores.softmax(-1)
        self.last = w.detach()
        return (w @ v).transpose(1, 2).reshape(b, d)


class Pooled(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 32)
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.pool = Pool()

    def forward(self, ids):
        x = self.enc(self.emb(ids), src_key_padding_mask=ids == 0)
        return self.pool(x, ids != 0)


def _ids() -> torch.Tensor:
    ids = torch.randint(1, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    ids[1, 6:] = 0
    return ids


def _captured():
    model, ids = Pooled().eval(), _ids()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    return model, ids, cap


def test_a_kind_over_other_positions_than_the_tokens_is_left_out_and_said(tmp_path):
    model, ids, cap = _captured()
    assert [(r.kind, tuple(r.probs.shape)) for r in cap.records] == [
        ("enc_self", (2, 4, 8, 8)),
        ("cross", (2, 4, 1, 7)),
    ]
    tokens = [f"t{i}" for i in range(8)]
    tr = cap.trace(0, src_tokens=tokens)
    assert tr.kinds == ("enc_self",) and tr.cross is None and tr.cross_mask is None
    said = [n for n in tr.meta["capture_notes"] if n.startswith("cross (pool) left out of the trace")]
    assert len(said) == 1 and "1 x 7" in said[0], tr.meta
    back = AttentionTrace.load(tr.save(tmp_path / "t.npz"))  # it opens (the 1 x 7 map under 8 tokens did not)
    assert back.kinds == ("enc_self",) and back.src_tokens == tuple(tokens)
    np.testing.assert_array_equal(back.probs("enc_self"), tr.probs("enc_self"))

    # given the pool's own positions as its tokens, the pool is drawn and the encoder left out
    tr = cap.trace(0, src_tokens=tokens[1:], tgt_tokens=tokens[:1])
    assert tr.kinds == ("cross",)
    assert model.pool.last is not None
    np.testing.assert_allclose(tr.probs("cross")[0], model.pool.last[0].numpy(), rtol=0, atol=1e-6)
    assert any(n.startswith("enc_self (enc.self_attn) left out") for n in tr.meta["capture_notes"])
    assert AttentionTrace.load(tr.save(tmp_path / "c.npz")).kinds == ("cross",)

    # no tokens given: the positions are numbered from the first kind over them, and the pool said again
    tr = cap.trace(0)
    assert tr.kinds == ("enc_self",) and tr.src_tokens == tuple(f"#{i}" for i in range(8))
    assert any(n.startswith("cross (pool) left out") for n in tr.meta["capture_notes"])
    assert AttentionTrace.load(tr.save(tmp_path / "n.npz")).src_tokens == tr.src_tokens


class Decoder(nn.Module):
    """nanoGPT's causal self-attention, one layer: a decoder-only model (its maps are ``dec_self``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.qkv, self.h = nn.Embedding(50, 32), nn.Linear(32, 96), 4

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (t.view(b, n, self.h, 8).transpose(1, 2) for t in self.qkv(self.emb(ids)).split(32, dim=2))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_a_decoder_only_models_tokens_given_as_the_source_label_its_maps(tmp_path):
    model, ids = Decoder().eval(), _ids()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    assert cap.kinds() == ("dec_self",)
    tokens = [f"t{i}" for i in range(8)]
    tr = cap.trace(1, src_tokens=tokens)  # (the decoder's side is tgt_tokens)
    assert tr.tgt_tokens == tuple(tokens) and tr.src_tokens == ()
    back = AttentionTrace.load(tr.save(tmp_path / "d.npz"))  # (it opens: before, its tokens were none)
    np.testing.assert_array_equal(back.probs("dec_self"), cap.records[0].probs[1:2].numpy())
    assert cap.trace(1).tgt_tokens == tuple(f"#{i}" for i in range(8))


def test_no_attention_captured_is_one_sentence():
    with torch.no_grad(), capture_attention(nn.Linear(4, 4)) as cap:
        nn.Linear(4, 4)(torch.randn(2, 4))
    with pytest.raises(ValueError, match="no attention was captured"):
        cap.trace(0)


class LinearAttentionLM(nn.Module):
    """Linear attention (elu + 1 feature maps, no softmax over keys) and a vocabulary softmax."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb, self.qkv, self.out = nn.Embedding(20, d), nn.Linear(d, 3 * d), nn.Linear(d, 20)

    def forward(self, ids):
        q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
        q, k = F.elu(q) + 1, F.elu(k) + 1
        z = 1 / (q @ k.sum(1, keepdim=True).transpose(1, 2))
        return self.out((q @ (k.transpose(1, 2) @ v)) * z).softmax(-1)


def test_a_model_whose_only_softmax_is_no_attention_says_why_it_has_no_maps():
    """Linear attention writes no weights over keys, and its vocabulary softmax is no attention: the trace's one
    sentence named only the vocabulary softmax; it says attention without a softmax has no weights to record."""
    model = LinearAttentionLM().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 20, (2, 5)))
    assert cap.records == [] and cap.notes == []
    with pytest.raises(ValueError, match="linear attention's feature maps") as raised:
        cap.trace(0)
    assert "vocabulary" in str(raised.value)


def test_tokens_that_fit_no_map_are_one_sentence():
    _, _, cap = _captured()
    with pytest.raises(
        ValueError, match="none of the attention captured can be drawn over the tokens given: enc_self"
    ):
        cap.trace(0, src_tokens=["a", "b", "c"])


def test_a_watched_model_with_such_a_head_writes_traces_that_open(tmp_path):
    model, ids = Pooled(), _ids()
    w = attnscope.watch(model, ids, every=1, run_dir=tmp_path / "r")
    w.step(0)
    w.close()
    traces = Run.open(tmp_path / "r").traces(0)
    assert len(traces) == 2
    for i, tr in enumerate(traces):
        assert tr.kinds == ("enc_self",)
        assert tr.src_tokens == tuple(str(t) for t in ids[i].tolist())


def test_layers_that_do_not_stack_draw_the_group_over_the_tokens_and_say_the_rest(tmp_path):
    """A GAT whose hidden layer has 3 heads and whose output layer has 1: one head count per kind in a
    trace, so the first is drawn (its weights as recorded) and the second said, where the stack raised."""
    from tests.usermodels import gat

    model, batch = gat.build(), gat.sample_batch()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*batch)
    heads = [int(r.probs.shape[1]) for r in cap.records]
    assert sorted(heads) == [1, 3]
    with pytest.raises(ValueError, match="different shapes"):
        cap.stacks()  # (the API's stacks say it, and point to .records)
    n = int(cap.records[0].probs.shape[-1])
    tr = cap.trace(0, src_tokens=[f"n{i}" for i in range(n)])
    three = next(r for r in cap.records if r.probs.shape[1] == 3)
    np.testing.assert_array_equal(tr.probs("enc_self")[0], three.probs[0].numpy())
    said = [x for x in tr.meta["capture_notes"] if "left out of the trace" in x]
    assert len(said) == 1 and "(1, 1, 7, 7) do not stack with the (1, 3, 7, 7)" in said[0], said
    assert AttentionTrace.load(tr.save(tmp_path / "g.npz")).n_heads == 3


def test_a_side_labelled_by_one_kind_is_not_taken_for_another_kinds_positions(tmp_path):
    """A Q-Former: learned queries attend to each other (their labels are the source side's positions) and
    to 6 image patches. No tokens given: the patches are no positions of that side, so the cross maps are
    left out and said, and the trace opens."""
    from tests.usermodels import qformer_queries

    model, batch = qformer_queries.build(), qformer_queries.sample_batch()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*batch)
    assert sorted({(r.kind, tuple(r.probs.shape[-2:])) for r in cap.records}) == [
        ("cross", (4, 6)),
        ("enc_self", (4, 4)),
    ]
    tr = cap.trace(0)
    assert tr.kinds == ("enc_self",) and len(tr.src_tokens) == 4
    assert any(x.startswith("cross (") and "4 x 6" in x for x in tr.meta["capture_notes"])
    assert AttentionTrace.load(tr.save(tmp_path / "q.npz")).kinds == ("enc_self",)


def test_a_watched_decoder_run_step_by_step_writes_traces_that_open(tmp_path):
    """A forward that decodes with a KV cache, one step at a time, after its prompt: the prompt's maps are
    drawn, each step's are said (watch raised "different shapes" at its first step)."""
    from tests.usermodels import incremental_decoding

    model, batch = incremental_decoding.build(), incremental_decoding.sample_batch()
    w = attnscope.watch(model, batch, every=1, run_dir=tmp_path / "r")
    w.step(0)
    w.close()
    traces = Run.open(tmp_path / "r").traces(0)
    assert traces and all(t.kinds == ("dec_self",) for t in traces)
    notes = traces[0].meta["capture_notes"]
    assert sum("call(s) left out of the trace" in x for x in notes) == 2, notes


def test_a_watched_decoder_fed_its_target_shifted_keeps_every_kind(tmp_path):
    """A seq2seq forward that shifts the target inside (teacher forcing: ``tgt[:, :-1]`` in): the probe's
    target ids are one longer than the decoder's positions, so that side is numbered, the source side
    keeps its ids, and every kind is drawn."""
    from tests.usermodels import annotated

    class Shifted(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.inner = annotated.make_model(dropout=0.0)

        def forward(self, src, tgt):
            inner = self.inner
            src_mask = (src != annotated.PAD).unsqueeze(-2)
            t = tgt[:, :-1]
            tgt_mask = (t != annotated.PAD).unsqueeze(-2) & annotated.subsequent_mask(t.size(-1)).type_as(
                src_mask
            )
            return inner.generator(inner.decode(inner.encode(src, src_mask), src_mask, t, tgt_mask))

    src, tgt = annotated.sample_batch()
    w = attnscope.watch(Shifted(), (src, tgt), every=1, run_dir=tmp_path / "r")
    w.step(0)
    w.close()
    tr = Run.open(tmp_path / "r").traces(0)[0]
    assert tr.kinds == ("enc_self", "dec_self", "cross")
    assert tr.src_tokens == tuple(str(t) for t in src[0].tolist())
    assert tr.tgt_tokens == tuple(f"#{j}" for j in range(tgt.shape[1] - 1))


class ReducedKeys(nn.Module):
    """PVT's spatial-reduction attention: the keys and values are the tokens average-pooled 4 to 1."""

    def __init__(self, pooled: bool, d: int = 32, h: int = 2):
        super().__init__()
        self.pooled, self.h = pooled, h
        self.q, self.kv = nn.Linear(d, d), nn.Linear(d, 2 * d)

    def forward(self, x):
        b, n, d = x.shape
        q = self.q(x).view(b, n, self.h, -1).transpose(1, 2)
        src = torch.nn.functional.avg_pool1d(x.transpose(1, 2), 4).transpose(1, 2) if self.pooled else x
        k, v = self.kv(src).view(b, -1, 2, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        w = (q @ k.transpose(-2, -1) / math.sqrt(d // self.h)).softmax(-1)
        return (w @ v).transpose(1, 2).reshape(b, n, d)


def test_self_attention_over_pooled_keys_is_left_out_for_the_layer_over_the_tokens(tmp_path):
    """A reduced-keys layer (16 queries over 4 pooled keys) first, then a full one: with no tokens given,
    the layer whose queries and keys are the sequence's positions is drawn, and the first said."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 32), ReducedKeys(True), ReducedKeys(False)).eval()
    ids = torch.randint(1, 50, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    assert [tuple(r.probs.shape) for r in cap.records] == [(2, 2, 16, 4), (2, 2, 16, 16)]
    tr = cap.trace(0)
    np.testing.assert_array_equal(tr.probs("enc_self")[0], cap.records[1].probs[0].numpy())
    assert any(n.startswith("enc_self (1): 1 call(s) left out") for n in tr.meta["capture_notes"])
    assert AttentionTrace.load(tr.save(tmp_path / "p.npz")).kinds == ("enc_self",)


def test_a_sequence_some_calls_of_a_kind_do_not_hold_draws_the_calls_that_do():
    """Calls of one kind over 2 sequences and over 6 (a hierarchical model's sentence and word levels):
    sequence 4's trace draws the calls over 6, and says the others, where indexing them raised."""
    from attnscope.core.families.capture import Captured, Record

    def rec(b: int, k: int) -> Record:
        probs = torch.rand(b, 1, 1, k, generator=torch.Generator().manual_seed(b)).softmax(-1)
        return Record("", "cross", probs, None, None, source="softmax")

    cap = Captured(records=[rec(2, 3), rec(6, 4)])
    tr = cap.trace(4, tgt_tokens=["q"])
    np.testing.assert_array_equal(tr.probs("cross")[0], cap.records[1].probs[4].numpy())
    assert tr.src_tokens == ("#0", "#1", "#2", "#3")
    assert cap.trace(1, tgt_tokens=["q"]).src_tokens == ("#0", "#1", "#2")  # (both hold it: the first drawn)
    with pytest.raises(ValueError, match="this trace is of sequence 6"):
        cap.trace(6)


def test_a_sequence_with_nan_in_its_data_keeps_its_maps_and_leaves_out_what_moves(tmp_path):
    """A NaN in one sequence's input: its values' norms are NaN, which no trace holds (the reader refuses
    them), so its trace leaves what attention moves out and says so; the other sequence keeps them."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    x[0, 3, 4] = float("nan")
    with torch.no_grad(), capture_attention(mha) as cap:
        mha(x, x, x)
    tr = cap.trace(0)
    assert tr.kinds == ("enc_self",) and tr.value_norms("enc_self") is None
    assert any("what attention moves is left out of the trace" in n for n in tr.meta["capture_notes"])
    back = AttentionTrace.load(tr.save(tmp_path / "nan.npz"))  # (it opens: the NaN norms did not)
    np.testing.assert_array_equal(
        np.isnan(back.probs("enc_self")[0]), np.isnan(cap.records[0].probs[0].numpy())
    )
    other = cap.trace(1)
    assert other.value_norms("enc_self") is not None and np.isfinite(other.value_norms("enc_self")).all()
    assert AttentionTrace.load(other.save(tmp_path / "ok.npz")).value_norms("enc_self") is not None


def test_attention_whose_keys_are_all_pooled_is_drawn_beside_the_tokens(tmp_path):
    """The only attention is over 4-to-1 pooled keys (PVT's, SegFormer's spatial reduction): the trace draws
    the 16 tokens as keys no query weighs (no mask hides them) and the 4 pooled keys beside them under
    their labels, with the weights the model computed, says so, passes the static audit, and opens again;
    watch writes it too (it raised: no map was over the tokens)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 32), ReducedKeys(True)).eval()
    ids = torch.randint(1, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    traces = [cap.trace(b) for b in range(2)]
    for b, tr in enumerate(traces):
        assert tr.probs("enc_self").shape == (1, 2, 16, 16) and not tr.probs("enc_self").any()
        assert tr.mask("enc_self").all()
        labels, weights = tr.learned("enc_self")
        assert labels == ("<pooled 0>", "<pooled 1>", "<pooled 2>", "<pooled 3>")
        np.testing.assert_array_equal(weights[0], rec.probs[b].numpy())
        assert any("its keys are none of the 16 tokens and 4 positions the model made" in n
                   for n in tr.meta["capture_notes"])  # fmt: skip
        back = AttentionTrace.load(tr.save(tmp_path / f"p{b}.npz"))
        np.testing.assert_array_equal(back.learned("enc_self")[1], weights)
    assert all(v.status != "fail" for v in static_checks(traces))
    w = attnscope.watch(model, ids, every=1, run_dir=tmp_path / "r")
    w.step(0)
    w.close()
    run = Run.open(tmp_path / "r")
    assert run.steps() == [0]
    assert all(t.learned("enc_self") is not None for t in run.traces(0))


class ClsPooledKeys(nn.Module):
    """CvT's stage 3 (microsoft/CvT): a [CLS] token joined before 16 patches; the queries are all 17, the keys
    the [CLS] then the patches pooled 4 to 1 by a strided depthwise conv."""

    def __init__(self, d: int = 8, h: int = 2):
        super().__init__()
        self.h = h
        self.patch = nn.Conv2d(3, d, 2, 2)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.sr = nn.Conv2d(d, d, 3, 2, 1, groups=d, bias=False)
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)
        self.used: torch.Tensor | None = None

    def forward(self, img):
        x = self.patch(img)
        b, d, hh, ww = x.shape
        cls = self.cls.expand(b, -1, -1)
        k = torch.cat([cls, self.sr(x).flatten(2).transpose(1, 2)], 1)
        q = torch.cat([cls, x.flatten(2).transpose(1, 2)], 1)
        q = self.q(q).view(b, -1, self.h, d // self.h).transpose(1, 2)
        k = self.k(k).view(b, -1, self.h, d // self.h).transpose(1, 2)
        self.used = (q @ k.transpose(-2, -1)).softmax(-1)
        return self.used


def test_keys_a_cls_token_then_pooled_positions_are_drawn_at_the_cls_column(tmp_path):
    """17 queries ([CLS] and 16 patches) over 5 keys ([CLS] and 4 pooled): the [CLS] key's weights sit at
    its own column of the 17 positions, the pooled keys beside them, the other tokens weigh 0."""
    torch.manual_seed(0)
    model = ClsPooledKeys().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 3, 8, 8))
    (rec,) = cap.records
    assert rec.exact and rec.key_labels == ("<cls 0>", "<pooled 0>", "<pooled 1>", "<pooled 2>", "<pooled 3>")
    tr = cap.trace(1)
    assert tr.src_tokens[0] == "<cls 0>" and len(tr.src_tokens) == 17
    p = tr.probs("enc_self")
    assert p.shape == (1, 2, 17, 17)
    np.testing.assert_array_equal(p[0, :, :, 0], model.used[1, :, :, 0].numpy())
    assert not p[..., 1:].any()
    labels, weights = tr.learned("enc_self")
    assert labels == ("<pooled 0>", "<pooled 1>", "<pooled 2>", "<pooled 3>")
    np.testing.assert_array_equal(weights[0], model.used[1, :, :, 1:].numpy())
    assert any("its keys are 1 of the 17 positions and 4 positions the model made" in n
               for n in tr.meta["capture_notes"])  # fmt: skip
    assert all(v.status != "fail" for v in static_checks([cap.trace(0), tr]))
    AttentionTrace.load(tr.save(tmp_path / "cvt.npz"))


class MeanQueryPool(nn.Module):
    """CLIP's AttentionPool2d: the mean of the tokens joined before them is the only query."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(20, d)
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids):
        x = self.emb(ids)
        x = torch.cat([x.mean(dim=1, keepdim=True), x], dim=1)
        return (self.q(x[:, :1]) @ self.k(x).transpose(1, 2)).softmax(-1)


def test_self_attention_where_only_a_joined_position_asks_is_drawn_at_its_row():
    """1 query (the mean token joined before the tokens) over the 5 positions of one sequence, no tokens
    given: drawn over the 5 positions at the mean token's row, the 4 others empty (they ask nothing); the
    trace says which rows ask, opens again, and the mask audit calls no row of it dead (before, the trace
    was refused: "1 of the sequence's positions asks and 5 answer")."""
    model = MeanQueryPool()
    with torch.no_grad(), capture_attention(model) as cap:
        weights = model(torch.randint(0, 20, (2, 4)))
    (rec,) = cap.records
    assert rec.kind == "enc_self" and rec.exact and rec.key_labels == ("<pooled 0>", None, None, None, None)
    tr = cap.trace(1)
    assert tr.src_tokens == ("<pooled 0>", "#0", "#1", "#2", "#3") and tr.meta["query_rows"] == {
        "enc_self": [0]
    }
    p = tr.probs("enc_self")
    assert p.shape == (1, 1, 5, 5) and np.allclose(p[0, 0, 0], weights[1, 0].numpy(), atol=1e-7)
    assert not p[0, 0, 1:].any() and not tr.mask("enc_self")[1:].any() and tr.mask("enc_self")[0].all()
    assert tr.asks("enc_self").tolist() == [True, False, False, False, False]
    assert any("1 of the sequence's 5 positions asks" in n for n in tr.meta["capture_notes"])
    again = AttentionTrace.from_bytes(tr.to_npz_bytes(), "t.npz")
    assert again.meta["query_rows"] == {"enc_self": [0]} and np.array_equal(again.probs("enc_self"), p)
    assert all(v.status != "fail" for v in static_checks([tr, cap.trace(0)]))


class Agents(nn.Module):
    """REFIL's entity attention: the agents (entities 1, 3 and 4, picked by index) ask, every entity
    answers, absent entities masked; heads folded batch-major into (B*H, q, d) for bmm."""

    def __init__(self, d: int = 8, h: int = 2):
        super().__init__()
        self.h, self.hd = h, d // h
        self.emb = nn.Linear(5, d)
        self.in_trans = nn.Linear(d, 3 * d, bias=False)
        self.agents = [1, 3, 4]

    def forward(self, ents, absent):
        x = self.emb(ents)
        bs, ne, d = x.shape
        q, k, v = self.in_trans(x).chunk(3, dim=-1)
        q = q[:, self.agents]
        na = q.shape[1]
        q = q.reshape(bs, na, self.h, self.hd).transpose(1, 2).reshape(bs * self.h, na, self.hd)
        k = k.reshape(bs, ne, self.h, self.hd).transpose(1, 2).reshape(bs * self.h, ne, self.hd)
        v = v.reshape(bs, ne, self.h, self.hd).transpose(1, 2).reshape(bs * self.h, ne, self.hd)
        logits = torch.bmm(q, k.transpose(1, 2)) / self.hd**0.5
        hidden = absent.repeat_interleave(self.h, dim=0)[:, None, :]
        w = logits.masked_fill(hidden, float("-inf")).softmax(-1)
        self.weights = w.view(bs, self.h, na, ne)
        return torch.bmm(w, v).view(bs, self.h, na, self.hd).transpose(1, 2).reshape(bs, na, d)


def test_self_attention_where_some_positions_ask_is_drawn_at_their_rows():
    """Agents among entities: the map (3 x 6) is drawn over the 6 entities at the agents' rows, the others
    empty, for every batch size and head count (batch = heads among them); the audit reads the rows that
    ask, so the empty ones are no dead queries, and a file whose other rows hold weight is refused."""
    for b, h in ((1, 1), (2, 2), (3, 2), (4, 4)):
        torch.manual_seed(b * 10 + h)
        model = Agents(h=h * 2, d=h * 8).eval()
        absent = torch.zeros(b, 6, dtype=torch.bool)
        if b == 3:
            absent[-1, 5] = True  # an entity gone from the last sequence (the tokens do not say it)
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randn(b, 6, 5), absent)
        (rec,) = cap.records
        assert rec.exact and rec.kind == "enc_self" and torch.equal(rec.probs, model.weights)
        for i in range(b):
            tr = cap.trace(i)
            assert tr.meta["query_rows"] == {"enc_self": [1, 3, 4]}
            p = tr.probs("enc_self")[0]
            assert p.shape == (h * 2, 6, 6)
            assert np.array_equal(p[:, [1, 3, 4]], model.weights[i].numpy())
            assert not p[:, [0, 2, 5]].any()
            assert tr.mask("enc_self")[[1, 3, 4]].tolist() == [[not a for a in absent[i].tolist()]] * 3
        traces = [cap.trace(i) for i in range(b)]
        failed = [v.name for v in static_checks(traces) if v.status == "fail"]
        assert failed == (["declared_mask[enc_self]"] if b == 3 else []), failed  # (entity 5 hidden, not PAD)
    bad = traces[0].replace(meta={**traces[0].meta, "query_rows": {"enc_self": [1, 3]}})
    with pytest.raises(Exception, match="rows that meta 'query_rows' leaves out hold weights"):
        AttentionTrace.from_bytes(bad.to_npz_bytes(), "t.npz")
    bad = traces[0].replace(meta={**traces[0].meta, "query_rows": {"enc_self": [1, 3, 6]}})
    with pytest.raises(Exception, match="distinct rows of its 6 queries"):
        AttentionTrace.from_bytes(bad.to_npz_bytes(), "t.npz")


class CrossSelf(nn.Module):
    """fairseq's ``--cross-self-attention``: the decoder's self-attention reads the encoder's output then
    its own positions (``key = cat(encoder_out, x)``), sequence-first, a causal mask over its own part."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.h = heads
        self.src_emb, self.tgt_emb = nn.Embedding(20, d), nn.Embedding(20, d)
        self.encoder = nn.MultiheadAttention(d, heads)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, src, tgt):  # (len, batch)
        s = self.src_emb(src)
        enc = s + self.encoder(s, s, s)[0]
        x = self.tgt_emb(tgt)
        y = torch.cat((enc, x), dim=0)
        (t, b, d), n = x.shape, y.shape[0]
        q = self.q(x).view(t, b * self.h, -1).transpose(0, 1) * (d // self.h) ** -0.5
        k = self.k(y).view(n, b * self.h, -1).transpose(0, 1)
        v = self.v(y).view(n, b * self.h, -1).transpose(0, 1)
        causal = torch.triu(torch.full((t, t), float("-inf")), 1)
        w = torch.softmax(torch.bmm(q, k.transpose(1, 2)) + torch.cat((x.new_zeros(t, n - t), causal), 1), -1)
        self.used = w.view(b, self.h, t, n)
        return torch.bmm(w, v).transpose(0, 1).reshape(t, b, d)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 2)])
def test_keys_that_are_the_sources_positions_then_the_decoders_own_are_labelled(tmp_path, batch, heads):
    """The decoder's queries over the source's positions then its own: the source's keys are labelled
    ``<src i>`` (they were unlabelled, so nothing kept a picture from putting them under the target's
    tokens), and the trace draws the target's own keys over its tokens with the source's beside them."""
    torch.manual_seed(batch)
    model = CrossSelf(heads=heads).eval()
    src, tgt = torch.randint(1, 20, (4, batch)), torch.randint(1, 20, (3, batch))
    with torch.no_grad(), capture_attention(model) as cap:
        model(src, tgt)
    dec = next(r for r in cap.records if r.name == "")
    assert dec.kind == "dec_self" and dec.exact
    assert dec.key_labels == ("<src 0>", "<src 1>", "<src 2>", "<src 3>", None, None, None)
    torch.testing.assert_close(dec.probs, model.used, atol=1e-6, rtol=0)
    tr = cap.trace(0, src_tokens=["a", "b", "c", "d"], tgt_tokens=["x", "y", "z"])
    assert set(tr.kinds) == {"enc_self", "dec_self"}
    np.testing.assert_array_equal(tr.probs("dec_self")[0], dec.probs[0, :, :, 4:].numpy())
    labels, beside = tr.learned("dec_self")
    assert labels == ("<src 0>", "<src 1>", "<src 2>", "<src 3>")
    np.testing.assert_array_equal(beside[0], dec.probs[0, :, :, :4].numpy())
    assert AttentionTrace.load(tr.save(tmp_path / "cs.npz")).kinds == tr.kinds


def test_weights_dropout_scaled_up_in_training_open_and_say_so(tmp_path):
    """Captured in training mode, dropout keeps each weight it does not drop times 1 / (1 - p): the maps
    hold weights above 1 (the ones the values were multiplied with). The trace says so and its file
    opens; attnscope's reader refused the file attnscope wrote, and so a watched run's steps."""
    torch.manual_seed(0)

    class Dropped(nn.Module):
        def __init__(self, d: int = 16, h: int = 2):
            super().__init__()
            self.h, self.qkv = h, nn.Linear(d, 3 * d)
            with torch.no_grad():
                self.qkv.weight[: 2 * d].mul_(8)  # peaked weights, as after some training

        def forward(self, x):
            b, n, d = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
            w = nn.functional.dropout(torch.softmax(q @ k.mT / (d // self.h) ** 0.5, -1), 0.1, self.training)
            return x + (w @ v).transpose(1, 2).reshape(b, n, d)

    model = nn.Sequential(nn.Embedding(20, 16), Dropped()).train()
    ids = torch.randint(0, 20, (2, 6))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    top = float(cap.records[0].probs.max())
    assert top > 1.05  # 1 / (1 - 0.1) times a weight near 1
    tr = cap.trace(0)
    assert tr.meta["weights_rescaled"] >= float(tr.enc_self.max())
    assert any(n.startswith("weights up to") and "dropout" in n for n in tr.meta["capture_notes"])
    back = AttentionTrace.load(tr.save(tmp_path / "dropped.npz"))
    np.testing.assert_array_equal(back.enc_self, tr.enc_self)
    w = attnscope.watch(model, probe=ids, every=1, run_dir=tmp_path / "run")
    w.step(0)
    w.close()
    run = Run.open(tmp_path / "run")
    assert run.steps() == [0] and run.traces(0)


class GatheredBlocks(nn.Module):
    """BigBird's second part (HF's block-sparse attention): the keys are blocks of the sequence gathered
    into one axis, ``cat([k_blocks[0], k_blocks[1], k_blocks[-1], k_blocks[r]])``, a random block ``r`` that may
    repeat a window block: 8 keys for 8 queries, at positions 0, 1, 2, 3, 6, 7, 6, 7."""

    def __init__(self, d: int = 4, order: tuple[int, ...] = (0, 1, -1, 3)):
        super().__init__()
        self.order = order
        self.emb = nn.Embedding(20, d)
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k = self.q(x)[:, None], self.k(x)[:, None]  # (B, 1, L, d)
        blocks = k.view(b, 1, n // 2, 2, d)
        k2 = torch.cat([blocks[:, :, i] for i in self.order], 2)
        return (q @ k2.transpose(-1, -2)).softmax(-1)


def test_keys_gathered_from_the_sequence_with_a_block_twice_are_not_drawn_under_its_tokens():
    """The record is exact in the model's key order, with each key's position; the trace does not draw it
    over the tokens (it drew the weight of keys 6 and 7 under tokens 4 to 7, saying nothing)."""
    torch.manual_seed(0)
    model = GatheredBlocks().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        want = model(torch.randint(0, 20, (2, 8)))
    (rec,) = cap.records
    torch.testing.assert_close(rec.probs, want, rtol=0, atol=0)
    assert rec.key_positions[1].tolist() == [8, 9, 10, 11, 14, 15, 14, 15]
    with pytest.raises(ValueError, match=r"the keys of sequence 1 are as many of its positions as its queries, but "
                       r"other ones or in another order"):  # fmt: skip
        cap.trace(1)


def test_keys_in_the_sequences_own_order_are_still_drawn():
    """The same model with the blocks in order (0, 1, 2, 3): drawn, no note."""
    torch.manual_seed(0)
    model = GatheredBlocks(order=(0, 1, 2, 3)).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (2, 8)))
    tr = cap.trace(1)
    assert tr.probs("enc_self").shape == (1, 1, 8, 8) and not tr.meta.get("capture_notes")


class PerHeadSteps(nn.Module):
    """pytorch-forecasting's TFT: one attention module called per head (ModuleList projections, ``bmm``),
    the queries the decoder steps (the last positions), the keys every position."""

    def __init__(self, heads: int = 2, d: int = 8, steps: int = 3):
        super().__init__()
        self.steps = steps
        self.emb = nn.Linear(3, d)
        self.q = nn.ModuleList(nn.Linear(d, 4) for _ in range(heads))
        self.k = nn.ModuleList(nn.Linear(d, 4) for _ in range(heads))
        self.v = nn.Linear(d, 4)

    def forward(self, x):
        h = self.emb(x)
        vs, outs, self.used = self.v(h), [], []
        for q, k in zip(self.q, self.k, strict=True):
            a = torch.bmm(q(h[:, -self.steps :]), k(h).permute(0, 2, 1)).softmax(-1)
            self.used.append(a)
            outs.append(torch.bmm(a, vs))
        return torch.stack(outs, 2).mean(2)


def test_heads_called_one_at_a_time_over_the_last_positions_draw_at_their_rows():
    """The heads' records joined into one layer keep the positions every head read, so the decoder steps'
    rows are placed among the keys and drawn there (the trace was refused: '3 of the sequence's positions
    ask and 8 answer')."""
    torch.manual_seed(0)
    model = PerHeadSteps().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 8, 3))
    (rec,) = cap.records
    assert rec.exact and rec.probs.shape == (2, 2, 3, 8)
    for b in range(2):
        tr = cap.trace(b)
        assert tr.meta["query_rows"] == {rec.kind: [5, 6, 7]}
        p = tr.probs(rec.kind)[0]
        assert np.array_equal(p[:, 5:], torch.stack([u[b] for u in model.used]).numpy())
        assert not p[:, :5].any()


class ForgotCausal(nn.Module):
    """An encoder-decoder whose decoder self-attention has no causal mask (so the mask calls it encoder
    self-attention), sources and targets of one length; ``towers``: two encoders, no decoder."""

    def __init__(self, towers: bool = False, d: int = 8):
        super().__init__()
        self.towers = towers
        self.emb = nn.Embedding(20, d)
        self.q, self.k = (
            nn.ModuleList(nn.Linear(d, d) for _ in range(3)),
            nn.ModuleList(nn.Linear(d, d) for _ in range(3)),
        )

    def attend(self, i, x, memory):
        return (self.q[i](x) @ self.k[i](memory).transpose(1, 2)).softmax(-1) @ memory

    def forward(self, src, tgt):
        x = self.emb(src)
        x = x + self.attend(0, x, x)
        y = self.emb(tgt)
        y = y + self.attend(1, y, y)  # no causal mask
        return y if self.towers else y + self.attend(2, y, x)


def test_self_attention_over_the_other_side_is_not_drawn_as_a_deeper_layer():
    """The decoder's self-attention with no causal mask is enc_self by its mask, and with sources and targets of one
    length the trace stacked it under the encoder's as a second layer, over the source tokens. Maps over other
    inputs' positions are never layers of one sequence: the trace draws the encoder's (the positions the
    cross-attention reads) and says the other is left out. Two towers of one length are two groups too."""
    torch.manual_seed(0)
    src, tgt = torch.randint(1, 20, (2, 4)), torch.randint(1, 20, (2, 4))
    model = ForgotCausal().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(src, tgt)
    assert [r.kind for r in cap.records] == ["enc_self", "enc_self", "cross"]
    trace = cap.trace(0, src_tokens=list("abcd"), tgt_tokens=list("wxyz"))
    assert trace.enc_self.shape[0] == 1
    assert np.allclose(trace.enc_self[0, 0], cap.records[0].probs[0, 0].numpy())
    (said,) = [n for n in trace.meta["capture_notes"] if "other side of the cross-attention" in n]
    assert said.startswith("enc_self (") and "1 call(s) over the positions on the other side" in said
    towers = ForgotCausal(towers=True).eval()
    with torch.no_grad(), capture_attention(towers) as cap:
        towers(src, tgt)
    trace = cap.trace(0, src_tokens=list("abcd"))
    assert trace.enc_self.shape[0] == 1 and trace.meta["capture_notes"]
