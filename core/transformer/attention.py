"""Multi-head scaled dot-product attention with explicit capture.

Two paths compute the same numbers:
- the fast path (no capture) calls ``F.scaled_dot_product_attention``;
- the explicit path (``return_attn=True``) computes scores and probabilities
  step by step and returns them, so what a plot shows is what the model used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class AttnMaps:
    """What one attention call computed: ``[batch, head, query, key]`` each."""

    scores: torch.Tensor  # q.k / sqrt(d_head), before masking and softmax
    probs: torch.Tensor  # softmax over allowed keys; masked entries exactly 0
    # ||f_h(x_j)|| per key, [batch, head, key]: f_h(x) = (x W_V,h + b_V,h) W_O,h, what head h moves from key
    # j per unit of weight (the head's output at query i is sum_j probs_ij f_h(x_j))
    value_norms: torch.Tensor | None = None
    # ||x_i|| of the residual stream the attention's output is added to, [batch, query] (written by the
    # layer around the attention; the identity term of the norm-based rollout)
    residual_norms: torch.Tensor | None = None


def head_value_norms(
    v: torch.Tensor, w_o: torch.Tensor, head_keep: torch.Tensor | None = None
) -> torch.Tensor:
    """||v_hj W_O,h^T|| for v (B, H, L, dh) and the output projection's weight w_o (D, H*dh): (B, H, L).

    Through each head's Gram matrix G_h = W_O,h^T W_O,h (dh x dh): ||v W^T||^2 = v G v^T, without making
    the (B, H, L, D) vectors. A head switched off (head_keep 0) moves nothing."""
    b, h, n, dh = v.shape
    w = w_o.reshape(w_o.shape[0], h, dh).to(v.dtype)  # (D, H, dh)
    gram = torch.einsum("dhe,dhf->hef", w, w)  # (H, dh, dh)
    sq = torch.einsum("bhle,hef,bhlf->bhl", v, gram, v)
    norms = sq.clamp_min(0).sqrt()
    if head_keep is not None:
        norms = norms * head_keep.to(norms.dtype).view(1, -1, 1)
    return norms


@dataclass(frozen=True)
class Intervention:
    """Deliberate changes to the forward pass (mask-lab bugs, head ablation).

    Anything set here forces the explicit path; the default changes nothing.
    """

    neg_inf_fill: bool = False  # fill masked scores with -inf and skip the fully-masked guard
    head_mask: dict[str, torch.Tensor] = field(default_factory=dict)  # kind -> [layer, head], 0 = off

    @property
    def active(self) -> bool:
        return self.neg_inf_fill or bool(self.head_mask)


def scaled_dot_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    neg_inf_fill: bool = False,
    into: AttnMaps | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, the one place masks become scores.

    q: (B, H, Lq, d), k and v: (B, H, Lk, d), mask: bool broadcastable to (B, H, Lq, Lk),
    True = may attend. Returns (out (B, H, Lq, d), probs, scores), probs and scores (B, H, Lq, Lk).
    Masked scores are filled with the dtype's most negative finite number, so a fully
    masked row never becomes NaN; its probabilities are then set to exactly 0.
    ``into``: tensors of that shape (a layer's slice of the model's map buffers) that receive the
    scores and probabilities as they are computed (the same kernels, so the same numbers), and
    are returned: no per-layer copy to stack afterwards.
    """
    # In-place steps where a tensor is not kept (the same numbers, fewer [B, H, Lq, Lk] allocations;
    # bench/capture_overhead.py); scores must not be changed after it is returned.
    direct = (
        into is not None
        and into.scores.dtype == q.dtype
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
    )
    kt = k.transpose(-2, -1)
    buffers = into if direct else None  # (direct implies into is not None)
    scores = torch.matmul(q, kt, out=buffers.scores) if buffers is not None else q @ kt
    scores.div_(math.sqrt(q.shape[-1]))  # (B, H, Lq, Lk)
    out = buffers.probs if buffers is not None else None

    def softmax(x: torch.Tensor) -> torch.Tensor:
        return x.softmax(dim=-1) if out is None else torch.softmax(x, dim=-1, out=out)

    if mask is None:
        probs = softmax(scores)
    elif neg_inf_fill:  # the classic bug: a fully masked row turns into NaN
        probs = softmax(scores.masked_fill(~mask, float("-inf")))
    elif bool(mask.all()):  # nothing masked (no padding, not causal): filling would change nothing
        probs = softmax(scores)
    else:
        # where(): the same numbers as scores.masked_fill(~mask, min) in one pass (not a copy, then a fill)
        probs = softmax(torch.where(mask, scores, torch.finfo(scores.dtype).min))
        # A masked key in a row with an allowed key gets exp(min - max) = exactly 0 already; only a row
        # with no allowed key at all (softmax spread it evenly over masked keys) must be set to 0. The
        # test reads the small bool mask, not the [B, H, Lq, Lk] maps (a full masked_fill pass was ~7%
        # of a traced forward at 512 tokens).
        dead = ~mask.any(dim=-1, keepdim=True)  # (B, 1|H, Lq, 1)
        if bool(dead.any()):  # in place unless autograd needs softmax's own output for its backward pass
            probs = probs.masked_fill(dead, 0.0) if probs.requires_grad else probs.masked_fill_(dead, 0.0)
    if into is not None and not direct:  # another dtype (autocast) or autograd: a detached copy
        with torch.no_grad():
            into.scores.copy_(scores)
            into.probs.copy_(probs)
    return probs @ v, probs, scores


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, dh)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_attn: bool = False,
        neg_inf_fill: bool = False,
        head_keep: torch.Tensor | None = None,
        into: AttnMaps | None = None,
    ) -> tuple[torch.Tensor, AttnMaps | None]:
        """query (B, Lq, D), key/value (B, Lk, D), mask bool (B, Lq, Lk) or (B, 1|H, Lq, Lk).

        head_keep: optional (H,) tensor, 0 switches a head's output off (ablation).
        into: with return_attn, (B, H, Lq, Lk) tensors the maps are written into (and returned).
        Returns (out (B, Lq, D), AttnMaps or None).
        """
        b, lq, d = query.shape
        q, k, v = self._split(self.w_q(query)), self._split(self.w_k(key)), self._split(self.w_v(value))
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]  # (B, 1, Lq, Lk)
        explicit = return_attn or neg_inf_fill or head_keep is not None
        maps = None
        if explicit:
            out, probs, scores = scaled_dot_product(
                q, k, v, mask, neg_inf_fill, into if return_attn else None
            )
            if self.training and self.attn_dropout.p > 0:
                out = self.attn_dropout(probs) @ v
            if return_attn:
                norms = head_value_norms(v.detach(), self.w_o.weight.detach(), head_keep)
                if into is not None and into.value_norms is not None:
                    into.value_norms.copy_(norms)
                    norms = into.value_norms
                maps = AttnMaps(scores=scores.detach(), probs=probs.detach(), value_norms=norms,
                                residual_norms=None if into is None else into.residual_norms)  # fmt: skip
        else:
            dropout_p = self.attn_dropout.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
            if mask is not None:
                # SDPA's answer for a fully masked row depends on the backend; ours is 0.
                out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        if head_keep is not None:
            out = out * head_keep.to(out.dtype).view(1, -1, 1, 1)
        out = out.transpose(1, 2).reshape(b, lq, d)  # (B, Lq, D)
        return self.w_o(out), maps
