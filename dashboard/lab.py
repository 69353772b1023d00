"""Cached computations and shared words of the analysis pages (mask audit, mask lab, head analytics, compare).

Everything that runs a model here is ``st.cache_data`` keyed on hashable inputs (model name,
device, weights version, input tuples, bug name, heads switched off), with a bounded number of
entries, so a widget that only changes what is shown (kind, layer, head, sequence...) never runs
the model again. Models come from ``loaders.load_model`` (shared by every session: read-only).

The session-state keys of these pages are declared here (``state.py`` holds the sidebar's).
"""

from __future__ import annotations

import streamlit as st

from core import analytics, audit, bugs
from core.audit import AuditReport
from core.trace import KIND_LABELS, AttentionTrace
from dashboard import loaders

# -- session-state keys -----------------------------------------------------------------------
AUD_KIND = "aud_kind"
AUD_SEQ = "aud_seq"
LAB_BUG = "lab_bug"
LAB_PAD = "lab_pad"  # add a shorter copy of a single input, so the batch has padding
LAB_KIND = "lab_kind"
LAB_SEQ = "lab_seq"
LAB_LAYER = "lab_layer"
LAB_HEAD = "lab_head"
HA_KIND = "ha_kind"
HA_STAT = "ha_stat"
HA_SEQ = "ha_seq"
HA_LAYER = "ha_layer"
HA_HEAD = "ha_head"
HA_CHART = "ha_stat_chart"  # plotly selection of the statistic heatmap
HA_TABLE = "ha_table"  # row selection of the table
HA_ROLL_LAYER = "ha_roll_layer"
HA_ATTR_ENCODER = "ha_attr_encoder"
HA_AL_LAYER = "ha_al_layer"
HA_AL_HEAD = "ha_al_head"
CMP_MODE = "cmp_mode"
CMP_SOURCE_B = "cmp_source_b"
CMP_TARGET_B = "cmp_target_b"
CMP_MODEL_B = "cmp_model_b"
CMP_BUG = "cmp_bug"
CMP_OFF = "cmp_off"  # heads switched off (multiselect of "kind · layer l · head h")
CMP_KIND = "cmp_kind"
CMP_SEQ = "cmp_seq"
CMP_LAYER = "cmp_layer"
CMP_HEAD = "cmp_head"
CMP_CHART = "cmp_head_diff_chart"

CACHE_ENTRIES = 16
CACHE_SIZE = "512MiB"  # audits carry traces; evict least recently used

Heads = tuple[tuple[str, int, int], ...]  # (kind, layer, head) switched off


# -- cached runs ----------------------------------------------------------------------------------


def _intervention(lm, off: Heads):
    return analytics.ablation(lm.cfg, list(off)) if off else None


@st.cache_data(max_entries=CACHE_ENTRIES, max_size=CACHE_SIZE, show_spinner="Auditing the masks…")
def audit_report(
    name: str,
    device: str,
    version: float,
    sources: tuple[str, ...],
    targets: tuple[str, ...] | None = None,
    bug: str | None = None,
    off: Heads = (),
) -> AuditReport:
    """core.audit.run_audit of the sidebar's model (with ``bug`` injected / heads ``off``).

    The report's traces are what the static checks read: without a bug or ablation, the
    model's own traces; with one, the buggy run teacher-forced on the correct model's output.
    Raises core.runner.InputError (bad input) or ValueError (a bug this model cannot take).
    """
    lm = loaders.load_model(name, device, version)
    return audit.run_audit(
        lm,
        list(sources),
        None if targets is None else list(targets),
        bug=bug,
        interv=_intervention(lm, off),
    )


@st.cache_data(max_entries=32, show_spinner="Generating…")
def generated(
    name: str,
    device: str,
    version: float,
    sources: tuple[str, ...],
    bug: str | None = None,
    off: Heads = (),
) -> tuple[str, ...]:
    """The model's own greedy output (text) per source, with ``bug`` / heads ``off`` in every step.

    Encoder-only models: their output (class label or embedding summary).
    """
    lm = loaders.load_model(name, device, version)
    return tuple(bugs.greedy_with_bug(lm, list(sources), bug, interv=_intervention(lm, off)))


