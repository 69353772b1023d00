"""Head analytics: per-head statistics, attention rollout, cross-attention attribution, ablation, diffs.

Everything here is numpy on ``[layer, head, query, key]`` attention (``AttentionTrace``
tensors); nothing draws. Statistics average over real (non-PAD) query rows and only
count real keys, so padding in a batch does not change a head's numbers.
"""

from __future__ import annotations

import numpy as np

from attnscope.core.analysis.audit import kind_sides, real_positions
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer.attention import Intervention

STATS = ("entropy", "distance", "diagonal", "previous", "next", "first", "last")
CROSS_STATS = STATS + ("monotonic",)
STAT_LABELS = {
    "entropy": "entropy (nats)",
    "distance": "mean |query - key|",
    "diagonal": "diagonal / self",
    "previous": "previous token",
    "next": "next token",
    "first": "first token (BOS/CLS)",
    "last": "last token (EOS/SEP)",
    "monotonic": "monotonic alignment (Kendall tau)",
}


def _mean_rows(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Mean over the query axis (last) of (L, H, Q) restricted to ``rows``; NaN when none."""
    if not rows.any():
        return np.full(x.shape[:2], np.nan)
    return x[..., rows].mean(-1, dtype=np.float64)


def _at_offset(p: np.ndarray, q_ok: np.ndarray, k_ok: np.ndarray, offset: int) -> np.ndarray:
    """Mean of p[q, q + offset] over valid rows whose key q + offset exists and is valid."""
    n_q, n_k = p.shape[-2:]
    q = np.arange(n_q)
    k = q + offset
    ok = q_ok & (k >= 0) & (k < n_k)
    ok[ok] &= k_ok[k[ok]]
    vals = p[..., q, np.clip(k, 0, n_k - 1)]  # (L, H, Q)
    return _mean_rows(vals, ok)


def kendall_tau(values: np.ndarray) -> np.ndarray:
    """Kendall tau-a of (position, value) along the last axis: +1 increasing, -1 decreasing, 0 flat."""
    n = values.shape[-1]
    if n < 2:
        return np.full(values.shape[:-1], np.nan)
    diff = np.sign(values[..., None, :] - values[..., :, None])  # (..., n, n): sign(v_j - v_i)
    upper = np.triu(np.ones((n, n), dtype=bool), 1)
    return diff[..., upper].sum(-1) / (n * (n - 1) / 2)


def head_stats(
    probs: np.ndarray,
    q_valid: np.ndarray | None = None,
    k_valid: np.ndarray | None = None,
    cross: bool = False,
) -> dict[str, np.ndarray]:
    """Per-head statistics of attention probs (L, H, Q, K); each value (L, H).

    entropy: mean over rows of -sum p log p (uniform over n keys = log n);
    distance: mean over rows of sum_k p |q - k|;
    diagonal / previous / next: mean p[q, q], p[q, q-1], p[q, q+1];
    first / last: mean mass on the first / last valid key (BOS/CLS, EOS/SEP in our formats);
    monotonic (cross=True): Kendall tau between query position and its argmax key.
    """
    p = np.asarray(probs)
    if p.dtype not in (np.float32, np.float64):
        p = p.astype(np.float32)
    n_q, n_k = p.shape[-2:]
    q_ok = np.ones(n_q, bool) if q_valid is None else np.asarray(q_valid, bool)
    k_ok = np.ones(n_k, bool) if k_valid is None else np.asarray(k_valid, bool)
    keys = np.nonzero(k_ok)[0]
    pk = p if len(keys) == n_k else p[..., keys]  # (L, H, Q, K'): real keys only
    # Vectorised in the maps' own dtype (float32: 20-30x faster than float64 with np.where at 512
    # tokens), row sums accumulated in float64. NaN weights stay NaN; p = 0 contributes 0.
    plogp = np.zeros_like(pk)
    with np.errstate(invalid="ignore"):
        np.log(pk, out=plogp, where=pk > 0)
    plogp *= pk
    dist = np.abs(np.arange(n_q)[:, None] - keys[None, :]).astype(pk.dtype)  # (Q, K')
    out = {
        "entropy": _mean_rows(-plogp.sum(-1, dtype=np.float64), q_ok),
        "distance": _mean_rows(np.einsum("...qk,qk->...q", pk, dist).astype(np.float64), q_ok),
        "diagonal": _at_offset(p, q_ok, k_ok, 0),
        "previous": _at_offset(p, q_ok, k_ok, -1),
        "next": _at_offset(p, q_ok, k_ok, 1),
        "first": _mean_rows(p[..., keys[0]].astype(np.float64), q_ok)
        if len(keys)
        else np.full(p.shape[:2], np.nan),
        "last": _mean_rows(p[..., keys[-1]].astype(np.float64), q_ok)
        if len(keys)
        else np.full(p.shape[:2], np.nan),
    }
    if cross:
        arg = np.where(k_ok, np.nan_to_num(p, nan=-1.0), -np.inf).argmax(-1)  # (L, H, Q)
        out["monotonic"] = kendall_tau(arg[..., q_ok].astype(np.float64))
    return out


def trace_head_stats(trace: AttentionTrace, kind: str, pad_id: int | None = None) -> dict[str, np.ndarray]:
    """head_stats of one kind of a trace, PAD queries and keys left out."""
    qside, kside = kind_sides(kind)
    q_real, k_real = real_positions(trace, qside, pad_id), real_positions(trace, kside, pad_id)
    return head_stats(trace.probs(kind), q_real, k_real, cross=kind == "cross")


def head_records(
    trace: AttentionTrace, pad_id: int | None = None, stats_by_kind: dict[str, dict] | None = None
) -> list[dict]:
    """One row per (kind, layer, head) with every statistic (a sortable table's rows).
    ``stats_by_kind``: trace_head_stats of each kind when already computed (not computed again)."""
    rows = []
    for kind in trace.kinds:
        stats = (stats_by_kind or {}).get(kind) or trace_head_stats(trace, kind, pad_id)
        n_layers, n_heads = stats["entropy"].shape
        for ly in range(n_layers):
            for h in range(n_heads):
                row = {"kind": kind, "layer": ly, "head": h}
                row.update({s: float(stats[s][ly, h]) if s in stats else float("nan") for s in CROSS_STATS})
                rows.append(row)
    return rows


# -- rollout and attribution -----------------------------------------------------------------------


def rollout(probs: np.ndarray, residual: float = 0.5, valid: np.ndarray | None = None) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020) of self-attention probs (L, H, S, S).

    Per layer: A = mean over heads, A' = residual * I + (1 - residual) * A, rows normalised;
    rollout after layer l = A'_l @ ... @ A'_0. Returns (L, S', S') (S' = valid tokens, all by
    default); the last entry is the rollout of the whole encoder.
    """
    heads_mean = np.asarray(probs).mean(axis=1, dtype=np.float64)  # (L, S, S): the head mean first (cheap)
    if valid is not None:
        v = np.asarray(valid, bool)
        heads_mean = heads_mean[:, v][:, :, v]
    n = heads_mean.shape[-1]
    eye = np.eye(n)
    out, acc = [], eye
    for layer in heads_mean:
        a = residual * eye + (1 - residual) * layer  # (S, S)
        sums = a.sum(-1, keepdims=True)
        a = a / np.where(sums == 0, 1.0, sums)
        acc = a @ acc
        out.append(acc)
    return np.stack(out)


def source_attribution(
    trace: AttentionTrace, through_encoder: bool = True, layer: int | None = None, residual: float = 0.5
) -> np.ndarray:
    """(T, S) share of each source token in each target position's cross-attention input.

    Cross attention is averaged over heads (and over decoder layers unless ``layer`` is given);
    through_encoder multiplies by the encoder rollout, so the columns are source tokens rather
    than encoder states. Rows sum to 1 for real target positions.
    """
    c = np.asarray(trace.probs("cross"), dtype=np.float64)
    c = c.mean(1)  # (L, T, S)
    c = c[layer] if layer is not None else c.mean(0)
    if through_encoder:
        c = c @ rollout(trace.probs("enc_self"), residual)[-1]
    return c


def alignment(
    weights: np.ndarray, q_valid: np.ndarray | None = None, k_valid: np.ndarray | None = None
) -> np.ndarray:
    """(Q,) argmax key per query of weights (Q, K) over valid keys; -1 for invalid queries."""
    w = np.asarray(weights, dtype=np.float64)
    if k_valid is not None:
        w = np.where(np.asarray(k_valid, bool)[None, :], np.nan_to_num(w, nan=-1.0), -np.inf)
    arg = np.nan_to_num(w, nan=-1.0).argmax(-1)
    if q_valid is not None:
        arg = np.where(np.asarray(q_valid, bool), arg, -1)
    return arg


def cross_alignment(
    trace: AttentionTrace, layer: int | None = None, head: int | None = None, pad_id: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(weights (T, S), argmax source index per target position, -1 at PAD) of cross attention."""
    c = np.asarray(trace.probs("cross"), dtype=np.float64)
    c = c[:, head] if head is not None else c.mean(1)  # (L, T, S)
    w = c[layer] if layer is not None else c.mean(0)
    return w, alignment(w, real_positions(trace, "tgt", pad_id), real_positions(trace, "src", pad_id))


# -- ablation ------------------------------------------------------------------------------------------


def head_shapes(cfg) -> dict[str, tuple[int, int]]:
    """kind -> (layers, heads) of a core TransformerConfig."""
    shapes = {"enc_self": (cfg.n_enc_layers, cfg.n_heads)}
    if not cfg.is_encoder_only:
        shapes.update(dec_self=(cfg.n_dec_layers, cfg.n_heads), cross=(cfg.n_dec_layers, cfg.n_heads))
    return shapes


def ablation(cfg, off: list[tuple[str, int, int]]) -> Intervention:
    """Intervention that switches off heads ``(kind, layer, head)`` of a core model."""
    import torch

    shapes = head_shapes(cfg)
    keep: dict[str, torch.Tensor] = {}
    for kind, ly, h in off:
        if kind not in shapes:
            raise ValueError(f"this model has no {kind} attention (kinds: {', '.join(shapes)})")
        n_layers, n_heads = shapes[kind]
        if not (0 <= ly < n_layers and 0 <= h < n_heads):
            raise ValueError(
                f"{kind} has layers 0..{n_layers - 1} and heads 0..{n_heads - 1}; got layer {ly} head {h}"
            )
        keep.setdefault(kind, torch.ones(n_layers, n_heads))[ly, h] = 0.0
    return Intervention(head_mask=keep)


def run_ablation(lm, sources: list[str], off: list[tuple[str, int, int]], targets: list[str] | None = None):
    """Traces of a core LoadedModel with heads switched off (teacher-forced on the intact model's output)."""
    from attnscope.core.analysis.bugs import trace_with_bug

    return trace_with_bug(lm, sources, None, targets, ablation(lm.cfg, off))


# -- comparing two traces --------------------------------------------------------------------------------


def _common(a: AttentionTrace, b: AttentionTrace, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Views of both traces' probs over the positions both have (no copy)."""
    pa, pb = a.probs(kind), b.probs(kind)
    if pa.shape[:2] != pb.shape[:2]:
        raise ValueError(
            f"cannot compare {kind}: {pa.shape[0]}x{pa.shape[1]} vs {pb.shape[0]}x{pb.shape[1]} (layers x heads)"
        )
    q, k = min(pa.shape[2], pb.shape[2]), min(pa.shape[3], pb.shape[3])
    return pa[:, :, :q, :k], pb[:, :, :q, :k]


def trace_difference(
    a: AttentionTrace, b: AttentionTrace, kind: str, layer: int | None = None, head: int | None = None
) -> np.ndarray:
    """b - a in float64, (L, H, Q, K) over the positions both have (the first min(Q) queries, min(K)
    keys); with ``layer`` and ``head``, that head's (Q, K) only (computed alone: a page that shows
    one head does not subtract every head of a 512-token trace)."""
    pa, pb = _common(a, b, kind)
    if layer is not None and head is not None:
        pa, pb = pa[layer, head], pb[layer, head]
    return pb.astype(np.float64) - pa.astype(np.float64)


def head_difference(a: AttentionTrace, b: AttentionTrace, kind: str) -> np.ndarray:
    """(L, H) mean total-variation distance 0.5 * sum_k |b - a| over the common query rows."""
    pa, pb = _common(a, b, kind)
    tv = np.empty(pa.shape[:2])
    for ly in range(pa.shape[0]):  # a layer at a time in float64: no (L, H, Q, K) float64 copies
        d = np.abs(pb[ly].astype(np.float64) - pa[ly].astype(np.float64))
        tv[ly] = (0.5 * d.sum(-1)).mean(-1)
    return tv
