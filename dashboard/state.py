"""The sidebar every page shares, and the accessors pages read it through (keys: dashboard/keys.py).

app.py draws the sidebar once per run (before the page), so its widgets keep their values
when the page changes. Pages then call ``current()`` / ``model()`` / ``traces()``, which stop
the page with a message (st.warning / st.error) when there is nothing valid to show.

The sidebar's "Your own model" box loads a path (a core checkpoint folder, a .pt/.pth/.safetensors
file beside a core config.json, a Hugging Face folder, or a model name from the local Hugging Face
cache) or an uploaded core checkpoint; dashboard/user_models.py checks both. A model that fails to
load is reported with st.error in one sentence and the model shown so far stays selected.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from attnscope.core.errors import InputError
from attnscope.core.families.interface import AttentionModel
from attnscope.core.traces.trace import AttentionTrace, meta_texts
from attnscope.dashboard import files, loaders, model_facts, opened, user_models, watched
from attnscope.dashboard import keys as K
from attnscope.dashboard.files import sentence
from attnscope.models import registry

GENERATE, TEACHER = "generate (greedy decoding)", "teacher forcing (give the target)"


@dataclass(frozen=True)
class Selection:
    """What the sidebar asks for; hashable, so it can key caches."""

    name: str
    device: str
    version: float
    sources: tuple[str, ...]
    targets: tuple[str, ...] | None  # None: greedy decoding
    batch: bool
    problems: tuple[str, ...] = ()  # source problems found before running the model
    target_problems: tuple[str, ...] = ()  # teacher-forcing target problems
    trace: str | None = None  # digest of an opened trace file shown instead of the model (opened.py)

    @property
    def key(self) -> loaders.TraceKey:
        """The model and inputs of this selection: what its traces depend on."""
        return loaders.TraceKey(self.name, self.device, self.version, self.sources, self.targets)


def _split_lines(text: str) -> tuple[list[str], list[int]]:
    """Lines of a batch (a final newline is not an empty line) and 1-based empty line numbers."""
    lines = (text or "").split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines = lines[:-1]
    empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    return lines, empty


def _fill_examples(lm: AttentionModel) -> None:
    """Put the model's examples into the text boxes (first run, and whenever the model changes)."""
    ex = loaders.examples(lm, 3)
    st.session_state[K.SOURCE] = ex[0]
    st.session_state[K.SOURCES] = "\n".join(ex)
    st.session_state[K.TARGET] = ""
    st.session_state[K.TARGETS] = ""
    st.session_state[K.TEXT_FOR_MODEL] = lm.name


def _source_problems(sources: list[str], empty: list[int], batch: bool) -> list[str]:
    if not any(s.strip() for s in sources):
        return ["The input is empty: type a text for the model to read in the sidebar."]
    if batch and empty:
        lines = ", ".join(map(str, empty))
        return [f"Line {lines} of the batch is empty: delete the empty line or type an input on it."]
    return []


def _target_problems(n_sources: int, targets: list[str] | None, t_empty: list[int], batch: bool) -> list[str]:
    if targets is None:
        return []
    if not any(t.strip() for t in targets):
        return ["The target is empty: type the target text, or choose 'generate' to let the model write it."]
    if batch and t_empty:
        return [f"Target line {', '.join(map(str, t_empty))} is empty: give one target per input line."]
    if len(targets) != n_sources:
        return [f"{n_sources} inputs but {len(targets)} target lines: give one target per input line."]
    return []


# -- your own model ---------------------------------------------------------------------------


def _use_model(path: str, what: str) -> None:
    """Load ``path`` (raises on failure), list it in the picker and select it."""
    lm = loaders.load_model(path, st.session_state.get(K.DEVICE) or "cpu", loaders.model_version(path))
    users = [p for p in st.session_state.get(K.USER_MODELS, []) if p != path]
    st.session_state[K.USER_MODELS] = [*users, path]
    st.session_state[K.MODEL] = path
    arch = model_facts.ARCH_LABELS[model_facts.arch(lm)]
    st.session_state[K.LOAD_MSG] = ("success", f"Loaded {what} {loaders.display_name(path)!r} ({arch}).")


def _load_from_path() -> None:
    """Callback of the Load button (runs before the script, so it may set the picker)."""
    text = (st.session_state.get(K.LOAD_PATH) or "").strip()
    if text in loaders.registry_names():
        st.session_state[K.MODEL] = text
        st.session_state[K.LOAD_MSG] = ("success", f"Selected {text!r}.")
        return
    try:
        if registry.is_snapshot(text):  # NAME@STEP: a zoo model as it was at that training step
            _use_model(text, "training snapshot")
            return
        roots = [st.session_state[K.UPLOAD_DIR].name] if K.UPLOAD_DIR in st.session_state else []
        _use_model(user_models.resolve_user_model(text, roots), "model")
    except Exception as exc:  # any file may be handed in: report it, keep the app running
        st.session_state[K.LOAD_MSG] = (
            "error",
            files.error_sentence(f"Cannot load {text or 'the model'}", exc),
        )