@st.cache_data(max_entries=32, show_spinner=False)
def head_stats(
    name: str,
    device: str,
    version: float,
    sources: tuple[str, ...],
    targets: tuple[str, ...] | None,
    seq: int,
    pad: int | None,
) -> tuple[dict[str, dict], list[dict]]:
    """({kind: core.analytics.trace_head_stats}, head_records) of sequence ``seq`` of the sidebar's
    traces (the traces come from loaders' cache): a 12-layer model at 512 tokens takes about a
    second, so a click that only picks another head does not recompute them."""
    tr = loaders.compute_traces(name, device, version, sources, targets)[seq]
    stats = {kind: analytics.trace_head_stats(tr, kind, pad) for kind in tr.kinds}
    return stats, analytics.head_records(tr, pad)


def outputs(
    sel, sources: tuple[str, ...], targets: tuple[str, ...] | None, report: AuditReport, bug=None, off=()
) -> tuple[str, ...]:
    """What the model answers: its greedy output (generate mode) or the teacher-forced argmax."""
    if targets is not None or not loaders.load_model(sel.name, sel.device, sel.version).injectable:
        return tuple(t.output_text for t in report.traces)
    return generated(sel.name, sel.device, sel.version, sources, bug, off)


# -- small helpers -----------------------------------------------------------------------------------


def injectable(lm) -> bool:
    """Masks and head ablation can be injected into attnscope's own Transformer only."""
    return lm.injectable


def not_injectable_message(lm) -> str:
    what = {
        "hf": "a Hugging Face model run through the transformers library",
        "adapter": "your own model run through its adapter file, which builds its masks inside its own code",
    }.get(lm.meta.get("kind", ""), "not one of attnscope's own Transformer models")
    return (
        f"Masks cannot be injected into **{loaders.display_name(lm.name)}**: it is {what}, and the lab "
        "changes the masks inside attnscope's own forward pass (core.model.Transformer). "
        "The **Mask audit** page still audits this model as a black box (static checks on its attention "
        "and leak tests through its public call). Pick a zoo model in the sidebar to try the bugs."
    )


def shorter_copy(text: str, char_level: bool) -> str | None:
    """The first half of ``text`` (characters, or words for word-level tokenizers); None if too short."""
    parts = list(text) if char_level else text.split()
    half = len(parts) // 2
    if half < 1:
        return None
    return ("" if char_level else " ").join(parts[:half])


def lab_batch(
    lm, sources: tuple[str, ...], targets: tuple[str, ...] | None, add_copy: bool
) -> tuple[tuple[str, ...], tuple[str, ...] | None, bool]:
    """The lab's batch: the sidebar's inputs, plus (single input, ``add_copy``) a shorter copy so
    there is padding. Returns (sources, targets, whether a copy was added)."""
    if not add_copy or len(sources) != 1:
        return sources, targets, False
    char = lm.src_tok.kind == "char"
    src = shorter_copy(sources[0], char)
    if src is None:
        return sources, targets, False
    if targets is None:
        return (sources[0], src), None, True
    tgt_char = lm.tgt_tok.kind == "char"
    tgt = shorter_copy(targets[0], tgt_char) or targets[0]
    return (sources[0], src), (targets[0], tgt), True


def head_options(lm) -> list[tuple[str, int, int]]:
    """Every (kind, layer, head) of a core model, in kind order."""
    return [
        (kind, ly, h)
        for kind, (n_layers, n_heads) in analytics.head_shapes(lm.cfg).items()
        for ly in range(n_layers)
        for h in range(n_heads)
    ]


def head_label(option: tuple[str, int, int]) -> str:
    kind, ly, h = option
    return f"{KIND_LABELS[kind]} · layer {ly} · head {h}"


def pad_id(lm) -> int | None:
    return lm.cfg.pad_id


def keep_valid(key: str, options: list, default=None) -> None:
    """Reset a widget's stored value when it is not among the options (new model, new batch)."""
    if st.session_state.get(key) not in options:
        st.session_state[key] = options[0] if default is None or default not in options else default


