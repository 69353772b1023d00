"""A memory write by content addressing (the DNC's and NTM's write head): weights over the memory's slots from a
softmax of cosine similarities, then an outer product ``bmm(w.unsqueeze(2), a.unsqueeze(1))`` that gives each slot
its share of a vector. Capture warned it as attention it could not lay out ("its weights multiply values over
positions"): the product sums over nothing, so it reads no values. The softmax is now accounted for as a
distribution that weighs nothing; a read through weights over the same memory is still said.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

SLOTS, WIDTH = 6, 4


class WriteHead(nn.Module):
    def __init__(self, read: bool):
        super().__init__()
        self.read = read
        self.ctrl, self.wkey, self.rkey = nn.Linear(5, 16), nn.Linear(16, WIDTH), nn.Linear(16, WIDTH)
        self.add, self.erase = nn.Linear(16, WIDTH), nn.Linear(16, WIDTH)

    def forward(self, x: torch.Tensor, memory: torch.Tensor):
        h = torch.tanh(self.ctrl(x))
        w = F.softmax(F.cosine_similarity(memory, self.wkey(h).unsqueeze(1), dim=-1) * 5.0, dim=1)  # (B, N)
        erase, add = torch.sigmoid(self.erase(h)), self.add(h)
        memory = memory * (1 - torch.bmm(w.unsqueeze(2), erase.unsqueeze(1))) + torch.bmm(
            w.unsqueeze(2), add.unsqueeze(1)
        )
        if not self.read:
            return memory
        r = F.softmax(F.cosine_similarity(memory, self.rkey(h).unsqueeze(1), dim=-1) * 5.0, dim=1)
        return torch.bmm(r.unsqueeze(1), memory).squeeze(1)


def test_a_write_by_an_outer_product_is_no_read():
    torch.manual_seed(0)
    model = WriteHead(read=False).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 5), torch.randn(2, SLOTS, WIDTH))
    assert not cap.records and not cap.notes, cap.notes
    assert [s.shape for s in cap.skipped] == [(2, SLOTS)]  # the softmax, accounted for


def test_a_read_after_the_write_is_still_said():
    torch.manual_seed(1)
    model = WriteHead(read=True).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(3, 5), torch.randn(3, SLOTS, WIDTH))
    (note,) = cap.notes
    assert "not recorded" in note and "memory read by its weights" in note
