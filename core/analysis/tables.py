"""Numbers the pages show besides figures: mask audit, periods of a table.

Pure functions over AttentionTrace / numpy; no streamlit, no plotly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from attnscope.core.traces.trace import KIND_LABELS, AttentionTrace

# -- masks ----------------------------------------------------------------------------------


def masked_mass_table(traces: Sequence[AttentionTrace]) -> pd.DataFrame:
    """Per kind, layer and head, over the whole batch: attention mass on masked keys (must be 0)
    and rows that were fully masked (no key allowed) or that came out all zero; rows that are NaN (as the
    model computed them) are counted apart and left out of the mass and of the all-zero check."""
    records = []
    for kind in traces[0].kinds:
        probs = np.stack([t.probs(kind) for t in traces]).astype(np.float64)  # (B, L, H, Q, K)
        mask = np.stack(  # (B, L, 1, Q, K): each layer's (a trace with no mask for the kind: every key allowed)
            [np.ones(t.probs(kind).shape[:1] + t.probs(kind).shape[2:], bool) if (m := t.layer_masks(kind)) is None
             else m for t in traces]
        )[:, :, None]  # fmt: skip
        nan_rows = np.isnan(probs).any(-1)  # (B, L, H, Q): rows that are not numbers (said apart)
        on_masked = np.where(nan_rows, 0.0, np.where(mask, 0.0, probs).sum(-1))  # (B, L, H, Q)
        dead = ~mask.any(-1)  # (B, L, 1, Q): query rows that may attend to no key
        full = dead.sum(axis=(0, 2, 3))  # (L,) fully masked query rows in the batch, per layer
        zero = (probs.sum(-1) == 0).sum(axis=(0, 3))  # (L, H)
        # the fully masked rows that must come out all zero: a NaN row is counted apart, as in the mass
        must_zero = (dead & ~nan_rows).sum(axis=(0, 3))  # (L, H)
        nans = nan_rows.sum(axis=(0, 3))  # (L, H)
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
                        "fully masked rows": int(full[layer]),
                        "all-zero rows": int(zero[layer, head]),
                        "NaN rows": int(nans[layer, head]),
                        "ok": worst == 0.0 and int(zero[layer, head]) == int(must_zero[layer, head]),
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
