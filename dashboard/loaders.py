"""Cached model loading and trace computation, and the server process's settings.

- ``load_model`` : ``st.cache_resource``, one model (attnscope.core.families.interface.AttentionModel) per (model, device, version) per
  process, shared read-only by every session.
- ``compute_traces`` : ``trace_cache.shared_cache`` (bounded entries, bytes and age; the traces
  are shared read-only, not copied per rerun), one list of AttentionTrace per
  (model, device, version, inputs). Widgets that only change what is shown (layer, head,
  colour scale...) never reach it, so they never re-run the model. (The analysis pages run models
  through ``dashboard/runs.py``, the Training page's replay too.)
- ``configure_process`` : what the server process sets once for every session (torch threads, the
  map pool, offline Hugging Face); ``app.py`` calls it, importing this module changes nothing.

Models come from the zoo (``attnscope.models.registry``) plus any folders listed in the environment
variable ``ATTNSCOPE_MODELS`` (os.pathsep-separated), so tests and other pages can add models
without touching this file, plus the paths a session loaded from the sidebar (``user`` below;
checked by dashboard/user_models.py). Everything is coded against that one
interface (zoo, minilm, Hugging Face, adapter files). Nothing is downloaded: HF_HUB_OFFLINE=1 unless set.
"""

from __future__ import annotations

import gc
import os
import random
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import streamlit as st
import torch

from attnscope.core.errors import ModelLoadError
from attnscope.core.families import map_pool
from attnscope.core.families.interface import AttentionModel
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer.checkpoint import CONFIG, read_meta
from attnscope.dashboard import model_facts, trace_cache, user_models
from attnscope.dashboard.files import UPLOAD_PREFIX
from attnscope.models import registry

