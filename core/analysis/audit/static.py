"""Mask audit, static checks: what the attention maps of ``AttentionTrace`` objects show (any model
that produces them). The mask a kind *should* have is derived from the tokens alone (a key is visible
iff it is not PAD, and for ``dec_self`` not in the future), and is compared with what the model did.
Only real (non-PAD) query rows are judged, except for NaN, which is never harmless because it spreads.

Tolerances: masked mass must be exactly 0; real rows sum to 1 within 1e-5 (or the precision the maps
were stored in, ``map_precision``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.core.traces.trace import AttentionTrace, head_masks_differ

ROW_SUM_TOL = 1e-5
MAP_CHUNK = 2**20  # values read at once where a check streams through maps

PAD_TOKENS = frozenset({"<pad>", "[PAD]"})
BOS_TOKENS = frozenset({"<bos>", "[CLS]", "<s>"})
EOS_TOKENS = frozenset({"<eos>", "[SEP]", "</s>"})

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
    """The verdicts of one audit (iterating a report goes through them), and the traces it read."""

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

    def __iter__(self) -> Iterator[Verdict]:
        return iter(self.verdicts)

    def __len__(self) -> int:
        return len(self.verdicts)


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
    q_real = q_real & trace.asks(kind)  # (rows of positions that ask nothing are no queries)
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
    worst: tuple[float, int, int, int, int, int] | None = None
    n_pairs, bad_heads = 0, set[tuple[int, ...]]()
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
            ly, h, qi = (int(i) for i in np.unravel_index(int(np.argmax(score)), score.shape))
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
    worst: tuple[float, int, int, int, int, float] | None = None
    n_rows = 0
    precision, tol = "float32", ROW_SUM_TOL
    # (layer, head) switched off by a head mask (BERT's head_mask): every weight exactly 0 in every sequence
    # while another head of its layer attends (every head 0 is a mask bug's zeros, and one sequence's head 0
    # alone is no head mask): left out of the sums, and named
    off: set[tuple[int, int]] | None = None
    for tr in traces:
        p = tr.probs(kind)
        dead = np.all(p == 0, axis=(-2, -1))  # (L, H)
        learned = tr.learned(kind)
        if learned is not None:
            dead &= np.all(learned[1] == 0, axis=(-2, -1))
        dead &= ~dead.all(axis=1, keepdims=True)
        found = {(int(ly), int(h)) for ly, h in zip(*np.nonzero(dead), strict=True)}
        off = found if off is None else off & found
    off = off or set()
    for b, tr in enumerate(traces):
        p = tr.probs(kind)
        q_real, _ = expected_mask(tr, kind, pad_id)
        n_rows += int(q_real.sum()) * p.shape[0] * p.shape[1]
        sums = p.sum(-1, dtype=np.float64)
        learned = tr.learned(kind)
        if learned is not None:  # weight on learned keys outside the sequence completes the rows
            sums = sums + learned[1].sum(-1, dtype=np.float64)
        dev = np.abs(sums - 1.0)  # (L, H, Q)
        dev = np.where(np.isnan(dev), np.inf, dev)
        dev = np.where(q_real[None, None, :], dev, 0.0)
        for ly, h in off:
            dev[ly, h] = 0.0
        ly, h, q = (int(i) for i in np.unravel_index(int(np.argmax(dev)), dev.shape))
        if worst is None or dev[ly, h, q] > worst[0]:
            worst = (float(dev[ly, h, q]), b, int(ly), int(h), int(q), float(sums[ly, h, q]))
    if worst is None:
        raise ValueError("no traces to check")
    dev, b, ly, h, q, total = worst
    if dev > ROW_SUM_TOL:  # only then does the maps' precision matter
        precision, tol = map_precision(traces[b].probs(kind))
    within = f"; {precision} maps: within {tol:.1e}" if precision != "float32" else ""
    heads_off = (
        f"; {len(off)} head(s) switched off, every weight 0 in every sequence (a head mask: "
        f"{', '.join(f'layer {ly} head {h}' for ly, h in sorted(off)[:3])}{' …' if len(off) > 3 else ''})"
        if off
        else ""
    )
    if dev <= tol:
        return Verdict(name, True, f"{n_rows} real query rows (all layers, heads) sum to 1 (largest deviation "
                       f"{dev:.1e}{within}){heads_off}", kind=kind, value=dev)  # fmt: skip
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
    """Query rows that may attend to nothing: fail for a real query, or when one produced NaN. A row that
    may see no token but puts weight on learned keys outside the sequence (memory keys, a null key) in
    every head attends to those: it is not fully masked."""
    name = f"fully_masked[{kind}]"
    real_rows: list[tuple[int, int, str]] = []
    pad_rows: dict[str, int] = {}
    for b, tr in enumerate(traces):
        q_real, exp = expected_mask(tr, kind, pad_id)
        p = tr.probs(kind)
        masks = tr.layer_masks(kind)  # (layer, q, k): each layer's, where its layers were masked differently
        if masks is None:
            masks = np.broadcast_to(exp, (p.shape[0], *exp.shape))
        dead = np.asarray(~np.asarray(masks, bool).any(-1))  # (layer, q): rows that see no key in that layer
        learned = tr.learned(kind)
        if learned is not None:  # a row whose weight goes to learned keys outside the sequence attends
            dead = dead & ~(learned[1].sum(-1) > 0).all(1)  # (layer, q): to them in every head of that layer
        for q in (int(i) for i in np.nonzero(dead.any(0))[0]):
            what = _produced(p[dead[:, q], :, q, :])
            if q_real[q]:
                real_rows.append((b, q, what))
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
    n_bad = 0
    first: tuple[int, int, int, bool, int | None] | None = None
    expected = [expected_mask(tr, kind, pad_id) for tr in traces]  # (real queries, the tokens' mask) of each
    windows = _windows(
        traces, kind, expected
    )  # layer -> its local rule (a window, chunks), where it keeps to one
    for b, (tr, (q_real, exp)) in enumerate(zip(traces, expected, strict=True)):
        masks = np.array(tr.layer_masks(kind), bool)  # (layer, q, k): every layer's mask is checked
        for windowed, rule in windows.items():  # (a window hides keys the tokens call for, by design)
            masks[windowed] |= exp & ~_band(kind, rule, *exp.shape)
        diff = (masks != exp[None]) & q_real[None, :, None]
        n_bad += int(diff.any(0).sum())
        if first is None and diff.any():
            ly, q, k = (int(i) for i in np.argwhere(diff)[0])
            first = (b, q, k, bool(masks[ly, q, k]), ly if tr.masks_differ(kind) else None)
    within = ""
    if windows:
        by_size: dict[Window, list[int]] = {}
        for windowed, rule in windows.items():
            by_size.setdefault(rule, []).append(windowed)
        within = "; " + "; ".join(
            f"layer{'s' * (len(ls) > 1)} {', '.join(map(str, ls))} attend{'s' * (len(ls) == 1)} within "
            f"{_rule_words(kind, rule)}"
            for rule, ls in sorted(by_size.items())
        )
    if first is None:
        if kind == "dec_self" and all(tr.mask(kind).shape[-1] < 2 for tr in traces):
            return Verdict(name, True, "not checked: the decoder input is one position (nothing after it to hide; "
                           "give targets to check the causal mask)", status="skip", kind=kind)  # fmt: skip
        return Verdict(name, True, "mask matches the tokens (PAD keys masked"
                       + (", future masked)" if kind == "dec_self" else ")") + within, kind=kind, value=0.0)  # fmt: skip
    b, q, k, allowed, layer = first
    what = "allowed but must be masked" if allowed else "masked but must be visible"
    at = "" if layer is None else f" in layer {layer} (its layers were masked differently)"
    differ = head_masks_differ(traces[b].meta).get(kind)
    if differ:  # the trace's mask is what every head may see: the heads' own masks disagree with each other
        at += (f"; the heads of {', '.join(differ[:3])}{' …' if len(differ) > 3 else ''} were masked differently "
               "(a per-head mask repeated in the wrong order?): the mask checked is what every head may see")  # fmt: skip
    detail = (
        f"{n_bad} wrong (query, key) entries on real rows, e.g. {_where(traces[b], kind, b, q, k)} {what}{at}"
    )
    return Verdict(name, False, detail, kind=kind, layer=layer, positions=(b, q, k), value=float(n_bad))


Window = tuple[str, int]  # ("window", w): a sliding window of w keys; ("chunk", c): chunks of c positions


def _band(kind: str, rule: Window, nq: int, nk: int) -> np.ndarray:
    """(q, k) True within a layer's local rule: a sliding window of ``w`` (a decoder's last ``w`` keys up to
    each query, an encoder's keys at most ``w`` positions away on either side), or chunks of ``c`` positions
    (Llama 4's chunked attention: a query sees its own chunk's keys)."""
    what, n = rule
    qi, ki = np.arange(nq)[:, None], np.arange(nk)[None, :]
    if what == "chunk":
        return qi // n == ki // n
    d = qi - ki
    return d < n if kind == "dec_self" else np.abs(d) <= n


def _rule_words(kind: str, rule: Window) -> str:
    what, n = rule
    if what == "chunk":
        return f"chunks of {n} positions"
    if kind == "dec_self":
        return f"a sliding window of {n} keys (the query's own and the {n - 1} before it)"
    return f"a sliding window of the keys at most {n} positions away on either side"


def _windows(
    traces: list[AttentionTrace], kind: str, expected: list[tuple[np.ndarray, np.ndarray]]
) -> dict[int, Window]:
    """layer -> its local rule where that layer's mask is, on every trace's real rows, exactly the tokens'
    mask within a sliding window (Mistral's and Gemma 2's decoder layers, ModernBERT's local encoder layers)
    or within chunks (Llama 4's), and narrower than it somewhere: such a rule hides keys by design, so the
    declared-mask check reads the layer against the tokens' mask within it. A layer whose hidden keys follow
    no such rule stays a mismatch. ``expected``: each trace's real queries and the mask its tokens call for."""
    if kind not in ("dec_self", "enc_self") or any(tr.probs(kind).shape[0] != traces[0].probs(kind).shape[0]
                                                   for tr in traces):  # fmt: skip
        return {}
    found: dict[int, Window] = {}
    for layer in range(traces[0].probs(kind).shape[0]):
        rows = [  # (real queries, the tokens' mask, this layer's mask) of each trace
            (q_real, exp, np.asarray(tr.mask(kind, layer), bool))
            for tr, (q_real, exp) in zip(traces, expected, strict=True)
        ]
        for rule in _candidates(kind, rows):
            fits, narrower = True, False
            for q_real, exp, m in rows:
                want = exp & _band(kind, rule, *exp.shape)
                if ((m != want) & q_real[:, None]).any():
                    fits = False
                    break
                narrower = narrower or bool(((want != exp) & q_real[:, None]).any())
            if fits and narrower:
                found[layer] = rule
                break
    return found


def _candidates(kind: str, rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> list[Window]:
    """The local rules a layer's mask may follow, read off its real rows: the widest reach of any query (a
    window), and for a decoder the first query that sees nothing before itself (where a chunk starts)."""
    reach, chunk = 0, None
    for q_real, exp, m in rows:
        seen = m & exp & q_real[:, None]
        if not seen.any():
            continue
        qi, ki = np.nonzero(seen)
        d = qi - ki
        reach = max(reach, int(d.max()) + 1 if kind == "dec_self" else int(np.abs(d).max()))
        if kind == "dec_self":
            first = np.where(seen.any(-1), np.argmax(seen, -1), -1)  # each real row's first key
            starts = [
                int(i) for i in np.nonzero(first == np.arange(len(first)))[0] if i > 0 and exp[i, i - 1]
            ]
            if starts:
                chunk = starts[0] if chunk is None else min(chunk, starts[0])
    out: list[Window] = [("window", reach)] if reach else []
    if chunk:
        out.append(("chunk", chunk))
    return out


def layer_rules(traces: list[AttentionTrace], kind: str, pad_id: int | None = None) -> dict[int, Window]:
    """layer -> the local rule (a sliding window, chunks) that check_declared_mask accepts for that layer of
    ``kind`` in this batch: the layer is read against the tokens' mask within it (``within_rule``). Empty
    where a trace carries no mask for the kind (the check skips it) or no layer keeps to such a rule."""
    if any(tr.mask(kind) is None for tr in traces):
        return {}
    return _windows(traces, kind, [expected_mask(tr, kind, pad_id) for tr in traces])


def within_rule(kind: str, rule: Window, mask: np.ndarray) -> tuple[np.ndarray, str]:
    """(the tokens' mask ``mask`` (Q, K) within a layer's local rule, the rule in words): the mask that
    check_declared_mask reads that layer against."""
    return mask & _band(kind, rule, *mask.shape), _rule_words(kind, rule)


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
        ly, h = (int(i) for i in np.unravel_index(int(np.argmax(m)), m.shape))
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
    out: list[Verdict] = []
    for check in STATIC_CHECKS:
        out.extend(check(traces, kind, pad_id) for kind in traces[0].kinds)
    out.append(check_finite(traces))
    if info:
        out.extend(check_special_tokens(traces, kind, pad_id) for kind in traces[0].kinds)
    return out
