"""attnscope: see, number by number, what the attention of a Transformer does.

The public API (imported on first use, so ``import attnscope`` stays light)::

    import attnscope

    with attnscope.capture_attention(model) as cap:   # any PyTorch model
        model(x)
    cap.records                                        # every attention map it computed

    lm = attnscope.load("reverse")                     # a zoo name, a model folder, an HF folder, an adapter
    trace = lm.trace(["hello"])[0]                     # an AttentionTrace
    trace = attnscope.AttentionTrace.load("t.npz")     # a trace file, checked, never unpickled
    report = attnscope.audit(lm, ["hello", "abc"])     # the mask audit: report.verdicts

    w = attnscope.watch(model, probe=ids, every=100, run_dir="runs/x")   # in a training loop:
    w.step(step, loss=loss)                            # the run opens with `attnscope view runs/x`

The packages: ``attnscope.core`` (the model side), ``attnscope.models`` (the zoo and the registry),
``attnscope.dashboard`` (the Streamlit app) and ``attnscope.cli`` (the command line).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnscope.core.families.capture import capture_attention
    from attnscope.core.runs.watch import watch
    from attnscope.core.traces.trace import AttentionTrace

__all__ = ["AttentionTrace", "audit", "capture_attention", "load", "watch"]

_LAZY = {
    "capture_attention": ("attnscope.core.families.capture", "capture_attention"),
    "AttentionTrace": ("attnscope.core.traces.trace", "AttentionTrace"),
    "watch": ("attnscope.core.runs.watch", "watch"),
}


def load(name_or_path: str, device: str = "cpu") -> Any:
    """An ``AttentionModel`` from a zoo name (``"reverse"``, ``"reverse@552"``, ``"minilm"``), a model
    folder, a Hugging Face folder or an adapter file (``attnscope.models.registry.load``)."""
    from attnscope.models import registry

    return registry.load(name_or_path, device)


def audit(model: Any, texts: list[str], targets: list[str] | None = None) -> Any:
    """The mask audit of ``model`` (a name, a path or a loaded ``AttentionModel``) on ``texts``: an
    ``AuditReport`` whose ``verdicts`` say, check by check, whether the masks hold."""
    from attnscope.core.analysis import audit as _audit

    lm = load(model) if isinstance(model, str) else model
    return _audit.run_audit(lm, list(texts), targets)


def __getattr__(name: str) -> Any:  # PEP 562: the heavy imports happen on first use
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
