"""Mask audit: static checks on attention traces and black-box leak tests.

Static checks read ``AttentionTrace`` objects only (any model that produces them):
the mask a kind *should* have is derived from the tokens alone (a key is visible iff
it is not PAD, and for ``dec_self`` not in the future), and is compared with what the
model did. Only real (non-PAD) query rows are judged, except for NaN, which is never
harmless because it spreads.

Dynamic checks call the model as a black box through a *forward-outputs function*::

    fwd(src_ids (B, S), tgt_ids (B, T) | None, src_real (B, S) bool, tgt_real (B, T) bool | None)
        -> {"enc": (B, S, ...) tensor, "dec": (B, T, ...) tensor (models with a decoder)}

``*_real`` say where the real tokens are (True = not PAD), independently of the ids,
so a test can change what sits in PAD positions while the padding stays the same.
Every model provides it as ``lm.forward_outputs`` (attnscope.core.families.interface); ``core_forward_outputs``
runs a core model with a mask-lab bug or head ablation injected. Models that build their masks
from the ids themselves (adapters, ``lm.masks_from_ids``) cannot have PAD content changed; for
them (and every model) ``batch_invariance`` runs each sequence alone and compares.

Tolerances: masked mass must be exactly 0; real rows sum to 1 within 1e-5; a leak
test passes when no real-position output moves by more than 1e-5 (float32 noise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from attnscope.core.analysis import bugs as B
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer.attention import Intervention

ROW_SUM_TOL = 1e-5
MAP_CHUNK = 2**20  # values read at once where a check streams through maps
LEAK_TOL = 1e-5
EXTRA_PAD = 2  # PAD columns the leak tests append so that even one text has padding
MAX_VARIANTS = 96  # causal leak: at most this many (sequence, position) changes
CHUNK = 32  # sequences per forward call in the leak tests

PAD_TOKENS = frozenset({"<pad>", "[PAD]"})
BOS_TOKENS = frozenset({"<bos>", "[CLS]", "<s>"})
EOS_TOKENS = frozenset({"<eos>", "[SEP]", "</s>"})

ForwardFn = Callable[..., dict[str, torch.Tensor]]
STATUSES = ("pass", "fail", "skip", "info")


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check. ``detail`` names layer/head/positions and the number measured."""

    name: str
    passed: bool
    detail: str
    status: str = ""  # pass | fail | skip | info (default: from passed)
    kind: str | None = None
    layer: int | None = None
    head: int | None = None
    positions: tuple[int, ...] = ()  # (sequence, query, key) or (sequence, position, changed position)
    value: float | None = None  # the largest mass / deviation / change measured

    def __post_init__(self) -> None:
        if not self.status:
            object.__setattr__(self, "status", "pass" if self.passed else "fail")
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.status == "fail" and self.passed:
            raise ValueError("a failed verdict cannot pass")

    def line(self) -> str:
        return f"{self.status.upper()} {self.name}: {self.detail}"


@dataclass
class AuditReport:
    verdicts: list[Verdict]
    traces: list[AttentionTrace]  # what the static checks looked at
    bug: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    @property
    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.passed]

    def lines(self) -> list[str]:
        return [v.line() for v in self.verdicts]


# -- what the masks should be -----------------------------------------------------------------


def kind_sides(kind: str) -> tuple[str, str]:
    """(query side, key side) of a kind: "src" or "tgt"."""
    return {"enc_self": ("src", "src"), "dec_self": ("tgt", "tgt"), "cross": ("tgt", "src")}[kind]


def real_positions(trace: AttentionTrace, side: str, pad_id: int | None = None) -> np.ndarray:
    """(L,) bool, True where the token of ``side`` ('src' or 'tgt') is real, False at PAD.

    Traces carry them (``src_real``/``tgt_real``); for older trace files: batches are right-padded,
    so PAD is the trailing run of PAD ids (or PAD tokens when pad_id is None); position 0 is always
    real (T5 and Marian start the decoder with PAD).
    """
    stored = trace.src_real if side == "src" else trace.tgt_real
    if stored is not None:  # the model packaged its real positions with the trace
        return np.asarray(stored, dtype=bool)
    ids = trace.src_ids if side == "src" else trace.tgt_ids
    toks = trace.src_tokens if side == "src" else trace.tgt_tokens
    if pad_id is not None and ids is not None:
        is_pad = np.asarray(ids) == pad_id
    else:
        is_pad = np.array([t in PAD_TOKENS for t in toks], dtype=bool)
    not_pad = np.nonzero(~is_pad)[0]
    n_real = max(int(not_pad[-1]) + 1 if len(not_pad) else 0, min(1, len(is_pad)))
    return np.arange(len(is_pad)) < n_real


