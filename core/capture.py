"""Per-head attention from models built with torch.nn (Transformer, TransformerEncoder/Decoder, MultiheadAttention).

    with capture_attention(model) as cap:
        out = model(src, tgt)
    cap.stacks()          # {"enc_self": (B, layer, head, q, k), "dec_self": ..., "cross": ...}
    cap.trace(0, src_tokens=..., tgt_tokens=...)  # an AttentionTrace for sequence 0

How: every ``nn.MultiheadAttention`` inside gets an instance-level ``forward`` that first calls
the original forward exactly as the caller asked (so the model receives the very output it
would have received), then a second time, without gradients, with ``need_weights=True,
average_attn_weights=False``, keeping only the per-head weights (that second call's output is
discarded; in training mode the RNG state is restored around it, so dropout draws do not move).
Scores (q.k/sqrt(d_head), before mask and softmax) are recomputed from the module's input
projections, except for modules with bias_k / add_zero_attn.

PyTorch's fast path (the fused TransformerEncoderLayer kernel and nested tensors, taken in eval
mode without gradients) never calls ``self_attn.forward``, so it is switched off
(``torch.backends.mha.set_fastpath_enabled(False)``) while a capture is open. The python path
computes the same math, but not bit for bit, and where the fast path turned a padded batch into
a nested tensor it returns 0 at PAD positions where the python path returns values. When the
outputs must be exactly those of an uncaptured call, use ``capture_call(model, ...)``: it runs
the model once normally (that output is returned) and once under capture.

Kinds: ``TransformerEncoderLayer.self_attn`` -> enc_self, ``TransformerDecoderLayer.self_attn``
-> dec_self, ``TransformerDecoderLayer.multihead_attn`` -> cross. A bare MultiheadAttention is
cross when its query is not its key, dec_self when its mask is causal, else enc_self (or pass
``kinds={module_name: kind}``). Layers are numbered in call order per kind.

On exit, always (even when the forward raised), the instance attributes are deleted (the class
forward and its fast path are back) and the fast-path flag is restored. The patch is visible to
every thread using the module: do not capture on a model another thread is running.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.trace import KINDS, AttentionTrace

_FASTPATH_LOCK = threading.Lock()
_FASTPATH_DEPTH = 0
_FASTPATH_SAVED = True


@dataclass(frozen=True)
class Record:
    """One attention call: per-head weights (B, H, q, k), scores or None, allowed mask (B, q, k) or None."""

    name: str  # module path inside the model
    kind: str  # enc_self | dec_self | cross
    probs: torch.Tensor
    scores: torch.Tensor | None
    mask: torch.Tensor | None  # bool, True = may attend (our convention)


@dataclass
class Captured:
    records: list[Record] = field(default_factory=list)

    def kinds(self) -> tuple[str, ...]:
        found = {r.kind for r in self.records}
        return tuple(k for k in KINDS if k in found)

    def of(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]

    def stacks(self, what: str = "probs") -> dict[str, torch.Tensor]:
        """kind -> (B, layer, head, q, k) of probs (or "scores"), layers in call order."""
        out = {}
        for kind in self.kinds():
            recs = self.of(kind)
            tensors = [getattr(r, what) for r in recs]
            if any(t is None for t in tensors):
                continue
            shapes = {tuple(t.shape) for t in tensors}
            if len(shapes) > 1:
                raise ValueError(
                    f"{kind} calls have different shapes {sorted(shapes)}: was the model run more than once "
                    "(e.g. step-by-step decoding)? Use .records for the individual calls"
                )
            out[kind] = torch.stack(tensors, dim=1)
        return out

    def masks(self) -> dict[str, torch.Tensor | None]:
        """kind -> (B, q, k) bool mask of its first layer (None when the call had no mask)."""
        return {k: self.of(k)[0].mask for k in self.kinds()}

    def trace(
        self,
        index: int = 0,
        src_tokens: tuple[str, ...] | list[str] = (),
        tgt_tokens: tuple[str, ...] | list[str] = (),
        model: str = "torch.nn",
        output_text: str = "",
    ) -> AttentionTrace:
        """An AttentionTrace of sequence ``index``: probs, scores, masks (all-True where no mask was given)."""
        probs, scores = self.stacks("probs"), self.stacks("scores")
        kw: dict[str, Any] = {}
        for kind, p in probs.items():
            p = p[index]  # (layer, head, q, k)
            kw[kind] = p.float().cpu().numpy()
            if kind in scores:
                kw[f"{kind}_scores"] = scores[kind][index].float().cpu().numpy()
            m = self.of(kind)[0].mask
            kw[f"{kind}_mask"] = (
                np.ones(p.shape[-2:], dtype=bool) if m is None else m[index].cpu().numpy().astype(bool)
            )
        return AttentionTrace(
            model=model,
            config_name="torch.nn",
            device=str(next(iter(probs.values())).device) if probs else "cpu",
            src_tokens=tuple(src_tokens),
            tgt_tokens=tuple(tgt_tokens),
            output_text=output_text,
            meta={"kind": "torch.nn", "capture": "nn.MultiheadAttention"},
            **kw,
        )


# -- masks and scores ---------------------------------------------------------------------
def _allowed(m: torch.Tensor) -> torch.Tensor:
    """torch.nn mask (bool: True = NOT allowed; float: additive, -inf = not allowed) -> True = allowed."""
    return ~m if m.dtype == torch.bool else torch.isfinite(m) & (m > torch.finfo(m.dtype).min / 2)


def _mask(b: int, h: int, lq: int, lk: int, attn_mask, key_padding_mask, is_causal: bool, device):
    """Allowed mask (B, q, k) from MultiheadAttention's arguments, or None when nothing is masked."""
    if attn_mask is None and key_padding_mask is None and not is_causal:
        return None
    allowed = torch.ones(b, lq, lk, dtype=torch.bool, device=device)
    if attn_mask is not None:
        am = _allowed(attn_mask)
        if am.dim() == 3:  # (B*H, q, k): keep a query/key pair if any head may use it
            am = am.view(b, h, lq, lk).any(dim=1)
        allowed = allowed & am
    elif is_causal:
        allowed = allowed & torch.ones(lq, lk, dtype=torch.bool, device=device).tril()
    if key_padding_mask is not None:
        allowed = allowed & _allowed(key_padding_mask).view(b, 1, lk)
    return allowed


