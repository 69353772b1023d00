"""Trace files in the dashboard: open a ``.npz`` / ``.json`` trace instead of running a model.

A trace is opened from the sidebar (an upload, or a path inside the allowed folders) or by
``attnscope view FILE``, which starts the server with ``ATTNSCOPE_VIEW_TRACE`` set: every new
session then opens that file (whoever started the server chose it, so no folder check). The
reader is attnscope.core.traces.trace's checked one (never unpickles; one sentence per bad file). Opened traces
live in this session only; the pages that need nothing but a trace draw it, the others say in
one line that they run the model and name the model to load (``needs_model``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from attnscope.core.traces.trace import AttentionTrace
from attnscope.dashboard import files, loaders
from attnscope.dashboard import keys as K

VIEW_ENV = "ATTNSCOPE_VIEW_TRACE"  # set by `attnscope view FILE`
TRACE_TYPES = ["npz", "json"]
KEEP = 4  # traces one session keeps open (the oldest is dropped)
# Sidebar keys kept while a trace replaces the model widgets (Streamlit drops the state of
# widgets a run does not draw; these come back as they were when the trace is closed).
SIDEBAR_KEYS = (K.MODEL, K.DEVICE, K.BATCH, K.SOURCE, K.SOURCES, K.MODE, K.TARGET, K.TARGETS)


@dataclass(frozen=True)
class OpenTrace:
    trace: AttentionTrace
    label: str  # file name shown in the sidebar
    digest: str  # of the file's bytes: keys caches
    problems: tuple[str, ...] = field(default_factory=tuple)  # opened, but with these warnings


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _keep(tr: AttentionTrace, label: str, data: bytes) -> OpenTrace:
    opened = OpenTrace(tr, label, _digest(data), tuple(tr.problems()))
    traces = dict(st.session_state.get(K.OPEN_TRACES) or {})
    traces.pop(opened.digest, None)
    traces[opened.digest] = opened
    while len(traces) > KEEP:
        traces.pop(next(iter(traces)))
    st.session_state[K.OPEN_TRACES] = traces
    st.session_state[K.TRACE] = opened.digest
    keep_sidebar()
    return opened


def keep_sidebar() -> None:
    """Keep the model's widget values while a trace replaces them (for when the trace is closed)."""
    for k in SIDEBAR_KEYS:
        if k in st.session_state:
            st.session_state[k] = st.session_state[k]


def _opened_message(o: OpenTrace) -> tuple[str, str]:
    tr = o.trace
    kinds = ", ".join(tr.kinds)
    text = (
        f"Opened {o.label}: {tr.n_layers} layers × {tr.n_heads} heads ({kinds}) from model "
        f"{loaders.display_name(tr.model) or 'unknown'}."
    )
    if o.problems:
        return "warning", text + " " + " ".join(o.problems)
    return "success", text


def _read_path(path: Path) -> tuple[AttentionTrace, bytes]:
    """The checked reader, and what identifies this version of the file (path, size, time)."""
    tr = AttentionTrace.load(path)
    st_ = path.stat()
    return tr, f"{path}:{st_.st_size}:{st_.st_mtime_ns}".encode()


def _open_upload() -> None:
    """Callback of 'Open trace' (upload): read the bytes with the checked reader."""
    f = st.session_state.get(K.TRACE_UPLOAD)
    if f is None:
        st.session_state[K.TRACE_MSG] = ("error", "Choose a .npz or .json trace file to upload first.")
        return
    try:
        data = files.upload_bytes(f)
        o = _keep(AttentionTrace.from_bytes(data, f.name), f.name, data)
        st.session_state[K.TRACE_MSG] = _opened_message(o)
    except Exception as exc:  # a hostile file: one sentence, the app keeps running
        st.session_state[K.TRACE_MSG] = ("error", files.error_sentence("Cannot open the trace", exc))


def _open_path() -> None:
    text = st.session_state.get(K.TRACE_PATH) or ""
    try:
        path = files.resolve_allowed_file(text, (".npz", ".json"), "a .npz or .json trace file")
        tr, data = _read_path(path)
        st.session_state[K.TRACE_MSG] = _opened_message(_keep(tr, path.name, data))
    except Exception as exc:
        st.session_state[K.TRACE_MSG] = (
            "error",
            files.error_sentence(f"Cannot open {text.strip() or 'the trace'}", exc),
        )


