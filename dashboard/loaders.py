"""Cached model loading and trace computation (the only place the dashboard runs a model).

- ``load_model`` : ``st.cache_resource``, one LoadedModel per (model, device, version) per
  process, shared read-only by every session.
- ``compute_traces`` : ``st.cache_data(max_entries=...)``, one list of AttentionTrace per
  (model, device, version, inputs). Widgets that only change what is shown (layer, head,
  colour scale...) never reach it, so they never re-run the model.

Models come from the zoo (``models.registry``) plus any folders listed in the environment
variable ``ATTNSCOPE_MODELS`` (os.pathsep-separated), so tests and other pages can add models
without touching this file. Everything is coded against LoadedModel's interface.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import streamlit as st
import torch

from core.checkpoint import CONFIG, WEIGHTS, read_meta
from core.runner import LoadedModel
from core.trace import AttentionTrace
from models import registry

EXTRA_MODELS_ENV = "ATTNSCOPE_MODELS"
TRACE_CACHE_ENTRIES = 32
TRACE_CACHE_SIZE = "1GiB"  # a 12-layer model at 512 tokens makes ~300 MB of maps; evict least recently used
DEMO_SEED = 2026  # examples shown by default (not a training/eval seed)


def _extra_folders() -> list[str]:
    raw = os.environ.get(EXTRA_MODELS_ENV, "")
    return [p for p in raw.split(os.pathsep) if p and (Path(p) / CONFIG).is_file()]


def registry_names() -> list[str]:
    """What the registry offers a picker: the zoo, then pretrained models whose package is installed."""
    names = getattr(registry, "all_names", registry.zoo_names)
    return list(names())


def model_choices() -> list[str]:
    """Registry names first (zoo in registry order, then pretrained), then ATTNSCOPE_MODELS folders."""
    known = registry_names()
    return known + [p for p in _extra_folders() if p not in known]


def model_folder(name: str) -> Path:
    return registry.resolve(name)[1]


def display_name(name: str) -> str:
    return Path(name).name if os.sep in name else name


def model_summary(name: str) -> str:
    """One line for the picker: the card's summary."""
    try:
        if name in registry_names():
            return registry.summary(name) if hasattr(registry, "summary") else registry.zoo_summary(name)
        meta = read_meta(model_folder(name))
        return str(meta.get("summary", ""))
    except Exception:  # a broken folder must not break the picker; loading reports it
        return ""


def picker_label(name: str, width: int = 48) -> str:
    """'reverse · reverses lowercase strings of 1-20 le…' for the model picker."""
    summary = model_summary(name)
    label = f"{display_name(name)} · {summary}" if summary else display_name(name)
    return label if len(label) <= width else label[: width - 1] + "…"


def model_version(name: str) -> float:
    """mtime of the weights: a retrained model gets new cache entries."""
    try:
        return (model_folder(name) / WEIGHTS).stat().st_mtime
    except OSError:
        return 0.0


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@st.cache_resource(max_entries=8, show_spinner="Loading the model…")
def load_model(name: str, device: str, version: float = 0.0) -> LoadedModel:
    """The model in eval mode on ``device`` (shared by all sessions: never mutate it)."""
    del version  # only part of the cache key
    return registry.load(name, device)


@st.cache_data(max_entries=TRACE_CACHE_ENTRIES, max_size=TRACE_CACHE_SIZE, show_spinner="Running the model…")
def compute_traces(
    name: str,
    device: str,
    version: float,
    sources: tuple[str, ...],
    targets: tuple[str, ...] | None = None,
) -> list[AttentionTrace]:
    """One AttentionTrace per source (targets: teacher forcing; None: greedy decoding).

    Over-long inputs are truncated (``truncate=True``); the warnings are in
    ``trace.meta["warnings"]``. Raises core.runner.InputError with a message for users.
    """
    lm = load_model(name, device, version)
    return lm.trace(list(sources), None if targets is None else list(targets), truncate=True)


def examples(lm: LoadedModel, n: int = 3) -> list[str]:
    """Example inputs for a model: meta["examples"], else its task's generator, else its vocabulary."""
    meta_examples = [str(e) for e in lm.meta.get("examples", []) if str(e).strip()]
    if meta_examples:
        return meta_examples[:n]
    task = lm.meta.get("task")
    if task:
        try:
            from models import tasks

            return [src for src, _ in tasks.generate(str(task), n, DEMO_SEED)]
        except (ImportError, KeyError, AttributeError, TypeError, ValueError):
            pass
    vocab = [t for t in lm.src_tok.itos[4:] if t.strip()]
    rng = random.Random(DEMO_SEED)
    sep = "" if lm.src_tok.kind == "char" else " "
    limit = max(1, min(12, lm.max_src_tokens))
    return [
        sep.join(rng.choice(vocab) for _ in range(rng.randint(max(1, limit // 2), limit))) for _ in range(n)
    ]
