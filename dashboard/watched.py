"""Run folders in the dashboard: what ``attnscope.watch`` writes while a model trains, opened on the
Training page (dashboard/run_view.py) and on Compare.

A run is opened from the sidebar's "Open a run" box (a folder inside the allowed folders, as model
and trace paths) or by ``attnscope view FOLDER``, which starts the server with ``ATTNSCOPE_VIEW_RUN``
set: every new session opens that folder (whoever started the server chose it, so no folder check)
and shows the Training page. The reader is ``attnscope.core.runs.runfile`` (every problem is one
sentence); a run may still be growing, so nothing here assumes it is finished.

Caches: a step's folder is written once and renamed into place (complete or absent), so its traces
are keyed on the folder's identity (path, step, inode and mtime: a step written again is a new
folder), not on ``Run.version()``, which changes with every scalar line (every training step), and
would read every step again each time a live view refreshes. The traces are float16 on disk, float32
once read: they live in one byte-bounded store shared by the sessions (dashboard/trace_cache.py);
per-step summaries (each head's entropy) are small and kept apart, so the curves over all steps read
each step once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import streamlit as st

from attnscope.core.runs.runfile import STEPS, Run, RunFormatError, step_dir_name
from attnscope.core.traces.trace import KIND_LABELS, AttentionTrace
from attnscope.dashboard import files, opened, trace_cache, user_models
from attnscope.dashboard import keys as K
from attnscope.dashboard.plots import training as P
from attnscope.models import attention_rules as R

RUN_ENV = "ATTNSCOPE_VIEW_RUN"  # set by `attnscope view FOLDER`
TRAINING_PAGE = "app_pages/training.py"  # where an opened run shows (relative to app.py)
LIVE_WINDOW_S = 600.0  # a run written to less than this long ago is followed live
REFRESH_S = 2.0  # how often a live run's view looks for new steps
RUN_CACHE_MB = 768  # the runs' traces in memory (float32), all sessions together
RUN_CACHE_ENTRIES = 512  # steps kept
Stamp = tuple[int, int]  # a step folder's (inode, mtime in ns)


# -- reading, cached ------------------------------------------------------------------------------


def open_run(path: str) -> Run:
    """The run at ``path`` (RunFormatError: one sentence). Cheap: the header only."""
    return Run.open(path)


def step_stamp(path: str, step: int) -> Stamp:
    """What identifies the folder of ``step`` as written (RunFormatError when it is gone: thinned)."""
    try:
        st_ = os.stat(Path(path) / STEPS / step_dir_name(step))
    except OSError:
        raise RunFormatError(
            f"step {step:,} is no longer in the run (the watcher thinned it to stay within its budget)"
        ) from None
    return st_.st_ino, st_.st_mtime_ns


@trace_cache.shared_cache(
    RUN_CACHE_MB, RUN_CACHE_ENTRIES, 3600.0, "Reading the run's traces…", env="ATTNSCOPE_RUN_CACHE_MB"
)
def _step_traces(path: str, step: int, stamp: Stamp) -> tuple[AttentionTrace, ...]:
    del stamp  # part of the key only
    return tuple(Run.open(path).traces(step))


def step_traces(path: str, step: int) -> tuple[AttentionTrace, ...]:
    """The probe's traces at ``step`` (one per probe input), read once per written step folder."""
    return _step_traces(path, step, step_stamp(path, step))


@st.cache_resource(max_entries=4, show_spinner="Loading the model at this step…")
def _step_model(path: str, step: int, stamp: Stamp):
    """The run's model at ``step`` (its adapter with the step's weights: registry's RUN_DIR@STEP)."""
    del stamp  # part of the key only
    from attnscope.models import registry

    return registry.load(f"{path}@{step}")


def can_replay(run: Run, step: int) -> str | None:
    """None when another input can be replayed at ``step``; else why not, in one sentence."""
    if run.weights(step) is None:
        return (
            "To run other inputs at the watched steps, watch with keep_weights=True and adapter= "
            "(the adapter builds the model, the step's weights go into it)."
        )
    if not run.header.get("adapter"):
        return (
            "This run kept weights but names no adapter file to build the model from (watch with adapter=)."
        )
    if not user_models.code_allowed():
        return (
            f"This run's model comes from its adapter file, which is code: start the server with "
            f"`{user_models.ALLOW_CODE_ENV}=1` to run other inputs at its steps."
        )
    return None


