"""Head analytics: per-head statistics, attention rollout, cross-attention attribution, ablation, diffs.

Everything here is numpy on ``[layer, head, query, key]`` attention (``AttentionTrace``
tensors); nothing draws. Statistics average over real (non-PAD) query rows and only
count real keys, so padding in a batch does not change a head's numbers.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

import numpy as np

from attnscope.core.analysis.audit import PAD_TOKENS, kind_sides, real_positions
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer.attention import Intervention

SPECIAL = re.compile(r"^(<[^<>\s]+>|\[[A-Z]+\]|<\|[^|]+\|>)$")  # <bos>, </s>, [CLS], <|endoftext|>
WORD_MARKS = "Ġ▁#"  # BPE / sentencepiece / WordPiece markers, not part of the word
SINK_WEIGHT = 0.5  # a head is "parked" when at least this share of its weight is on sinks ...
SINK_RATIO = 0.5  # ... and its share of what moves there is at most this fraction of that weight share

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
    learned: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per-head statistics of attention probs (L, H, Q, K); each value (L, H).

    entropy: mean over rows of -sum p log p (uniform over n keys = log n), the weights on ``learned``
    keys outside the sequence (L, H, Q, M) counted too (they complete the rows);
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
    row_plogp = plogp.sum(-1, dtype=np.float64)  # (L, H, Q)
    if learned is not None:  # memory keys, a null key: no position, but part of the row's spread
        lw = np.asarray(learned, dtype=np.float64)
        row_plogp += (lw * np.log(np.where(lw > 0, lw, 1.0))).sum(-1)
    dist = np.abs(np.arange(n_q)[:, None] - keys[None, :]).astype(pk.dtype)  # (Q, K')
    out = {
        "entropy": _mean_rows(-row_plogp, q_ok),
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
    """head_stats of one kind of a trace, PAD queries and keys left out; the entropy counts the weights on
    learned keys outside the sequence (``trace.learned``), so that it is over the whole rows."""
    qside, kside = kind_sides(kind)
    q_real, k_real = real_positions(trace, qside, pad_id), real_positions(trace, kside, pad_id)
    q_real = q_real & trace.asks(kind)
    learned = trace.learned(kind)
    return head_stats(
        trace.probs(kind),
        q_real,
        k_real,
        cross=kind == "cross",
        learned=None if learned is None else learned[1],
    )


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


# -- what attention moves: value-weighted rows, sinks, parked heads ---------------------------------


def is_special(token: str) -> bool:
    """A special token: <bos>, <eos>, </s>, [CLS], [SEP], <|endoftext|> (and <pad>, [PAD])."""
    return bool(SPECIAL.match(token))


def is_punctuation(token: str) -> bool:
    t = token.strip(WORD_MARKS)
    return bool(t) and not is_special(token) and all(unicodedata.category(c).startswith("P") for c in t)


def normalized_moves(probs: np.ndarray, value_norms: np.ndarray) -> np.ndarray:
    """alpha_ij ||f_h(x_j)||, each row scaled to sum 1 (rows that move nothing stay 0), float64.

    probs (..., Q, K) and value_norms (..., K) (the leading axes are layer, head) -> (..., Q, K); the
    same numbers as ``AttentionTrace.moves(kind, normalize=True)``."""
    m = np.asarray(probs, dtype=np.float64) * np.asarray(value_norms, dtype=np.float64)[..., None, :]
    total = m.sum(-1, keepdims=True)
    return np.divide(m, total, out=np.zeros_like(m), where=total > 0)


def sink_keys(key_tokens: Sequence[str], k_valid: np.ndarray | None = None) -> np.ndarray:
    """(K,) bool: the keys attention "parks" on when it has nowhere better to go: the first real key,
    special tokens (<bos>, [CLS], <eos>, [SEP]) and punctuation. PAD is never a sink (its keys are
    masked: real = False)."""
    n = len(key_tokens)
    real = np.ones(n, bool) if k_valid is None else np.asarray(k_valid, bool)
    sinks = np.array(
        [(is_special(t) and t not in PAD_TOKENS) or is_punctuation(t) for t in key_tokens], dtype=bool
    ).reshape(n)
    first = np.nonzero(real)[0]
    if len(first):
        sinks[first[0]] = True
    return sinks & real


def sink_shares(
    probs: np.ndarray,
    sinks: np.ndarray,
    q_valid: np.ndarray | None = None,
    value_norms: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(weight share, moves share) per head, each (L, H): the mean over real query rows of the
    attention weight on sink keys, and of the share of what moves (rows of alpha ||f(x)|| scaled to
    sum 1) that comes from them. moves share is None without value norms."""
    p = np.asarray(probs, dtype=np.float64)
    q_ok = np.ones(p.shape[-2], bool) if q_valid is None else np.asarray(q_valid, bool)
    sel = np.asarray(sinks, bool)
    weight = _mean_rows(p[..., sel].sum(-1), q_ok)
    if value_norms is None:
        return weight, None
    return weight, _mean_rows(normalized_moves(p, value_norms)[..., sel].sum(-1), q_ok)


