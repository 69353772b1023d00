"""The words of the analysis pages: what each audit check and mask bug means, verdict lines,
and why a page does not apply to a model. Plain strings and functions of data: no widgets."""

from __future__ import annotations

from attnscope.core.analysis.audit import AuditReport
from attnscope.core.traces.trace import AttentionTrace
from attnscope.dashboard import loaders

# the audit checks, in the order the page lists them
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


# The Mask lab's two tabs (link parameter ``view`` -> tab label). Only the open one is built and drawn.
LAB_VIEWS = {
    "change": "What the bug changes: the mask and the attention it moves",
    "maps": "Attention: correct and with the bug",
}


def bug_title(name: str) -> str:
    return BUG_HELP.get(name, (name,))[0]


def where(traces: list[AttentionTrace], seq: int) -> str:
    return f"sequence {seq}" if len(traces) > 1 else "input"


def summary(report: AuditReport) -> tuple[int, int, int]:
    """(passed, failed, skipped) tests of a report; info lines are not tests."""
    n_pass = sum(v.status == "pass" for v in report.verdicts)
    n_fail = sum(v.status == "fail" for v in report.verdicts)
    n_skip = sum(v.status == "skip" for v in report.verdicts)
    return n_pass, n_fail, n_skip


def verdict_line(report: AuditReport) -> str:
    n_pass, n_fail, n_skip = summary(report)
    if n_fail == 0:
        return f"All {n_pass} checks pass" + (f" ({n_skip} skipped)" if n_skip else "") + "."
    names = ", ".join(v.name for v in report.failed)
    return f"{n_fail} of {n_pass + n_fail} checks FAIL: {names}."


def report_text(report: AuditReport) -> str:
    """The report as ``python -m attnscope audit`` prints it."""
    head = f"# mask audit of {report.meta.get('model', '')}" + (
        f" with bug {report.bug}" if report.bug else ""
    )
    return "\n".join([head, *report.lines()]) + "\n"


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


def not_injectable_message(lm) -> str:
    what = {
        "hf": "a Hugging Face model run through the transformers library",
        "adapter": "your own model run through its adapter file, which builds its masks inside its own code",
    }.get(lm.meta.get("kind", ""), "not one of attnscope's own Transformer models")
    return (
        f"Masks cannot be injected into **{loaders.display_name(lm.name)}**: it is {what}, and the lab "
        "changes the masks inside attnscope's own forward pass (attnscope.core.transformer.model.Transformer). "
        "The **Mask audit** page still audits this model as a black box (static checks on its attention "
        "and leak tests through its public call). Pick a zoo model in the sidebar to try the bugs."
    )
