"""Kyubyong/transformer, ported to PyTorch the way its readers port it: heads folded head-major
with ``torch.cat(torch.chunk(Q, num_heads, dim=2), dim=0)`` (no ``view``: row ``h * N + n``), key
masks from the sign of the embeddings' sums, ``key_masks.repeat(num_heads, 1)`` and
``torch.where(key_masks == 0, paddings, outputs)`` with ``-2 ** 32 + 1``, heads merged back with
``torch.cat(torch.chunk(outputs, num_heads, dim=0), dim=2)``. Encoder-only classifier:
forward(x) -> class logits ``(N, N_CLASSES)``. Any batch size and head count (batch = heads too).
"""

from __future__ import annotations

import torch
from torch import nn

PAD = 0
VOCAB_SIZE = 24
N_CLASSES = 2


class multihead_attention(nn.Module):  # noqa: N801 (the original's name)
    def __init__(self, num_units: int, num_heads: int, sink: list):
        super().__init__()
        self.num_heads, self.sink = num_heads, sink
        self.Q = nn.Linear(num_units, num_units)
        self.K = nn.Linear(num_units, num_units)
        self.V = nn.Linear(num_units, num_units)
        self.norm = nn.LayerNorm(num_units)

    def forward(self, queries, keys, key_masks):
        num_heads = self.num_heads
        Q = torch.relu(self.Q(queries))  # (N, T_q, C)
        K = torch.relu(self.K(keys))
        V = torch.relu(self.V(keys))
        Q_ = torch.cat(torch.chunk(Q, num_heads, dim=2), dim=0)  # (h*N, T_q, C/h)
        K_ = torch.cat(torch.chunk(K, num_heads, dim=2), dim=0)
        V_ = torch.cat(torch.chunk(V, num_heads, dim=2), dim=0)
        outputs = torch.matmul(Q_, K_.transpose(1, 2)) / (K_.size(-1) ** 0.5)  # (h*N, T_q, T_k)
        masks = key_masks.repeat(num_heads, 1).unsqueeze(1).repeat(1, queries.size(1), 1)  # (h*N, T_q, T_k)
        paddings = torch.ones_like(outputs) * (-(2**32) + 1)
        outputs = torch.where(masks == 0, paddings, outputs)
        outputs = torch.softmax(outputs, dim=-1)
        n = queries.size(0)
        self.sink.append(
            ("enc_self", torch.stack(torch.chunk(outputs.detach(), num_heads, dim=0), dim=1).clone())
        )
        outputs = torch.matmul(outputs, V_)  # (h*N, T_q, C/h)
        outputs = torch.cat(torch.chunk(outputs, num_heads, dim=0), dim=2)  # (N, T_q, C)
        assert outputs.size(0) == n
        return self.norm(outputs + queries)


class Classifier(nn.Module):
    def __init__(self, num_units: int = 24, num_heads: int = 4, num_blocks: int = 2):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embed = nn.Embedding(VOCAB_SIZE, num_units, padding_idx=PAD)
        self.pos = nn.Embedding(64, num_units)
        self.blocks = nn.ModuleList([multihead_attention(num_units, num_heads, self.computed)
                                     for _ in range(num_blocks)])  # fmt: skip
        self.out = nn.Linear(num_units, N_CLASSES)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key_masks = torch.sign(x).float()  # (N, T): 0 at PAD
        enc = self.embed(x) + self.pos(torch.arange(x.size(1)).unsqueeze(0).repeat(x.size(0), 1))
        for block in self.blocks:
            enc = block(enc, enc, key_masks)
        return self.out(enc.mean(1))


def build(seed: int = 0, heads: int = 4) -> Classifier:
    torch.manual_seed(seed)
    return Classifier(num_units=8 * heads if heads != 3 else 24, num_heads=heads).eval()


def sample_batch(batch: int = 3) -> tuple[torch.Tensor]:
    """``batch`` sequences of 7 ids, the i-th with 7 - i real tokens (at least 2), right-padded with 0."""
    g = torch.Generator().manual_seed(batch)
    x = torch.randint(1, VOCAB_SIZE, (batch, 7), generator=g)
    for i in range(batch):
        x[i, max(7 - i, 2) :] = PAD
    return (x,)