def apply_click(event, applied_key: str, tag, layer_key: str, head_key: str, parse) -> None:
    """Copy a clicked (layer, head) from a chart's selection into the selectors, once per click."""
    points = list(getattr(getattr(event, "selection", None), "points", None) or [])
    if not points:
        return
    picked = parse(points[0].get("x"), points[0].get("y"))
    if picked is not None and st.session_state.get(applied_key) != (tag, picked):
        st.session_state[applied_key] = (tag, picked)
        st.session_state[layer_key], st.session_state[head_key] = picked


def side_by_side(fig, n_keys: int):
    """A chart shown in half the page's width: room for a two-line title (``line 1<br>line 2``),
    key labels turned upright once there are more than a few columns."""
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 60
    fig.update_layout(margin=dict(t=top + 22))
    if n_keys > 6:
        fig.update_xaxes(tickangle=-90)
    return fig


def verdict_frame(verdicts, columns: list[str] | None = None):
    """The verdict table (plots.audit.verdict_table) with each status cell coloured; its height fits every row."""
    from dashboard.plots.audit import STATUS_COLOR, STATUS_ICON, verdict_table

    df = verdict_table(verdicts)
    if columns is not None:
        df = df[columns]
    colours = {STATUS_ICON[k]: c for k, c in STATUS_COLOR.items()}
    styled = df.style.map(lambda v: f"background-color: {colours.get(v, 'white')}", subset=["status"])
    return styled, min(38 + 35 * len(df), 900)


def where(traces: list[AttentionTrace], seq: int) -> str:
    return f"sequence {seq}" if len(traces) > 1 else "input"


def summary(report: AuditReport) -> tuple[int, int, int]:
    """(passed, failed, skipped) tests of a report; info lines are not tests."""
    n_pass = sum(v.status == "pass" for v in report.verdicts)
    n_fail = sum(v.status == "fail" for v in report.verdicts)
    n_skip = sum(v.status == "skip" for v in report.verdicts)
    return n_pass, n_fail, n_skip


def black_box_caption(lm) -> str:
    """How a model that is not attnscope's own Transformer is audited."""
    if lm.masks_from_ids:
        return (
            "This model is audited as a black box: its own traces, and leak tests through its forward. It builds "
            "its masks from the token ids, so PAD content cannot be changed; batch invariance (each sequence "
            "alone vs padded in the batch) and future invariance test its padding and causal masks instead."
        )
    return (
        "This model is audited as a black box: its own traces, and leak tests through its public call "
        "with attention_mask built from the real positions."
    )


def verdict_line(report: AuditReport) -> str:
    n_pass, n_fail, n_skip = summary(report)
    if n_fail == 0:
        return f"All {n_pass} checks pass" + (f" ({n_skip} skipped)" if n_skip else "") + "."
    names = ", ".join(v.name for v in report.failed)
    return f"{n_fail} of {n_pass + n_fail} checks FAIL: {names}."


def report_text(report: AuditReport) -> str:
    """The report as ``python -m core audit`` prints it."""
    head = f"# mask audit of {report.meta.get('model', '')}" + (
        f" with bug {report.bug}" if report.bug else ""
    )
    return "\n".join([head, *report.lines()]) + "\n"


# -- words ----------------------------------------------------------------------------------------------

STATIC = ("masked_mass", "row_sums", "fully_masked", "declared_mask", "finite")
DYNAMIC = ("finite_outputs", "batch_invariance", "causal_leak", "padding_leak")
INFO = ("special_tokens",)