def replay_input(path: str, step: int, text: str) -> AttentionTrace:
    """``text`` through the run's model as it was at ``step`` (InputError / ModelLoadError: one sentence)."""
    lm = _step_model(path, step, step_stamp(path, step))
    return lm.trace([text], truncate=True)[0]


def _quiet_traces(path: str, step: int, stamp: Stamp) -> tuple[AttentionTrace, ...]:
    """_step_traces without its spinner (for use inside another cached function)."""
    store = _step_traces.store()
    key = _step_traces.key(path, step, stamp)
    return store.get_or_compute(key, lambda: tuple(Run.open(path).traces(step)))


@st.cache_data(max_entries=8192, show_spinner=False)
def _step_entropy(path: str, step: int, stamp: Stamp, probe: int, kind: str) -> np.ndarray:
    trs = _quiet_traces(path, step, stamp)
    return R.entropy(trs[probe].probs(kind)).astype(np.float32)


def entropy_over_steps(path: str, steps: list[int], probe: int, kind: str) -> np.ndarray:
    """Each head's mean row entropy at every step: ``[step, layer, head]`` (nats). The steps' maps must
    have one shape (``shaped_like_latest`` picks them): a run whose model grew a layer has several."""
    return np.stack([_step_entropy(path, s, step_stamp(path, s), probe, kind) for s in steps])


Shape = tuple[int, tuple[int, ...] | None]  # (probe inputs, the maps' shape: None where there are none)


@st.cache_data(max_entries=8192, show_spinner=False)
def _step_shape(path: str, step: int, stamp: Stamp, probe: int, kind: str) -> Shape:
    trs = _quiet_traces(path, step, stamp)
    if probe >= len(trs) or kind not in trs[probe].kinds:
        return len(trs), None
    return len(trs), tuple(int(n) for n in trs[probe].probs(kind).shape)


def shape_text(shape: Shape) -> str:
    """ "2 inputs, 2 layers × 4 heads over 6×6 tokens" ("3 inputs, none of these maps")."""
    n, maps = shape
    text = f"{n} probe input{'s' * (n != 1)}"
    if maps is None:
        return text + ", none of these maps"
    layers, heads, nq, nk = maps
    return (
        text
        + f", {layers} layer{'s' * (layers != 1)} × {heads} head{'s' * (heads != 1)} over {nq}×{nk} tokens"
    )


@dataclass(frozen=True)
class Shaped:
    """The steps whose maps (of one probe input and kind) are shaped as the latest step's, and the others."""

    kept: list[int]  # the latest step's shape (the latest included)
    odd: dict[int, Shape]  # step -> its shape, where it differs (the model grew, the probe changed)
    latest: Shape


def shaped_like_latest(path: str, steps: list[int], probe: int, kind: str) -> Shaped:
    """``steps`` split by their maps' shape (probe input ``probe``, ``kind``): the curves and the animation
    over steps draw only the steps shaped as the latest; a run folder may hold others (a model that grew a
    layer mid-run, a run continued with another probe by an older attnscope, steps written by hand)."""
    shapes = {s: _step_shape(path, s, step_stamp(path, s), probe, kind) for s in steps}
    latest = shapes[steps[-1]]
    kept = [s for s in steps if shapes[s] == latest]
    return Shaped(kept, {s: sh for s, sh in shapes.items() if sh != latest}, latest)


def steps_text(steps: list[int], most: int = 8) -> str:
    """ "0, 2 and 4", "0, 2, 4, … (12 steps)"."""
    shown = [f"{s:,}" for s in steps[:most]]
    if len(steps) > most:
        return ", ".join(shown) + f", … ({len(steps)} steps)"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