def _upload_stem(uploads) -> str:
    """A folder name for an upload: the .zip's name, else the config's "name", else 'upload'."""
    stem = ""
    if len(uploads) == 1 and uploads[0].name.lower().endswith(".zip"):
        stem = Path(uploads[0].name).stem
    for f in uploads:
        if f.name == "config.json":
            try:
                stem = str(json.loads(f.getvalue()).get("name", ""))
            except (ValueError, AttributeError):
                pass
    return re.sub(r"[^\w.-]", "_", stem)[:40].strip("._") or "upload"


def _load_upload() -> None:
    """Callback of the upload's Load button: check, save into this session's folder, load."""
    uploads = st.session_state.get(K.UPLOADS) or []
    dest = None
    try:
        root = files.session_upload_root()
        dest = root / f"{_upload_stem(uploads)}-{sum(1 for _ in root.iterdir()) + 1}"
        user_models.save_upload([(f.name, f.getvalue()) for f in uploads], dest, files.upload_limit_bytes())
        _use_model(str(dest), "uploaded checkpoint")
    except Exception as exc:
        if dest is not None:
            shutil.rmtree(dest, ignore_errors=True)
        st.session_state[K.LOAD_MSG] = ("error", files.error_sentence("Cannot load the upload", exc))


def own_model_box() -> None:
    """Sidebar expander: load a model from a path or an upload."""
    msg = st.session_state.pop(K.LOAD_MSG, None)
    with st.expander("Your own model", expanded=msg is not None):
        st.text_input(
            "Folder, weights file, adapter file or cached Hugging Face name",
            key=K.LOAD_PATH,
            placeholder="~/models/my-model  or  gpt2",
            help="A core checkpoint folder (config.json + model.safetensors or model.pt/.pth + "
            "src_vocab.json), a .pt/.pth beside a core config.json, a Hugging Face folder, a model "
            "name already in the Hugging Face cache (never downloaded), or an adapter file (.py: any "
            "PyTorch model; runs its code, so only when the server was started with "
            "ATTNSCOPE_ALLOW_CODE=1). Relative paths start at the repository root.",
        )
        st.button("Load", key=K.LOAD_PATH_BUTTON, on_click=_load_from_path)
        roots = ", ".join(f"`{r}`" for r in user_models.allowed_roots())
        st.caption(f"Allowed folders: {roots} and `{user_models.MODEL_DIRS_ENV}`.")
        if not user_models.code_allowed():
            st.caption(
                f"Adapter files (.py) are off: start the server with `{user_models.ALLOW_CODE_ENV}=1` to load them."
            )
        limit = files.upload_limit_mb()
        st.file_uploader(
            "Upload a core checkpoint",
            type=user_models.UPLOAD_TYPES,
            accept_multiple_files=True,
            key=K.UPLOADS,
            help="config.json, model.safetensors (or a .pt/.pth state dict, read with weights_only), "
            "src_vocab.json [+ tgt_vocab.json, card.md, meta.json], as separate files or one .zip.",
        )
        st.caption(
            f"At most {limit} MB in all (server.maxUploadSize); a .zip may unpack to "
            f"{limit * user_models.UNZIP_FACTOR} MB. Pickles that would run code are refused."
        )
        st.button("Load upload", key=K.LOAD_UPLOAD_BUTTON, on_click=_load_upload)
        if msg is not None:
            (st.error if msg[0] == "error" else st.success)(msg[1])


def _model_facts_caption(lm: AttentionModel, name: str) -> str:
    kind = model_facts.KIND_LABELS.get(loaders.model_kind(name), "core folder")
    tok = lm.meta.get("tokenizer") or f"{lm.src_tok.kind} tokens"
    return f"{kind} · {model_facts.ARCH_LABELS[model_facts.arch(lm)]} · {tok}"


def _trace_sidebar(o: opened.OpenTrace) -> Selection:
    """The sidebar while a trace file replaces the model: what the trace is, Close, Open another."""
    opened.keep_sidebar()
    with st.sidebar:
        st.header("attnscope")
        opened.sidebar_box(o)
        watched.sidebar_box(watched.current())
    tr = o.trace
    text = tr.meta.get("source") if isinstance(tr.meta.get("source"), str) else None
    label = text or " ".join(tr.src_tokens or tr.tgt_tokens)[:200]
    sel = Selection(f"trace:{o.digest}", tr.device, 0.0, (label,), None, False, trace=o.digest)
    st.session_state[K.SELECTION] = sel
    return sel