def expected_mask(
    trace: AttentionTrace, kind: str, pad_id: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(real queries (Q,), mask (Q, K)) that ``kind`` must use, from the tokens alone."""
    qs, ks = kind_sides(kind)
    q_real, k_real = real_positions(trace, qs, pad_id), real_positions(trace, ks, pad_id)
    mask = np.broadcast_to(k_real[None, :], (len(q_real), len(k_real))).copy()
    if kind == "dec_self":
        mask &= np.tril(np.ones_like(mask))
    return q_real, mask


def _tok(tokens: Sequence[str], i: int) -> str:
    return repr(tokens[i]) if 0 <= i < len(tokens) else "?"


def _where(trace: AttentionTrace, kind: str, b: int, q: int, k: int | None = None) -> str:
    qt, kt = trace.axes(kind)
    s = f"seq {b} query {q} {_tok(qt, q)}"
    return s if k is None else f"{s} -> key {k} {_tok(kt, k)}"


# -- static checks ----------------------------------------------------------------------------------


def check_masked_mass(traces: list[AttentionTrace], kind: str, pad_id: int | None = None) -> Verdict:
    """Attention mass that real queries put on keys they must not see (PAD, future): exactly 0."""
    name = f"masked_mass[{kind}]"
    worst, n_pairs, bad_heads = None, 0, set()
    for b, tr in enumerate(traces):
        p = tr.probs(kind)  # (L, H, Q, K)
        q_real, ok = expected_mask(tr, kind, pad_id)
        forbidden = ~ok & q_real[:, None]  # (Q, K)
        n_pairs += int(forbidden.sum())
        if not forbidden.any():
            continue
        # Only the block of rows and columns that hold a forbidden pair is read: a view when they are
        # runs (PAD rows of real queries, PAD columns), and no masking pass when the whole block is
        # forbidden (padding): a quarter of the maps for a sequence padded to twice its length.
        rows, cols = _columns(forbidden.any(1)), _columns(forbidden.any(0))
        sub, where = p[:, :, rows][..., cols], forbidden[rows][:, cols]
        on = sub if where.all() else np.where(where, sub, 0.0)  # (L, H, q, k); NaN stays NaN there
        row = on.sum(-1)  # (L, H, q)
        bad = ~(row == 0)  # NaN counts as bad
        bad_heads.update(tuple(int(i) for i in lh) for lh in np.argwhere(bad.any(-1)))
        if bad.any():
            score = np.where(np.isnan(row), np.inf, row)
            ly, h, qi = np.unravel_index(int(np.argmax(score)), score.shape)
            ki = int(np.argmax(np.nan_to_num(on[ly, h, qi], nan=np.inf)))
            if worst is None or score[ly, h, qi] > worst[0]:
                q, k = np.arange(p.shape[2])[rows][qi], np.arange(p.shape[3])[cols][ki]  # in the full map
                worst = (float(score[ly, h, qi]), b, int(ly), int(h), int(q), int(k))
    if worst is None:
        if n_pairs == 0:
            return Verdict(
                name, True, "no masked keys for real queries in this input (no PAD, no future)", kind=kind
            )
        return Verdict(name, True, f"0 on all {n_pairs} masked (query, key) pairs, every layer and head",
                       kind=kind, value=0.0)  # fmt: skip
    mass, b, ly, h, q, k = worst
    tr = traces[b]
    why = "future" if kind == "dec_self" and k > q and real_positions(tr, "tgt", pad_id)[k] else "PAD"
    n_heads = tr.probs(kind).shape[0] * tr.probs(kind).shape[1]
    amount = "NaN probabilities" if mass == np.inf else f"{mass:.3g} of the attention"
    detail = (f"{amount} on masked keys at layer {ly} head {h}, "
              f"{_where(tr, kind, b, q, k)} ({why}); {len(bad_heads)} of {n_heads} heads read masked keys")  # fmt: skip
    return Verdict(name, False, detail, kind=kind, layer=ly, head=h, positions=(b, q, k), value=mass)


def masked_mass_per_head(trace: AttentionTrace, kind: str, pad_id: int | None = None) -> np.ndarray:
    """(layer, head): the largest mass one real query puts on keys it must not see (NaN stays NaN)."""
    q_real, ok = expected_mask(trace, kind, pad_id)
    forbidden = ~ok & q_real[:, None]
    p = trace.probs(kind)
    if not forbidden.any():
        return np.zeros(p.shape[:2])
    return np.where(forbidden, p, 0.0).sum(-1).max(-1)


# Half-precision maps (a float16 / bfloat16 model) sum to 1 only within their own precision.
# bfloat16 first: its values (8 significant bits) are float16 numbers too, float16's (11) mostly not bfloat16's.
_HALF = (("bfloat16", 2.0**-7), ("float16", float(np.finfo(np.float16).eps)))


def _fits(x: np.ndarray, name: str) -> bool:
    """Every float32 in ``x`` is a ``name`` (bfloat16 / float16) number."""
    if name == "bfloat16":
        return not np.any(x.view(np.uint32) & np.uint32(0xFFFF))  # the low 16 bits of the mantissa unused
    return np.array_equal(x.astype(np.float16).astype(np.float32), x)


def map_precision(p: np.ndarray) -> tuple[str, float]:
    """(dtype name, row-sum tolerance) of the precision the weights ``p`` were computed in, read from the
    values (a trace keeps them as float32): bfloat16 when every float32 has its low 16 bits zero, float16
    when every value is a float16 number; else float32 and ROW_SUM_TOL. Zeros (masked keys, dead rows) fit
    every precision and tell nothing: only the other finite values are read, and maps with none of them
    are float32. A strided sample decides float32 at once; else the maps are read in chunks, stopping at
    the first value that fits no half precision."""
    p = np.asarray(p, dtype=np.float32)
    # Contiguous pieces, each flattened without a copy (one sequence's maps are a strided view of the
    # batch's: flattening them whole would copy every map).
    if p.flags.c_contiguous or p.ndim <= 2:
        pieces = [p.reshape(-1)]
    else:  # one (query, key) map at a time
        pieces = [p[i].reshape(-1) for i in np.ndindex(p.shape[:-2])]
    informative = lambda x: x[np.isfinite(x) & (x != 0)]  # noqa: E731
    step = max(1, sum(a.size for a in pieces) // 4096)
    sample = np.concatenate([informative(a[::step]) for a in pieces])
    left = [name for name, _ in _HALF if _fits(sample, name)]
    seen = False
    for a in pieces:
        for start in range(0, a.size, MAP_CHUNK):
            if not left:
                return "float32", ROW_SUM_TOL
            chunk = a[start : start + MAP_CHUNK]
            if not chunk.any():
                continue
            values = informative(chunk)
            seen = seen or values.size > 0
            left = [name for name in left if _fits(values, name)]
    if not left or not seen:
        return "float32", ROW_SUM_TOL
    return left[0], max(ROW_SUM_TOL, dict(_HALF)[left[0]])


def check_row_sums(traces: list[AttentionTrace], kind: str, pad_id: int | None = None) -> Verdict:
    """Every real query row of probabilities sums to 1 (within 1e-5, or within the precision of half-
    precision maps: ``map_precision``); NaN fails."""
    name = f"row_sums[{kind}]"
    worst, n_rows = None, 0
    precision, tol = "float32", ROW_SUM_TOL
    for b, tr in enumerate(traces):
        p = tr.probs(kind)
        q_real, _ = expected_mask(tr, kind, pad_id)
        n_rows += int(q_real.sum()) * p.shape[0] * p.shape[1]
        dev = np.abs(p.sum(-1, dtype=np.float64) - 1.0)  # (L, H, Q)
        dev = np.where(np.isnan(dev), np.inf, dev)
        dev = np.where(q_real[None, None, :], dev, 0.0)
        ly, h, q = np.unravel_index(int(np.argmax(dev)), dev.shape)
        if worst is None or dev[ly, h, q] > worst[0]:
            worst = (float(dev[ly, h, q]), b, int(ly), int(h), int(q))
    dev, b, ly, h, q = worst
    if dev > ROW_SUM_TOL:  # only then does the maps' precision matter
        precision, tol = map_precision(traces[b].probs(kind))
    within = f"; {precision} maps: within {tol:.1e}" if precision != "float32" else ""
    if dev <= tol:
        return Verdict(name, True, f"{n_rows} real query rows (all layers, heads) sum to 1 (largest deviation "
                       f"{dev:.1e}{within})", kind=kind, value=dev)  # fmt: skip
    total = traces[b].probs(kind)[ly, h, q].sum()
    detail = f"row sums to {total:.6g} at layer {ly} head {h}, {_where(traces[b], kind, b, q)}{within}"
    return Verdict(name, False, detail, kind=kind, layer=ly, head=h, positions=(b, q), value=dev)


def _produced(rows: np.ndarray) -> str:
    """What fully masked rows (..., K) came out as: NaN, zeros, uniform or other."""
    if np.isnan(rows).any():
        return "NaN"
    if np.all(rows == 0):
        return "zeros"
    if np.allclose(rows, 1.0 / rows.shape[-1], atol=1e-6):
        return "uniform"
    return "other"


def check_fully_masked(traces: list[AttentionTrace], kind: str, pad_id: int | None = None) -> Verdict:
    """Query rows that may attend to nothing: fail for a real query, or when one produced NaN."""
    name = f"fully_masked[{kind}]"
    real_rows: list[tuple[int, int, str]] = []
    pad_rows: dict[str, int] = {}
    for b, tr in enumerate(traces):
        q_real, exp = expected_mask(tr, kind, pad_id)
        mask = tr.mask(kind) if tr.mask(kind) is not None else exp
        p = tr.probs(kind)
        for q in np.nonzero(~mask.any(-1))[0]:
            what = _produced(p[:, :, q, :])
            if q_real[q]:
                real_rows.append((b, int(q), what))
            else:
                pad_rows[what] = pad_rows.get(what, 0) + 1
    pad_txt = ", ".join(f"{n} -> {w}" for w, n in pad_rows.items())
    if real_rows:
        b, q, what = real_rows[0]
        detail = (f"{len(real_rows)} real query rows may attend to nothing, e.g. {_where(traces[b], kind, b, q)} "
                  f"-> {what}" + (f"; PAD rows: {pad_txt}" if pad_txt else ""))  # fmt: skip
        return Verdict(name, False, detail, kind=kind, positions=(b, q), value=float(len(real_rows)))
    if "NaN" in pad_rows:
        return Verdict(name, False, f"fully masked PAD query rows produced NaN ({pad_txt}); NaN spreads",
                       kind=kind, value=float(pad_rows["NaN"]))  # fmt: skip
    if pad_rows:
        return Verdict(name, True, f"only PAD query rows are fully masked ({pad_txt}), harmless", kind=kind)
    return Verdict(name, True, "no fully masked query rows", kind=kind, value=0.0)


def check_declared_mask(traces: list[AttentionTrace], kind: str, pad_id: int | None = None) -> Verdict:
    """The mask the model reports using equals the one the tokens call for, on real query rows."""
    name = f"declared_mask[{kind}]"
    if any(tr.mask(kind) is None for tr in traces):
        return Verdict(name, True, "the trace carries no mask for this kind", status="skip", kind=kind)
    n_bad, first = 0, None
    for b, tr in enumerate(traces):
        q_real, exp = expected_mask(tr, kind, pad_id)
        diff = (tr.mask(kind) != exp) & q_real[:, None]
        n_bad += int(diff.sum())
        if first is None and diff.any():
            q, k = (int(i) for i in np.argwhere(diff)[0])
            first = (b, q, k, bool(tr.mask(kind)[q, k]))
    if first is None:
        return Verdict(name, True, "mask matches the tokens (PAD keys masked"
                       + (", future masked)" if kind == "dec_self" else ")"), kind=kind, value=0.0)  # fmt: skip
    b, q, k, allowed = first
    what = "allowed but must be masked" if allowed else "masked but must be visible"
    detail = (
        f"{n_bad} wrong (query, key) entries on real rows, e.g. {_where(traces[b], kind, b, q, k)} {what}"
    )
    return Verdict(name, False, detail, kind=kind, positions=(b, q, k), value=float(n_bad))


def check_finite(traces: list[AttentionTrace]) -> Verdict:
    """No NaN or inf in any attention map or output probability; says where NaN first appears."""
    spots: list[tuple[str, int, int]] = []  # (kind, layer, rows with NaN), in forward order
    for kind in traces[0].kinds:
        for layer in range(traces[0].probs(kind).shape[0]):
            rows = sum(int((~np.isfinite(tr.probs(kind)[layer])).any(axis=(0, 2)).sum()) for tr in traces)
            if rows:
                spots.append((kind, layer, rows))
    out_bad = any(tr.out_probs is not None and not np.isfinite(tr.out_probs).all() for tr in traces)
    if not spots and not out_bad:
        return Verdict("finite", True, "no NaN or inf in attention or outputs")
    if not spots:
        return Verdict("finite", False, "output probabilities are not finite")
    kind, layer, rows = spots[0]
    path = " -> ".join(f"{k} L{lay} ({n} rows)" for k, lay, n in spots[:6]) + (
        " ..." if len(spots) > 6 else ""
    )
    detail = f"NaN first in {kind} layer {layer}, then spreads: {path}" + ("; outputs NaN" if out_bad else "")
    return Verdict("finite", False, detail, kind=kind, layer=layer, value=float(len(spots)))


def special_mass(trace: AttentionTrace, kind: str, pad_id: int | None = None) -> dict[str, np.ndarray]:
    """Mean attention mass (over real query rows) on PAD, BOS/CLS and EOS/SEP keys, each (layer, head)."""
    p = trace.probs(kind)
    q_real, _ = expected_mask(trace, kind, pad_id)
    _, kside = kind_sides(kind)
    ktoks = trace.src_tokens if kside == "src" else trace.tgt_tokens
    k_pad = ~real_positions(trace, kside, pad_id)
    groups = {
        "PAD": k_pad,
        "BOS": np.array([t in BOS_TOKENS for t in ktoks], dtype=bool),
        "EOS": np.array([t in EOS_TOKENS for t in ktoks], dtype=bool),
    }
    if not q_real.any():
        return {g: np.zeros(p.shape[:2]) for g in groups}
    # Each group's keys summed first (a view when they are one run, e.g. the PAD columns), then the real
    # query rows averaged: the same sums as selecting the rows first, without copying every real row.
    return {g: p[..., _columns(sel)].sum(-1)[:, :, q_real].mean(-1) for g, sel in groups.items()}


def _columns(sel: np.ndarray) -> slice | np.ndarray:
    """Index of the True entries of a bool vector: a slice when they are one run (no copy), else indices."""
    idx = np.flatnonzero(sel)
    if len(idx) and int(idx[-1]) - int(idx[0]) + 1 == len(idx):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


def check_special_tokens(traces: list[AttentionTrace], kind: str, pad_id: int | None = None) -> Verdict:
    """Information, not a test: how much attention goes to PAD, BOS/CLS and EOS/SEP keys."""
    parts = []
    masses = [special_mass(tr, kind, pad_id) for tr in traces]
    for g in ("BOS", "EOS", "PAD"):
        m = np.mean([ms[g] for ms in masses], axis=0)  # (L, H)
        if not np.isfinite(m).all():
            parts.append(f"{g} NaN")
            continue
        ly, h = np.unravel_index(int(np.argmax(m)), m.shape)
        parts.append(f"{g} {m.mean():.2f} (max {m[ly, h]:.2f} at layer {ly} head {h})")
    return Verdict(
        f"special_tokens[{kind}]", True, "mean mass on " + ", ".join(parts), status="info", kind=kind
    )


STATIC_CHECKS = (check_masked_mass, check_row_sums, check_fully_masked, check_declared_mask)


def static_checks(
    traces: list[AttentionTrace], pad_id: int | None = None, info: bool = True
) -> list[Verdict]:
    """Every static check for every kind of a batch of traces (one per sequence)."""
    if not traces:
        raise ValueError("no traces to audit")
    out = []
    for check in STATIC_CHECKS:
        out.extend(check(traces, kind, pad_id) for kind in traces[0].kinds)
    out.append(check_finite(traces))
    if info:
        out.extend(check_special_tokens(traces, kind, pad_id) for kind in traces[0].kinds)
    return out


# -- black-box leak tests -------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeBatch:
    """Ids and real-token vectors for the leak tests (PAD columns already appended)."""

    src: torch.Tensor | None  # (B, S) long (None: decoder-only model)
    src_real: torch.Tensor | None  # (B, S) bool
    tgt: torch.Tensor | None = None  # (B, T) long
    tgt_real: torch.Tensor | None = None
    extra_pad: int = 0

    def call(self, fwd: ForwardFn, src=None, tgt=None, rows=None) -> dict[str, torch.Tensor]:
        sel = (lambda t: t) if rows is None else (lambda t: None if t is None else t[rows])
        return fwd(
            sel(self.src) if src is None else src,
            sel(self.tgt) if tgt is None else tgt,
            sel(self.src_real),
            sel(self.tgt_real),
        )


def batch_from_traces(
    traces: list[AttentionTrace], pad_id: int, extra_pad: int = EXTRA_PAD, max_len: int | None = None,
    device: str = "cpu",
) -> ProbeBatch:  # fmt: skip
    """Stack a batch's ids and append ``extra_pad`` PAD columns (fewer if max_len forbids)."""

    def stack(side: str) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
        ids = [tr.src_ids if side == "src" else tr.tgt_ids for tr in traces]
        if ids[0] is None or len(ids[0]) == 0:
            return None, None
        real = torch.tensor(np.stack([real_positions(tr, side, pad_id) for tr in traces]))
        return torch.tensor(np.stack(ids), dtype=torch.long), real

    src, src_real = stack("src")
    tgt, tgt_real = stack("tgt")
    widths = [t.shape[1] for t in (src, tgt) if t is not None]
    extra = extra_pad if max_len is None else max(0, min(extra_pad, max_len - max(widths)))

    def grow(ids, real):
        if ids is None or extra == 0:
            return ids, real
        ids = torch.cat([ids, torch.full((ids.shape[0], extra), pad_id, dtype=torch.long)], 1)
        return ids, torch.cat([real, torch.zeros(real.shape[0], extra, dtype=torch.bool)], 1)

    src, src_real = grow(src, src_real)
    tgt, tgt_real = grow(tgt, tgt_real)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return ProbeBatch(to(src), to(src_real), to(tgt), to(tgt_real), extra)


def core_forward_outputs(lm, src, tgt, src_real, tgt_real, bug: B.Bug | None = None,
                         interv: Intervention | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """Forward-outputs function of a core LoadedModel (masks from the real vectors, bug optional)."""
    masks = B.reference_masks(src_real, tgt_real) if bug is None else bug.masks(src_real, tgt_real)
    iv = interv if bug is None else bug.intervention(interv)
    with torch.no_grad():
        out = lm.model(src, tgt, masks=masks, interv=iv)
    res = {"enc": out.memory}
    if tgt is not None:
        res["dec"] = out.hidden
    return res


def forward_fn(lm, bug: B.Bug | None = None, interv: Intervention | None = None) -> ForwardFn:
    """The black-box forward-outputs function for ``lm`` (a bug or head ablation injected: core only)."""
    if bug is None and interv is None:
        return lm.forward_outputs
    if not lm.injectable:
        raise ValueError("mask bugs and head ablation can only be injected into core models")
    return partial(core_forward_outputs, lm, bug=bug, interv=interv)


def _finite_at(out: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: output finite at each position (True at PAD, which is not judged)."""
    fin = torch.isfinite(out.float()).reshape(out.shape[0], out.shape[1], -1).all(-1)
    return fin | ~real


def _change(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N, L) largest absolute change per position; inf where either side is not finite."""
    d = (a.float() - b.float()).abs().reshape(a.shape[0], a.shape[1], -1).amax(-1)
    return torch.nan_to_num(d, nan=float("inf"))


def check_finite_outputs(fwd: ForwardFn, batch: ProbeBatch, base: dict | None = None) -> Verdict:
    """Outputs at real positions are finite (on the batch with extra PAD columns). ``base``: the
    batch's outputs when already computed (dynamic_checks runs the batch once for every check)."""
    out = batch.call(fwd) if base is None else base
    bad = []
    for name, real in (("enc", batch.src_real), ("dec", batch.tgt_real)):
        if name in out and real is not None:
            nb = ~_finite_at(out[name], real)
            if nb.any():
                b, i = (int(x) for x in torch.nonzero(nb)[0])
                bad.append((name, int(nb.sum()), int(real.sum()), b, i))
    pads = f"batch with {batch.extra_pad} extra PAD columns"
    if not bad:
        return Verdict("finite_outputs", True, f"outputs finite at every real position ({pads})")
    name, n, total, b, i = bad[0]
    detail = "; ".join(f"{nm} NaN/inf at {k} of {t} real positions" for nm, k, t, _, _ in bad)
    return Verdict("finite_outputs", False, f"{detail}, first seq {b} {name} position {i} ({pads})",
                   positions=(b, i), value=float("inf"))  # fmt: skip


def _blame(traces, kind: str, b: int, q: int, keys: list[int]) -> tuple[int, int, float] | None:
    """(layer, head, mass) with the most attention from query q to ``keys`` in the trace, if any."""
    if b >= len(traces) or kind not in traces[b].kinds:
        return None
    p = traces[b].probs(kind)
    keys = [k for k in keys if k < p.shape[3]]
    if q >= p.shape[2] or not keys:
        return None
    m = np.nan_to_num(p[:, :, q, keys].sum(-1))  # (L, H)
    ly, h = np.unravel_index(int(np.argmax(m)), m.shape)
    return (int(ly), int(h), float(m[ly, h])) if m[ly, h] > 0 else None


def _pool(
    ids: torch.Tensor, real: torch.Tensor, pad_id: int, vocab: int | None, skip: set[int]
) -> torch.Tensor:
    """Token ids to write into positions: the model's vocabulary minus specials, else ids seen."""
    if vocab:
        pool = [i for i in range(vocab) if i not in skip and i != pad_id]
    else:
        pool = sorted({int(i) for i in ids[real].tolist()} - {pad_id})
    return torch.tensor(pool, dtype=torch.long)


@dataclass(frozen=True)
class _PadProbe:
    """One side's PAD content changed: the rows that have PAD on that side, with their new ids."""

    side: str  # src | tgt
    rows: torch.Tensor  # (k,) long: the batch rows that have PAD on this side
    changed: torch.Tensor  # (B, L): the side's ids with every PAD position holding another token
    n_pads: int  # PAD positions changed in the whole batch

    @property
    def ids(self) -> torch.Tensor:
        """(k, L): the changed ids of the rows that have PAD."""
        return self.changed[self.rows]


def _pad_probe(
    batch: ProbeBatch, side: str, pad_id: int, vocab: int | None, skip_ids: set[int], seed: int = 0
) -> _PadProbe | Verdict:
    """The rows of ``side`` with their PAD content changed, or the skip verdict when there is none."""
    name = f"padding_leak[{side}]"
    ids, real = (batch.src, batch.src_real) if side == "src" else (batch.tgt, batch.tgt_real)
    if ids is None:
        return Verdict(name, True, f"the model reads no {side} sequence", status="skip")
    pads = ~real
    pool = _pool(ids, real, pad_id, vocab, skip_ids)
    if not pads.any() or len(pool) == 0:
        return Verdict(name, True, "no PAD positions to change", status="skip")
    g = torch.Generator().manual_seed(seed)
    fill = pool[torch.randint(len(pool), ids.shape, generator=g)].to(ids.device)
    changed = torch.where(pads, fill, ids)
    rows = torch.nonzero(pads.any(dim=1)).flatten()
    return _PadProbe(side, rows, changed, int(pads.sum()))


def _run_probes(
    fwd: ForwardFn, batch: ProbeBatch, probes: Sequence[_PadProbe]
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """(the batch's outputs, {side: outputs of that probe's rows}) from one call: the batch with the
    probes' changed rows appended. Each changed row is compared with its unchanged row of the same
    call (same kernels, same batch shape: no float noise between them), and a row without PAD is not
    run a second time. One sequence's outputs depend only on its own tokens in a sound model; one that
    mixes sequences fails ``batch_invariance``, which runs each sequence alone."""
    n = (batch.src if batch.src is not None else batch.tgt).shape[0]
    parts = {name: [t] for name, t in (("src", batch.src), ("tgt", batch.tgt), ("sr", batch.src_real),
                                       ("tr", batch.tgt_real))}  # fmt: skip
    for p in probes:
        for name, t in (
            ("src", batch.src),
            ("tgt", batch.tgt),
            ("sr", batch.src_real),
            ("tr", batch.tgt_real),
        ):
            parts[name].append(None if t is None else (p.ids if name == p.side else t[p.rows]))
    cat = {name: None if ts[0] is None else torch.cat(ts) for name, ts in parts.items()}
    out = fwd(cat["src"], cat["tgt"], cat["sr"], cat["tr"])
    base = {name: t[:n] for name, t in out.items()}
    alts, start = {}, n
    for p in probes:
        k = len(p.rows)
        alts[p.side] = {name: t[start : start + k] for name, t in out.items()}
        start += k
    return base, alts


def _padding_verdict(
    p: _PadProbe, batch: ProbeBatch, base: dict[str, torch.Tensor], alt: dict[str, torch.Tensor], traces=()
) -> Verdict:
    """Real-position outputs of the probe's rows, with and without their PAD content changed."""
    name, side = f"padding_leak[{p.side}]", p.side
    worst = None
    for out_name, out_real in (("enc", batch.src_real), ("dec", batch.tgt_real)):
        if out_name not in base or out_real is None or (side == "tgt" and out_name == "enc"):
            continue
        d = _change(base[out_name][p.rows], alt[out_name]).masked_fill(~out_real[p.rows], 0.0)  # (k, L)
        v = float(d.max())
        if worst is None or v > worst[0]:
            r, i = divmod(int(d.argmax()), d.shape[1])
            worst = (v, out_name, int(p.rows[r]), i)
    v, out_name, b, i = worst
    if v <= LEAK_TOL:
        return Verdict(
            name,
            True,
            f"changing {p.n_pads} {side} PAD tokens moved real outputs by at most {v:.1e}",
            value=v,
        )
    where = f"{out_name} output at seq {b} position {i}"
    kind = "enc_self" if out_name == "enc" else ("cross" if side == "src" else "dec_self")
    real = batch.src_real if side == "src" else batch.tgt_real
    pad_pos = [int(k) for k in torch.nonzero(~real[b]).flatten()]
    blame = _blame(traces, kind, b, i, pad_pos)
    extra = f"; {kind} layer {blame[0]} head {blame[1]} puts {blame[2]:.3g} on PAD there" if blame else ""
    nonfinite = " (not finite: NaN)" if v == float("inf") else ""
    return Verdict(name, False, f"changing {p.n_pads} {side} PAD tokens moved the {where} by {v:.3g}{nonfinite}"
                   f"{extra}", kind=kind, layer=blame[0] if blame else None, head=blame[1] if blame else None,
                   positions=(b, i), value=v)  # fmt: skip


def check_padding_leak(
    fwd: ForwardFn, batch: ProbeBatch, side: str, pad_id: int, traces=(), vocab: int | None = None,
    skip_ids: set[int] = frozenset(), seed: int = 0,
) -> Verdict:  # fmt: skip
    """Change what sits in the PAD positions of ``side``; real-position outputs must not move. The
    changed rows run in one call with the unchanged batch (``_run_probes``)."""
    p = _pad_probe(batch, side, pad_id, vocab, skip_ids, seed)
    if isinstance(p, Verdict):
        return p
    base, alts = _run_probes(fwd, batch, [p])
    return _padding_verdict(p, batch, base, alts[side], traces)


def check_causal_leak(
    fwd: ForwardFn, batch: ProbeBatch, pad_id: int, traces=(), vocab: int | None = None,
    skip_ids: set[int] = frozenset(), seed: int = 0,
) -> Verdict:  # fmt: skip
    """Change each future target token; decoder outputs at earlier positions must not move."""
    name = "causal_leak"
    if batch.tgt is None:
        return Verdict(name, True, "the model has no decoder", status="skip")
    tgt, real = batch.tgt, batch.tgt_real
    pool = _pool(tgt[:, 1:], real[:, 1:], pad_id, vocab, skip_ids)
    pairs = [(b, j) for b in range(tgt.shape[0]) for j in range(1, tgt.shape[1]) if real[b, j]]
    if not pairs or len(pool) < 2:
        return Verdict(name, True, "no target token after the first position to change", status="skip")
    if len(pairs) > MAX_VARIANTS:
        pick = np.linspace(0, len(pairs) - 1, MAX_VARIANTS).round().astype(int)
        pairs = [pairs[i] for i in sorted(set(pick))]
    g = torch.Generator().manual_seed(seed)
    worst = (0.0, None)
    for start in range(0, len(pairs), CHUNK):
        chunk = pairs[start : start + CHUNK]
        rows = torch.tensor([b for b, _ in chunk], device=tgt.device)
        new_tgt = tgt[rows].clone()
        for n, (b, j) in enumerate(chunk):
            choice = pool[torch.randint(len(pool), (1,), generator=g)].item()
            if choice == int(tgt[b, j]):
                choice = int(pool[(pool != choice).nonzero()[0, 0]])
            new_tgt[n, j] = choice
        out = batch.call(fwd, tgt=new_tgt, rows=rows)["dec"]
        # Reference from the same rows: a batch of another size may take other kernels (float noise).
        base = batch.call(fwd, rows=rows)["dec"]
        d = _change(base, out)  # (N, T)
        for n, (b, j) in enumerate(chunk):
            earlier = d[n, :j].masked_fill(~real[b, :j], 0.0)
            v = float(earlier.max())
            if v > worst[0]:
                worst = (v, (b, int(earlier.argmax()), j))
    v, where = worst
    if where is None or v <= LEAK_TOL:
        return Verdict(name, True, f"changing each of {len(pairs)} future target tokens moved earlier outputs "
                       f"by at most {v:.1e}", value=v)  # fmt: skip
    b, i, j = where
    toks = traces[b].tgt_tokens if b < len(traces) else ()
    blame = _blame(traces, "dec_self", b, i, list(range(i + 1, j + 1)))
    extra = f"; dec_self layer {blame[0]} head {blame[1]} looks ahead with {blame[2]:.3g}" if blame else ""
    nonfinite = " (not finite: NaN)" if v == float("inf") else ""
    detail = (f"decoder output at seq {b} position {i} {_tok(toks, i)} moved by {v:.3g}{nonfinite} when "
              f"position {j} {_tok(toks, j)} changed{extra}")  # fmt: skip
    return Verdict(name, False, detail, kind="dec_self", layer=blame[0] if blame else None,
                   head=blame[1] if blame else None, positions=(b, i, j), value=v)  # fmt: skip


def _alone_inputs(batch: ProbeBatch) -> list[tuple[list, dict[str, int]]]:
    """Per sequence: [src, src_real, tgt, tgt_real] trimmed to its real tokens, and its real lengths."""
    n_seq = (batch.src if batch.src is not None else batch.tgt).shape[0]
    out = []
    for b in range(n_seq):
        lens: dict[str, int] = {}
        parts: list = []
        for side, ids, real in (("src", batch.src, batch.src_real), ("tgt", batch.tgt, batch.tgt_real)):
            if ids is None:
                parts += [None, None]
                continue
            n = int(real[b].sum())
            lens["enc" if side == "src" else "dec"] = n
            parts += [ids[b : b + 1, :n], real[b : b + 1, :n]]
        out.append((parts, lens))
    return out


def _same_call(batch: ProbeBatch, lens: dict[str, int]) -> bool:
    """One sequence with no PAD column: alone it is the very call that gave the batch's outputs (same
    ids, same shapes, so the same numbers): the comparison is exact without running it again."""
    n_seq = (batch.src if batch.src is not None else batch.tgt).shape[0]
    return n_seq == 1 and all(
        ids is None or n == ids.shape[1]
        for ids, n in ((batch.src, lens.get("enc")), (batch.tgt, lens.get("dec")))
    )


def alone_outputs(fwd: ForwardFn, batch: ProbeBatch) -> list[dict[str, torch.Tensor] | None]:
    """Each sequence's outputs run alone, trimmed to its real tokens (None where that run would be the
    batch's own call: see _same_call). Independent of the batch's call, so it may run beside it."""
    out = []
    for (src, src_real, tgt, tgt_real), lens in _alone_inputs(batch):
        out.append(None if _same_call(batch, lens) else fwd(src, tgt, src_real, tgt_real))
    return out


def check_batch_invariance(
    fwd: ForwardFn, batch: ProbeBatch, traces=(), base: dict | None = None, alone: list | None = None
) -> Verdict:
    """Each sequence run alone (trimmed to its real tokens) gives, at its real positions, the outputs
    it got padded in the batch. Works for any model, also one that builds its masks from the ids.
    ``base`` and ``alone``: the batch's outputs and ``alone_outputs`` when already computed."""
    name = "batch_invariance"
    base = batch.call(fwd) if base is None else base
    alone = alone_outputs(fwd, batch) if alone is None else alone
    worst: tuple[float, tuple | None] = (0.0, None)
    n_seq = len(alone)
    for b, ((_, lens), own) in enumerate(zip(_alone_inputs(batch), alone, strict=True)):
        own = base if own is None else own
        for out_name, n in lens.items():
            if out_name not in base or out_name not in own or n == 0:
                continue
            ref = base[out_name][b : b + 1, :n]
            d = _change(ref, own[out_name][:, :n])[0] / max(1.0, float(ref.abs().max()))  # (n,) relative
            v = float(d.max())
            if v > worst[0]:
                worst = (v, (b, out_name, int(d.argmax()), n))
    v, where = worst
    if where is None or v <= LEAK_TOL:
        return Verdict(name, True, f"each of {n_seq} sequences alone gives its padded-batch outputs "
                       f"(largest relative change {v:.1e})", value=v)  # fmt: skip
    b, out_name, i, n = where
    toks = () if b >= len(traces) else (traces[b].src_tokens if out_name == "enc" else traces[b].tgt_tokens)
    nonfinite = " (not finite: NaN)" if v == float("inf") else ""
    detail = (f"seq {b} run alone ({n} tokens) changes its {out_name} output at position {i} {_tok(toks, i)} "
              f"by {v:.3g}{nonfinite} relative to the padded batch: PAD or other sequences leak into it")  # fmt: skip
    return Verdict(name, False, detail, positions=(b, i), value=v)


def dynamic_checks(fwd: ForwardFn | None, batch: ProbeBatch | None, pad_id: int, traces=(),
                   vocab: tuple[int | None, int | None] = (None, None), skip_ids: set[int] = frozenset(),
                   masks_from_ids: bool = False, concurrent: bool = False) -> list[Verdict]:  # fmt: skip
    """finite_outputs, batch_invariance, causal_leak (future invariance), padding_leak[src/tgt]
    (skipped for models that compute their masks from the ids: a changed PAD id is no longer PAD).

    The batch runs once for every check that compares to it, together with the padding leaks'
    changed rows (``_run_probes``) when those are at most as many as the batch's rows (so one call
    never holds more than twice the batch); else each side's changed batch runs on its own, the
    unchanged batch's shape (a call of another shape may take other kernels: float noise).

    ``concurrent``: ``fwd`` keeps no state between calls (core models), so the sequences' runs alone
    (batch_invariance) go in a worker thread while this one runs the batch and the leak tests: two
    cores busy instead of one (torch releases the GIL in its kernels)."""
    names = ("finite_outputs", "batch_invariance", "causal_leak", "padding_leak[src]", "padding_leak[tgt]")
    if fwd is None or batch is None:
        return [Verdict(n, True, "this model offers no forward_outputs hook", status="skip") for n in names]
    pads: dict[str, Verdict] = {}
    probes: list[_PadProbe] = []
    for side in ("src", "tgt"):
        if masks_from_ids:
            why = ("the model computes its masks from the token ids, so PAD content cannot change while "
                   "the padding stays: batch_invariance tests the padding instead")  # fmt: skip
            pads[side] = Verdict(f"padding_leak[{side}]", True, why, status="skip")
            continue
        p = _pad_probe(batch, side, pad_id, vocab[0 if side == "src" else 1], skip_ids)
        if isinstance(p, Verdict):
            pads[side] = p
        else:
            probes.append(p)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-alone") as pool:
        later = (
            pool.submit(with_threads, torch.get_num_threads(), alone_outputs, fwd, batch)
            if concurrent
            else None
        )
        n = (batch.src if batch.src is not None else batch.tgt).shape[0]
        if sum(len(p.rows) for p in probes) <= n:
            base, alts = _run_probes(fwd, batch, probes)
        else:  # each side's changed batch runs on its own, the same shape as the unchanged one
            base, alts = batch.call(fwd), {}
            for p in probes:
                alts[p.side] = {name: t[p.rows] for name, t in batch.call(fwd, **{p.side: p.changed}).items()}
        for p in probes:
            pads[p.side] = _padding_verdict(p, batch, base, alts[p.side], traces)
        causal = check_causal_leak(fwd, batch, pad_id, traces, vocab[1], skip_ids)
        alone = None if later is None else later.result()
    return [
        check_finite_outputs(fwd, batch, base),
        check_batch_invariance(fwd, batch, traces, base, alone),
        causal,
        pads["src"],
        pads["tgt"],
    ]


def with_threads(threads: int, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with ``threads`` intra-op threads: for a worker thread, which starts with
    torch's default count, not its caller's."""
    torch.set_num_threads(threads)
    return fn(*args, **kwargs)


# -- whole audit ------------------------------------------------------------------------------------------


def _same_batch(a: ProbeBatch, b: ProbeBatch) -> bool:
    pairs = ((a.src, b.src), (a.src_real, b.src_real), (a.tgt, b.tgt), (a.tgt_real, b.tgt_real))
    return all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y)) for x, y in pairs
    )


class _PendingTraces(Sequence):
    """The traces ``later()`` will give, as a sequence: the leak tests read them only to name the head
    behind a failure, so they can start before the traced pass has finished. ``later`` is called once."""

    def __init__(self, later: Callable[[], Sequence[AttentionTrace]]):
        self._later, self._traces = later, None

    def get(self) -> list[AttentionTrace]:
        if self._traces is None:
            self._traces = list(self._later())
        return self._traces

    def __len__(self) -> int:
        return len(self.get())

    def __getitem__(self, i):
        return self.get()[i]


def run_audit(
    lm,
    sources: list[str],
    targets: list[str] | None = None,
    bug: B.Bug | str | None = None,
    interv: Intervention | None = None,
    extra_pad: int = EXTRA_PAD,
    traces: list[AttentionTrace] | None = None,
    probe: list[AttentionTrace] | None = None,
    later: Callable[[], Sequence[AttentionTrace]] | None = None,
    concurrent: bool | None = None,
) -> AuditReport:
    """Static checks on the traces of ``sources`` plus the leak tests, with ``bug`` injected if given.
    ``traces``: this run's traces when the caller already has them: ``lm.trace(sources, targets)``,
    or with a bug or ablation ``attnscope.core.analysis.bugs.trace_with_bug(lm, sources, bug, targets, interv)``.
    ``probe`` and ``later``: traces of the same inputs with the same token ids (the correct model's,
    for a bug teacher-forced on its output), from which the leak tests' batch is built, and a function
    that returns this run's traces (e.g. a Future's ``result`` of the traced pass running in another
    thread): the leak tests run here first, then ``later()`` is called. If its ids are not the probe's,
    the leak tests run again on its own batch. ``concurrent``: run the sequences alone in a second
    thread beside the leak tests (see dynamic_checks); default: for core models. A caller that already
    keeps the cores busy (the Mask lab audits two models at once) passes False."""
    if concurrent is None:  # core models' forward keeps no state: two threads may run it at once
        concurrent = lm.injectable
    bug = B.get(bug) if isinstance(bug, str) else bug
    if (bug is not None or interv is not None) and not lm.injectable:
        raise ValueError("mask bugs and head ablation can only be injected into core models")
    if traces is not None:
        if len(traces) != len(sources):
            raise ValueError(f"{len(traces)} traces for {len(sources)} sources")
    elif bug is not None or interv is not None:
        trace = partial(B.trace_with_bug, lm, sources, bug, targets, interv)
    else:
        trace = partial(lm.trace, sources, targets)
    if probe is not None and len(probe) != len(sources):
        raise ValueError(f"{len(probe)} probe traces for {len(sources)} sources")
    f = lm.audit_facts()
    fwd = forward_fn(lm, bug, interv)

    def batch_of(trs: Sequence[AttentionTrace]) -> ProbeBatch:
        return batch_from_traces(list(trs), f["pad_id"], extra_pad, f["max_len"], lm.device)

    def leak_tests(b: ProbeBatch, seen: Sequence[AttentionTrace]) -> list[Verdict]:
        return dynamic_checks(
            fwd, b, f["pad_id"], seen, f["vocab"], f["skip_ids"], lm.masks_from_ids, concurrent=concurrent
        )  # core: its forward keeps no state

    if traces is None and probe is not None and later is not None:
        pending = _PendingTraces(later)
        batch = batch_of(probe)
        dynamic = leak_tests(batch, pending)
        traces = pending.get()
        own = batch_of(traces)
        if not _same_batch(own, batch):  # the probe's ids were not these traces' ids: test these
            batch = own
            dynamic = leak_tests(batch, traces)
    else:
        traces = trace() if traces is None else traces
        batch = batch_of(traces)
        dynamic = leak_tests(batch, traces)
    verdicts = static_checks(traces, f["pad_id"]) + dynamic
    meta = {"model": lm.name, "n_inputs": len(sources), "extra_pad": batch.extra_pad}
    return AuditReport(verdicts, traces, bug.name if bug else None, meta)
