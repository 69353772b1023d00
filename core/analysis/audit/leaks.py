"""Mask audit, black-box leak tests: the model called through a *forward-outputs function*::

    fwd(src_ids (B, S), tgt_ids (B, T) | None, src_real (B, S) bool, tgt_real (B, T) bool | None)
        -> {"enc": (B, S, ...) tensor, "dec": (B, T, ...) tensor (models with a decoder)}

``*_real`` say where the real tokens are (True = not PAD), independently of the ids,
so a test can change what sits in PAD positions while the padding stays the same.
Every model provides it as ``lm.forward_outputs`` (attnscope.core.families.interface); ``core_forward_outputs``
runs a core model with a mask-lab bug or head ablation injected. Models that build their masks
from the ids themselves (adapters, ``lm.masks_from_ids``) cannot have PAD content changed; for
them (and every model) ``batch_invariance`` runs each sequence alone and compares.

A leak test passes when no real-position output moves by more than LEAK_TOL (float32 noise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from attnscope.core.analysis import bugs as B
from attnscope.core.analysis.audit.static import Verdict, _tok, real_positions
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer.attention import Intervention

LEAK_TOL = 1e-5
EXTRA_PAD = 2  # PAD columns the leak tests append so that even one text has padding
MAX_VARIANTS = 96  # causal leak: at most this many (sequence, position) changes
CHUNK = 32  # sequences per forward call in the leak tests
CONFIRM = 16  # causal leak: changes that moved an earlier output, each run again alone (two calls each)

ForwardFn = Callable[..., dict[str, torch.Tensor]]


# -- black-box leak tests -------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeBatch:
    """Ids and real-token vectors for the leak tests (PAD columns already appended)."""

    src: torch.Tensor | None  # (B, S) long (None: decoder-only model)
    src_real: torch.Tensor | None  # (B, S) bool
    tgt: torch.Tensor | None = None  # (B, T) long
    tgt_real: torch.Tensor | None = None
    extra_pad: int = 0

    @property
    def n(self) -> int:
        """Sequences in the batch."""
        ids = self.src if self.src is not None else self.tgt
        if ids is None:
            raise ValueError("a probe batch needs a source or a target")
        return ids.shape[0]

    def side(self, side: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, real) of ``side`` ("src" or "tgt"); ValueError when the batch has none."""
        ids, real = (self.src, self.src_real) if side == "src" else (self.tgt, self.tgt_real)
        if ids is None or real is None:
            raise ValueError(f"this batch has no {side} sequence")
        return ids, real

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
        present = [i for i in ids if i is not None]
        if len(present) < len(ids) or len(present[0]) == 0:
            return None, None
        real = np.stack([real_positions(tr, side, pad_id) for tr in traces])
        ids_ = np.stack(present)
        fed = (ids_ >= 0).all(axis=0)  # id -1: a learned position the model joins itself (a [CLS]), not fed
        return torch.tensor(ids_[:, fed], dtype=torch.long), torch.tensor(real[:, fed])

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
    out = lm.forward_with(src, tgt, masks=masks, interv=iv)  # no gradients
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
    """(N, L) largest absolute change per position; inf where one side is not finite and the other is (or
    another non-number). Values NaN on both sides (or the same infinity) did not move: the finite-outputs
    check says that they are not numbers, and a leak test does not blame the change for them."""
    a, b = a.float(), b.float()
    d = (a - b).abs()
    same = (torch.isnan(a) & torch.isnan(b)) | (torch.isinf(a) & (a == b))
    d = torch.where(same, torch.zeros_like(d), d).reshape(a.shape[0], a.shape[1], -1).amax(-1)
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
    ids: torch.Tensor, real: torch.Tensor, pad_id: int, vocab: int | None, skip: AbstractSet[int]
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
    batch: ProbeBatch, side: str, pad_id: int, vocab: int | None, skip_ids: AbstractSet[int], seed: int = 0
) -> _PadProbe | Verdict:
    """The rows of ``side`` with their PAD content changed, or the skip verdict when there is none."""
    name = f"padding_leak[{side}]"
    ids, real = (batch.src, batch.src_real) if side == "src" else (batch.tgt, batch.tgt_real)
    if ids is None or real is None:
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
    n = batch.n
    parts: dict[str, list[torch.Tensor | None]] = {name: [t] for name, t in (("src", batch.src), ("tgt", batch.tgt), ("sr", batch.src_real),
                                       ("tr", batch.tgt_real))}  # fmt: skip
    for p in probes:
        for name, t in (
            ("src", batch.src),
            ("tgt", batch.tgt),
            ("sr", batch.src_real),
            ("tr", batch.tgt_real),
        ):
            parts[name].append(None if t is None else (p.ids if name == p.side else t[p.rows]))
    cat = {
        name: None if ts[0] is None else torch.cat([t for t in ts if t is not None])
        for name, ts in parts.items()
    }
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
    if worst is None:
        raise ValueError("the model gave no output to compare")
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
    _, real = batch.side(side)
    pad_pos = [int(k) for k in torch.nonzero(~real[b]).flatten()]
    blame = _blame(traces, kind, b, i, pad_pos)
    extra = f"; {kind} layer {blame[0]} head {blame[1]} puts {blame[2]:.3g} on PAD there" if blame else ""
    nonfinite = " (not finite: NaN)" if v == float("inf") else ""
    return Verdict(name, False, f"changing {p.n_pads} {side} PAD tokens moved the {where} by {v:.3g}{nonfinite}"
                   f"{extra}", kind=kind, layer=blame[0] if blame else None, head=blame[1] if blame else None,
                   positions=(b, i), value=v)  # fmt: skip


