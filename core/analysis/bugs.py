"""Named mask bugs, injected into a core model's real forward pass (the mask lab).

Each bug is a known mistake from tutorials and real code. It is applied the way
the model takes masks: as ``Masks`` (bool ``[batch, query, key]``, True = may
attend) passed to ``Transformer.forward(masks=...)`` / ``LoadedModel.trace(masks=...)``,
plus an ``Intervention`` for bugs that live inside attention (``-inf`` fill).
Nothing is monkey-patched; the correct model is untouched.

A bug is built from the real-token vectors of a batch (``src_real`` ``[B, S]``,
``tgt_real`` ``[B, T]``, True = not PAD), so the padding leak test can change
the content of PAD positions while the masks still say where PAD is.

Padding bugs only show when the batch has PAD: audit a batch of texts of
different lengths (the audit also appends PAD columns of its own for its leak
tests). ``neg_inf_fill`` only shows when a row is fully masked: it uses the
common 2-D padding mask ``pad[:, None, :] & pad[:, :, None]`` that blanks PAD
query rows, which is harmless with a finite fill and turns into NaN with ``-inf``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnscope.core.families.interface import pad_rows
from attnscope.core.transformer.attention import Intervention
from attnscope.core.transformer.model import Masks

__all__ = ["BUGS", "Bug", "UnknownBugError", "get", "names", "reference_masks", "real_from_masks"]


class UnknownBugError(ValueError):
    """A bug name that is not in the registry."""


def _tril(n: int, device, diagonal: int = 0) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(diagonal)  # (n, n)


def reference_masks(src_real: torch.Tensor, tgt_real: torch.Tensor | None = None) -> Masks:
    """The correct masks (as ``Transformer.make_masks``) from real-token vectors.

    src_real (B, S) bool, tgt_real (B, T) bool or None (encoder-only).
    """
    b, s = src_real.shape
    enc = src_real[:, None, :].expand(b, s, s)  # keys: real source tokens
    if tgt_real is None:
        return Masks(enc_self=enc)
    t = tgt_real.shape[1]
    dec = tgt_real[:, None, :] & _tril(t, tgt_real.device)[None]  # (B, T, T) causal & real key
    cross = src_real[:, None, :].expand(b, t, s)  # (B, T, S)
    return Masks(enc_self=enc, dec_self=dec, cross=cross)


def real_from_masks(masks: Masks) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Real-token vectors back from correct masks: a key is real iff some query may read it."""
    src_real = masks.enc_self.any(dim=1)  # (B, S)
    tgt_real = None if masks.dec_self is None else masks.dec_self.any(dim=1)  # (B, T)
    return src_real, tgt_real


# -- the bugs -------------------------------------------------------------------------
# Each builder: (src_real (B, S), tgt_real (B, T) | None) -> buggy Masks.


def _inverted(sr, tr):
    ok = reference_masks(sr, tr)
    if tr is None:
        return Masks(enc_self=~ok.enc_self)
    return Masks(enc_self=~ok.enc_self, dec_self=~ok.dec_self, cross=~ok.cross)


def _causal(diagonal: int):
    def build(sr, tr):
        ok = reference_masks(sr, tr)
        t = tr.shape[1]
        dec = tr[:, None, :] & _tril(t, tr.device, diagonal)[None]
        return Masks(enc_self=ok.enc_self, dec_self=dec, cross=ok.cross)

    return build


def _pad_on_queries(sr, tr):
    b, s = sr.shape
    enc = sr[:, :, None].expand(b, s, s)  # rows of PAD queries blanked, every key readable
    if tr is None:
        return Masks(enc_self=enc)
    t = tr.shape[1]
    dec = tr[:, :, None] & _tril(t, tr.device)[None]
    cross = tr[:, :, None].expand(b, t, s)  # the target's padding, on the query axis
    return Masks(enc_self=enc, dec_self=dec, cross=cross)


