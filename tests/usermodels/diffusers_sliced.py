"""A text-conditioned denoiser block as diffusers writes it, with attention slicing switched on to
save memory: latents ``(B, C, H, W)`` flattened to tokens by a 1x1 ``nn.Conv2d``, self-attention over
them, then cross-attention to a text encoder's states with its padding mask. Each attention folds
the heads batch-major (``head_to_batch_dim``), preprocesses the mask to ``(B*H, 1, K)`` with
``repeat_interleave``, and computes the weights ``slice_size`` rows of the fold at a time through
``get_attention_scores`` (``baddbmm`` with ``beta=0`` on an empty tensor, or ``beta=1`` on the mask),
writing each slice's output into a preallocated tensor. forward(latents, ids) -> noise (B, C, H, W).
"""

from __future__ import annotations

import torch
from torch import nn

PAD = 0
VOCAB_SIZE = 40


class Attention(nn.Module):
    def __init__(self, query_dim: int, heads: int, dim_head: int, sink: list, kind: str, cross_dim=None):
        super().__init__()
        inner = heads * dim_head
        self.heads, self.scale, self.kind, self.sink = heads, dim_head**-0.5, kind, sink
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(cross_dim or query_dim, inner, bias=False)
        self.to_v = nn.Linear(cross_dim or query_dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, query_dim), nn.Dropout(0.0)])
        self.slice_size = 3  # rows of the (batch * heads) fold per slice: a whole head count here

    def head_to_batch_dim(self, tensor):
        batch_size, seq_len, dim = tensor.shape
        tensor = tensor.reshape(batch_size, seq_len, self.heads, dim // self.heads)
        return tensor.permute(0, 2, 1, 3).reshape(batch_size * self.heads, seq_len, dim // self.heads)

    def batch_to_head_dim(self, tensor):
        batch_size, seq_len, dim = tensor.shape
        tensor = tensor.reshape(batch_size // self.heads, self.heads, seq_len, dim)
        return tensor.permute(0, 2, 1, 3).reshape(batch_size // self.heads, seq_len, dim * self.heads)

    def prepare_attention_mask(self, attention_mask, target_length):
        # (B, K) with 1 = keep -> additive (B*H, 1, K)
        bias = (1.0 - attention_mask[:, None, :].float()) * -10000.0
        return bias.repeat_interleave(self.heads, dim=0)

    def get_attention_scores(self, query, key, attention_mask=None):
        if attention_mask is None:
            baddbmm_input = torch.empty(query.shape[0], query.shape[1], key.shape[1], dtype=query.dtype)
            beta = 0
        else:
            baddbmm_input = attention_mask.expand(-1, query.shape[1], -1)
            beta = 1
        attention_scores = torch.baddbmm(
            baddbmm_input, query, key.transpose(-1, -2), beta=beta, alpha=self.scale
        )
        return attention_scores.softmax(dim=-1)

    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None):
        batch_size, sequence_length, _ = hidden_states.shape
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        if attention_mask is not None:
            attention_mask = self.prepare_attention_mask(attention_mask, context.shape[1])
        query = self.head_to_batch_dim(self.to_q(hidden_states))
        key = self.head_to_batch_dim(self.to_k(context))
        value = self.head_to_batch_dim(self.to_v(context))
        batch_size_attention, query_tokens, _ = query.shape
        hidden = torch.zeros((batch_size_attention, query_tokens, value.shape[-1]), dtype=query.dtype)
        slices = []
        for i in range((batch_size_attention - 1) // self.slice_size + 1):
            start_idx, end_idx = i * self.slice_size, (i + 1) * self.slice_size
            mask_slice = attention_mask[start_idx:end_idx] if attention_mask is not None else None
            attn_slice = self.get_attention_scores(
                query[start_idx:end_idx], key[start_idx:end_idx], mask_slice
            )
            slices.append(attn_slice.detach().clone())
            hidden[start_idx:end_idx] = torch.bmm(attn_slice, value[start_idx:end_idx])
        full = torch.cat(slices).view(batch_size, self.heads, query_tokens, context.shape[1])
        self.sink.append((self.kind, full))
        hidden = self.batch_to_head_dim(hidden)
        return self.to_out[1](self.to_out[0](hidden))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, text_dim: int, sink: list):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, dim // heads, sink, "enc_self")
        self.attn2 = Attention(dim, heads, dim // heads, sink, "cross", cross_dim=text_dim)

    def forward(self, x, text, text_mask):
        x = x + self.attn1(self.norm1(x))
        return x + self.attn2(self.norm2(x), text, attention_mask=text_mask)


class Denoiser(nn.Module):
    def __init__(self, channels: int = 4, dim: int = 24, heads: int = 3, text_dim: int = 16):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.text = nn.Embedding(VOCAB_SIZE, text_dim)
        self.proj_in = nn.Conv2d(channels, dim, 1)
        self.block = TransformerBlock(dim, heads, text_dim, self.computed)
        self.proj_out = nn.Conv2d(dim, channels, 1)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, latents, ids):
        b, _, h, w = latents.shape
        x = self.proj_in(latents).flatten(2).transpose(1, 2)  # (B, H*W, dim)
        x = self.block(x, self.text(ids), ids != PAD)
        return self.proj_out(x.transpose(1, 2).reshape(b, -1, h, w))


def build(seed: int = 0) -> Denoiser:
    torch.manual_seed(seed)
    return Denoiser().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """latents (2, 4, 2, 3) -> 6 tokens; prompts (2, 5), the second padded after 3 tokens."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB_SIZE, (2, 5), generator=g)
    ids[1, 3:] = PAD
    return torch.randn(2, 4, 2, 3, generator=g), ids
