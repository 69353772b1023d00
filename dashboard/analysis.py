"""Numbers the pages show besides figures: decoding steps, mask audit, periods of a table.

Pure functions over AttentionTrace / numpy; no streamlit, no plotly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.trace import KIND_LABELS, AttentionTrace

# -- decoding ---------------------------------------------------------------------------


def n_steps(trace: AttentionTrace, pad_id: int = 0) -> int:
    """Real decoder positions of a sequence = greedy steps taken (BOS + tokens, PAD excluded)."""
    if trace.tgt_ids is None:
        return 0
    return int((np.asarray(trace.tgt_ids) != pad_id).sum())


@dataclass(frozen=True)
class DecodeStep:
    """Step t of greedy decoding, read from a trace of the greedy output (teacher forcing on it).

    The decoder query at step t is position t of the decoder input (BOS + generated prefix);
    causal masking makes its attention identical to the step's own forward pass.
    """

    step: int
    prefix: tuple[str, ...]  # decoder input tokens 0..t (what the step could see)
    query_token: str  # decoder input token at position t
    new_token: str  # argmax output at position t (the token this step generated)
    new_prob: float
    cross: np.ndarray  # (layer, head, S): the step's attention over the source
    dec_self: np.ndarray  # (layer, head, t+1): its attention over the prefix
    topk_tokens: tuple[str, ...]
    topk_probs: np.ndarray  # (k,)


def decode_step(trace: AttentionTrace, t: int, itos: Sequence[str]) -> DecodeStep:
    """Step t (0-based) of a greedy trace; itos maps ids to tokens for the top-k bars."""
    if trace.cross is None:
        raise ValueError("this trace has no decoder")
    if not 0 <= t < len(trace.tgt_tokens):
        raise IndexError(f"step {t} is outside 0..{len(trace.tgt_tokens) - 1}")
    topk_ids = np.asarray(trace.topk_ids[t])
    return DecodeStep(
        step=t,
        prefix=tuple(trace.tgt_tokens[: t + 1]),
        query_token=trace.tgt_tokens[t],
        new_token=trace.out_tokens[t],
        new_prob=float(trace.out_probs[t]),
        cross=np.asarray(trace.cross[:, :, t, :]),
        dec_self=np.asarray(trace.dec_self[:, :, t, : t + 1]),
        topk_tokens=tuple(itos[int(i)] if 0 <= int(i) < len(itos) else "<unk>" for i in topk_ids),
        topk_probs=np.asarray(trace.topk_probs[t]),
    )


# -- masks ----------------------------------------------------------------------------------


def masked_mass_table(traces: Sequence[AttentionTrace]) -> pd.DataFrame:
    """Per kind, layer and head, over the whole batch: attention mass on masked keys (must be 0)
    and rows that were fully masked (no key allowed) or that came out all zero."""
    records = []
    for kind in traces[0].kinds:
        probs = np.stack([t.probs(kind) for t in traces]).astype(np.float64)  # (B, L, H, Q, K)
        mask = np.stack([t.mask(kind) for t in traces])[:, None, None]  # (B, 1, 1, Q, K)
        on_masked = (probs * ~mask).sum(-1)  # (B, L, H, Q)
        full = int((~mask.any(-1)).sum())  # fully masked query rows in the batch
        zero = (probs.sum(-1) == 0).sum(axis=(0, 3))  # (L, H)
        for layer in range(probs.shape[1]):
            for head in range(probs.shape[2]):
                worst = float(on_masked[:, layer, head].max())
                records.append(
                    {
                        "attention": KIND_LABELS[kind],
                        "layer": layer,
                        "head": head,
                        "max mass on masked keys (one query)": worst,
                        "total mass on masked keys": float(on_masked[:, layer, head].sum()),
                        "fully masked rows": full,
                        "all-zero rows": int(zero[layer, head]),
                        "ok": worst == 0.0 and int(zero[layer, head]) == full,
                    }
                )
    return pd.DataFrame.from_records(records)


# -- positional encodings -----------------------------------------------------------------


def dominant_period(table: np.ndarray) -> np.ndarray:
    """``[P, D]`` -> ``[D]``: period (in positions) of each column's strongest Fourier component.

    For a sinusoid of wavelength w < P this recovers w (to the FFT's resolution); it is how a
    learned table is put on the same "wavelength" axis as the paper's encoding.
    """
    t = np.asarray(table, dtype=np.float64)
    n = t.shape[0]
    spec = np.abs(np.fft.rfft(t - t.mean(axis=0), axis=0))  # (n//2+1, D)
    spec[0] = 0.0
    k = spec.argmax(axis=0)
    return np.where(k > 0, n / np.maximum(k, 1), np.inf)
