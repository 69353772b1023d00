"""BERT-style encoder (Hugging Face code shape): additive extended mask (finfo.min at padding) added
to the scores, nn.functional.softmax, grouped-query attention by hand (4 query heads, 2 key/value
heads, repeat_interleave), and a masked-LM head: forward returns logits (B, S, V). Random seeded
weights, character vocabulary.

``encode(text)`` = BOS, the characters, EOS (BOS and EOS play [CLS] and [SEP]). The model's own maps
are in ``model.computed`` as ("enc_self", probs (B, 4, S, S)).
"""

from __future__ import annotations

import math

import torch
from torch import nn

ARCH = "encoder"
VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz ")
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 64
EXAMPLES = ["hello world", "attention"]
_STOI = {c: i for i, c in enumerate(VOCAB) if len(c) == 1}


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int, sink: list):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = n_heads, n_kv_heads, hidden // n_heads
        self.query = nn.Linear(hidden, n_heads * self.head_dim)
        self.key = nn.Linear(hidden, n_kv_heads * self.head_dim)
        self.value = nn.Linear(hidden, n_kv_heads * self.head_dim)
        self.sink = sink

    def transpose_for_scores(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        return x.view(x.size()[:-1] + (n_heads, self.head_dim)).permute(0, 2, 1, 3)  # (B, heads, L, hd)

    def forward(self, hidden_states, attention_mask):
        q = self.transpose_for_scores(self.query(hidden_states), self.num_heads)  # (B, 4, L, hd)
        k = self.transpose_for_scores(self.key(hidden_states), self.num_kv_heads)  # (B, 2, L, hd)
        v = self.transpose_for_scores(self.value(hidden_states), self.num_kv_heads)  # (B, 2, L, hd)
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, 4, L, hd)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (B, 4, L, L)
        scores = scores + attention_mask  # (B, 1, 1, L) additive: 0 or finfo.min
        probs = nn.functional.softmax(scores, dim=-1)
        self.sink.append(("enc_self", probs.detach().clone()))  # (B, 4, L, L)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()  # (B, L, 4, hd)
        return context.view(context.size()[:-2] + (self.num_heads * self.head_dim,))  # (B, L, D)


class Layer(nn.Module):
    def __init__(self, hidden: int, inter: int, sink: list):
        super().__init__()
        self.attention = SelfAttention(hidden, 4, 2, sink)
        self.attn_dense, self.attn_norm = nn.Linear(hidden, hidden), nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Sequential(nn.Linear(hidden, inter), nn.GELU())
        self.out_dense, self.out_norm = nn.Linear(inter, hidden), nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, h, ext):
        a = self.attn_norm(self.attn_dense(self.attention(h, ext)) + h)
        return self.out_norm(self.out_dense(self.intermediate(a)) + a)


class BertForMaskedLM(nn.Module):
    def __init__(self, vocab=len(VOCAB), hidden=32, inter=64, n_layers=2, max_len=MAX_LEN):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=PAD)
        self.position_embeddings = nn.Embedding(max_len, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layer = nn.ModuleList([Layer(hidden, inter, self.computed) for _ in range(n_layers)])
        self.lm_head = nn.Linear(hidden, vocab)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = (input_ids != PAD).long()  # 1 = real token
        ext = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(
            torch.float32
        ).min  # (B, 1, 1, L)
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        h = self.emb_norm(self.word_embeddings(input_ids) + self.position_embeddings(pos))
        for layer in self.layer:
            h = layer(h, ext)
        return self.lm_head(h)  # (B, L, V) logits


def load() -> nn.Module:
    torch.manual_seed(0)
    return BertForMaskedLM()


def encode(text: str) -> list[int]:
    """BOS, the characters (a-z and space, lower-cased), EOS."""
    bad = sorted({c for c in text.lower() if c not in _STOI})
    if bad:
        raise ValueError(f"characters {''.join(bad)!r} are not in the vocabulary (a-z and space)")
    return [BOS] + [_STOI[c] for c in text.lower()] + [EOS]


def forward(model: nn.Module, src: torch.Tensor, tgt: None) -> torch.Tensor:
    return model(src)
