"""Encoder-decoder seq2seq written like a diffusion U-Net's ``BasicTransformerBlock``: every block
has ``attn1`` (self-attention) and, in the target stack, ``attn2`` whose keys and values are the
encoder memory (``context``) - no "cross", "decoder" or "context" in any module name. One
``Attention`` class with ``to_q``/``to_k``/``to_v``/``to_out``, heads folded to 3-D with
``reshape(B, L, H, d).permute(0, 2, 1, 3).reshape(B * H, L, d)``, scores
``q @ k.transpose(-1, -2) * self.scale``, bool masks (True = keep) applied with
``torch.where(mask, scores, -inf)``, ``scores.softmax(dim=-1)``. Source and target share one
``nn.Embedding``. forward(src, tgt) -> logits (B, T, vocab).
"""

from __future__ import annotations

import torch
from torch import nn

PAD, BOS = 0, 1
VOCAB_SIZE, D_MODEL, N_HEADS, N_LAYERS = 20, 32, 4, 2


class Attention(nn.Module):
    def __init__(self, sink: list, label: str):
        super().__init__()
        self.heads, self.scale = N_HEADS, (D_MODEL // N_HEADS) ** -0.5
        self.to_q, self.to_k, self.to_v = (nn.Linear(D_MODEL, D_MODEL, bias=False) for _ in range(3))
        self.to_out = nn.Linear(D_MODEL, D_MODEL)
        self.sink, self.label = sink, label

    def head_to_batch_dim(self, x):
        B, L, D = x.shape
        return x.reshape(B, L, self.heads, D // self.heads).permute(0, 2, 1, 3).reshape(B * self.heads, L, -1)

    def batch_to_head_dim(self, x):
        BH, L, d = x.shape
        return (
            x.reshape(BH // self.heads, self.heads, L, d).permute(0, 2, 1, 3).reshape(-1, L, d * self.heads)
        )

    def forward(self, hidden_states, context=None, mask=None):
        """mask: (B, q, k) bool, True = may attend."""
        context = hidden_states if context is None else context
        q = self.head_to_batch_dim(self.to_q(hidden_states))  # (B*H, q, d)
        k = self.head_to_batch_dim(self.to_k(context))  # (B*H, k, d)
        v = self.head_to_batch_dim(self.to_v(context))
        scores = q @ k.transpose(-1, -2) * self.scale  # (B*H, q, k)
        keep = mask.repeat_interleave(self.heads, dim=0)  # (B*H, q, k)
        scores = torch.where(keep, scores, torch.tensor(float("-inf")))
        probs = scores.softmax(dim=-1)
        self.sink.append((self.label, probs.detach().reshape(-1, self.heads, *probs.shape[1:]).clone()))
        return self.to_out(self.batch_to_head_dim(probs @ v))


class Block(nn.Module):
    def __init__(self, sink: list, with_memory: bool):
        super().__init__()
        self.norm1, self.attn1 = (
            nn.LayerNorm(D_MODEL),
            Attention(sink, "dec_self" if with_memory else "enc_self"),
        )
        self.norm2 = nn.LayerNorm(D_MODEL)
        self.attn2 = Attention(sink, "cross") if with_memory else None
        self.norm3, self.ff = (
            nn.LayerNorm(D_MODEL),
            nn.Sequential(nn.Linear(D_MODEL, 64), nn.GELU(), nn.Linear(64, D_MODEL)),
        )

    def forward(self, x, self_mask, memory=None, memory_mask=None):
        x = x + self.attn1(self.norm1(x), mask=self_mask)
        if self.attn2 is not None:
            x = x + self.attn2(self.norm2(x), context=memory, mask=memory_mask)
        return x + self.ff(self.norm3(x))


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embed = nn.Embedding(VOCAB_SIZE, D_MODEL, padding_idx=PAD)  # shared by source and target
        self.pos = nn.Parameter(torch.randn(64, D_MODEL) * 0.02)
        self.src_blocks = nn.ModuleList(Block(self.computed, False) for _ in range(N_LAYERS))
        self.tgt_blocks = nn.ModuleList(Block(self.computed, True) for _ in range(N_LAYERS))
        self.lm_head = nn.Linear(D_MODEL, VOCAB_SIZE)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, src, tgt):
        S, T = src.shape[1], tgt.shape[1]
        src_keep, tgt_keep = src != PAD, tgt != PAD  # (B, S), (B, T)
        enc_mask = src_keep[:, None, :].expand(-1, S, -1)  # (B, S, S)
        dec_mask = tgt_keep[:, None, :] & torch.ones(T, T, dtype=torch.bool).tril()  # (B, T, T)
        mem_mask = src_keep[:, None, :].expand(-1, T, -1)  # (B, T, S)
        memory = self.embed(src) + self.pos[:S]
        for block in self.src_blocks:
            memory = block(memory, enc_mask)
        x = self.embed(tgt) + self.pos[:T]
        for block in self.tgt_blocks:
            x = block(x, dec_mask, memory, mem_mask)
        return self.lm_head(x)


def build(seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """src (3, 7) with 7, 5, 3 real tokens; tgt (3, 6) with BOS first and 6, 4, 2 real tokens."""
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 3, 4, 5, 6, 7], [1, 8, 9, 10, 0, 0], [1, 11, 0, 0, 0, 0]])
    return src, tgt