# Sessions run models at the same time; intra-op threads that outnumber the cores spin-wait for
# each other (bench/load.py compares). Half the cores, at least one; ATTNSCOPE_TORCH_THREADS overrides.
TORCH_THREADS = int(os.environ.get("ATTNSCOPE_TORCH_THREADS") or max(1, (os.cpu_count() or 2) // 2))

EXTRA_MODELS_ENV = "ATTNSCOPE_MODELS"
# Traces are shared by every session (no copy per rerun; see dashboard/trace_cache.py): at most
# this many, this many MB of arrays (ATTNSCOPE_TRACE_CACHE_MB), least recently used out first,
# and dropped after an hour unused. MiniLM at 512 tokens is ~150 MB of maps.
TRACE_CACHE_ENTRIES = 32
TRACE_CACHE_MB = 1024
TRACE_CACHE_TTL_S = 3600
# Memory of traces that are gone is kept for the next traced pass (core/families/map_pool.py): at most this
# many MB of it (ATTNSCOPE_MAP_POOL_MB; 0 turns the pool off). A MiniLM pair at 512 tokens is ~600 MB.
MAP_POOL_MB = 1024
_configured = False


def configure_process() -> None:
    """The server process's settings, once (every run of app.py calls it): intra-op threads, the map
    pool's budget, and no Hugging Face download (a model name is looked up locally)."""
    global _configured
    if _configured:
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(TORCH_THREADS)
    map_pool.POOL.configure(int(float(os.environ.get("ATTNSCOPE_MAP_POOL_MB", MAP_POOL_MB)) * 2**20))
    _configured = True


DEMO_SEED = 2026  # examples shown by default (not a training/eval seed)
# Inputs offered for models with a natural-language tokenizer and no examples of their own.
TEXT_EXAMPLES = [
    "The cat sat on the mat.",
    "Attention lets every word look at every other word.",
    "A man is playing a guitar on stage.",
]
WEIGHT_FILES = ("model.safetensors", "model.pt", "model.pth", "pytorch_model.bin")


def _extra_folders() -> list[str]:
    """ATTNSCOPE_MODELS entries: model folders, and adapter files (.py) when code is allowed."""
    raw = os.environ.get(EXTRA_MODELS_ENV, "")
    out = []
    for p in (p for p in raw.split(os.pathsep) if p):
        if (Path(p) / CONFIG).is_file():
            out.append(p)
        elif p.endswith(user_models.ADAPTER_SUFFIX) and Path(p).is_file() and user_models.code_allowed():
            out.append(p)
    return out


def registry_names() -> list[str]:
    """What the registry offers a picker: the zoo, then pretrained models whose package is installed."""
    names = getattr(registry, "all_names", registry.zoo_names)
    return list(names())


def is_named_model(name: str) -> bool:
    """A model a link or the sidebar may name: the registry's names and their training snapshots
    (``reverse@500``, only steps that exist), never a path."""
    if name in registry_names():
        return True
    if not registry.is_snapshot(name):
        return False
    try:
        registry.snapshot_weights(name)
    except ModelLoadError:
        return False
    return True


def model_choices(user: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Registry names first (zoo in registry order, then pretrained), then ATTNSCOPE_MODELS folders,
    then the paths this session loaded (``user``)."""
    known = registry_names()
    out = known + [p for p in _extra_folders() if p not in known]
    return out + [p for p in user if p not in out]


def model_folder(name: str) -> Path:
    return registry.resolve(name)[1]


def display_name(name: str) -> str:
    return user_models.display_name(name) if os.sep in name else name


def model_kind(name: str) -> str:
    """zoo | pretrained | hf | core | upload (a checkpoint uploaded in this session)."""
    if os.sep in name and any(part.startswith(UPLOAD_PREFIX) for part in Path(name).parts):
        return "upload"
    try:
        return registry.model_kind(name)
    except Exception:  # a vanished folder: loading reports it
        return "core"


def model_summary(name: str) -> str:
    """One line for the picker: the card's summary."""
    try:
        if name in registry_names():
            return registry.summary(name) if hasattr(registry, "summary") else registry.zoo_summary(name)
        folder = model_folder(name)
        meta = read_meta(folder)
        if not meta.get("summary") and model_kind(name) == "hf":
            import json

            hf = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
            return f"Hugging Face {hf.get('model_type', '')} folder"
        return str(meta.get("summary", ""))
    except Exception:  # a broken folder must not break the picker; loading reports it
        return ""


def picker_label(name: str, width: int = 60) -> str:
    """'minilm (pretrained) · all-MiniLM-L6-v2 sentence em…' for the model picker (core folders
    have no tag: 'reverse · reverses lowercase strings…')."""
    summary = model_summary(name)
    kind = model_kind(name)
    tag = f" ({model_facts.KIND_LABELS[kind]})" if kind not in ("zoo", "core") else ""
    label = f"{display_name(name)}{tag} · {summary}" if summary else display_name(name) + tag
    return label if len(label) <= width else label[: width - 1] + "…"


def model_version(name: str) -> float:
    """Latest mtime of the config and weights: a retrained model gets new cache entries."""
    try:
        path = Path(name)
        if path.suffix == user_models.ADAPTER_SUFFIX:  # an adapter: its file
            files = [path]
        elif path.is_file():  # a weights file beside a config.json
            files = [path, path.parent / CONFIG]
        else:
            folder = model_folder(name)
            files = [folder / CONFIG, *(folder / w for w in WEIGHT_FILES)]
            if registry.is_snapshot(name):
                files.append(registry.snapshot_weights(name))
        return max((f.stat().st_mtime for f in files if f.exists()), default=0.0)
    except Exception:  # unknown or vanished: loading reports it
        return 0.0


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# Streamlit runs gc.collect(2) after every script run (runner.postScriptGC): it frees the cycles each
# run leaves (a plotly figure and its parts point at each other), but it walks every tracked object,
# ~450,000 once torch, transformers and a model are loaded: 0.2-0.5 s of CPU per rerun, holding the GIL
# while the server still sends the run's last messages. So what lives on (imports, models, plotly's
# validators) is moved out of the collector's view (gc.freeze) at the end of the first run, of a run
# that loaded a model, and of every REFREEZE_RUNS-th run: the collection after each run then walks
# only what runs create. Each refreeze first unfreezes and collects everything, so garbage frozen with
# the long-lived objects (the figures of the run that froze) is freed at the next one.
REFREEZE_RUNS = 50
_GC_LOCK = threading.Lock()
_gc = {"runs": 0, "stale": True}  # runs since the last freeze; a model loaded (or nothing frozen yet)


def keep_collection_cheap(force: bool = False) -> bool:
    """Called at the end of every script run: refreeze when due (see above). True when it did."""
    with _GC_LOCK:
        _gc["runs"] += 1
        if not (force or _gc["stale"] or _gc["runs"] >= REFREEZE_RUNS):
            return False
        _gc.update(runs=0, stale=False)
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        return True


@st.cache_resource(max_entries=8, show_spinner="Loading the model…")
def load_model(name: str, device: str, version: float = 0.0) -> AttentionModel:
    """The model in eval mode on ``device`` (shared by all sessions: never mutate it)."""
    del version  # only part of the cache key
    if name.endswith(
        user_models.ADAPTER_SUFFIX
    ):  # whatever asked (picker, path box, link): code needs consent
        user_models.check_code_allowed(name)
    lm = registry.load(name, device)
    if os.sep in name:  # a path: name it as the picker does ('org/model' for a cache snapshot)
        lm.name = display_name(name)
    _gc["stale"] = True  # frozen at the end of this run (keep_collection_cheap)
    return lm


Heads = tuple[tuple[str, int, int], ...]  # (kind, layer, head) switched off


@dataclass(frozen=True)
class TraceKey:
    """What a traced run depends on: the model (name, device, weights version), the inputs, and for
    the analysis pages' runs the mask bug injected and the heads switched off. Hashable: it keys the
    shared caches (``compute_traces`` here, ``dashboard/runs.py``)."""

    name: str
    device: str
    version: float
    sources: tuple[str, ...]
    targets: tuple[str, ...] | None = None  # None: greedy decoding
    bug: str | None = None
    off: Heads = ()

    def model(self) -> AttentionModel:
        return load_model(self.name, self.device, self.version)

    def but(self, **changes) -> TraceKey:
        """This key with some fields changed (another input, model, bug...)."""
        return replace(self, **changes)

    def plain(self) -> TraceKey:
        """The model's own run of the same inputs: no bug, no head switched off."""
        return replace(self, bug=None, off=())

    @property
    def target_list(self) -> list[str] | None:
        return None if self.targets is None else list(self.targets)


@trace_cache.shared_cache(
    TRACE_CACHE_MB,
    TRACE_CACHE_ENTRIES,
    TRACE_CACHE_TTL_S,
    "Running the model…",
    env="ATTNSCOPE_TRACE_CACHE_MB",
)
def compute_traces(key: TraceKey) -> list[AttentionTrace]:
    """One AttentionTrace per source of the model as it is (targets: teacher forcing; None: greedy
    decoding). A key with a bug or switched-off heads is the analysis pages' run (runs.audit_report).

    Over-long inputs are truncated (``truncate=True``); the warnings are in
    ``trace.meta["warnings"]``. Raises attnscope.core.errors.InputError with a message for users.
    """
    if key.bug is not None or key.off:
        raise ValueError(
            "compute_traces runs the model as it is: a bug or an ablation goes to runs.audit_report"
        )
    lm = key.model()
    if key.targets is None and lm.arch == "decoder":  # 'generate': each prompt continued, then traced
        return lm.trace_continuation(list(key.sources), truncate=True)
    return lm.trace(list(key.sources), key.target_list, truncate=True)


def examples(lm: AttentionModel, n: int = 3) -> list[str]:
    """Example inputs for a model: a registry model's first input (registry.FIRST_INPUTS), then
    meta["examples"], else its task's generator, else its vocabulary."""
    first = registry.first_input(lm.name, getattr(lm, "folder", None))
    if first is None or n < 1:
        return _other_examples(lm, n)
    return [first, *[e for e in _other_examples(lm, n) if e != first]][:n]


def _other_examples(lm: AttentionModel, n: int) -> list[str]:
    meta_examples = [str(e) for e in lm.meta.get("examples", []) if str(e).strip()]
    if meta_examples:
        return meta_examples[:n]
    if lm.src_tok.kind in ("hf", "wordpiece"):  # a natural-language tokenizer
        return TEXT_EXAMPLES[:n]
    task = lm.meta.get("task")
    if task:
        try:
            from attnscope.models import tasks

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
