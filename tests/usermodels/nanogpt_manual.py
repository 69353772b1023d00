"""nanoGPT's manual attention path (PyTorch < 2.0, ``flash = False``): a ``bias`` buffer
``torch.tril(torch.ones(T, T)).view(1, 1, T, T)``, ``att = (q @ k.transpose(-2, -1)) * (1.0 /
math.sqrt(k.size(-1)))``, ``att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))``,
``F.softmax(att, dim=-1)``; fused ``c_attn`` split into q, k, v; learned token (``wte``) and
position (``wpe``) embeddings; ``lm_head`` tied to ``wte``. forward(idx) -> logits (B, T, vocab).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB_SIZE, BLOCK_SIZE, N_EMBD, N_HEAD, N_LAYER = 20, 16, 32, 4, 2


class CausalSelfAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.0), nn.Dropout(0.0)
        self.n_head, self.n_embd, self.sink = N_HEAD, N_EMBD, sink
        self.register_buffer(
            "bias", torch.tril(torch.ones(BLOCK_SIZE, BLOCK_SIZE)).view(1, 1, BLOCK_SIZE, BLOCK_SIZE)
        )

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        self.sink.append(("dec_self", att.detach().clone()))
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(N_EMBD, 4 * N_EMBD), nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(N_EMBD), CausalSelfAttention(sink)
        self.ln_2, self.mlp = nn.LayerNorm(N_EMBD), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(VOCAB_SIZE, N_EMBD),
                wpe=nn.Embedding(BLOCK_SIZE, N_EMBD),
                drop=nn.Dropout(0.0),
                h=nn.ModuleList([Block(self.computed) for _ in range(N_LAYER)]),
                ln_f=nn.LayerNorm(N_EMBD),
            )
        )
        self.lm_head = nn.Linear(N_EMBD, VOCAB_SIZE, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # (t,)
        tok_emb = self.transformer.wte(idx)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))  # (b, t, vocab_size)


def build(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """idx (3, 7): 7, 5 and 3 real tokens, right-padded with 0 (causal: no query sees its padding)."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
