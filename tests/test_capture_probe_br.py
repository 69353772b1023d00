"""Cases found by probing capture with attention written the way efficient-attention code, pooling heads and
everyday user code write it: a mean token made from features handed in by a masked mean, a mean over a slice
of them, or a sum divided and unsqueezed on the way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnscope.core.families.capture import capture_attention


class PooledToken(nn.Module):
    """An attention pool over features handed in (B, N, d): a mean token joined before them asks the only
    query. ``how`` is the way the mean is written; ``maps`` keeps the weights (B, H, 1, 1 + N)."""

    def __init__(self, how: str, d: int = 8, h: int = 2):
        super().__init__()
        self.how, self.h = how, h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.maps: list[torch.Tensor] = []

    def forward(self, x, m):  # m: (B, N) 1 at a real position, 0 at padding
        b, n, d = x.shape
        if self.how == "masked mean":
            mean = (x * m[..., None]).sum(1, keepdim=True) / m.sum(1, keepdim=True)[..., None]
        elif self.how == "slice mean":  # the features after a first (class) position
            mean = x[:, 1:].mean(1, keepdim=True)
        elif self.how == "sum over count":
            mean = x.sum(dim=1, keepdim=True) / n
        else:  # "mean unsqueezed"
            mean = x.mean(1).unsqueeze(1)
        x = torch.cat([mean, x], dim=1)
        q = self.q(x[:, :1]).view(b, 1, self.h, d // self.h).transpose(1, 2)
        k, v = (f(x).view(b, n + 1, self.h, d // self.h).transpose(1, 2) for f in (self.k, self.v))
        w = ((q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5).softmax(-1)
        self.maps.append(w.detach().clone())
        return self.o((w @ v).transpose(1, 2).reshape(b, d))


@pytest.mark.parametrize("how", ["masked mean", "slice mean", "sum over count", "mean unsqueezed"])
@pytest.mark.parametrize("batch,heads", [(2, 2), (1, 1), (3, 4)])
def test_a_mean_token_written_any_common_way_is_a_pooled_position(how, batch, heads):
    """Each of these was ``dec_self`` with the features labelled ``<ctx i>`` and the mean token a query of its
    own, silently: a decoder reading a memory. The mean is a position pooled from the features it is joined
    to, as ``x.mean(1, keepdim=True)`` written directly is: enc_self, its query and first key ``<pooled 0>``."""
    torch.manual_seed(batch * 10 + heads)
    model = PooledToken(how, h=heads).eval()
    x = torch.randn(batch, 4, 8)
    m = torch.ones(batch, 4)
    m[-1, 3:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, m)
    (r,) = cap.records
    want = model.maps[0]
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)
    assert r.kind == "enc_self" and r.exact and not cap.notes, (r.kind, cap.notes)
    assert r.query_labels == ("<pooled 0>",)
    assert r.key_labels == ("<pooled 0>", None, None, None, None)
    for i in range(batch):
        tr = cap.trace(i)
        assert tr.meta["query_rows"] == {"enc_self": [0]}
        np.testing.assert_allclose(tr.enc_self[0, :, 0], want[i, :, 0].numpy(), atol=1e-6)


class TwoInputs(nn.Module):
    """Cross-attention from a text's tokens to image features handed in, the features first weighted by a
    broadcast mask (``x * m[..., None]``, no mean): the product is not a pooled token, and the call stays cross."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(20, d)
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids, feats, m):
        feats = feats * m[..., None]
        w = (self.q(self.emb(ids)) @ self.k(feats).transpose(1, 2)).softmax(-1)
        return w @ feats


def test_features_weighted_by_a_mask_and_not_pooled_stay_the_keys_of_a_cross_attention():
    model = TwoInputs().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (2, 3)), torch.randn(2, 5, 8), torch.ones(2, 5))
    (r,) = cap.records
    assert r.kind == "cross" and r.key_labels is None and r.query_labels is None
