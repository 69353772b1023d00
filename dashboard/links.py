"""Links to a view: the URL's query parameters carry what rebuilds the current picture.

``apply`` reads them once per session (the first run, before any widget is drawn) and puts each
value into the widget's session-state key, validated like typed input: a model must be one this
server lists by name (the zoo, minilm, ATTNSCOPE_MODELS), never a path, so a link can never make
the server load a file or run code that the sidebar would refuse; texts are length-capped and then
checked by the same tokenizer checks as the sidebar's box; every other value must be one of the
widget's options. Whatever is refused gets one sentence above the page. ``publish`` writes the
current values back (``st.query_params``) on every run, so the URL follows the clicks, and
``share_box`` shows the link with a one-click copy button.

Parameters: ``model``, ``text``, ``batch``, ``mode``, ``target`` (sidebar) plus each page's
own (``kind``, ``seq``, ``layer``, ``head`` and its main options, such as the Attention page's
``show=moves``, ``PAGE_PARAMS``). The page is the
URL's path (``/attention``, ``/heads``...).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from urllib.parse import urlencode, urlsplit

import streamlit as st

from attnscope.core.analysis import analytics, bugs
from attnscope.core.errors import ModelLoadError
from attnscope.core.traces.trace import KINDS
from attnscope.dashboard import keys as K
from attnscope.dashboard import loaders, state, words
from attnscope.dashboard.plots.attention import AGGREGATES
from attnscope.models import registry

MAX_TEXT = 2000  # characters of one text parameter (the longest model input is 512 tokens)
MAX_VALUE = 64  # characters of any other parameter
MAX_INT = 100_000
MODES = {"generate": state.GENERATE, "teacher": state.TEACHER}
COMPARE = {
    "input": "another input",
    "model": "another model",
    "bug": "a mask bug",
    "heads": "heads switched off",
    "step": "another training step",
    "moves": "what the weights move",
}

Parse = Callable[[str], object]  # raises ValueError with the reason


def _int(lo: int = 0) -> Parse:
    def parse(v: str) -> int:
        if not v.strip().isdigit() or not lo <= int(v) <= MAX_INT:
            raise ValueError(f"must be a whole number from {lo} to {MAX_INT}")
        return int(v)

    return parse


def _bool(v: str) -> bool:
    if v not in ("0", "1", "true", "false"):
        raise ValueError("must be 1 or 0")
    return v in ("1", "true")


def _one_of(options) -> Parse:
    options = tuple(options)

    def parse(v: str) -> str:
        if v not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return v

    return parse


def _mapped(table: dict[str, str]) -> Parse:
    def parse(v: str) -> str:
        if v not in table:
            raise ValueError(f"must be one of {', '.join(table)}")
        return table[v]

    return parse


def _head(v: str) -> int | str:
    return v if v in AGGREGATES else _int()(v)


def _layer_or_mean(v: str) -> int | str:
    return v if v == "mean" else _int()(v)


def _list_of(options) -> Parse:
    one = _one_of(options)

    def parse(v: str) -> list[str]:
        return [one(x) for x in v.split(",") if x] if v else []

    return parse


def _text(v: str) -> str:
    if len(v) > MAX_TEXT:
        raise ValueError(f"is {len(v):,} characters long; links carry at most {MAX_TEXT:,}")
    return v


def _model(v: str) -> str:
    if registry.is_snapshot(v):  # NAME@STEP: a training snapshot that exists
        try:
            registry.snapshot_weights(v)
        except ModelLoadError as exc:
            raise ValueError(f"names no snapshot: {exc}") from None
        return v
    if v not in loaders.registry_names():
        raise ValueError(
            "is not a model this server has by name (links name zoo and listed models only, never a "
            "path); load it in the sidebar's 'Your own model' box"
        )
    return v


def _bug(v: str) -> str:
    return _one_of(bugs.names())(v)


KIND = ("kind", None, _one_of(KINDS))
SEQ = ("seq", None, _int())
LAYER = ("layer", None, _int())
HEAD = ("head", None, _head)
# url path -> (parameter, session key, parse); None keys are filled from the page's prefix below.
_VIEW = {  # page: (prefix of its keys, its parameters)
    "attention": ("ATT", [KIND, SEQ, LAYER, HEAD, ("log", K.ATT_LOG, _bool), ("mask", K.ATT_MASK, _bool),
                          ("agg", K.ATT_AGG, _list_of(AGGREGATES)),
                          ("show", K.ATT_SHOW, _one_of(("weight", "moves")))]),
    "decoding": ("DEC", [SEQ, ("step", K.DEC_STEP, _int(1)), LAYER, ("log", K.DEC_LOG, _bool)]),
    "masks": ("MASK", [SEQ]),
    "mask-audit": ("AUD", [KIND, SEQ, LAYER, HEAD]),
    "mask-lab": ("LAB", [("bug", K.LAB_BUG, _bug), ("pad", K.LAB_PAD, _bool), ("view", K.LAB_VIEW,
                         _mapped(words.LAB_VIEWS)), KIND, SEQ, LAYER, HEAD]),
    "heads": ("HA", [KIND, ("stat", K.HA_STAT, _one_of(analytics.CROSS_STATS)), SEQ, LAYER, HEAD,
                     ("al_layer", K.HA_AL_LAYER, _layer_or_mean), ("al_head", K.HA_AL_HEAD, _layer_or_mean)]),
    "compare": ("CMP", [("vs", K.CMP_MODE, _mapped(COMPARE)), ("text_b", K.CMP_SOURCE_B, _text),
                        ("target_b", K.CMP_TARGET_B, _text), ("model_b", K.CMP_MODEL_B, _model),
                        ("bug", K.CMP_BUG, _bug), ("step_b", K.CMP_STEP_B, _int()), KIND, SEQ, LAYER, HEAD]),
    "training": ("TRAIN", [KIND, ("step", K.TRAIN_STEP, _int())]),
    "positional": ("PE", []),
    "bertviz": ("BV", [("view", K.BV_VIEW, _one_of(("head", "model"))), SEQ]),
    "model": ("", []),
}  # fmt: skip
PAGE_PARAMS: dict[str, list[tuple[str, str, Parse]]] = {
    page: [(p, key or getattr(K, f"{prefix}_{p.upper()}"), parse) for p, key, parse in params]
    for page, (prefix, params) in _VIEW.items()
}
SIDEBAR = ("model", "batch", "text", "mode", "target")
SHORT_NAMES = {K.CMP_MODE: COMPARE, K.LAB_VIEW: words.LAB_VIEWS}  # session values that links shorten


def page_name(url_path: str) -> str:
    """The page's name in PAGE_PARAMS (the default page's path is empty)."""
    return url_path if url_path in PAGE_PARAMS else "attention"


def _unparse(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, list | tuple):
        return ",".join(str(x) for x in v)
    return str(v)


def apply(url_path: str, say: Callable[[str], None]) -> None:
    """First run of a session: the URL's parameters into the widgets' keys; refusals to ``say``."""
    if st.session_state.get(K.LINK_APPLIED):
        return
    st.session_state[K.LINK_APPLIED] = True
    params = st.query_params.to_dict()
    if not params:
        return
    page = page_name(url_path)
    known = {p: (key, parse) for p, key, parse in PAGE_PARAMS[page]}
    problems: list[str] = []
    values: dict[str, object] = {}
    for name, raw in list(params.items())[:40]:
        shown = name if len(name) <= 30 else name[:30] + "…"
        if name not in known and name not in SIDEBAR:
            problems.append(f"'{shown}' is not a setting of this page")
            continue
        limit = MAX_TEXT if name in ("text", "target", "text_b", "target_b") else MAX_VALUE
        try:
            if len(raw) > limit:
                raise ValueError(f"is {len(raw):,} characters long; links carry at most {limit:,}")
            if name in known:
                values[known[name][0]] = known[name][1](raw)
            elif name == "model":
                values[K.MODEL] = _model(raw)
                if values[K.MODEL] not in loaders.registry_names():  # a snapshot: offer it in the picker
                    users = [p for p in st.session_state.get(K.USER_MODELS, []) if p != raw]
                    st.session_state[K.USER_MODELS] = [*users, raw]
            elif name == "batch":
                values[K.BATCH] = _bool(raw)
            elif name == "mode":
                values[K.MODE] = _mapped(MODES)(raw)
            else:  # text / target: the sidebar's boxes check them like typed input
                values[name] = _text(raw)
        except ValueError as exc:
            value = raw if len(raw) <= 40 else raw[:40] + "…"
            problems.append(f"{shown}={value!r} {exc}")
    batch = bool(values.get(K.BATCH, st.session_state.get(K.BATCH, False)))
    if "text" in values:
        text = values.pop("text")
        values[K.SOURCES if batch else K.SOURCE] = text if batch else str(text).split("\n")[0]
        st.session_state[K.LINK_TEXT] = True  # the model's examples must not replace it
    if "target" in values:
        text = values.pop("target")
        values[K.TARGETS if batch else K.TARGET] = text if batch else str(text).split("\n")[0]
    st.session_state.update(values)
    names = {key: p for p, (key, _) in known.items()}
    st.session_state[K.LINK_VALUES] = {k: (names.get(k, ""), v) for k, v in values.items() if k in names}
    if problems:
        say("This link's " + "; ".join(problems) + ". The rest of the view is as linked.")


def current_params(url_path: str) -> dict[str, str]:
    """The parameters that rebuild the current view (sidebar, then the page's own)."""
    ss = st.session_state
    out: dict[str, str] = {}
    sel = ss.get(K.SELECTION)
    if sel is not None and not sel.trace:
        out["model"] = sel.name if loaders.is_named_model(sel.name) else ""
        if sel.batch:
            out["batch"] = "1"
        out["text"] = "\n".join(sel.sources)
        if sel.targets is not None:
            out["mode"] = "teacher"
            out["target"] = "\n".join(sel.targets)
        if not out["model"]:  # a model loaded from a path: the link cannot name it
            del out["model"]
    for name, key, _ in PAGE_PARAMS[page_name(url_path)]:
        if key in ss and ss[key] is not None:
            value = ss[key]
            if key in SHORT_NAMES:  # a label: the link carries its short name
                value = next((k for k, v in SHORT_NAMES[key].items() if v == value), "")
            out[name] = _unparse(value)
    return {k: v for k, v in out.items() if v != "" or k in ("text", "target")}


def publish(url_path: str) -> str:
    """Write the current view into the URL (only when it changed); returns the query string."""
    params = current_params(url_path)
    if st.query_params.to_dict() != params:
        st.query_params.from_dict(params)
    return urlencode(params)


def report(say: Callable[[str], None]) -> None:
    """After the page ran once from a link: the linked values the page had to change (out of range)."""
    linked = st.session_state.pop(K.LINK_VALUES, None)
    if not linked:
        return
    changed = [
        f"{name}={_unparse(value)} (showing {_unparse(st.session_state.get(key))})"
        for key, (name, value) in linked.items()
        if key in st.session_state and st.session_state.get(key) != value
    ]
    if changed:
        say("This link asked for values this view does not have: " + "; ".join(changed) + ".")


def link(query: str) -> str:
    """The full link (scheme, host, page path and the query)."""
    base = st.context.url or ""
    return f"{base}?{query}" if query else base


# Puts the page's own path and query in the address bar when it shows anything else (replaceState:
# no new history entry). Streamlit writes the query (st.query_params) onto whatever path the address
# bar has at that moment, and the new page's path only once the browser has redrawn the navigation,
# which can come long after the page's query (a page that computes for seconds): until then the
# address bar would show the new query under the old page's path, or the new path with an old query.
ADDRESS_JS = (
    "<script>/* {run} */(() => {{ const want = {want};"
    " if (location.pathname + location.search !== want) history.replaceState(history.state, '', want);"
    " }})();</script>"
)
_RUNS = itertools.count()


def address(query: str) -> str:
    """What the address bar must show for this view: the page's path, then the query."""
    path = urlsplit(link("")).path or "/"
    return f"{path}?{query}" if query else path


def _address_script(query: str) -> str:
    want = json.dumps(address(query))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):  # never ends the script
        want = want.replace(ch, esc)
    return ADDRESS_JS.format(run=next(_RUNS), want=want)  # new text every run: the script runs again


def share_box(slot, query: str) -> None:
    """The sidebar's link to this view (st.code has a copy button), and the same view in the address bar."""
    with slot.container():
        st.caption("Link to this view (copy button on the right):")
        st.code(link(query), language=None, wrap_lines=True)
        st.html(_address_script(query), unsafe_allow_javascript=True)
