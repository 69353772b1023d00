"""Mask audit: static checks on attention traces (``static``), black-box leak tests through a model's
forward outputs (``leaks``), and the runner that puts both into one report (``runner``).

    from attnscope.core.analysis import audit
    report = audit.run_audit(lm, ["hello", "abc"])   # an AuditReport: report.verdicts, report.passed
"""

from attnscope.core.analysis.audit.leaks import (
    CHUNK,
    EXTRA_PAD,
    LEAK_TOL,
    MAX_VARIANTS,
    ForwardFn,
    ProbeBatch,
    alone_outputs,
    batch_from_traces,
    check_batch_invariance,
    check_causal_leak,
    check_finite_outputs,
    check_padding_leak,
    core_forward_outputs,
    dynamic_checks,
    forward_fn,
    with_threads,
)
from attnscope.core.analysis.audit.runner import run_audit
from attnscope.core.analysis.audit.static import (
    BOS_TOKENS,
    EOS_TOKENS,
    MAP_CHUNK,
    PAD_TOKENS,
    ROW_SUM_TOL,
    STATUSES,
    AuditReport,
    Verdict,
    check_declared_mask,
    check_finite,
    check_fully_masked,
    check_masked_mass,
    check_row_sums,
    check_special_tokens,
    expected_mask,
    kind_sides,
    layer_rules,
    map_precision,
    masked_mass_per_head,
    real_positions,
    special_mass,
    static_checks,
    within_rule,
)

__all__ = [
    "BOS_TOKENS", "CHUNK", "EOS_TOKENS", "EXTRA_PAD", "LEAK_TOL", "MAP_CHUNK", "MAX_VARIANTS", "PAD_TOKENS",
    "ROW_SUM_TOL", "STATUSES", "AuditReport", "ForwardFn", "ProbeBatch", "Verdict", "alone_outputs",
    "batch_from_traces", "check_batch_invariance", "check_causal_leak", "check_declared_mask", "check_finite",
    "check_finite_outputs", "check_fully_masked", "check_masked_mass", "check_padding_leak", "check_row_sums",
    "check_special_tokens", "core_forward_outputs", "dynamic_checks", "expected_mask", "forward_fn",
    "kind_sides", "layer_rules", "map_precision", "masked_mass_per_head", "real_positions", "run_audit",
    "special_mass", "static_checks", "with_threads", "within_rule",
]  # fmt: skip