def parked(
    weight_share: np.ndarray,
    moves_share: np.ndarray,
    min_weight: float = SINK_WEIGHT,
    ratio: float = SINK_RATIO,
) -> np.ndarray:
    """True where a head is parked: weight share >= ``min_weight`` (at least half its weight on
    sinks) and moves share <= ``ratio`` x weight share (what it moves from there is at most half as
    much): the weight is large but carries little. NaN (no value norms) is never parked."""
    w, m = np.asarray(weight_share, dtype=np.float64), np.asarray(moves_share, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return (w >= min_weight) & (m <= ratio * w) & np.isfinite(w) & np.isfinite(m)


def value_weighted_entropy(
    probs: np.ndarray,
    value_norms: np.ndarray,
    q_valid: np.ndarray | None = None,
    k_valid: np.ndarray | None = None,
) -> np.ndarray:
    """(L, H) mean over real query rows of the entropy (nats) of the normalized moves rows: how spread
    out what a head moves is, where ``head_stats``'s entropy says how spread out its weights are."""
    return head_stats(normalized_moves(probs, value_norms), q_valid, k_valid)["entropy"]


def trace_sink_stats(trace: AttentionTrace, kind: str, pad_id: int | None = None) -> dict[str, np.ndarray]:
    """{"sink_weight", "sink_moves", "vw_entropy"} of one kind of a trace, each (L, H); the last two are
    NaN where the trace holds no value norms."""
    qside, kside = kind_sides(kind)
    q_ok, k_ok = real_positions(trace, qside, pad_id), real_positions(trace, kside, pad_id)
    q_ok = q_ok & trace.asks(kind)
    probs, norms = trace.probs(kind), trace.value_norms(kind)
    _, keys = trace.axes(kind)
    weight, moves = sink_shares(probs, sink_keys(keys, k_ok), q_ok, norms)
    nan = np.full(weight.shape, np.nan)
    return {
        "sink_weight": weight,
        "sink_moves": nan if moves is None else moves,
        "vw_entropy": nan if norms is None else value_weighted_entropy(probs, norms, q_ok, k_ok),
    }


def sink_records(trace: AttentionTrace, pad_id: int | None = None) -> list[dict]:
    """One row per (kind, layer, head): the sink tokens' share of the weight and of what moves, whether
    the head is parked, and the sink taking most of its weight; sorted by weight share, highest first."""
    rows = []
    for kind in trace.kinds:
        qside, kside = kind_sides(kind)
        q_ok, k_ok = real_positions(trace, qside, pad_id), real_positions(trace, kside, pad_id)
        q_ok = q_ok & trace.asks(kind)
        _, keys = trace.axes(kind)
        sinks = sink_keys(keys, k_ok)
        p = np.asarray(trace.probs(kind), dtype=np.float64)
        weight, moves = sink_shares(p, sinks, q_ok, trace.value_norms(kind))
        is_parked = parked(weight, moves) if moves is not None else np.zeros(weight.shape, bool)
        idx = np.nonzero(sinks)[0]
        per_key = _mean_rows(np.moveaxis(p[..., idx], -1, 0), q_ok) if len(idx) and q_ok.any() else None
        for (ly, h), w in np.ndenumerate(weight):
            col = per_key[:, ly, h] if per_key is not None else None
            # a head whose rows are all NaN (a broken trace) names no sink
            main = keys[idx[int(np.nanargmax(col))]] if col is not None and np.isfinite(col).any() else ""
            rows.append({
                "kind": kind, "layer": ly, "head": h, "sink weight": float(w),
                "sink moves": float("nan") if moves is None else float(moves[ly, h]),
                "parked": bool(is_parked[ly, h]), "main sink": main,
            })  # fmt: skip
    return sorted(rows, key=lambda r: -r["sink weight"] if np.isfinite(r["sink weight"]) else np.inf)


def parked_sentence(records: Sequence[dict], kind_labels: dict[str, str]) -> str:
    """The sink table in words (markdown: tokens in backticks): per kind, how many heads are parked and
    on which token; "" when no kind has value norms."""
    parts = []
    for kind in dict.fromkeys(r["kind"] for r in records):
        rows = [r for r in records if r["kind"] == kind]
        label = kind_labels.get(kind, kind)
        if all(not np.isfinite(r["sink moves"]) for r in rows):
            continue
        hits = [r for r in rows if r["parked"]]
        if not hits:
            top = rows[0]
            parts.append(
                f"No {label} head is parked (the most on sinks: layer {top['layer']} head {top['head']}, "
                f"{top['sink weight']:.0%} of its weight and {top['sink moves']:.0%} of what it moves)."
            )
            continue
        on: dict[str, int] = {}
        for r in hits:
            on[r["main sink"]] = on.get(r["main sink"], 0) + 1
        tokens = " and ".join(f"`{t}`" for t in sorted(on, key=lambda t: -on[t])[:3])
        heads = ", ".join(
            f"layer {r['layer']} head {r['head']} ({r['sink weight']:.0%} of the weight, "
            f"{r['sink moves']:.0%} of what moves)"
            for r in hits[:4]
        )
        more = f" and {len(hits) - 4} more" if len(hits) > 4 else ""
        parts.append(
            f"{len(hits)} of {len(rows)} {label} heads are parked on {tokens}: they put at least half their "
            f"weight there, but what they move from there is at most half that share: {heads}{more}."
        )
    return " ".join(parts)


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


def norm_layers(
    probs: np.ndarray, value_norms: np.ndarray, residual_norms: np.ndarray | None = None
) -> np.ndarray:
    """Each layer's norm-based mixing matrix (L, Q, K), rows scaled to sum 1:
    C_ij = sum_h alpha^h_ij ||f_h(x_j)|| (+ delta_ij ||x_i|| with ``residual_norms`` (L, Q): the
    residual connection as an identity term weighted by the norm of the stream it keeps)."""
    c = np.einsum(
        "lhqk,lhk->lqk", np.asarray(probs, dtype=np.float64), np.asarray(value_norms, dtype=np.float64)
    )
    if residual_norms is not None:
        n = min(c.shape[1], c.shape[2])
        idx = np.arange(n)
        c[:, idx, idx] += np.asarray(residual_norms, dtype=np.float64)[:, :n]
    total = c.sum(-1, keepdims=True)
    return np.divide(c, total, out=np.zeros_like(c), where=total > 0)


def norm_rollout(
    probs: np.ndarray,
    value_norms: np.ndarray,
    residual_norms: np.ndarray,
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """Norm-based (effective) rollout of self-attention (Kobayashi et al. 2021's residual-aware norms).

    probs (L, H, S, S), value_norms (L, H, S) = ||f_h(x_j)||, residual_norms (L, S) = ||x_i||. Per
    layer C_ij = sum_h alpha^h_ij ||f_h(x_j)|| + delta_ij ||x_i||, rows scaled to sum 1 (over the
    ``valid`` tokens only), then multiplied as attention rollout is: C_l @ ... @ C_0. Returns (L, S', S').
    """
    p = np.asarray(probs, dtype=np.float64)
    vn = np.asarray(value_norms, dtype=np.float64)
    rn = np.asarray(residual_norms, dtype=np.float64)
    if valid is not None:
        v = np.asarray(valid, bool)
        p, vn, rn = p[:, :, v][:, :, :, v], vn[..., v], rn[:, v]
    layers = norm_layers(p, vn, rn)
    out, acc = [], np.eye(p.shape[-1])
    for c in layers:
        acc = c @ acc
        out.append(acc)
    return np.stack(out)


def has_norms(trace: AttentionTrace, *kinds: str) -> bool:
    """Whether the trace holds the value norms (and, for self-attention, the residual norms) that the
    norm-based rollout and attribution need, for every kind named."""
    for kind in kinds:
        if kind not in trace.kinds or trace.value_norms(kind) is None:
            return False
        if kind == "enc_self" and trace.residual_norms(kind) is None:
            return False
    return True


def trace_rollout(
    trace: AttentionTrace, valid: np.ndarray | None = None, method: str = "attention", residual: float = 0.5
) -> np.ndarray:
    """The encoder's rollout: ``rollout`` of its weights, or ``norm_rollout`` (method="norm")."""
    if method == "attention":
        return rollout(trace.probs("enc_self"), residual, valid)
    if method != "norm":
        raise ValueError(f"unknown rollout {method!r}; use 'attention' or 'norm'")
    vn, rn = trace.value_norms("enc_self"), trace.residual_norms("enc_self")
    if vn is None or rn is None:
        raise ValueError("this trace holds no value or residual norms: the norm-based rollout needs them")
    return norm_rollout(trace.probs("enc_self"), vn, rn, valid)


def source_attribution(
    trace: AttentionTrace,
    through_encoder: bool = True,
    layer: int | None = None,
    residual: float = 0.5,
    method: str = "attention",
) -> np.ndarray:
    """(T, S) share of each source token in each target position's cross-attention input.

    Cross attention is averaged over heads (and over decoder layers unless ``layer`` is given);
    through_encoder multiplies by the encoder rollout, so the columns are source tokens rather
    than encoder states. Rows sum to 1 for real target positions. method="norm": per decoder
    layer the cross-attention's what-moves matrix sum_h alpha^h_tj ||f_h(e_j)|| (rows scaled to
    sum 1) instead of the head mean, and the encoder's norm-based rollout.
    """
    if method == "norm":
        vn = trace.value_norms("cross")
        if vn is None or not (not through_encoder or has_norms(trace, "enc_self")):
            raise ValueError("this trace holds no value norms: the norm-based attribution needs them")
        c = norm_layers(trace.probs("cross"), vn)  # (L, T, S)
    elif method == "attention":
        c = np.asarray(trace.probs("cross"), dtype=np.float64).mean(1)  # (L, T, S)
    else:
        raise ValueError(f"unknown attribution {method!r}; use 'attention' or 'norm'")
    c = c[layer] if layer is not None else c.mean(0)
    if through_encoder:
        c = c @ trace_rollout(trace, method=method, residual=residual)[-1]
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
