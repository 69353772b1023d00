"""Keys beyond the tokens, the way ViT and lucidrains' x-transformers write them: a learned
``cls_token`` prepended to the embeddings (a query and a key of its own), ``num_mem_kv`` learned
memory key/values per head joined in front of the keys (``mem_k`` expanded over the batch and
``torch.cat`` on the key axis) and, in the last layer, a learned null key (``null_k``) appended.
An encoder: its self-attention stays encoder self-attention. forward(ids) -> (B, N_CLASSES).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
VOCAB_SIZE = 20
N_CLASSES = 3


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, num_mem_kv: int, null_kv: bool, sink: list):
        super().__init__()
        self.heads, self.dim_head, self.sink = heads, dim // heads, sink
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.to_out = nn.Linear(dim, dim)
        self.mem_k = nn.Parameter(torch.randn(heads, num_mem_kv, self.dim_head))
        self.mem_v = nn.Parameter(torch.randn(heads, num_mem_kv, self.dim_head))
        self.null_k = nn.Parameter(torch.randn(heads, 1, self.dim_head)) if null_kv else None
        self.null_v = nn.Parameter(torch.randn(heads, 1, self.dim_head)) if null_kv else None

    def forward(self, x, keep):  # keep: (B, N) True where a key may be attended
        b, n, _ = x.shape
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, self.heads, self.dim_head).transpose(1, 2) for t in (q, k, v))
        mem_k, mem_v = (m.unsqueeze(0).expand(b, -1, -1, -1) for m in (self.mem_k, self.mem_v))
        k, v = torch.cat((mem_k, k), dim=-2), torch.cat((mem_v, v), dim=-2)
        keep = F.pad(keep, (self.mem_k.shape[1], 0), value=True)
        if self.null_k is not None:
            k = torch.cat((k, self.null_k.unsqueeze(0).expand(b, -1, -1, -1)), dim=-2)
            v = torch.cat((v, self.null_v.unsqueeze(0).expand(b, -1, -1, -1)), dim=-2)
            keep = F.pad(keep, (0, 1), value=True)
        sim = torch.einsum("bhid,bhjd->bhij", q, k) * self.dim_head**-0.5
        sim = sim.masked_fill(~keep[:, None, None, :], -torch.finfo(sim.dtype).max)
        attn = sim.softmax(dim=-1)
        self.sink.append(("enc_self", attn.detach().clone()))
        out = torch.einsum("bhij,bhjd->bhid", attn, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))


class ViTLike(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, depth: int = 2, num_mem_kv: int = 2):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embed = nn.Embedding(VOCAB_SIZE, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, 16, dim) * 0.1)
        self.layers = nn.ModuleList(
            [
                Attention(dim, heads, num_mem_kv, null_kv=i == depth - 1, sink=self.computed)
                for i in range(depth)
            ]
        )
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, N_CLASSES)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, n = ids.shape
        x = self.embed(ids)
        cls_tokens = self.cls_token.expand(b, -1, -1)
        x = torch.cat((cls_tokens, x), dim=1)
        x = x + self.pos_embedding[:, : n + 1]
        keep = F.pad(ids != PAD, (1, 0), value=True)
        for attn, norm in zip(self.layers, self.norms, strict=True):
            x = x + attn(norm(x), keep)
        return self.head(x[:, 0])


def build(seed: int = 0) -> ViTLike:
    torch.manual_seed(seed)
    return ViTLike().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """ids (3, 6) with 6, 4, 2 real tokens, right-padded with 0."""
    return (torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 0, 0], [13, 14, 0, 0, 0, 0]]),)
