"""Attention masks, one convention everywhere.

Every mask is a ``torch.bool`` tensor where ``True`` means *this query may
attend to this key* (the convention of ``F.scaled_dot_product_attention``).
Full masks have shape ``[batch, query, key]``; attention adds the head axis.

Fully masked rows: a query whose keys are all masked (it can only happen with a
hand-made or buggy mask, never with the masks below on non-empty input)
attends to nothing: its probabilities are all exactly 0 and its attention
output is the zero vector (the residual stream passes through unchanged).
This matches what ``F.scaled_dot_product_attention`` returns for such rows
since PyTorch 2.5 and never produces NaN.
"""

from __future__ import annotations

import torch


def padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``[batch, length]`` bool: True where the token is real (not PAD)."""
    return ids != pad_id


def causal_mask(length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[length, length]`` bool: True where key position <= query position."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def enc_self_mask(src_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Encoder self-attention, ``[batch, src, src]``: every query sees every real source key."""
    keys = padding_mask(src_ids, pad_id)  # (B, S)
    return keys[:, None, :].expand(-1, src_ids.shape[1], -1)


def dec_self_mask(tgt_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Decoder self-attention, ``[batch, tgt, tgt]``: causal AND real target key."""
    length = tgt_ids.shape[1]
    keys = padding_mask(tgt_ids, pad_id)[:, None, :]  # (B, 1, T)
    return keys & causal_mask(length, tgt_ids.device)[None]  # (B, T, T)


def cross_mask(tgt_ids: torch.Tensor, src_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Cross-attention, ``[batch, tgt, src]``: every target query sees every real source key."""
    keys = padding_mask(src_ids, pad_id)  # (B, S)
    return keys[:, None, :].expand(-1, tgt_ids.shape[1], -1)


def fully_masked_rows(mask: torch.Tensor) -> torch.Tensor:
    """Bool ``[..., query]``: True for queries that may attend to no key at all."""
    return ~mask.any(dim=-1)


def to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boundary helper: bool (True = allowed) -> float mask with 0 / -inf (libraries' form)."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))


def to_torch_nn(mask: torch.Tensor) -> torch.Tensor:
    """Boundary helper: our convention -> ``torch.nn.MultiheadAttention``'s (True = NOT allowed)."""
    return ~mask