CHECK_HELP = {
    "masked_mass": "Attention that real queries put on keys they must not see: PAD keys, and for decoder "
    "self-attention also later positions. It must be exactly 0, because masked scores are filled before the "
    "softmax. A failure names the layer, head, query and key with the most mass on a forbidden key.",
    "row_sums": "Every real query's weights sum to 1 (within 1e-5). A row that sums to 0 had no visible key "
    "at all; NaN means the softmax broke.",
    "fully_masked": "Query rows that may attend to nothing. For PAD queries that is harmless if the row comes "
    "out as zeros; a real query with no visible key, or any row that turns into NaN, fails.",
    "declared_mask": "The mask the model reports it used equals the mask the tokens call for (key padding, "
    "plus causal for decoder self-attention), compared entry by entry on real query rows.",
    "finite": "No NaN or inf in any attention map or output probability; if there is, where it first "
    "appears (NaN spreads from layer to layer).",
    "finite_outputs": "Leak test: the model runs on the batch with extra PAD columns appended; the output at "
    "every real position must be finite.",
    "batch_invariance": "Leak test: each sequence runs alone, trimmed to its real tokens; its outputs at real "
    "positions must equal those it got padded in the batch (within 1e-5, relative). If they move, padding or "
    "another sequence leaks in (a missing padding mask, heads split with the wrong reshape).",
    "causal_leak": "Leak test (future invariance): each future target token is replaced by another token; the decoder's outputs at "
    "earlier positions must not move (by more than 1e-5). If they move, the decoder sees the future.",
    "padding_leak": "Leak test: the tokens in PAD positions (source or target) are replaced by random tokens; "
    "outputs at real positions must not move (by more than 1e-5). If they move, the model reads padding.",
    "special_tokens": "Information, not a test: the mean attention mass on BOS/CLS, EOS/SEP and PAD keys. Heads "
    "that park their attention on a special token are common; mass on PAD is not.",
}


def check_base(name: str) -> str:
    """'masked_mass[enc_self]' -> 'masked_mass'."""
    return name.split("[", 1)[0]


# Each bug: a title, the buggy code, the correct code, and what it breaks (one or two sentences).
BUG_HELP = {
    "inverted": (
        "Inverted mask",
        'scores.masked_fill(mask, float("-inf"))  # mask: True = allowed',
        'scores.masked_fill(~mask, float("-inf"))',
        "The mask says True = may attend (SDPA's convention) but the code treats True as 'hide this key', so "
        "exactly the allowed keys are hidden: queries read only PAD and future keys, and rows with no such "
        "key are fully masked.",
    ),
    "causal_diag_masked": (
        "Causal mask off by one: the diagonal masked",
        "hide = torch.triu(torch.ones(T, T), diagonal=0).bool()",
        "hide = torch.triu(torch.ones(T, T), diagonal=1).bool()",
        "triu(0) instead of triu(1) hides each position from itself as well as the future: the first "
        "position (BOS) sees nothing at all, every other sees only earlier tokens.",
    ),
    "causal_next_visible": (
        "Causal mask off by one: the next token visible",
        "allowed = torch.tril(torch.ones(T, T), diagonal=1).bool()",
        "allowed = torch.tril(torch.ones(T, T), diagonal=0).bool()",
        "tril(1) instead of tril(0) lets each position read the next target token, the one it has to "
        "predict: training looks perfect, generation falls apart.",
    ),
    "pad_on_queries": (
        "Padding mask on the query axis",
        "mask = real[:, :, None]  # (B, L, 1): broadcast over keys",
        "mask = real[:, None, :]  # (B, 1, L): one entry per key",
        "The padding vector is put along the queries instead of the keys: PAD rows are blanked (harmless) "
        "while real queries still read every PAD key.",
    ),
    "cross_no_src_pad": (
        "Cross attention without the source padding mask",
        "decoder(tgt, memory, tgt_mask=causal)",
        "decoder(tgt, memory, tgt_mask=causal, memory_mask=src_real[:, None, :])",
        "The decoder's cross attention gets no mask, so every target position also reads the encoder "
        "states at source PAD positions.",
    ),
    "neg_inf_fill": (
        "-inf fill with a 2-D padding mask",
        'mask = real[:, None, :] & real[:, :, None]\nscores.masked_fill(~mask, float("-inf"))',
        "mask = real[:, None, :]\nscores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
        "PAD query rows are masked too, so their scores are all -inf and softmax returns NaN (0/0); the NaN "
        "then spreads through the next layers into real positions.",
    ),
    "wrong_broadcast": (
        "Padding mask broadcast the wrong way",
        "mask = real.unsqueeze(1).unsqueeze(-1)  # (B, 1, L, 1)",
        "mask = real[:, None, None, :]  # (B, 1, 1, L)",
        "The encoder's padding mask gets its singleton axis in the wrong place and broadcasts over keys "
        "instead of queries: PAD rows are masked, real queries read PAD keys.",
    ),
}


def bug_title(name: str) -> str:
    return BUG_HELP.get(name, (name,))[0]
