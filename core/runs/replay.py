"""Any input at a watched step: ``RUN_DIR@STEP`` names the model as it was at that step of a run.

A run watched with ``keep_weights=True`` and an ``adapter=`` holds what it takes: the adapter file builds
the model (its code), the step's ``weights.safetensors`` (float16) replaces the weights. The registry
(``attnscope.load("runs/x@300")``), the command line and the dashboard take such names. A run without
weights or without an adapter cannot be replayed on other inputs, and says why in one sentence.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from attnscope.core.errors import ModelLoadError
from attnscope.core.runs.runfile import Run, RunFormatError, is_run

RUN_STEP = re.compile(r"^(?P<path>.+)@(?P<step>\d{1,10})$")


def split_run_step(text: str) -> tuple[Path, int] | None:
    """'runs/x@300' -> (Path('runs/x'), 300) when runs/x is a run folder; else None."""
    m = RUN_STEP.match(str(text))
    if m is None:
        return None
    path = Path(m["path"]).expanduser()
    return (path, int(m["step"])) if is_run(path) else None


def load_step(run_dir: str | Path, step: int, device: str = "cpu") -> Any:
    """The run's model at ``step``: its adapter's model with the step's weights (an AdapterModel)."""
    try:
        run = Run.open(run_dir)
        steps = run.steps()
    except RunFormatError as exc:
        raise ModelLoadError(str(exc)) from None
    if step not in steps:
        shown = ", ".join(map(str, steps[-12:])) or "none"
        raise ModelLoadError(f"the run {run.name} has no step {step}; its steps: {shown}")
    weights = run.weights(step)
    if weights is None:
        raise ModelLoadError(
            f"the run {run.name} kept no weights at step {step}: watch with keep_weights=True to replay "
            "other inputs (the probe's own traces are in the run)"
        )
    adapter = run.header.get("adapter")
    if not isinstance(adapter, str) or not Path(adapter).is_file():
        raise ModelLoadError(
            f"the run {run.name} has weights but no adapter file"
            + (f" (it named {adapter}, which is not there)" if isinstance(adapter, str) else "")
            + ": attnscope rebuilds the model from an adapter to replay other inputs (watch with adapter=)"
        )
    from safetensors.torch import load_file

    from attnscope.core.families.adapter import load_adapter

    lm = load_adapter(adapter, name=f"{run.name}@{step}", device=device)
    own = lm.model.state_dict()
    try:
        state = load_file(str(weights))
    except Exception as exc:  # noqa: BLE001 (a damaged file: one sentence)
        raise ModelLoadError(f"cannot read the weights of {run.name} at step {step}: {exc}") from None
    if set(state) != set(own):
        missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        raise ModelLoadError(
            f"the weights of {run.name} at step {step} do not fit the adapter's model "
            f"(missing {missing[:3]}, unexpected {extra[:3]}): was the model changed since the run?"
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ModelLoadError(
                f"the weights of {run.name} at step {step} do not fit the adapter's model: {key} is "
                f"{tuple(value.shape)} there, {tuple(own[key].shape)} in the model"
            )
    lm.model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
    lm.meta["run_step"] = {"run": str(run.path), "step": step}
    lm.meta["summary"] = f"{run.name} at step {step:,} (weights from the run, float16)"
    return lm
