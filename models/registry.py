"""Zoo names -> model folders, and loading any model by name or path.

Besides the zoo (models/<name>/ folders trained with core) there are pretrained models shipped by
installed packages (EXTRA_MODELS, e.g. ``minilm``) and any folder or file a user points to:
- a core model folder (config.json without "model_type" + model.safetensors or model.pt/.pth),
- a ``.pt``/``.pth`` state dict beside a core config.json (read with weights_only, never code),
- a Hugging Face folder (config.json with "model_type"), run by attnscope.core.families.hf.HFModel,
- an adapter file (``*.py``): any PyTorch model, run by attnscope.core.families.adapter.AdapterModel (this runs the
  file's code: the CLI runs what you name; the dashboard only with ATTNSCOPE_ALLOW_CODE=1).
``model_kind(name_or_path)`` says which: "zoo", "pretrained", "core", "hf", "adapter".

Training snapshots: ``NAME@STEP`` names the zoo model ``NAME`` as it was after STEP training steps
(float16 weights in the run folder models/NAME/run, the format ``attnscope.watch`` writes, with the
held-out accuracy and loss in its scalars); ``snapshots(NAME)`` lists them, and ``NAME@STEP`` is accepted wherever
a model name is (CLI, sidebar, links, compare). The last step is the model itself.
Every one of them implements attnscope.core.families.interface.AttentionModel.
``FIRST_INPUTS`` is the one table of the input each zoo and pretrained model opens on in the dashboard.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from attnscope.core.errors import ModelLoadError
from attnscope.core.families.hf import is_hf_folder
from attnscope.core.families.interface import AttentionModel
from attnscope.core.families.native import LoadedModel, load_folder, resolve_device
from attnscope.core.runs.replay import load_step, split_run_step
from attnscope.core.runs.runfile import STEPS, WEIGHTS, Run, RunFormatError, is_run, step_dir_name
from attnscope.core.transformer.checkpoint import CONFIG, read_meta

ZOO_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL = "reverse"
# Zoo models in the order the dashboard lists them.
ORDER = ("reverse", "sort", "dates", "numbers", "brackets")
# The input each zoo and pretrained model opens on in the dashboard (the first of
# attnscope.dashboard.loaders.examples; its task's generator or meta["examples"] give the others):
# one that shows what the model does, and that the model gets right (tests/test_app.py checks both).
FIRST_INPUTS: dict[str, str] = {
    "reverse": "attention",  # -> noitnetta: the cross-attention is an anti-diagonal
    "sort": "3141592653",  # -> 1123345569: each output digit looks at its copies in the input
    "dates": "21 Nov 2026",  # -> 2026-11-21: year, month and day read from their places
    "numbers": "123456",  # -> one hundred twenty-three thousand four hundred fifty-six
    "brackets": "([]{()})",  # -> balanced: a head goes from each bracket to its partner
    "minilm": "The cat sat on the mat.",  # a sentence (its embedding; every word in the vocabulary)
}
WEIGHT_SUFFIXES = (".pt", ".pth", ".safetensors")  # a weights file beside a core config.json
ADAPTER_SUFFIX = ".py"  # an adapter file (core/families/adapter.py)
RUN = "run"  # models/NAME/run: the training run (attnscope.core.runs.runfile's format), written by models/train.py
WEIGHT_FILE = "model.safetensors"
SNAPSHOT = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)@(?P<step>\d{1,9})$")


def _pretrained() -> dict:
    """name -> attnscope.models.pretrained.Pretrained, for the pretrained models whose package is installed."""
    from attnscope.models import pretrained

    return {name: p for name, p in pretrained.PRETRAINED.items() if p.available()}


# Pretrained models (not trained here), name -> one-line summary; `python -m attnscope models` lists them.
EXTRA_MODELS: dict[str, str] = {name: p.summary for name, p in _pretrained().items()}


def zoo_names() -> list[str]:
    """Names of the models committed under models/<name>/ (each with a config.json)."""
    found = {p.parent.name for p in ZOO_DIR.glob(f"*/{CONFIG}")}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def zoo_summary(name: str) -> str:
    """One-line summary from the model's meta.json (or its card)."""
    meta = read_meta(ZOO_DIR / name)
    if meta.get("summary"):
        return str(meta["summary"])
    card = ZOO_DIR / name / "card.md"
    if card.exists():
        for line in card.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.startswith("#"):
                return line.strip()
    return ""