@st.cache_resource(max_entries=8, show_spinner="Building the animation…")
def _replay_figure(path: str, frames: tuple[tuple[int, Stamp], ...], probe: int, kind: str, max_tile: int):
    """The animated grid (plots.training.replay_figure) of these steps (each with its folder's stamp).
    Shared by the sessions: read-only once built (st.plotly_chart serialises it)."""
    probs = [_quiet_traces(path, s, stamp)[probe].probs(kind) for s, stamp in frames]
    ref = _quiet_traces(path, *frames[-1])[probe]
    q_tok, k_tok = ref.axes(kind)
    return P.replay_figure(
        probs,
        [s for s, _ in frames],
        q_tok,
        k_tok,
        title=f"{KIND_LABELS[kind]} through training: press ▶ Play",
        max_tile=max_tile,
    )


def replay_figure(path: str, plan: P.ReplayPlan, probe: int, kind: str):
    """The animation of ``plan``'s steps (built once per set of step folders, probe, kind)."""
    frames = tuple((s, step_stamp(path, s)) for s in plan.steps)
    return _replay_figure(path, frames, probe, kind, plan.max_tile)


@st.cache_data(max_entries=64, show_spinner=False)
def _series(path: str, version: tuple[int, ...]) -> dict[str, tuple[list[int], list[float]]]:
    del version
    return Run.open(path).series()


def series(run: Run) -> dict[str, tuple[list[int], list[float]]]:
    """``run.series()`` (loss and metrics), read again only when the run grew."""
    return _series(str(run.path), run.version())


@st.cache_data(max_entries=64, show_spinner=False)
def _audits(path: str, version: tuple[int, ...]) -> tuple[dict, str | None]:
    del version
    run = Run.open(path)
    errors = [r["watch_error"] for r in run.by_step().values() if isinstance(r.get("watch_error"), str)]
    return run.audits(), errors[-1] if errors else None


@st.cache_data(max_entries=64, show_spinner=False)
def _not_finite(path: str, version: tuple[int, ...]) -> dict[str, int]:
    del version
    return Run.open(path).not_finite()


def not_finite(run: Run) -> dict[str, int]:
    """``run.not_finite()``: scalar -> the first step it was NaN or infinite, read again when the run grew."""
    return _not_finite(str(run.path), run.version())


def audits(run: Run) -> tuple[dict[int, dict], str | None]:
    """(``run.audits()``, the last "could not probe" error the watcher logged, or None)."""
    return _audits(str(run.path), run.version())


def last_write(run: Run) -> float:
    """When the run was last written (seconds since the epoch): its header, scalars or steps."""
    times = []
    for name in ("run.json", "scalars.jsonl", STEPS):
        try:
            times.append((run.path / name).stat().st_mtime)
        except OSError:
            pass
    return max(times, default=0.0)


def is_live(run: Run, now: float | None = None) -> bool:
    """Written to within LIVE_WINDOW_S: its view follows new steps."""
    return (now if now is not None else time.time()) - last_write(run) < LIVE_WINDOW_S


def ago(seconds: float) -> str:
    """'12 s', '3 min', '2 h', '4 days'."""
    seconds = max(0.0, seconds)
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def probe_labels(run: Run, traces: tuple[AttentionTrace, ...] | list[AttentionTrace]) -> list[str]:
    """A short name per probe input: the header's text when the probe was texts, else its tokens."""
    texts = (
        (run.header.get("probe") or {}).get("texts") if isinstance(run.header.get("probe"), dict) else None
    )
    out = []
    for i, tr in enumerate(traces):
        if isinstance(texts, list) and i < len(texts) and isinstance(texts[i], str):
            text = texts[i]
        else:
            text = " ".join(tr.src_tokens or tr.tgt_tokens)
        out.append(f"{i}: {text[:50]}" + ("…" if len(text) > 50 else ""))
    return out


# -- open and close -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenRun:
    path: str  # the folder (real path)
    label: str  # the run's title


def resolve_allowed_folder(text: str) -> Path:
    """What the user typed -> an existing folder inside the allowed folders (user_models.PathRefused /
    ValueError), as dashboard/files.py checks a file."""
    text = (text or "").strip().strip("'\"")
    if not text:
        raise ValueError("type the path of a run folder (the run_dir given to attnscope.watch)")
    _, real = user_models.real_path(text)
    user_models.check_allowed(text, real, user_models.allowed_roots())
    if not real.exists():
        raise ValueError(f"{text} does not exist")
    if not real.is_dir():
        raise ValueError(f"{real.name} is a file; a run is a folder (the run_dir given to attnscope.watch)")
    return real