def open_served_trace() -> None:
    """Once per session: the trace ``attnscope view FILE`` serves (ATTNSCOPE_VIEW_TRACE)."""
    path = os.environ.get(VIEW_ENV)
    if not path or st.session_state.get(K.VIEW_DONE):
        return
    st.session_state[K.VIEW_DONE] = True
    try:
        tr, data = _read_path(Path(path))
        st.session_state[K.TRACE_MSG] = _opened_message(_keep(tr, Path(path).name, data))
    except Exception as exc:
        st.session_state[K.TRACE_MSG] = ("error", files.error_sentence(f"Cannot open {Path(path).name}", exc))


def close() -> None:
    """Callback of 'Close the trace': back to the sidebar's model."""
    st.session_state[K.TRACE] = None


def close_and_load(name: str) -> None:
    """Callback: close the trace and pick the model that wrote it."""
    st.session_state[K.TRACE] = None
    st.session_state[K.MODEL] = name


def current() -> OpenTrace | None:
    """The trace shown instead of a model, or None."""
    key = st.session_state.get(K.TRACE)
    return (st.session_state.get(K.OPEN_TRACES) or {}).get(key) if key else None


def writer_name(tr: AttentionTrace) -> str | None:
    """The trace's model when this server can load it by name (zoo, minilm, ATTNSCOPE_MODELS)."""
    return tr.model if tr.model in loaders.registry_names() else None


def needs_model(o: OpenTrace, what: str = "This page") -> None:
    """One line: this page runs the model, which a trace file does not hold; then stop the page."""
    name = writer_name(o.trace)
    if name:
        st.info(
            f"{what} needs the model itself, and a trace file holds only the numbers of one run: close the "
            f"trace and load **{name}** (the model that wrote {o.label})."
        )
        st.button(
            f"Close the trace and load {name}", key="needs_model_load", on_click=close_and_load, args=(name,)
        )
    else:
        who = loaders.display_name(o.trace.model) or "the model that wrote it"
        st.info(
            f"{what} needs the model itself, and a trace file holds only the numbers of one run: close the "
            f"trace and load {who} in the sidebar's 'Your own model' box."
        )
    st.stop()


def sidebar_box(o: OpenTrace | None) -> None:
    """Sidebar: the open trace (with a Close button), and the 'Open a trace' expander."""
    msg = st.session_state.pop(K.TRACE_MSG, None)
    if o is not None:
        tr = o.trace
        st.markdown(f"**Trace file** `{o.label}`")
        st.caption(
            f"written by **{loaders.display_name(tr.model) or 'unknown'}** on {tr.device or '?'} · "
            f"{', '.join(tr.kinds)} · {tr.n_layers} layers × {tr.n_heads} heads · "
            f"{len(tr.src_tokens)} source, {len(tr.tgt_tokens)} decoder tokens"
        )
        for p in o.problems:
            st.warning(p)
        st.button(
            "Close the trace", key=K.TRACE_CLOSE_BUTTON, on_click=close, help="Back to the model above."
        )
    if msg is not None:  # once used, the box stays open (a changing `expanded` would fold it under the user)
        st.session_state[K.TRACE_BOX_USED] = True
    with st.expander("Open a trace", expanded=bool(st.session_state.get(K.TRACE_BOX_USED)) and o is None):
        st.file_uploader(
            "Upload a trace (.npz or .json)",
            type=TRACE_TYPES,
            key=K.TRACE_UPLOAD,
            help="A file written by `attnscope trace --out`, a page's download button, or "
            "`trace.save(...)` in Python. Read without unpickling.",
        )
        st.button("Open trace", key=K.TRACE_UPLOAD_BUTTON, on_click=_open_upload)
        st.text_input("or a trace file's path", key=K.TRACE_PATH, placeholder="~/traces/run.npz")
        st.button("Open path", key=K.TRACE_PATH_BUTTON, on_click=_open_path)
        st.caption(f"At most {files.upload_limit_mb()} MB per upload; paths inside the allowed folders.")
    if msg is not None:
        (st.error if msg[0] == "error" else st.warning if msg[0] == "warning" else st.success)(msg[1])