def _run(name: str) -> Run | None:
    """models/NAME/run (the training run, in the run format of attnscope.watch), None when absent."""
    path = ZOO_DIR / name / RUN
    if name not in zoo_names() or not is_run(path):
        return None
    try:
        return Run.open(path)
    except RunFormatError as exc:
        raise ModelLoadError(f"cannot read the training run of {name}: {exc}") from exc


@functools.lru_cache(maxsize=32)
def _history(name: str, version: tuple[int, ...]) -> dict[str, Any]:
    del version  # the cache key: a retrain writes a new run
    run = _run(name)
    return {} if run is None else read_history(run)


def read_history(run: Run | Path) -> dict[str, Any]:
    """A zoo training run's history (see ``history``) from its run folder."""
    if not isinstance(run, Run):
        run = Run.open(run)
    name = run.name
    try:
        points = run.by_step()
        snaps = []
        for step in run.steps():
            info = run.step_info(step)
            if info.get("weights") is True and run.weights(step) is not None:
                file = f"{RUN}/{STEPS}/{step_dir_name(step)}/{WEIGHTS}"
            elif step == run.header.get("steps") and run.header.get("final_weights") == WEIGHT_FILE:
                file = WEIGHT_FILE  # the last step is the model itself
            else:
                continue
            point = points.get(step, {})
            snaps.append({"step": step, "heldout": point.get("heldout"), "heldout_loss": point.get("heldout_loss"),
                          "train_loss": point.get("train_loss"), "file": file})  # fmt: skip
    except RunFormatError as exc:
        raise ModelLoadError(f"cannot read the training run of {name}: {exc}") from exc
    curve = [
        {"step": step, **{k: p.get(k) for k in ("heldout", "heldout_loss", "train_loss")}}
        for step, p in points.items()
    ]
    head = run.header
    return {"task": head.get("task"), "steps": head.get("steps"), "n_heldout": head.get("n_heldout"),
            "curve": curve, "snapshots": snaps}  # fmt: skip


def history(name: str) -> dict[str, Any]:
    """The training history of zoo model ``name`` ({} when it has none), from its run folder
    models/NAME/run: "task", "steps" (the run's total), "n_heldout", "curve" (held-out accuracy and
    loss, training loss, by step) and "snapshots" (step, held-out figures, weights file)."""
    run = _run(name)
    return {} if run is None else _history(name, run.version())


def snapshots(name: str) -> list[dict[str, Any]]:
    """The training snapshots of zoo model ``name``, step order: dicts with step, heldout
    (accuracy on the never-seen set), heldout_loss, train_loss and file (inside the folder)."""
    return [dict(s) for s in history(name).get("snapshots", [])]


def split_snapshot(name: str) -> tuple[str, int | None]:
    """'reverse@500' -> ('reverse', 500); a name without '@STEP' -> (name, None)."""
    m = SNAPSHOT.match(name)
    if m and m["name"] in zoo_names():
        return m["name"], int(m["step"])
    return name, None


def first_input(name: str, folder: str | Path | None = None) -> str | None:
    """FIRST_INPUTS for a registry model (a snapshot ``NAME@STEP`` opens on NAME's), None for any
    other; with ``folder``, only when it is the registry's folder for that name (a user's folder
    that happens to be called ``reverse`` is not the zoo's)."""
    base = split_snapshot(name)[0]
    if base not in FIRST_INPUTS or base not in all_names():
        return None
    if folder is not None:
        try:
            if Path(folder).resolve() != resolve(base)[1].resolve():
                return None
        except (ModelLoadError, OSError):
            return None
    return FIRST_INPUTS[base]


def is_snapshot(name: str) -> bool:
    return split_snapshot(name)[1] is not None


def snapshot_weights(name: str) -> Path:
    """The weights file of 'NAME@STEP' (ModelLoadError naming the steps there are)."""
    base, step = split_snapshot(name)
    snaps = snapshots(base)
    for snap in snaps:
        if snap["step"] == step:
            return ZOO_DIR / base / snap["file"]
    steps = ", ".join(str(s["step"]) for s in snaps)
    raise ModelLoadError(
        f"{base} has no snapshot at step {step}; "
        + (f"its snapshots are at steps {steps}" if steps else "it has no snapshots")
    )


