"""Positional encoding: the model's own table (sinusoidal or learned), or the paper's for any size.

Core models: ``src_embed.pos``. Hugging Face models: their position embedding module (BERT's
position_embeddings, GPT-2's wpe, BART/Marian's embed_positions); models with relative (T5) or
rotary positions have no table, and the page says so and offers the paper's sinusoids.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnscope.core.analysis import tables as analysis
from attnscope.core.transformer.positional import sinusoidal_table, wavelengths
from attnscope.dashboard import keys as K
from attnscope.dashboard import state, ui
from attnscope.dashboard.plots import positional as P

OWN, FREE = "this model's encoding", "explore the paper's sinusoids (any d_model, length)"

st.title("Positional encoding")
lm = state.model("The position table")
cfg = lm.cfg
own = lm.position_table()
if own.table is None:
    st.info(
        f"Model **{lm.name}** has no position table to show: it uses {own.where}. "
        "Below: the paper's sinusoids, for any size."
    )
    st.session_state[K.PE_SOURCE] = FREE
source = st.radio(
    "Encoding", (OWN, FREE) if own.table is not None else (FREE,), key=K.PE_SOURCE, horizontal=True
)

if source == OWN:
    core_model = own.where == "src_embed.pos"
    # Core's sinusoids interleave sin/cos (even/odd dims); Hugging Face's sinusoidal tables
    # (Marian) put them in halves, so their dims are labelled generically and measured by FFT.
    sinusoidal = own.scheme == "sinusoidal" and core_model
    table = own.table  # (positions, d_model)
    kind = "sinusoidal (fixed)" if own.scheme == "sinusoidal" else "learned"
    st.caption(
        f"Model **{lm.name}**: {kind} positions, max_len {cfg.max_len}, d_model {cfg.d_model}"
        + ("" if core_model else f", table `{own.where}` ({table.shape[0]} rows)")
        + (f", position ids start at {own.offset}" if own.offset else "")
        + (
            ". Token embeddings are scaled by √d_model before the positions are added."
            if cfg.scale_embeddings
            else "."
        )
    )
    name = f"{lm.name}, {kind.split()[0]}"
else:
    sinusoidal = True
    c1, c2 = st.columns(2)
    d_model = int(
        c1.number_input(
            "d_model",
            min_value=2,
            max_value=2048,
            value=min(max(2, cfg.d_model + cfg.d_model % 2), 2048),
            step=2,
            key=K.PE_DMODEL,
        )
    )
    max_len = int(
        c2.number_input(
            "max length",
            min_value=2,
            max_value=4096,
            value=min(max(cfg.max_len, 2), 256),
            key=K.PE_MAXLEN,
        )
    )
    table = sinusoidal_table(max_len, d_model).numpy()
    name = f"sinusoidal, d_model {d_model}"

n_pos, d = table.shape
default_dims = sorted({x for x in (0, 1, 2, 3, d // 2, d // 2 + 1, d - 2, d - 1) if 0 <= x < d})
if any(x >= d for x in st.session_state.get(K.PE_DIMS, [])):
    st.session_state[K.PE_DIMS] = default_dims
dims = st.multiselect(
    "Dimensions to plot" + (" (even = sin, odd = cos of the same frequency)" if sinusoidal else ""),
    list(range(d)),
    default=default_dims,
    key=K.PE_DIMS,
)

curves = P.pe_curves(
    table, dims, sinusoidal=sinusoidal, title=f"PE(position, dimension) of chosen dimensions ({name})"
)
ui.chart(curves, key="pe_curves")
left, right = st.columns(2)
heat = P.pe_heatmap(table, title=f"PE matrix [{n_pos} positions × {d} dims] ({name})")
sim = P.similarity_figure(table, title=f"dot product PE(p) · PE(q) ({name})")
with left:
    ui.chart(heat, key="pe_heat")
with right:
    ui.chart(sim, key="pe_sim")
if sinusoidal:
    wl = wavelengths(d).numpy()
    wave = P.wavelength_figure(
        wl,
        y_title="wavelength (positions, log)",
        title=f"wavelength of each dimension: 2π·10000^(2i/d) ({name})",
    )
else:
    wl = analysis.dominant_period(table)
    wave = P.wavelength_figure(
        np.where(np.isfinite(wl), wl, np.nan),
        y_title="dominant period (positions, log)",
        title=f"dominant period of each learned dimension (FFT over positions) ({name})",
        lines=False,
    )
ui.chart(wave, key="pe_wave")
if sinusoidal:
    st.caption(
        "Sinusoids: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same). Wavelengths grow "
        "geometrically from 2π to 10000·2π, so PE(pos + k) is a fixed rotation of PE(pos) for every k, "
        "and the dot product depends only on the distance |p − q|."
    )
else:
    st.caption(
        "A learned table has no formula; its dominant period per dimension is measured with an FFT "
        "over positions (infinite periods, i.e. no oscillation, are left out)."
    )
ui.figure_downloads(
    {"curves": curves, "matrix": heat, "similarity": sim, "wavelength": wave},
    "positional",
    key="pe_dl",
    table=table,
)