def check_padding_leak(
    fwd: ForwardFn, batch: ProbeBatch, side: str, pad_id: int, traces=(), vocab: int | None = None,
    skip_ids: AbstractSet[int] = frozenset(), seed: int = 0,
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
    skip_ids: AbstractSet[int] = frozenset(), seed: int = 0,
) -> Verdict:  # fmt: skip
    """Change each future target token; decoder outputs at earlier positions must not move."""
    name = "causal_leak"
    if batch.tgt is None or batch.tgt_real is None:
        return Verdict(name, True, "the model has no decoder", status="skip")
    tgt, real = batch.tgt, batch.tgt_real
    pool = _pool(tgt[:, 1:], real[:, 1:], pad_id, vocab, skip_ids)
    pairs = [(b, j) for b in range(tgt.shape[0]) for j in range(1, tgt.shape[1]) if real[b, j]]
    if not pairs or len(pool) < 2:
        return Verdict(name, True, "not run: the decoder input has no target token after the first position to "
                       "change (the model generated nothing after its start token); give targets (--target) to "
                       "test the decoder's causal mask", status="skip")  # fmt: skip
    if len(pairs) > MAX_VARIANTS:
        pick = np.linspace(0, len(pairs) - 1, MAX_VARIANTS).round().astype(int)
        pairs = [pairs[i] for i in sorted(set(pick))]
    g = torch.Generator().manual_seed(seed)
    moved: list[tuple[float, int, int, int, torch.Tensor]] = []  # (change, seq, position, changed, its ids)
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
            moved.append((float(earlier.max()), b, int(earlier.argmax()), j, new_tgt[n]))
    moved.sort(key=lambda m: -m[0])
    worst: tuple[float, tuple[int, int, int] | None] = (moved[0][0], moved[0][1:4]) if moved else (0.0, None)
    over = [m for m in moved if m[0] > LEAK_TOL]
    crossed = 0
    if over:
        # each change ran beside the other rows' changes in one batch: a model that mixes its batch's rows (a
        # head split across sequences) moves a row by another row's change. Each change alone, against its row
        # alone, says whether its own future moved it (else batch invariance is what reports the mixing)
        # (the largest moves first: where none of them is a sequence's own, the smaller ones are taken alike)
        worst = (0.0, None)
        for _, b, _, j, ids in over[:CONFIRM]:
            one = torch.tensor([b], device=tgt.device)
            d = _change(batch.call(fwd, rows=one)["dec"], batch.call(fwd, tgt=ids[None], rows=one)["dec"])
            earlier = d[0, :j].masked_fill(~real[b, :j], 0.0)
            if float(earlier.max()) > LEAK_TOL and float(earlier.max()) > worst[0]:
                worst = (float(earlier.max()), (b, int(earlier.argmax()), j))
            elif float(earlier.max()) <= LEAK_TOL:
                crossed += 1
        if worst[1] is None:
            crossed = len(over)
    v, where = worst
    if where is None or v <= LEAK_TOL:
        if crossed:
            return Verdict(name, True, f"changing each of {len(pairs)} future target tokens alone moved earlier "
                           f"outputs of its sequence by at most {v:.1e}; {crossed} of them moved earlier outputs "
                           "only beside other sequences' changes in one batch (the batch's rows mix, which "
                           "batch_invariance reports)", value=v)  # fmt: skip
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
    n_seq = batch.n
    out = []
    for b in range(n_seq):
        lens: dict[str, int] = {}
        parts: list = []
        for side, ids, real in (("src", batch.src, batch.src_real), ("tgt", batch.tgt, batch.tgt_real)):
            if ids is None or real is None:
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
    n_seq = batch.n
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
                   vocab: tuple[int | None, int | None] = (None, None), skip_ids: AbstractSet[int] = frozenset(),
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
        n = batch.n
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