def snapshot_meta(name: str, meta: dict[str, Any]) -> dict[str, Any]:
    """The final model's meta.json as it applies to snapshot ``name``: its own held-out figures
    (measured during training) and "snapshot": {"step", "steps"} (the run's total)."""
    base, step = split_snapshot(name)
    snap = next(s for s in snapshots(base) if s["step"] == step)
    out = dict(meta)
    metrics = dict(meta.get("metrics", {}))
    for key in ("heldout_accuracy", "heldout_exact_match"):
        if key in metrics:
            metrics[key] = snap["heldout"]
    out["metrics"] = metrics
    out["snapshot"] = {
        "step": step,
        "steps": history(base).get("steps"),
        "heldout_loss": snap.get("heldout_loss"),
    }
    out["summary"] = f"{meta.get('summary', base)} (after {step:,} training steps)"
    return out


def all_names() -> list[str]:
    """Zoo names, then pretrained names (what a model picker offers)."""
    return zoo_names() + [n for n in EXTRA_MODELS if n not in zoo_names()]


def summary(name: str) -> str:
    """One-line summary of a zoo or pretrained model."""
    base, step = split_snapshot(name)
    if step is not None:
        return f"{zoo_summary(base)} (after {step:,} training steps)"
    return EXTRA_MODELS[name] if name in EXTRA_MODELS and name not in zoo_names() else zoo_summary(name)


def model_kind(name_or_path: str) -> str:
    """The model's origin: zoo, pretrained (shipped by a package), hf (Hugging Face folder) or core."""
    if name_or_path in zoo_names() or is_snapshot(name_or_path):
        return "zoo"
    if split_run_step(name_or_path) is not None:  # a watched run's step: its adapter's model
        return "adapter"
    if name_or_path in EXTRA_MODELS:
        return "pretrained"
    path = Path(name_or_path).expanduser()
    if path.suffix == ADAPTER_SUFFIX:
        return "adapter"
    return "hf" if path.is_dir() and is_hf_folder(path) else "core"


def resolve(name_or_path: str) -> tuple[str, Path]:
    """A zoo name or a folder path -> (display name, folder)."""
    if name_or_path in zoo_names():
        return name_or_path, ZOO_DIR / name_or_path
    if is_snapshot(name_or_path):
        return name_or_path, ZOO_DIR / split_snapshot(name_or_path)[0]
    hit = split_run_step(name_or_path)
    if hit is not None:
        return f"{hit[0].name}@{hit[1]}", hit[0]
    if name_or_path in EXTRA_MODELS:  # its package's files (registry.load knows how to run them)
        return name_or_path, _pretrained()[name_or_path].folder()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path.name, path
    if path.is_file() and path.suffix in (*WEIGHT_SUFFIXES, ADAPTER_SUFFIX):
        return path.stem, path.parent
    known = ", ".join(all_names()) or "(none trained yet)"
    raise ModelLoadError(f"unknown model {name_or_path!r}: not a zoo name ({known}) nor a model folder")


def load(name_or_path: str, device: str = "cpu", **hf_options) -> AttentionModel:
    """Any model by zoo name, pretrained name, folder, weights file (.pt/.pth/.safetensors) or adapter file.

    hf_options go to attnscope.core.families.hf.load_hf for Hugging Face folders (dtype, device_map, max_new_tokens).
    """
    pretrained = _pretrained()
    if name_or_path in pretrained and name_or_path not in zoo_names():
        return pretrained[name_or_path].load(resolve_device(device))
    hit = split_run_step(name_or_path)
    if hit is not None:  # RUN_DIR@STEP: a watched run at a step it kept weights for
        return load_step(hit[0], hit[1], device)
    name, folder = resolve(name_or_path)
    if is_snapshot(name_or_path):  # the zoo model as it was at that training step
        from attnscope.core.transformer import checkpoint

        cfg, model, src_tok, tgt_tok, card, meta = checkpoint.load_parts(
            folder, resolve_device(device), weights=snapshot_weights(name_or_path)
        )
        return LoadedModel(
            name, folder, cfg, model, src_tok, tgt_tok, card, snapshot_meta(name_or_path, meta)
        )
    path = Path(name_or_path).expanduser()
    if path.suffix == ADAPTER_SUFFIX:
        from attnscope.core.families.adapter import load_adapter

        return load_adapter(path, name=name, device=device)
    if path.is_file():  # a weights file (.pt/.pth: weights_only) next to a core config.json and vocabularies
        from attnscope.core.transformer import checkpoint

        parts = checkpoint.load_parts(folder, resolve_device(device), weights=path)
        return LoadedModel(name, folder, *parts)
    if is_hf_folder(folder):
        from attnscope.core.families.hf import load_hf

        return load_hf(folder, name=name, device=device, **hf_options)
    return load_folder(folder, name=name, device=device)