def _scores(mha: nn.MultiheadAttention, query, key) -> torch.Tensor | None:
    """(B, H, q, k) q.k/sqrt(d_head) from the module's own projections (batch-first inputs)."""
    if mha.bias_k is not None or mha.add_zero_attn:
        return None
    e, h = mha.embed_dim, mha.num_heads
    bias = mha.in_proj_bias
    bq = bk = None
    if bias is not None:
        bq, bk = bias[:e], bias[e : 2 * e]
    if mha._qkv_same_embed_dim:
        wq, wk = mha.in_proj_weight[:e], mha.in_proj_weight[e : 2 * e]
    else:
        wq, wk = mha.q_proj_weight, mha.k_proj_weight
    q = F.linear(query, wq, bq)  # (B, q, E)
    k = F.linear(key, wk, bk)  # (B, k, E)
    b, lq, lk, d = q.shape[0], q.shape[1], k.shape[1], e // h
    q = q.view(b, lq, h, d).transpose(1, 2)  # (B, H, q, d)
    k = k.view(b, lk, h, d).transpose(1, 2)  # (B, H, k, d)
    return q @ k.transpose(-2, -1) / math.sqrt(d)


def _is_causal_mask(mask: torch.Tensor | None) -> bool:
    if mask is None or mask.shape[-1] != mask.shape[-2]:
        return False
    causal = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).tril()
    return bool((mask == causal).all())


# -- kinds --------------------------------------------------------------------------------------
def _layer_kinds(model: nn.Module) -> dict[str, str]:
    """module name -> kind for attention modules inside torch.nn encoder/decoder layers."""
    kinds = {}
    for name, mod in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(mod, nn.TransformerEncoderLayer):
            kinds[prefix + "self_attn"] = "enc_self"
        elif isinstance(mod, nn.TransformerDecoderLayer):
            kinds[prefix + "self_attn"] = "dec_self"
            kinds[prefix + "multihead_attn"] = "cross"
    return kinds


