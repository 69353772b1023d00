"""A pointer network's attention (shirgur's PointerNet, Vinyals et al.): ``u = bmm(V.expand(B, -1).unsqueeze(1),
tanh(W1 d + W2 e))``, a learned vector on the left of the product, then a softmax over the inputs that both points
and weighs the encoder's outputs. Lineage stopped at that product (a learned matrix on the left), so every step
was "not recorded ... a 2-D softmax is a distribution per row, not per-head attention". Each decoding step is now a
cross-attention record over the inputs, exact.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnscope.core.families.capture import capture_attention


class PointerAttention(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int):
        super().__init__()
        self.input_linear = nn.Linear(input_dim, hidden_dim)
        self.context_linear = nn.Conv1d(input_dim, hidden_dim, 1, 1)
        self.V = nn.Parameter(torch.randn(hidden_dim))
        self.tanh, self.softmax = nn.Tanh(), nn.Softmax(dim=1)

    def forward(self, input, context, mask):
        inp = self.input_linear(input).unsqueeze(2).expand(-1, -1, context.size(1))  # (B, hidden, L)
        context = context.permute(0, 2, 1)
        ctx = self.context_linear(context)  # (B, hidden, L)
        V = self.V.unsqueeze(0).expand(context.size(0), -1).unsqueeze(1)  # (B, 1, hidden)
        att = torch.bmm(V, self.tanh(inp + ctx)).squeeze(1)  # (B, L)
        att = att.masked_fill(mask, float("-inf"))
        alpha = self.softmax(att)
        return torch.bmm(ctx, alpha.unsqueeze(2)).squeeze(2), alpha


class PointerNet(nn.Module):
    def __init__(self, hidden: int = 8):
        super().__init__()
        self.embedding = nn.Linear(2, hidden)
        self.encoder = nn.LSTM(hidden, hidden, batch_first=True)
        self.cell = nn.LSTMCell(hidden, hidden)
        self.att = PointerAttention(hidden, hidden)
        self.kept: list[torch.Tensor] = []

    def forward(self, points: torch.Tensor, steps: int) -> torch.Tensor:
        x = self.embedding(points)
        context, (h, c) = self.encoder(x)
        h, c = h[0], c[0]
        inp = torch.zeros_like(h)
        mask = torch.zeros(points.shape[:2], dtype=torch.bool)
        rows = torch.arange(points.shape[0])
        self.kept = []
        for _ in range(steps):
            h, c = self.cell(inp, (h, c))
            _, alpha = self.att(h, context, mask)
            self.kept.append(alpha.detach().clone())
            idx = alpha.argmax(1)
            mask = mask.clone()
            mask[rows, idx] = True  # a point is pointed at once
            inp = x[rows, idx]
        return torch.stack(self.kept, 1)


@pytest.mark.parametrize("batch", [1, 2, 3, 6])
def test_each_pointing_step_is_a_cross_attention_record(batch):
    torch.manual_seed(batch)
    model = PointerNet().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.rand(batch, 5, 2), steps=3)
    assert not cap.notes, cap.notes
    assert len(cap.records) == 3
    for rec, alpha in zip(cap.records, model.kept, strict=True):
        assert rec.exact and rec.kind == "cross" and tuple(rec.probs.shape) == (batch, 1, 1, 5)
        torch.testing.assert_close(rec.probs[:, 0, 0], alpha)
        # the points already pointed at are masked (none at the first step)
        keep = torch.ones_like(alpha, dtype=torch.bool) if rec.mask is None else rec.mask.reshape(batch, 5)
        assert torch.equal(keep, alpha > 0)
    assert cap.records[-1].mask is not None