def _cross_no_src_pad(sr, tr):
    ok = reference_masks(sr, tr)
    return Masks(enc_self=ok.enc_self, dec_self=ok.dec_self, cross=torch.ones_like(ok.cross))


def _neg_inf_fill(sr, tr):
    enc = sr[:, None, :] & sr[:, :, None]  # 2-D padding mask: PAD query rows fully masked
    if tr is None:
        return Masks(enc_self=enc)
    t = tr.shape[1]
    dec = tr[:, None, :] & tr[:, :, None] & _tril(t, tr.device)[None]
    cross = sr[:, None, :] & tr[:, :, None]
    return Masks(enc_self=enc, dec_self=dec, cross=cross)


def _wrong_broadcast(sr, tr):
    b, s = sr.shape
    pad4 = sr[:, None, :, None]  # (B, 1, S, 1): the buggy unsqueeze(-1); correct is (B, 1, 1, S)
    enc = pad4.expand(b, 1, s, s)[:, 0]  # broadcast over keys, as against scores (B, H, S, S)
    if tr is None:
        return Masks(enc_self=enc)
    ok = reference_masks(sr, tr)
    return Masks(enc_self=enc, dec_self=ok.dec_self, cross=ok.cross)


@dataclass(frozen=True)
class Bug:
    """One named mask bug: how to build its masks and whether attention fills with -inf."""

    name: str
    description: str  # one line: what the buggy code does and what it breaks
    kinds: tuple[str, ...]  # attention kinds whose mask changes
    build: Callable[[torch.Tensor, torch.Tensor | None], Masks]
    neg_inf_fill: bool = False
    needs_decoder: bool = False

    def masks(self, src_real: torch.Tensor, tgt_real: torch.Tensor | None = None) -> Masks:
        """Buggy masks for a batch, bool [B, q, k] per kind (True = may attend)."""
        if self.needs_decoder and tgt_real is None:
            raise ValueError(f"bug {self.name!r} needs a model with a decoder")
        return self.build(src_real.bool(), None if tgt_real is None else tgt_real.bool())

    def intervention(self, base: Intervention | None = None) -> Intervention:
        base = base or Intervention()
        return Intervention(
            neg_inf_fill=base.neg_inf_fill or self.neg_inf_fill, head_mask=dict(base.head_mask)
        )

    def apply(self, masks: Masks, interv: Intervention | None = None) -> tuple[Masks, Intervention]:
        """Correct masks (and intervention) of a batch -> the buggy ones."""
        return self.masks(*real_from_masks(masks)), self.intervention(interv)


BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug(
            "inverted",
            "True = masked read as True = allowed: every mask is flipped, queries read PAD and future keys only",
            ("enc_self", "dec_self", "cross"),
            _inverted,
        ),
        Bug(
            "causal_diag_masked",
            "causal mask off by one (triu(0) instead of triu(1)): each position cannot see itself, BOS sees nothing",
            ("dec_self",),
            _causal(-1),
            needs_decoder=True,
        ),
        Bug(
            "causal_next_visible",
            "causal mask off by one (tril(1) instead of tril(0)): each position sees the next target token",
            ("dec_self",),
            _causal(1),
            needs_decoder=True,
        ),
        Bug(
            "pad_on_queries",
            "padding mask applied along queries instead of keys: real queries read PAD keys, PAD rows are blanked",
            ("enc_self", "dec_self", "cross"),
            _pad_on_queries,
        ),
        Bug(
            "cross_no_src_pad",
            "cross attention without the source padding mask: the decoder reads source PAD positions",
            ("cross",),
            _cross_no_src_pad,
            needs_decoder=True,
        ),
        Bug(
            "neg_inf_fill",
            "masked scores filled with -inf and PAD query rows masked too: fully masked rows give NaN that spreads",
            ("enc_self", "dec_self", "cross"),
            _neg_inf_fill,
            neg_inf_fill=True,
        ),
        Bug(
            "wrong_broadcast",
            "encoder padding mask shaped [B,1,L,1] instead of [B,1,1,L]: broadcast over keys, so it masks queries",
            ("enc_self",),
            _wrong_broadcast,
        ),
    )
}