# -- the patch ------------------------------------------------------------------------------------
@contextlib.contextmanager
def _fastpath_off() -> Iterator[None]:
    global _FASTPATH_DEPTH, _FASTPATH_SAVED
    with _FASTPATH_LOCK:
        if _FASTPATH_DEPTH == 0:
            _FASTPATH_SAVED = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)
        _FASTPATH_DEPTH += 1
    try:
        yield
    finally:
        with _FASTPATH_LOCK:
            _FASTPATH_DEPTH -= 1
            if _FASTPATH_DEPTH == 0:
                torch.backends.mha.set_fastpath_enabled(_FASTPATH_SAVED)


def _wrap(mha: nn.MultiheadAttention, name: str, fixed_kind: str | None, cap: Captured):
    original = type(mha).forward.__get__(mha)  # the class forward, bound

    def forward(
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights=True,
        attn_mask=None,
        average_attn_weights=True,
        is_causal=False,
    ):
        out = original(
            query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal,
        )  # fmt: skip
        record_mask = attn_mask
        if is_causal and attn_mask is None:  # MultiheadAttention needs the mask itself to give weights
            n = query.shape[-2] if query.dim() == 2 else query.shape[1 if mha.batch_first else 0]
            record_mask = ~torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
        rng = torch.random.fork_rng(devices=[query.device] if query.is_cuda else []) if mha.training else None
        with torch.no_grad(), rng or contextlib.nullcontext():
            _, weights = original(
                query, key, value, key_padding_mask=key_padding_mask, need_weights=True,
                attn_mask=record_mask, average_attn_weights=False, is_causal=False,
            )  # fmt: skip
        unbatched = query.dim() == 2
        q_, k_ = (query[None], key[None]) if unbatched else (query, key)
        if not mha.batch_first and not unbatched:
            q_, k_ = q_.transpose(0, 1), k_.transpose(0, 1)  # (B, L, E)
        weights = weights[None] if unbatched else weights  # (B, H, q, k)
        b, h, lq, lk = weights.shape
        kpm = key_padding_mask[None] if unbatched and key_padding_mask is not None else key_padding_mask
        allowed = _mask(b, h, lq, lk, record_mask, kpm, False, weights.device)
        if fixed_kind is not None:
            kind = fixed_kind
        elif query is not key:
            kind = "cross"
        else:
            kind = "dec_self" if allowed is not None and _is_causal_mask(allowed[0]) else "enc_self"
        with torch.no_grad():
            scores = _scores(mha, q_, k_)
        cap.records.append(
            Record(name, kind, weights.detach(), None if scores is None else scores.detach(), allowed)
        )
        return out

    return forward


@contextlib.contextmanager
def capture_attention(model: nn.Module, kinds: dict[str, str] | None = None) -> Iterator[Captured]:
    """Record per-head attention of every nn.MultiheadAttention in ``model`` during the block."""
    cap = Captured()
    fixed = {**_layer_kinds(model), **(kinds or {})}
    patched: list[nn.MultiheadAttention] = []
    with _fastpath_off():
        try:
            for name, mod in model.named_modules():
                if isinstance(mod, nn.MultiheadAttention):
                    if "forward" in mod.__dict__:
                        raise RuntimeError(f"{name or 'model'} is already being captured (nested capture)")
                    mod.forward = _wrap(mod, name, fixed.get(name), cap)
                    patched.append(mod)
            yield cap
        finally:
            for mod in patched:
                del mod.forward  # the class forward (and with it the fast path) is back


def capture_call(
    model: nn.Module, *args, kinds: dict[str, str] | None = None, **kwargs
) -> tuple[Any, Captured]:
    """(model(*args, **kwargs) exactly as without capture, the attention of a second, captured call)."""
    output = model(*args, **kwargs)
    with capture_attention(model, kinds) as cap:
        model(*args, **kwargs)
    return output, cap