def _without_model(warning: str | None = None) -> None:
    """The sidebar when no model can run: the reason, and the boxes that load a model or a trace."""
    if warning:
        st.warning(warning)
    st.session_state[K.SELECTION] = None
    own_model_box()
    opened.sidebar_box(None)
    watched.sidebar_box(watched.current())


def _pick_model(choices: list[str]) -> tuple[str, str]:
    """The Model and Device widgets: (model name, device)."""
    if st.session_state.get(K.MODEL) not in choices:
        st.session_state[K.MODEL] = "reverse" if "reverse" in choices else choices[0]
    name = st.selectbox(
        "Model",
        choices,
        key=K.MODEL,
        format_func=loaders.picker_label,
        help="The model zoo (models/<name>/) and installed pretrained models, with each card's summary.",
    )
    summary = loaders.model_summary(name)
    if summary:
        st.caption(summary)
    options = loaders.devices()
    if st.session_state.get(K.DEVICE) not in options:
        st.session_state[K.DEVICE] = options[0]
    device = st.radio(
        "Device", options, key=K.DEVICE, horizontal=True, help="CUDA is offered when a GPU is available."
    )
    return name, device


def _source_boxes(lm: AttentionModel) -> tuple[bool, list[str], list[int]]:
    """The input box (or the batch's lines), filled with the model's examples when the model changed:
    (batch, sources, 1-based numbers of empty lines)."""
    fresh = K.TEXT_FOR_MODEL not in st.session_state and K.LINK_TEXT not in st.session_state
    if st.session_state.get(K.TEXT_FOR_MODEL) != lm.name and not fresh:
        if st.session_state.pop(K.LINK_TEXT, False):  # a link's text stays
            st.session_state[K.TEXT_FOR_MODEL] = lm.name
        else:  # the model changed: its examples replace the text
            _fill_examples(lm)
    batch = st.toggle(
        "Batch: several inputs, one per line",
        key=K.BATCH,
        help="A batch pads shorter inputs with <pad>, so padding masks are real.",
    )
    defaults = ("", "")  # the shown box's default value (what it holds until it has a text of its own)
    if fresh:  # this session's first run: the examples are the shown box's default, so a browser that
        ex = loaders.examples(lm, 3)  # comes back to a session started over keeps its text; the hidden
        shown = (ex[0], "\n".join(ex))  # box gets them as its value
        defaults = ("", shown[1]) if batch else (shown[0], "")
        st.session_state[K.SOURCE if batch else K.SOURCES] = shown[0] if batch else shown[1]
        st.session_state[K.TEXT_FOR_MODEL] = lm.name
    if batch:
        raw = st.text_area("Inputs (one per line)", value=defaults[1], key=K.SOURCES, height=110)
        sources, empty = _split_lines(raw)
    else:
        raw = st.text_input("Input text", value=defaults[0], key=K.SOURCE)
        sources, empty = [raw], []
    st.caption(model_facts.limits_line(lm))
    return batch, sources, empty


def _decoder_boxes(lm: AttentionModel, batch: bool) -> tuple[list[str] | None, list[int]]:
    """Generate or teacher-force, and the targets: (targets or None, 1-based numbers of empty lines)."""
    targets, t_empty = None, []
    if not lm.has_decoder:
        st.caption("Encoder-only model: no decoder input.")
        return targets, t_empty
    # Labels stay the same for every model: the browser matches radio values by their label.
    mode = st.radio("Decoder input", (GENERATE, TEACHER), key=K.MODE)
    if mode == TEACHER:
        if batch:
            targets, t_empty = _split_lines(st.text_area("Targets (one per line)", key=K.TARGETS, height=90))
        else:
            targets = [st.text_input("Target text", key=K.TARGET)]
    if model_facts.arch(lm) == "decoder":
        st.caption(
            "Decoder-only model: the input is the prompt; 'generate' continues it greedily and "
            "the target is the continuation. Prompt and continuation are one sequence "
            "(decoder self-attention only)."
        )
    return targets, t_empty


def sidebar() -> Selection | None:
    """Draw the shared sidebar; store and return the Selection (None when no model loads). A run
    folder just opened (``attnscope view FOLDER`` or the sidebar's box) switches to the Training page."""
    opened.open_served_trace()
    watched.open_served_run()
    watched.go_to_training()
    o = opened.current()
    if o is not None:
        return _trace_sidebar(o)
    choices = loaders.model_choices(tuple(st.session_state.get(K.USER_MODELS, [])))
    with st.sidebar:
        st.header("attnscope")
        if not choices:
            _without_model(
                "No models yet. Train the zoo (see docs/zoo.md) or set ATTNSCOPE_MODELS "
                "to a model folder, then reload."
            )
            return None
        name, device = _pick_model(choices)
        version = loaders.model_version(name)
        try:
            lm = loaders.load_model(name, device, version)
        except Exception as exc:  # a broken folder, CUDA, ...: one sentence, the sidebar keeps working
            st.error(files.error_sentence(f"Cannot load model {loaders.display_name(name)!r}", exc))
            _without_model()
            return None
        st.caption(_model_facts_caption(lm, name))
        st.caption(f"Device used: **{lm.device}**")
        batch, sources, empty = _source_boxes(lm)
        targets, t_empty = _decoder_boxes(lm, batch)
        own_model_box()
        opened.sidebar_box(None)
        watched.sidebar_box(watched.current())
    sel = Selection(
        name,
        device,
        version,
        tuple(sources),
        None if targets is None else tuple(targets),
        batch,
        tuple(_source_problems(sources, empty, batch)),
        tuple(_target_problems(len(sources), targets, t_empty, batch)),
    )
    st.session_state[K.SELECTION] = sel
    return sel