def _opened_message(run: Run) -> tuple[str, str]:
    steps = run.steps()
    latest = f", the latest {steps[-1]:,}" if steps else ""
    return (
        "success",
        f"Opened run {run.name}: {len(steps)} watched steps{latest}. It shows on the Training page.",
    )


def _keep(run: Run) -> None:
    st.session_state[K.RUN] = str(run.path)
    st.session_state[K.RUN_GOTO] = True


def _open_path() -> None:
    """Callback of 'Open run'."""
    text = st.session_state.get(K.RUN_PATH) or ""
    try:
        run = Run.open(resolve_allowed_folder(text))
        _keep(run)
        st.session_state[K.RUN_MSG] = _opened_message(run)
    except Exception as exc:  # any folder may be typed: one sentence, the app keeps running
        st.session_state[K.RUN_MSG] = (
            "error",
            files.error_sentence(f"Cannot open {text.strip() or 'the run'}", exc),
        )


def _at_root() -> bool:
    """The browser asked for the app itself, not for a page by its path (a link to /compare stays)."""
    url = st.context.url
    if url is None:  # no browser (AppTest)
        return True
    base = "/" + str(st.get_option("server.baseUrlPath") or "").strip("/")
    return urlparse(url).path.rstrip("/") in ("", base.rstrip("/"))


def open_served_run() -> None:
    """Once per session: the run ``attnscope view FOLDER`` serves (ATTNSCOPE_VIEW_RUN), shown on the
    Training page unless the session started on another page's address."""
    path = os.environ.get(RUN_ENV)
    if not path or st.session_state.get(K.RUN_VIEW_DONE):
        return
    st.session_state[K.RUN_VIEW_DONE] = True
    try:
        run = Run.open(path)
        _keep(run)
        if not _at_root():
            st.session_state.pop(K.RUN_GOTO, None)
        st.session_state[K.RUN_MSG] = _opened_message(run)
    except Exception as exc:
        st.session_state[K.RUN_MSG] = ("error", files.error_sentence(f"Cannot open {Path(path).name}", exc))


def go_to_training() -> None:
    """After a run was opened (this run's callback or the served run): show the Training page."""
    if st.session_state.pop(K.RUN_GOTO, False):
        opened.keep_sidebar()  # this run ends here, before the sidebar's widgets: keep their values
        st.switch_page(TRAINING_PAGE)


def close() -> None:
    """Callback of 'Close the run'."""
    st.session_state[K.RUN] = None


def current() -> OpenRun | None:
    """The open run (None: none). A run whose folder went away is closed with one sentence."""
    path = st.session_state.get(K.RUN)
    if not path:
        return None
    try:
        run = Run.open(path)
    except RunFormatError as exc:
        st.session_state[K.RUN] = None
        st.session_state[K.RUN_MSG] = ("error", files.error_sentence("The run was closed", exc))
        return None
    return OpenRun(str(path), run.name)


def sidebar_box(o: OpenRun | None) -> None:
    """Sidebar: the open run (with a Close button), and the 'Open a run' expander."""
    msg = st.session_state.pop(K.RUN_MSG, None)
    if o is not None:
        st.markdown(f"**Run** `{o.label}`")
        st.caption("Watched while it trained (attnscope.watch): see the **Training** and **Compare** pages.")
        st.button(
            "Close the run", key=K.RUN_CLOSE_BUTTON, on_click=close, help="Training shows the zoo again."
        )
    if msg is not None:
        st.session_state[K.RUN_BOX_USED] = True
    with st.expander("Open a run", expanded=bool(st.session_state.get(K.RUN_BOX_USED)) and o is None):
        st.text_input(
            "A run folder's path",
            key=K.RUN_PATH,
            placeholder="~/runs/my-model",
            help="The run_dir a training loop gave attnscope.watch (run.json, scalars.jsonl, steps/). "
            "A run still being written is followed as it grows.",
        )
        st.button("Open run", key=K.RUN_PATH_BUTTON, on_click=_open_path)
        st.caption("Folders inside the allowed folders (as for models and traces).")
    if msg is not None:
        (st.error if msg[0] == "error" else st.warning if msg[0] == "warning" else st.success)(msg[1])
