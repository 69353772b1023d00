"""Files from users: uploads (the server's size limit, this session's folder), paths inside the
allowed folders, and the one sentence any failure becomes on the page.

The sidebar's model box (state.py), trace files (opened.py) and corpus statistics files
(corpus_view.py) all go through here; what a model folder or an upload may contain is checked in
``user_models``, what a trace file may contain in ``attnscope.core.traces.trace_io``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import streamlit as st

from attnscope.dashboard import keys as K
from attnscope.dashboard import user_models

UPLOAD_PREFIX = "attnscope-upload-"  # per-session temporary folders of uploaded checkpoints
MESSAGE_CHARS = 400  # an exception's text is cut here: a hostile file can make it long


def upload_limit_mb() -> int:
    """Streamlit's server.maxUploadSize (MB; dashboard/server.toml sets it)."""
    return int(st.get_option("server.maxUploadSize"))


def upload_limit_bytes() -> int:
    return upload_limit_mb() * 2**20


def upload_bytes(f) -> bytes:
    """An uploaded file's bytes, refused (ValueError) past the server's upload limit."""
    data = f.getvalue()
    if len(data) > upload_limit_bytes():
        raise ValueError(f"{f.name} is larger than the upload limit ({upload_limit_mb()} MB)")
    return data


def session_upload_root() -> Path:
    """This session's folder for uploads (removed when the session's state is dropped)."""
    tmp = st.session_state.get(K.UPLOAD_DIR)
    if tmp is None:
        tmp = tempfile.TemporaryDirectory(prefix=UPLOAD_PREFIX)
        st.session_state[K.UPLOAD_DIR] = tmp
    return Path(tmp.name)


def resolve_allowed_file(text: str, suffixes: tuple[str, ...], kind: str) -> Path:
    """What the user typed -> an existing file with one of ``suffixes`` in an allowed folder
    (user_models.PathRefused / ValueError naming ``kind``, e.g. "a .parquet stats file")."""
    text = (text or "").strip().strip("'\"")
    if not text:
        raise ValueError(f"type the path of {kind}")
    _, real = user_models.real_path(text)
    user_models.check_allowed(text, real, user_models.allowed_roots())
    if real.suffix.lower() not in suffixes:
        raise ValueError(f"{real.name} is not {kind}")
    if not real.is_file():
        raise ValueError(f"{text} does not exist")
    return real


def sentence(text: str) -> str:
    """A message ('the input has ...') as a sentence for the page: capitalised, with a full stop."""
    text = text.strip()
    if not text:
        return text
    return text[0].upper() + text[1:] + ("" if text[-1] in ".!?)" else ".")


def error_sentence(prefix: str, exc: BaseException) -> str:
    """Any exception while handling a user's file or path as one sentence: ``prefix: what went wrong``
    (its text on one line, cut at MESSAGE_CHARS; the exception's type when it has no text)."""
    text = " ".join(str(exc).split())[:MESSAGE_CHARS] or type(exc).__name__
    return sentence(f"{prefix}: {text}" if prefix else text)