def current() -> Selection:
    """The sidebar's Selection; stops the page (with the reason shown) when there is none."""
    sel = st.session_state.get(K.SELECTION)
    if sel is None:
        st.info("Pick a model in the sidebar.")
        st.stop()
    return sel


def trace_file() -> opened.OpenTrace | None:
    """The trace file shown instead of a model (None: the sidebar's model)."""
    return opened.current() if current().trace else None


def model(what: str = "This page") -> AttentionModel:
    """The sidebar's model; with a trace file open, says in one line which model to load and stops."""
    sel = current()
    if sel.trace:
        opened.needs_model(opened.current(), what)
    return loaders.load_model(sel.name, sel.device, sel.version)


def pad_id() -> int | None:
    """The model's PAD id; None for a trace file (its real positions are stored in it)."""
    return None if current().trace else model().cfg.pad_id


def check_inputs(greedy: bool = False) -> None:
    """Answers the sidebar's input problems on the page (st.warning) and stops it if there are any;
    for pages that run the model on their own batch (the Mask lab) and need no trace of the sidebar's."""
    sel = current()
    problems = list(sel.problems) + ([] if greedy else list(sel.target_problems))
    for p in problems:
        st.warning(p)
    if problems:
        st.stop()


def show_warnings(traces: list[AttentionTrace], batch: bool) -> None:
    """Each truncation warning of ``traces`` once, as st.warning ("Input 2: ..." in a batch)."""
    shown = set()
    for i, tr in enumerate(traces):
        for w in meta_texts(tr.meta, "warnings"):
            msg = f"Input {i + 1}: {w}." if batch else sentence(w)
            if msg not in shown:
                shown.add(msg)
                st.warning(msg)


def _notes(n: int) -> str:
    """``1 note`` / ``3 notes``: what capture said is counted by note (a call may have two reasons, and one
    note may stand for every call of a module), never as a number of calls."""
    return f"{n} note" if n == 1 else f"{n} notes"


def show_capture_flags(traces: list[AttentionTrace]) -> None:
    """One warning when capture could not verify (or left out) attention calls of a model it
    captured, naming each module and reason; the trace carries them, from the model or a file."""
    notes: list[str] = []
    for tr in traces:
        notes.extend(n for n in meta_texts(tr.meta, "capture_notes") if n not in notes)
    if notes:
        lines = "\n".join(f"- {n}" for n in notes[:8])
        more = f"\n- and {len(notes) - 8} more" if len(notes) > 8 else ""
        st.warning(f"Capture's notes on this model's attention: what it could not verify, left out, or drew from "
                   f"another row or step ({_notes(len(notes))}, one per module and reason):\n{lines}{more}",
                   icon="⚠️")  # fmt: skip


def traces(greedy: bool = False) -> list[AttentionTrace]:
    """Traces of the sidebar's inputs (greedy=True: always greedy decoding, whatever the mode).

    Input problems are answered on the page (st.warning / st.error) and stop it; truncation
    warnings are shown and the page goes on.
    """
    sel = current()
    if sel.trace:
        out = [opened.current().trace]
        show_capture_flags(out)
        return out
    check_inputs(greedy)
    try:
        out = loaders.compute_traces(sel.key.but(targets=None) if greedy else sel.key)
    except InputError as exc:
        st.error(sentence(str(exc)))
        st.stop()
    show_warnings(out, sel.batch)
    show_capture_flags(out)
    return out


def sequence_picker(key: str, traces_: list[AttentionTrace]) -> int:
    """Which sequence of a batch to show (0 without a batch)."""
    if len(traces_) == 1:
        return 0
    sel = current()
    n = len(traces_)
    if st.session_state.get(key, 0) >= n:
        st.session_state[key] = 0
    return st.selectbox(
        "Sequence",
        list(range(n)),
        key=key,
        format_func=lambda i: f"{i}: {sel.sources[i][:40]}",
        help="Sequences of the batch keep the batch's padded length, so PAD positions are visible.",
    )
