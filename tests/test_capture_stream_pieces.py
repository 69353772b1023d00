"""Requests packed into one 1-D stream of tokens and attended one call each (vLLM's and SGLang's reference
kernels: ``for i in range(num_seqs): attn(q[cu[i]:cu[i + 1]], ...)``). Requests of one length were joined into a
batch, request b its row b; of different lengths they stayed maps of their own, and ``trace(b)`` given request b's
tokens drew the last map of that length (another request's), with a note about a decoder's steps. Each piece is
now a sequence of its own in the order the calls ran (``record.batch_rows``), and ``trace(b)`` draws request b.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

D = 24


class RefAttention(nn.Module):
    """One layer over a packed stream: ``q, k, v`` (N, H, d), each request attended on its own."""

    def __init__(self, heads: int, style: str, causal: bool):
        super().__init__()
        self.h, self.style, self.causal = heads, style, causal
        self.keep = False  # the weights written down, in a run of its own (not captured)
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(-1, 3, self.h, D // self.h).unbind(1)
        self.kept = []
        if self.style == "buffer":  # SGLang's extend reference: each request's output written into place
            out = torch.empty_like(q)
        outs = []
        for i in range(len(cu) - 1):
            a, b = int(cu[i]), int(cu[i + 1])
            n = b - a
            if self.style == "sdpa":
                qi, ki, vi = (t[a:b].transpose(0, 1) for t in (q, k, v))  # (H, n, d)
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=self.causal)
                if self.keep:
                    s = (qi @ ki.transpose(-1, -2)) / math.sqrt(D // self.h)
                    if self.causal:
                        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
                    self.kept.append(s.softmax(-1))
                outs.append(o.transpose(0, 1))
                continue
            w = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) / math.sqrt(D // self.h)
            if self.causal:
                w = w + torch.triu(torch.ones(n, n), diagonal=1) * torch.finfo(torch.float32).min
            p = torch.softmax(w, dim=-1)
            if self.keep:
                self.kept.append(p.detach().clone())
            o = torch.einsum("hqk,khd->qhd", p, v[a:b])
            if self.style == "buffer":
                out[a:b] = o
            else:
                outs.append(o)
        y = out if self.style == "buffer" else torch.cat(outs)
        return x + self.o(y.reshape(-1, D))


class Packed(nn.Module):
    def __init__(self, heads: int, style: str, causal: bool, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(60, D)
        self.layers = nn.ModuleList(RefAttention(heads, style, causal) for _ in range(layers))

    def forward(self, ids: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x, cu)
        return x


def _check(style: str, causal: bool, heads: int, lens: list[int]) -> None:
    torch.manual_seed(len(lens) * 10 + heads)
    model = Packed(heads, style, causal).eval()
    seqs = [torch.randint(1, 60, (n,)) for n in lens]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.cat(seqs), cu)
    for m in model.layers:
        m.keep = True
    with torch.no_grad():
        model(torch.cat(seqs), cu)
    kind = "dec_self" if causal else "enc_self"
    assert {r.kind for r in cap.records} == {kind}
    assert all(r.exact for r in cap.records)
    for b, seq in enumerate(seqs):
        tr = cap.trace(b, src_tokens=[f"t{int(t)}" for t in seq])
        maps = getattr(tr, kind)
        assert maps.shape == (2, heads, lens[b], lens[b]), (b, maps.shape)
        for layer, m in enumerate(model.layers):
            torch.testing.assert_close(torch.tensor(maps[layer]), m.kept[b], atol=1e-5, rtol=1e-4)
    # the whole stream is no sequence of its own: said, not drawn
    with pytest.raises(ValueError, match="over other positions"):
        cap.trace(0, src_tokens=[f"t{int(t)}" for t in torch.cat(seqs)])


@pytest.mark.parametrize("style", ["cat", "buffer", "sdpa"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [1, 2, 3, 4, 8])
def test_each_request_of_a_packed_stream_is_its_own_sequence(style, causal, heads):
    for lens in ([5, 3, 5], [2, 6], [4, 4, 7, 1]):
        _check(style, causal, heads, lens)


def test_requests_of_one_length_are_a_batch_as_before():
    _check("cat", True, 2, [4, 4, 4])


def test_the_note_says_which_piece_is_which_sequence():
    model = Packed(2, "cat", True).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 60, (8,)), torch.tensor([0, 5, 8]))
    assert [r.batch_rows for r in cap.records] == [(0,), (1,), (0,), (1,)]
    assert any("trace(b) draws the b-th" in n for n in cap.notes)
