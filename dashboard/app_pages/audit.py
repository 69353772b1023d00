"""Mask audit: every check of attnscope.core.analysis.audit on the sidebar's model and inputs, in words and numbers."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnscope.core.analysis import audit
from attnscope.core.errors import InputError
from attnscope.core.traces.trace import KIND_LABELS
from attnscope.dashboard import files, loaders, opened, runs, state, ui, words
from attnscope.dashboard import keys as K
from attnscope.dashboard.plots import analytics as PA
from attnscope.dashboard.plots import attention as PT
from attnscope.dashboard.plots import audit as P
from attnscope.dashboard.plots.common import AXIS_TITLES

COLUMN_ORDER = ["status", "check", "detail", "kind", "layer", "head", "positions", "value"]
COLUMNS = {
    "status": st.column_config.TextColumn("status", width="small"),
    "check": st.column_config.TextColumn("check", width="medium"),
    "value": st.column_config.NumberColumn("largest value", format="%.3g", help="mass / deviation / change"),
    "positions": st.column_config.TextColumn(
        "positions", help="(sequence, query, key) or (sequence, position, changed)"
    ),
    "detail": st.column_config.TextColumn("detail", width="large"),
}


def _table(verdicts, key: str) -> None:
    table, height = ui.verdict_frame(verdicts)
    st.dataframe(
        table, hide_index=True, key=key, column_config=COLUMNS, height=height, column_order=COLUMN_ORDER
    )
    bases = list(dict.fromkeys(words.check_base(v.name) for v in verdicts))
    with st.expander("What these checks mean", expanded=False):
        st.markdown("\n".join(f"- **{b}**: {words.CHECK_HELP[b]}" for b in bases if b in words.CHECK_HELP))


st.title("Mask audit")
st.markdown(
    "Does the model attend only where its masks allow? **Static checks** read the attention the model "
    "produced and compare it with the mask the tokens call for (a key is visible iff it is not PAD, and in "
    "decoder self-attention not in the future). **Leak tests** run the model again as a black box: they "
    "change what sits in PAD positions or in future target positions, or run each sequence alone, and the "
    "outputs at real positions must not move. Give a batch of inputs of different lengths (sidebar) to exercise padding in the static "
    "checks; the leak tests append PAD columns of their own either way."
)
traces = state.traces()
sel = state.current()
file = state.trace_file()
if file is not None:  # a trace file: the static checks read it; the leak tests need the model
    lm, pad = None, None
    report = audit.AuditReport(audit.static_checks(traces), traces, meta={"model": file.trace.model})
else:
    lm = state.model()
    pad = lm.cfg.pad_id
    try:
        report = runs.audit_report(sel.key)
    except (InputError, ValueError) as exc:
        st.error("The audit cannot run on this input: " + files.sentence(str(exc)))
        st.stop()

ui.run_caption(report.traces[0])
n_pass, n_fail, n_skip = words.summary(report)
if n_fail:
    st.error(words.verdict_line(report))
    for v in report.failed:
        st.markdown(f"- ❌ **{v.name}**: {v.detail}")
else:
    st.success(words.verdict_line(report))
m = st.columns(4)
m[0].metric("Checks passed", n_pass)
m[1].metric("Checks failed", n_fail)
m[2].metric("Skipped", n_skip)
m[3].metric("Inputs audited", f"{len(report.traces)} (+{report.meta.get('extra_pad', 0)} PAD cols)")
if lm is not None and not lm.injectable:
    st.caption(words.black_box_caption(lm))

static = [v for v in report.verdicts if words.check_base(v.name) in words.STATIC]
dynamic = [v for v in report.verdicts if words.check_base(v.name) in words.DYNAMIC]
info = [v for v in report.verdicts if words.check_base(v.name) in words.INFO]
st.subheader("Static checks (on the attention maps)")
_table(static, "aud_static")
st.subheader("Leak tests (the model run again with changed inputs)")
if file is not None:
    who = (
        opened.writer_name(file.trace) or loaders.display_name(file.trace.model) or "the model that wrote it"
    )
    st.info(f"The leak tests run the model again, which a trace file does not hold: load {who} to run them.")
else:
    _table(dynamic, "aud_dynamic")
st.subheader("Special tokens (information)")
_table(info, "aud_info")

# -- where: per-head mass on masked keys, the mask used vs the mask called for, one head ----------------
st.subheader("Where to look")
kinds = list(report.traces[0].kinds)
c_kind, c_seq = st.columns([3, 2])
with c_kind:
    ui.keep_valid(K.AUD_KIND, kinds)
    kind = st.radio("Attention kind", kinds, key=K.AUD_KIND, format_func=KIND_LABELS.get, horizontal=True)
with c_seq:
    seq = state.sequence_picker(K.AUD_SEQ, report.traces)
tr = report.traces[seq]
where = words.where(report.traces, seq)
q_tok, k_tok = tr.axes(kind)
q_title, k_title = AXIS_TITLES[kind]
_, expected = audit.expected_mask(tr, kind, pad)
figs = {}
per_head = audit.masked_mass_per_head(tr, kind, pad)
figs["masked mass per head"] = PA.stat_heatmap(
    per_head,
    title=f"{KIND_LABELS[kind]}: largest attention one real query puts on masked keys, per head ({where}); "
    "click a cell",
    stat="score",
    label="mass on masked keys",
)
event = ui.chart(figs["masked mass per head"], key=K.AUD_CHART, on_select="rerun", selection_mode="points")
ui.apply_click(event, K.AUD_CLICK_APPLIED, (kind, seq), K.AUD_LAYER, K.AUD_HEAD, PA.parse_head_point)
st.caption("0 everywhere for a correct model. NaN means the softmax of that head produced NaN.")

probs = tr.probs(kind)
n_layers, n_heads = probs.shape[:2]
worst = next(
    (v for v in report.failed if v.kind == kind and v.layer is not None and v.head is not None), None
)
default = (worst.layer, worst.head) if worst else tuple(int(i) for i in np.unravel_index(
    int(np.argmax(np.nan_to_num(per_head, nan=np.inf))), per_head.shape))  # fmt: skip
layer, head = ui.layer_head_picker(K.AUD_LAYER, K.AUD_HEAD, n_layers, n_heads, default)

c1, c2 = st.columns(2)
declared = tr.mask(kind, layer)  # the picked layer's (its layers may have been masked differently)
at_layer = f" · layer {layer}" if tr.masks_differ(kind) else ""
if declared is not None:
    # A layer that keeps to a local rule (a sliding window, chunks) is read as the declared-mask check reads
    # it: against the tokens' mask within that rule, so the figure agrees with the verdict.
    rule = audit.layer_rules(report.traces, kind, pad).get(layer)
    called_for, rule_words = (expected, "") if rule is None else audit.within_rule(kind, rule, expected)
    figs["mask used vs called for"] = P.mask_compare_figure(
        called_for,
        declared,
        q_tok,
        k_tok,
        title=f"mask the model used vs the mask the tokens call for<br>{KIND_LABELS[kind]}{at_layer}"
        + ("" if rule is None else f" · within its {'chunks' if rule[0] == 'chunk' else 'window'}")
        + f" · {where}",
        query_title=q_title,
        key_title=k_title,
    )
    ui.side_by_side(figs["mask used vs called for"], len(k_tok))
    with c1:
        ui.chart(figs["mask used vs called for"], key="aud_mask_compare")
        st.caption(
            "Red: the model may attend where it must not (a leak). Orange: masked but must be visible."
            + (
                f" Layer {layer} attends within {rule_words}, as the declared-mask check accepts: the mask "
                "the tokens call for is read within it (keys outside it are masked by design)."
                if rule_words
                else ""
            )
        )
else:
    c1.info("This trace carries no mask for this kind; only the attention itself is checked.")
figs["head"] = PT.head_heatmap(
    PT.head_weights(probs, layer, head),
    q_tok,
    k_tok,
    mask=expected,
    query_title=q_title,
    key_title=k_title,
    title=f"attention, ✕ = must be 0<br>{KIND_LABELS[kind]} · layer {layer} · head {head} · {where}",
)
ui.side_by_side(figs["head"], len(k_tok))
with c2:
    ui.chart(figs["head"], key="aud_head_chart")
    st.caption("✕ marks keys this query must not see (from the tokens); their weight must be exactly 0.")

ui.downloads(tr, seq, figs, key="aud_dl")
st.download_button(
    "audit report .txt",
    data=words.report_text(report),
    file_name=f"{loaders.display_name(tr.model)}-audit.txt",
    mime="text/plain",
    key="aud_report_txt",
    on_click="ignore",
    help="One line per check, as `python -m attnscope audit` prints it.",
)