def names() -> list[str]:
    return list(BUGS)


def get(name: str) -> Bug:
    try:
        return BUGS[name]
    except KeyError:
        raise UnknownBugError(f"unknown bug {name!r}; choose one of: {', '.join(BUGS)}") from None


# -- running a core model with a bug ---------------------------------------------------------


def batch_ids(
    lm, sources: list[str], targets: list[str] | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(src (B, S), decoder input (B, T) or None) exactly as ``LoadedModel.trace`` builds them
    (``LoadedModel.batch``): without targets the decoder input is the correct model's greedy output."""
    b = lm.batch(sources, targets)
    return b.src, b.tgt


def source_ids(lm, sources: list[str]) -> torch.Tensor:
    """(B, S) source ids, PAD on the right, as ``LoadedModel.trace`` builds them."""
    return pad_rows([lm.prepare(s).ids for s in sources], lm.cfg.pad_id, lm.device)[0]


def masks_for(
    lm,
    src: torch.Tensor,
    tgt: torch.Tensor | None,
    bug: Bug | None = None,
    interv: Intervention | None = None,
) -> tuple[Masks, Intervention | None]:
    """Masks and intervention for one batch of ids, with ``bug`` injected (None = correct)."""
    pad = lm.cfg.pad_id
    src_real, tgt_real = src != pad, (None if tgt is None else tgt != pad)
    if bug is None:
        return reference_masks(src_real, tgt_real), interv
    return bug.masks(src_real, tgt_real), bug.intervention(interv)


def trace_with_bug(
    lm,
    sources: list[str],
    bug: Bug | str | None,
    targets: list[str] | None = None,
    interv: Intervention | None = None,
):
    """AttentionTraces of a core LoadedModel with ``bug`` injected into its forward pass.

    Without targets, the decoder input is the correct model's greedy output, so a trace of
    the correct model (``lm.trace(sources)``) lines up position by position.
    """
    bug = get(bug) if isinstance(bug, str) else bug
    if bug is not None and bug.needs_decoder and not lm.has_decoder:
        raise ValueError(f"bug {bug.name!r} needs a decoder; model {lm.name!r} is encoder-only")
    b = lm.batch(sources, targets)  # one batch, one greedy decode: the trace runs on exactly it
    masks, iv = masks_for(lm, b.src, b.tgt, bug, interv)
    return lm.trace_batch(b, masks, iv)


@torch.no_grad()
def greedy_with_bug(
    lm,
    sources: list[str],
    bug: Bug | str | None,
    max_len: int | None = None,
    interv: Intervention | None = None,
) -> list[str]:
    """The model's own greedy output (text) with ``bug`` in every decoding step."""
    bug = get(bug) if isinstance(bug, str) else bug
    if not lm.has_decoder:
        return [t.output_text for t in trace_with_bug(lm, sources, bug, interv=interv)]
    cfg = lm.cfg
    src = source_ids(lm, sources)
    max_len = min(max_len or cfg.max_len - 1, cfg.max_len - 1)
    ys = torch.full((src.shape[0], 1), cfg.bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    cols = []
    for _ in range(max_len):
        masks, iv = masks_for(lm, src, ys, bug, interv)
        logits = lm.forward_with(src, ys, masks=masks, interv=iv).logits[:, -1]  # (B, V)
        nxt = torch.nan_to_num(logits, nan=float("-inf")).argmax(-1).masked_fill(done, cfg.pad_id)
        cols.append(nxt)
        done = done | (nxt == cfg.eos_id)
        if bool(done.all()):
            break
        ys = torch.cat([ys, nxt.masked_fill(nxt == cfg.eos_id, cfg.pad_id)[:, None]], dim=1)
    out = torch.stack(cols, dim=1)
    return [lm.tgt_tok.decode(row) for row in out.tolist()]
