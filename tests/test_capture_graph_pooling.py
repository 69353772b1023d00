"""PyG's ``softmax(src, ptr=ptr)`` on a sorted batch of graphs (``AttentionalAggregation``'s gate): a softmax
written as ``exp`` and ``torch._segment_reduce(..., "sum", offsets=ptr)``. Capture said no softmax ran at all
("attention written without a softmax ... has no weights to record"); it now says what ran: weights per node over
each graph, not a (query, key) map, as PyG's ``softmax(src, index)`` by a scatter is said.
"""

from __future__ import annotations

import torch
from torch import nn

from attnscope.core.families.capture import capture_attention


def softmax_ptr(src: torch.Tensor, ptr: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """torch_geometric.utils.softmax on its ``ptr`` path, without torch_scatter."""
    count = ptr[1:] - ptr[:-1]
    ptr = ptr.view([1] * dim + [-1])
    src_max = torch._segment_reduce(src.detach(), "max", offsets=ptr).repeat_interleave(count, dim=dim)
    out = (src - src_max).exp()
    out_sum = torch._segment_reduce(out, "sum", offsets=ptr) + 1e-16
    return out / out_sum.repeat_interleave(count, dim=dim)


class AttentionalAggregation(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.gate, self.nn = nn.Linear(3, 8), nn.Linear(8, 1), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        gate = softmax_ptr(self.gate(x), ptr)
        return torch._segment_reduce(self.nn(x) * gate, "sum", offsets=ptr)


def test_a_softmax_over_segments_is_said_as_one():
    torch.manual_seed(0)
    model = AttentionalAggregation().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        pooled = model(torch.randn(9, 3), torch.tensor([0, 4, 9]))
    assert pooled.shape == (2, 8) and not cap.records
    (note,) = cap.notes
    assert "torch._segment_reduce" in note and "not recorded" in note and "no softmax" not in note
