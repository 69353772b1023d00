"""Trace files: writing them, and reading those that anyone may hand us, checked before they are believed.

Writing: ``AttentionTrace.save(path)``, ``to_npz_bytes()`` and ``to_json()`` come here. A ``.npz`` holds
one member per array (the names of ``AttentionTrace.to_numpy``) plus ``header``, a JSON string (model,
config_name, device, output_text, meta); a ``.json`` file is the header's keys and every array as
nested lists. A numpy string array drops the NUL characters that end a string, so where a token ends in
one (a byte-level vocabulary's ``"\x00"``), the ``.npz`` header keeps that list of tokens as written
(``exact_tokens``); a ``.json`` file's lists keep them themselves.

Reading: ``AttentionTrace.load(path)`` and ``AttentionTrace.from_bytes(data, name)`` come here. A bad file
raises TraceFormatError with one sentence that starts with the file's name. Nothing is unpickled:
in a ``.npz`` every member's ``.npy`` header is read first (``np.lib.format``), so object arrays,
wrong dtypes and wrong or huge shapes are refused before any data is read; ``.json`` nested lists
are converted with their shapes and dtypes checked. ``problems(trace)`` lists what does not stop a
trace from opening but must be said (NaN, attention on keys its own mask forbids, rows that do
not sum to 1): a buggy model writes exactly such traces, and the mask audit is there to read them.
"""

from __future__ import annotations

import io
import json
import re
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.core.errors import TraceFormatError
from attnscope.core.traces.trace import (
    _ARRAYS,
    _TOKENS,
    KINDS,
    LAYER_MASKS,
    LEARNED,
    VALUE_NORMS,
    AttentionTrace,
    head_masks_differ,
)

MAX_TRACE_TOKENS = 2048  # per axis (source, decoder)
MAX_TRACE_VALUES = (
    160_000_000  # attention values over all kinds (a 12 x 12-head model at 1,024 tokens: 151 M)
)
MAX_TRACE_BYTES = 1 << 30  # a file opened from a path (uploads have the server's own limit)
MAX_NPZ_BYTES = 2 << 30  # what a .npz's members may unpack to in all (the zip directory says, before reading)
MAX_HEADER_CHARS = 1 << 20
MAX_TOKEN_CHARS = 1024  # one token's text
MAX_TOPK = 64  # predictions kept per position
MAX_CLASSES = 100_000  # out_probs of a classifier
MAX_JSON_DEPTH = 16  # a trace's JSON nests 5 deep (a [layer, head, query, key] list in the object)
# The format's version, in the header of every file written, and the members each version may hold:
# a reader refuses members it does not know and versions newer than it reads.
FORMAT_VERSION = 4  # the newest this reader knows; a file is written in the oldest that holds its members
_V1 = frozenset(
    (
        *_TOKENS,
        *(a for a in _ARRAYS if a not in LEARNED and a not in VALUE_NORMS and a not in LAYER_MASKS),
        "header",
    )
)
FORMAT_MEMBERS = {
    1: _V1,
    2: _V1 | frozenset(LEARNED),
    3: _V1 | frozenset(LEARNED) | frozenset(VALUE_NORMS),
    4: _V1 | frozenset(LEARNED) | frozenset(VALUE_NORMS) | frozenset(LAYER_MASKS),
}  # 2: weights on learned keys (memory key/values, null keys); 3: value norms (what attention moves);
# 4: each layer's mask where a kind's layers were masked differently
MAX_LEARNED_KEYS = 1024
PROB_TOL = 1e-3
# meta["weights_rescaled"]: the largest weight of a trace whose weights were scaled up after the softmax (dropout
# while training keeps each weight it does not drop times 1 / (1 - p)): up to it, not 1, values are weights
MAX_RESCALED = 1e4
_STR_ARRAYS = ("topk_tokens",)


class _Bad(Exception):
    """What is wrong, without the file's name (added once, in read_*)."""


def _fail(name: str, why: str) -> TraceFormatError:
    why = " ".join(str(why).split())
    return TraceFormatError(f"{name} is not a trace attnscope can open: {why[:300]}")


# -- the .npz container ------------------------------------------------------------------------------


def _npy_header(fp) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
    elif version in ((2, 0), (3, 0)):
        shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
    else:
        raise _Bad(f"unknown .npy version {version}")
    return tuple(int(s) for s in shape), dtype


def _read_npz(source) -> tuple[Any, dict[str, np.ndarray]]:  # the header as parsed: _check judges it
    try:
        zf = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:  # (a zip version
        # or compression zipfile does not read)
        raise _Bad("the file is truncated or not a .npz archive") from exc
    with zf:
        infos = zf.infolist()
        known = set().union(*FORMAT_MEMBERS.values())
        for info in infos:  # the zip directory first: nothing is decompressed for a member refused here
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if key not in known or not info.filename.endswith(".npy"):
                raise _Bad(f"it holds {info.filename!r}, which is not a member of the trace format")
        if sum(i.file_size for i in infos) > MAX_NPZ_BYTES:
            raise _Bad(f"its members unpack to more than {MAX_NPZ_BYTES / 2**20:,.0f} MB")
        members = {}
        for info in infos:
            key = info.filename[:-4]
            try:
                with zf.open(info) as fp:
                    shape, dtype = _npy_header(fp)
            except _Bad:
                raise
            except Exception as exc:  # zlib/CRC/EOF/ValueError: a broken member
                raise _Bad(f"member {info.filename!r} is truncated or not a numpy array") from exc
            if dtype.hasobject:
                raise _Bad(
                    f"{key!r} holds Python objects (pickled data), which attnscope never unpickles; "
                    "traces hold only numbers, booleans and strings"
                )
            members[key] = (shape, dtype)
        if "header" not in members:
            raise _Bad("it has no 'header' (the model, device and meta that trace.save writes)")
        shape, dtype = members["header"]
        if shape != () or dtype.kind != "U":
            raise _Bad(f"its header is {dtype} of shape {_dims(shape)}, not one JSON string")
        _check_declared(members)
        for info in infos:  # a member cannot hold more than the zip directory says it unpacks to
            if _nbytes(*members[info.filename[:-4]]) > info.file_size:
                raise _Bad(f"member {info.filename!r} declares more data than it holds (truncated)")

        def load(key: str) -> np.ndarray:
            try:
                with zf.open(key + ".npy") as fp:
                    return np.lib.format.read_array(fp, allow_pickle=False)
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError,
                    RuntimeError) as exc:  # (an encrypted member: RuntimeError)  # fmt: skip
                raise _Bad(f"{key!r} is truncated or damaged") from exc

        header_text = str(load("header")).removeprefix("\ufeff")
        if len(header_text) > MAX_HEADER_CHARS:
            raise _Bad(f"its header is longer than {MAX_HEADER_CHARS:,} characters")
        if _json_depth(header_text) > MAX_JSON_DEPTH:
            raise _Bad(f"its header nests deeper than {MAX_JSON_DEPTH} levels; a trace's header nests 4")
        header = _loads(header_text, "its header is not JSON", "its header")
        if not isinstance(header, dict):
            raise _Bad("its header is not a JSON object (of the model, device and meta)")
        allowed = FORMAT_MEMBERS[_version(header)]
        extra = sorted(set(members) - allowed)
        if extra:
            raise _Bad(f"it holds {extra[0]!r}, which format {_version(header)} of traces does not have")
        arrays = {k: load(k) for k in members if k != "header"}
    return header, arrays


def _version(header: Any) -> int:
    """The format version a header declares (files written before versions existed are version 1)."""
    version = header.get("format", 1) if isinstance(header, dict) else 1
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _Bad(f"its header's format {version!r} is not a version number")
    if version not in FORMAT_MEMBERS:
        raise _Bad(
            f"it is trace format {version}, written by a newer attnscope; this one reads format "
            f"{max(FORMAT_MEMBERS)} and older"
        )
    return version


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _check_declared(members: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
    """Token counts, attention sizes, each member's own shape and dtype (_check_members) and then every
    member's bytes, from the .npy headers alone, before any data is read: no member may declare more than a
    trace of these tokens can hold (and a member too large is the member named: the tokens and maps the limits
    are taken from are checked first)."""
    for name in _TOKENS:
        if name in members:
            shape = members[name][0]
            if len(shape) == 1 and shape[0] > MAX_TRACE_TOKENS:
                raise _Bad(
                    f"it has {shape[0]:,} {name.replace('_', ' ')}; attnscope opens at most {MAX_TRACE_TOKENS:,}"
                )
    values = 0
    for name, (shape, _) in members.items():
        if name in KINDS or name.endswith("_scores"):
            if any(s > MAX_TRACE_TOKENS for s in shape[2:]):
                raise _Bad(
                    f"{name} is {'x'.join(map(str, shape))}; attnscope opens at most {MAX_TRACE_TOKENS:,} tokens"
                )
            values += int(np.prod(shape, dtype=np.int64)) if name in KINDS else 0
    if values > MAX_TRACE_VALUES:
        raise _Bad(f"it holds {values:,} attention values; attnscope opens at most {MAX_TRACE_VALUES:,}")
    _check_members(members)  # each member's own shape and dtype first: a size sentence names a member too big
    n = max([1] + [members[t][0][0] for t in _TOKENS if t in members and len(members[t][0]) == 1])
    for name, (shape, dtype) in members.items():
        if name == "header":
            limit = MAX_HEADER_CHARS * 4
        elif name in _TOKENS:
            limit = MAX_TRACE_TOKENS * MAX_TOKEN_CHARS * 4
        elif name in KINDS or name.endswith("_scores"):
            limit = values * 16  # float64 (complex numbers are refused by _check_members)
        elif name.endswith("_mask"):
            limit = n * n * 8
        elif name in LAYER_MASKS:  # (layer, query, key): at most one per layer's map of a head
            limit = values * 8
        elif name in VALUE_NORMS:  # (layer, head, key): at most one per attention value
            limit = values * 8
        elif name in LEARNED:
            limit = min(values, MAX_TRACE_VALUES) * 8 + MAX_LEARNED_KEYS * 8 * max(1, values // max(n, 1))
        elif name.startswith("topk"):
            limit = n * MAX_TOPK * max(8, MAX_TOKEN_CHARS * 4 if name == "topk_tokens" else 8)
        elif name == "out_probs":
            limit = max(n, MAX_CLASSES) * 8
        else:  # ids and real positions
            limit = n * 8
        if _nbytes(shape, dtype) > limit:
            raise _Bad(
                f"{name} declares {'x'.join(map(str, shape)) or 'a scalar'} {dtype} "
                f"({_nbytes(shape, dtype) / 2**20:,.1f} MB), more than a trace of {n:,} tokens holds"
            )


def _check_members(members: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
    """What each member's shape and dtype alone say: tokens are lists of strings; each map is real numbers
    [layer, head, query, key] with at least one layer and head and its tokens' lengths; every member beside a
    map is shaped by it (masks: their dimensions; their size is judged by _check_declared, their shape by
    _check), ids and flags one per token, numbers numbers. From a .npz's .npy headers before any data is read
    (so that a size sentence never blames a member for another's shape), and from a .json's converted lists."""
    lengths = {}
    for name in _TOKENS:
        if name not in members:
            continue
        shape, dtype = members[name]
        size = int(np.prod(shape, dtype=np.int64))
        if size and (len(shape) != 1 or dtype.kind != "U"):
            raise _Bad(f"{name} must be a list of strings, got {dtype} of shape {_dims(shape)}")
        if size > MAX_TRACE_TOKENS:
            raise _Bad(
                f"it has {size:,} {name.replace('_', ' ')}; attnscope opens at most {MAX_TRACE_TOKENS:,}"
            )
        lengths[name] = size
    S, T = lengths.get("src_tokens", 0), lengths.get("tgt_tokens", 0)
    axes = {"enc_self": (S, S), "dec_self": (T, T), "cross": (T, S)}
    if not any(k in members for k in KINDS):
        raise _Bad("it holds no attention (none of enc_self, dec_self, cross)")
    for kind in KINDS:
        if kind not in members:
            for member in ("learned", "value_norms", "residual_norms"):
                if f"{kind}_{member}" in members:
                    raise _Bad(f"it holds {kind}_{member} but no {kind}")
            continue
        shape, dtype = members[kind]
        if dtype.kind not in "fiu":
            raise _Bad(f"{kind} must hold real numbers, got {dtype}")
        if len(shape) == 4 and 0 in shape[:2]:
            raise _Bad(f"{kind} is {_dims(shape)}: a map has at least one layer and one head")
        if len(shape) != 4 or shape[2:] != axes[kind]:
            q, k = axes[kind]
            raise _Bad(
                f"{kind} is {_dims(shape)}, but its tokens call for [layer, head, {q}, {k}] "
                "([layer, head, query, key] with query and key as long as their tokens)"
            )
        s = members.get(f"{kind}_scores")
        if s is not None and (s[1].kind not in "fiu" or s[0] != shape):
            raise _Bad(
                f"{kind}_scores is {s[1]} {_dims(s[0])}, not real numbers shaped like {kind} ({_dims(shape)})"
            )
        for suffix, dims, want in (("_mask", 2, shape[2:]), ("_layer_masks", 3, (shape[0], *shape[2:]))):
            m = members.get(kind + suffix)
            if m is not None and m[1].kind not in "biu":
                raise _Bad(f"{kind}{suffix} must be booleans (True = may attend), got {m[1]}")
            if m is not None and len(m[0]) != dims:
                raise _Bad(f"{kind}{suffix} is {_dims(m[0])}, but {kind} calls for "
                           f"{'[layer, query, key]' if dims == 3 else '[query, key]'} = {_dims(want)}")  # fmt: skip
        w = members.get(f"{kind}_learned")
        if w is not None and (
            w[1].kind not in "fiu"
            or len(w[0]) != 4
            or w[0][:3] != shape[:3]
            or not 0 < w[0][3] <= MAX_LEARNED_KEYS
        ):
            raise _Bad(f"{kind}_learned is {w[1]} {_dims(w[0])}, not real numbers shaped [layer, head, query, "
                       f"learned keys] = {_dims(shape[:3])}x(1 to {MAX_LEARNED_KEYS}) like {kind}")  # fmt: skip
        for member, names, want in (
            ("value_norms", "[layer, head, key]", (*shape[:2], shape[3])),
            ("residual_norms", "[layer, query]", (shape[0], shape[2])),
        ):
            v = members.get(f"{kind}_{member}")
            if v is not None and (v[1].kind not in "fiu" or v[0] != want):
                raise _Bad(f"{kind}_{member} is {v[1]} {_dims(v[0])}, not real numbers shaped {names} = "
                           f"{_dims(want)} like {kind}")  # fmt: skip
    for side, n in (("src", S), ("tgt", T)):
        for suffix, kinds_ok, what in (("_ids", "iu", "whole numbers"), ("_real", "biu", "booleans")):
            a = members.get(side + suffix)
            if a is None:
                continue
            if a[1].kind not in kinds_ok:
                raise _Bad(f"{side}{suffix} must be {what}, got {a[1]}")
            if a[0] != (n,):
                raise _Bad(f"{side}{suffix} is {_dims(a[0])}, but there are {n} {side}_tokens")
    ti, tp = members.get("topk_ids"), members.get("topk_probs")
    if (ti is None) != (tp is None):
        raise _Bad("it has only one of topk_ids and topk_probs")
    if ti is not None and tp is not None:
        if len(ti[0]) != 2 or ti[0] != tp[0] or ti[1].kind not in "iu" or tp[1].kind not in "fiu":
            raise _Bad(f"topk_ids ({ti[1]} {_dims(ti[0])}) and topk_probs ({tp[1]} {_dims(tp[0])}) must be "
                       "whole numbers and probabilities of one [position, k] shape")  # fmt: skip
        tt = members.get("topk_tokens")
        if tt is not None and (tt[0] != ti[0] or tt[1].kind != "U"):
            raise _Bad(
                f"topk_tokens is {tt[1]} {_dims(tt[0])}, not strings shaped like topk_ids ({_dims(ti[0])})"
            )
    op = members.get("out_probs")
    if op is not None:
        n_out = lengths.get("out_tokens", 0)
        if len(op[0]) != 1 or op[1].kind not in "fiu" or (n_out > 1 and op[0][0] != n_out):
            raise _Bad(f"out_probs is {op[1]} {_dims(op[0])}, not one probability per output token ({n_out})")


# -- .json -----------------------------------------------------------------------------------------


def _json_depth(text: str) -> int:
    """How deep the document's arrays and objects nest (strings left out), without parsing it."""
    raw = np.frombuffer(re.sub(r'"(?:\\.|[^"\\])*"', '""', text).encode(), dtype=np.uint8)
    step = (raw == ord("[")).astype(np.int32) + (raw == ord("{")) - (raw == ord("]")) - (raw == ord("}"))
    return int(np.cumsum(step, dtype=np.int64).max(initial=0))


def _loads(text: str, not_json: str, what: str = "it") -> Any:
    """``json.loads``, each failure one sentence (``not_json``: what to say of text that is no JSON; ``what``:
    what the text is, "it" or "its header")."""
    try:
        return json.loads(text)
    except ValueError as exc:  # (a JSONDecodeError, or Python's limit on an int's digits)
        if "integer string conversion" in str(exc):
            raise _Bad(
                f"{what} holds a whole number of more than {sys.get_int_max_str_digits():,} digits, which no "
                "trace holds"
            ) from exc
        raise _Bad(not_json) from exc
    except RecursionError as exc:
        raise _Bad(not_json) from exc


def _read_json(text: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    text = text.removeprefix("\ufeff")  # a byte-order mark (editors on Windows write one): not JSON, not ours
    if _json_depth(text) > MAX_JSON_DEPTH:
        raise _Bad(f"it nests deeper than {MAX_JSON_DEPTH} levels; a trace nests 5")
    doc = _loads(text, "it is truncated or not JSON")
    if not isinstance(doc, dict):
        raise _Bad("it is not a JSON object with the trace's fields")
    allowed = FORMAT_MEMBERS[_version(doc)] | {
        "model",
        "config_name",
        "device",
        "output_text",
        "meta",
        "format",
    }
    extra = sorted(set(doc) - allowed)
    if extra:
        raise _Bad(f"it holds {extra[0]!r}, which format {_version(doc)} of traces does not have")
    arrays: dict[str, np.ndarray] = {}
    for name in (*_TOKENS, *_ARRAYS, *_STR_ARRAYS):
        if name in doc and doc[name] is not None:
            value = doc[name]
            if name in _TOKENS and isinstance(value, list) and len(value) > MAX_TRACE_TOKENS:
                raise _Bad(
                    f"it has {len(value):,} {name.replace('_', ' ')}; attnscope opens at most {MAX_TRACE_TOKENS:,}"
                )
            try:
                arrays[name] = np.asarray(value)
            except (ValueError, TypeError) as exc:
                raise _Bad(f"{name} is a ragged list (rows of different lengths)") from exc
            if arrays[name].dtype.hasobject:
                raise _Bad(f"{name} is a ragged or mixed list, not an array")
            if (
                name in _TOKENS
                and isinstance(value, list)
                and all(isinstance(t, str) for t in value)
                and arrays[name].tolist() != value
            ):
                # (a token ending in NUL, which the array dropped: the list keeps it)
                doc.setdefault("exact_tokens", {})[name] = value
    return doc, arrays


# -- what every trace must satisfy -----------------------------------------------------------------


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "a scalar"


def _shape(a: np.ndarray) -> str:
    return _dims(a.shape)


def _top_weight(header: dict[str, Any]) -> float:
    """The largest value a weight may have: 1, or meta["weights_rescaled"] where the trace says its weights were
    scaled up after the softmax (dropout while training)."""
    top = (header.get("meta") or {}).get("weights_rescaled")
    if isinstance(top, (int, float)) and not isinstance(top, bool) and 1 < top <= MAX_RESCALED:
        return float(top)
    return 1.0


def _what(value: Any) -> str:
    """A JSON value's kind, for a sentence: "a number", "a list holding an object", ..."""
    if isinstance(value, list):
        odd = [v for v in value if not isinstance(v, str)]
        return f"a list holding {_what(odd[0])}" if odd else "a list of strings"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return "text" if isinstance(value, str) else "an object"


def _check_meta(meta: dict[str, Any], n_tgt: int) -> None:
    """The meta entries the app reads as lists, text or numbers (the pages show them), as a file from outside
    may hold them: each of the type attnscope writes, or absent. (learned_keys, value_norms and query_rows are
    checked with their members; forward_ms, source, weights_rescaled and head_masks_differ are read where they
    are used, and taken only when they fit.)"""
    for key in ("capture_notes", "warnings", "labels"):  # written as lists of sentences / class names
        value = meta.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
            raise _Bad(f"the header's meta {key!r} must be a list of strings, not {_what(value)}")
    head = meta.get("embedding_head")
    if head is not None and not (
        isinstance(head, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in head)
    ):
        raise _Bad("the header's meta 'embedding_head' must be a list of numbers, not "
                   + (_what(head) if not isinstance(head, list) else "a list holding other values"))  # fmt: skip
    n = meta.get("prompt_len")
    if n is not None and not (type(n) is int and 0 <= n <= n_tgt):
        raise _Bad(f"the header's meta 'prompt_len' must be a whole number from 0 to the trace's {n_tgt} "
                   f"tgt_tokens, not {n!r:.40}")  # fmt: skip


_F32_MAX = float(np.finfo(np.float32).max)
_I64_MAX = int(np.iinfo(np.int64).max)


def _check_kept(arrays: dict[str, np.ndarray]) -> None:
    """Numbers attnscope keeps as float32 (weights, scores, norms, probabilities) and int64 (ids) must fit
    there: a finite float64 past float32's range would turn infinite, a uint64 past int64's negative."""
    for name, a in arrays.items():
        if (
            not a.size
            or name in _TOKENS
            or name in _STR_ARRAYS
            or name.endswith(("_mask", "_masks", "_real"))
        ):
            continue
        if (
            name.endswith("_ids")
            and a.dtype.kind == "u"
            and a.dtype.itemsize >= 8
            and int(a.max()) > _I64_MAX
        ):
            raise _Bad(f"{name} holds {int(a.max()):,}, past the largest id attnscope keeps (2**63 - 1)")
        if not name.endswith("_ids") and a.dtype.kind == "f" and a.dtype.itemsize > 4:
            finite = np.isfinite(a)
            big = max(
                float(np.max(a, where=finite, initial=-np.inf)),
                -float(np.min(a, where=finite, initial=np.inf)),
            )
            if big > _F32_MAX:
                raise _Bad(f"{name} holds {big:.3g} ({a.dtype}), too large for float32 (at most {_F32_MAX:.3g}), "
                           "in which attnscope keeps it")  # fmt: skip


def _check(header: Any, arrays: dict[str, np.ndarray]) -> None:
    """Everything a trace must satisfy: the header's fields, the members' shapes and dtypes (_check_members), then
    their values (masks of 0/1, probabilities, norms, rows), reading the data."""
    if not isinstance(header, dict):
        raise _Bad("its header is not a JSON object")
    for key in ("model", "config_name", "device", "output_text"):
        if not isinstance(header.get(key, ""), str):
            raise _Bad(f"the header's {key!r} is not text")
    if not isinstance(header.get("meta", {}) or {}, dict):
        raise _Bad("the header's 'meta' is not a JSON object")
    _check_members({k: (a.shape, a.dtype) for k, a in arrays.items()})
    _check_exact_tokens(header.get("exact_tokens"), arrays)
    tgt = arrays.get("tgt_tokens")
    _check_meta(header.get("meta") or {}, 0 if tgt is None else int(tgt.size))
    values = 0
    top = _top_weight(header)
    with np.errstate(invalid="ignore", over="ignore"):  # (NaN in a map is said by problems(), not here)
        for kind in (k for k in KINDS if k in arrays):
            p = arrays[kind]
            values += p.size
            if values > MAX_TRACE_VALUES:
                raise _Bad(f"it holds more than {MAX_TRACE_VALUES:,} attention values")
            m, lm = arrays.get(f"{kind}_mask"), arrays.get(f"{kind}_layer_masks")
            for name, a, want, axes in (
                (f"{kind}_mask", m, p.shape[2:], "[query, key]"),
                (f"{kind}_layer_masks", lm, (p.shape[0], *p.shape[2:]), "[layer, query, key]"),
            ):
                if a is None:
                    continue
                if a.shape != want:
                    raise _Bad(f"{name} is {_shape(a)}, but {kind} calls for {axes} = {_dims(want)}")
                if a.dtype.kind != "b" and not np.isin(a, (0, 1)).all():
                    raise _Bad(f"{name} must be booleans (True = may attend), got {a.dtype}")
            if lm is not None and (
                m is None or not np.array_equal(np.asarray(lm[0], dtype=bool), np.asarray(m, dtype=bool))
            ):
                raise _Bad(
                    f"{kind}_layer_masks' first layer is not {kind}_mask (the kind's mask is its first layer's)"
                )
            # (in the map's own dtype: a float64 past float32's range is no probability, and is not cast)
            if np.isinf(p).any():
                raise _Bad(f"{kind} holds infinite values, which are not probabilities")
            low, high = np.nanmin(p, initial=0.0), np.nanmax(p, initial=0.0)
            if low < -PROB_TOL or high > top * (1 + PROB_TOL):
                raise _Bad(
                    f"{kind} holds values from {float(low):.3g} to {float(high):.3g}; attention "
                    f"probabilities lie in [0, {top:.4g}] (scores before the softmax go in {kind}_scores)"
                )
        _check_learned(header, arrays)
        _check_value_norms(header, arrays)
        _check_query_rows(header, arrays)
        _check_kept(arrays)


def _check_exact_tokens(exact: Any, arrays: dict[str, np.ndarray]) -> None:
    """The header's ``exact_tokens`` (tokens that end in NUL, which a numpy string array drops): for each list
    of tokens it names, one string per token, each the member's token with its NULs."""
    if exact is None:
        return
    if not isinstance(exact, dict) or not set(exact) <= set(_TOKENS):
        raise _Bad("the header's 'exact_tokens' is not an object of token lists (" + ", ".join(_TOKENS) + ")")
    for name, tokens in exact.items():
        given = arrays.get(name)
        n = 0 if given is None else int(given.size)
        if not (isinstance(tokens, list) and len(tokens) == n and all(isinstance(t, str) for t in tokens)):
            raise _Bad(f"the header's exact_tokens for {name} is not a list of {n} strings, one per token")
        if any(len(t) > MAX_TOKEN_CHARS for t in tokens):
            raise _Bad(f"the header's exact_tokens for {name} holds a token longer than {MAX_TOKEN_CHARS:,} "
                       "characters")  # fmt: skip
        if given is not None and np.array(tokens, dtype=str).tolist() != given.tolist():
            raise _Bad(f"the header's exact_tokens for {name} are not the file's {name}")


def _check_learned(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Weights on learned keys (shaped by _check_members: one (layer, head, query) row per row of their kind's
    map, at most MAX_LEARNED_KEYS keys): probabilities, one label each in meta["learned_keys"]."""
    labels = (header.get("meta") or {}).get("learned_keys") or {}
    if not isinstance(labels, dict):
        raise _Bad("the header's meta 'learned_keys' is not an object of kind -> labels")
    for kind in KINDS:
        w = arrays.get(f"{kind}_learned")
        if w is None:
            continue
        top = _top_weight(header)
        with np.errstate(invalid="ignore"):  # (NaN where the model's weights are NaN, as in the map itself)
            if (  # (in their own dtype: a float64 past float32's range is no probability either)
                np.isinf(w).any()
                or np.nanmin(w, initial=0.0) < -PROB_TOL
                or np.nanmax(w, initial=0.0) > top * (1 + PROB_TOL)
            ):
                raise _Bad(f"{kind}_learned holds values outside [0, {top:.4g}], which are not probabilities")
        names = labels.get(kind)
        if (
            not isinstance(names, list)
            or len(names) != w.shape[3]
            or not all(isinstance(x, str) for x in names)
        ):
            raise _Bad(f"{kind}_learned has {w.shape[3]} keys but meta 'learned_keys' does not name each one")


VALUE_SCOPES = ("with the output projection", "without the output projection")


def _check_value_norms(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Value norms (shaped by _check_members: one per (layer, head, key) of their kind's map): finite and not
    negative, judged in their own dtype (whether they fit float32 is _check_kept's sentence)."""
    scopes = (header.get("meta") or {}).get("value_norms") or {}
    if not isinstance(scopes, dict) or not all(v in VALUE_SCOPES for v in scopes.values()):
        raise _Bad(f"the header's meta 'value_norms' must map kinds to one of {VALUE_SCOPES}")
    for kind in KINDS:
        for member in ("value_norms", "residual_norms"):
            n = arrays.get(f"{kind}_{member}")
            if n is None:
                continue
            with np.errstate(invalid="ignore"):
                if not np.isfinite(n).all() or n.min(initial=0) < 0:
                    raise _Bad(f"{kind}_{member} holds negative or non-finite values, which are not norms")


def _check_query_rows(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """meta["query_rows"]: for self-attention where only some positions ask (and a decoder step's
    cross-attention drawn at its row), the rows that do (distinct, in the map); every other row of the map
    holds no weight and sees no key."""
    rows_of = (header.get("meta") or {}).get("query_rows") or {}
    if not isinstance(rows_of, dict):
        raise _Bad("the header's meta 'query_rows' is not an object of kind -> rows")
    for kind, rows in rows_of.items():
        p = arrays.get(kind) if kind in ("enc_self", "dec_self", "cross") else None
        if p is None:
            raise _Bad(f"the header's meta 'query_rows' names {kind!r}, which is no attention of the trace")
        n = int(p.shape[2])
        if (
            not isinstance(rows, list)
            or not rows
            or not all(type(r) is int and 0 <= r < n for r in rows)
            or len(set(rows)) != len(rows)
        ):
            raise _Bad(f"the header's meta 'query_rows' for {kind} must be distinct rows of its {n} queries")
        empty = np.ones(n, dtype=bool)
        empty[rows] = False
        m = arrays.get(f"{kind}_layer_masks")
        m = arrays.get(f"{kind}_mask") if m is None else m
        if np.nan_to_num(p[:, :, empty]).any() or (
            m is not None and np.asarray(m, dtype=bool)[..., empty, :].any()
        ):
            raise _Bad(f"{kind}'s rows that meta 'query_rows' leaves out hold weights or see keys")


def _from_fields(header: dict[str, Any], arrays: dict[str, Any]) -> AttentionTrace:
    """The trace a checked header and arrays describe, each array in the dtype its field holds."""
    kw: dict[str, Any] = {k: header.get(k, "") for k in ("model", "config_name", "device", "output_text")}
    kw["meta"] = header.get("meta", {}) or {}
    exact = header.get("exact_tokens") or {}
    for name in _TOKENS:
        kw[name] = tuple(str(t) for t in exact.get(name, arrays.get(name, ())))
    for name in _ARRAYS:
        if name in arrays:
            value = np.asarray(arrays[name])
            if name == "topk_tokens":
                value = value.astype(str)
            elif name.endswith(("_mask", "_masks", "_real")):
                value = value.astype(bool)
            elif name.endswith("_ids"):
                value = value.astype(np.int64)
            else:
                value = value.astype(np.float32)
            kw[name] = value
    return AttentionTrace(**kw)


def _build(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> AttentionTrace:
    _check(header, arrays)
    with np.errstate(all="ignore"):  # (every value fits its dtype: _check_kept; no numpy warning is printed)
        return _from_fields(header, arrays)


def read_bytes(data: bytes, name: str) -> AttentionTrace:
    """A trace from a file's bytes (an upload); ``name``'s extension picks the format."""
    suffix = Path(name).suffix.lower()
    try:
        if suffix == ".npz":
            return _build(*_read_npz(io.BytesIO(data)))
        if suffix == ".json":
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _Bad("it is not UTF-8 text") from exc
            return _build(*_read_json(text))
    except _Bad as exc:
        raise _fail(name, str(exc)) from None
    except (ValueError, TypeError, KeyError) as exc:  # a field our checks missed: still one sentence
        raise _fail(name, f"{type(exc).__name__}: {exc}") from None
    raise TraceFormatError(f"{name} is not a trace file: a trace ends in .npz or .json")


def read_path(path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> AttentionTrace:
    """A trace from a file; its size is checked before anything is read."""
    path = Path(path)
    if path.suffix.lower() not in (".npz", ".json"):
        raise TraceFormatError(f"{path.name} is not a trace file: a trace ends in .npz or .json")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not path.is_file():
        raise TraceFormatError(f"{path} is not a file")
    if size > max_bytes:
        raise TraceFormatError(
            f"{path.name} is {size / 2**20:,.0f} MB; attnscope opens trace files up to {max_bytes / 2**20:,.0f} MB"
        )
    try:
        if path.suffix.lower() == ".npz":
            return _build(*_read_npz(path))
        return read_bytes(path.read_bytes(), path.name)
    except TraceFormatError:  # read_bytes' sentence, already naming the file
        raise
    except _Bad as exc:
        raise _fail(path.name, str(exc)) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise _fail(path.name, f"{type(exc).__name__}: {exc}") from None


# -- writing ------------------------------------------------------------------------------------------


def _npz_members(trace: AttentionTrace) -> dict[str, Any]:  # name -> array, for np.savez_compressed
    arrays = trace.to_numpy()
    header = _file_header(trace)
    exact = {
        name: list(getattr(trace, name))
        for name in _TOKENS
        if arrays[name].tolist() != list(getattr(trace, name))  # (a token ending in NUL: numpy drops it)
    }
    if exact:
        header["exact_tokens"] = exact
    arrays["header"] = np.array(json.dumps(header, ensure_ascii=False))
    return arrays


def _file_header(trace: AttentionTrace) -> dict[str, Any]:
    members = set(trace.to_numpy())
    version = min(v for v, allowed in FORMAT_MEMBERS.items() if members <= allowed)
    return {**trace.header(), "format": version}


def to_npz_bytes(trace: AttentionTrace) -> bytes:
    """The ``.npz`` file's bytes (numpy's compressed archive; nothing pickled)."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **_npz_members(trace))
    return buf.getvalue()


def to_json(trace: AttentionTrace) -> str:
    """The ``.json`` file's text: the header's keys and every array as nested lists."""
    doc: dict[str, Any] = _file_header(trace)
    for name, arr in trace.to_numpy().items():
        doc[name] = list(getattr(trace, name)) if name in _TOKENS else arr.tolist()
    return json.dumps(doc, ensure_ascii=False)


def write_path(trace: AttentionTrace, path: str | Path) -> Path:
    """Write ``trace`` as ``.npz`` or ``.json``, chosen by the path's extension."""
    path = Path(path)
    if path.suffix == ".npz":
        np.savez_compressed(path, **_npz_members(trace))
    elif path.suffix == ".json":
        path.write_text(to_json(trace))
    else:
        raise TraceFormatError(f"trace file must end in .npz or .json, got {path.name!r}")
    return path


# -- opens, but must be said -------------------------------------------------------------------------


def problems(trace: AttentionTrace) -> list[str]:
    """One sentence per kind that holds NaN, puts attention on keys its own mask forbids, or has real
    query rows that do not sum to 1 (vectorised: a 6 x 12-head trace at 512 tokens in well under 1 s);
    one more where the model's output probabilities are not numbers (NaN or infinite logits)."""
    out = []
    for name in ("out_probs", "topk_probs"):
        values = getattr(trace, name)
        if values is None:
            continue
        bad = ~np.isfinite(np.asarray(values, dtype=np.float64))
        if bad.any():
            out.append(
                f"{name} holds NaN or infinite values ({int(bad.sum()):,} of {bad.size:,}): the model's "
                "output is not a number (NaN or infinite logits), so its answer means nothing."
            )
            break  # topk_probs come from the same output
    for kind in trace.kinds:
        p = trace.probs(kind)
        nan = np.isnan(p)
        if nan.any():
            per_head = nan.sum(axis=(2, 3))
            ly, h = np.unravel_index(int(np.argmax(per_head)), per_head.shape)
            n_heads = int((per_head > 0).sum())
            out.append(
                f"{kind} holds NaN: {int(nan.sum()):,} values in {n_heads} head(s), most at layer {ly}, head {h} "
                "(a fully masked row filled with -inf gives NaN, and so does NaN or infinity in the model's input or "
                "weights); the mask audit's checks name them."
            )
        layer_masks = trace.layer_masks(kind)
        mask = None if layer_masks is None else np.asarray(layer_masks, bool)[:, None]  # (layer, 1, q, k)
        # (heads masked differently: the mask is what every head may see, and a head's weight outside it may be
        # its own mask's, so it is not checked here; the Masks page and the mask audit say so)
        if mask is not None and kind not in head_masks_differ(trace.meta):
            # rows with no key allowed (a left-padded decoder's padding queries) hold whatever the fill gave: a
            # very negative finite fill spreads them evenly, -inf makes NaN (said above); the mask audit's
            # fully-masked check says whether such a row is a real query's
            forbidden = np.where(~mask & mask.any(-1, keepdims=True), np.nan_to_num(p, nan=0.0), 0.0)
            worst = float(forbidden.max()) if forbidden.size else 0.0
            if worst > 1e-6:
                ly, h, q, k = np.unravel_index(int(np.argmax(forbidden)), forbidden.shape)
                out.append(
                    f"{kind}'s mask disagrees with its maps: layer {ly}, head {h} puts {worst:.3g} on key {k} "
                    f"from query {q}, which the mask forbids; the Masks page and the mask audit show where."
                )
        rows = np.nansum(p, axis=-1)
        learned = trace.learned(kind)
        if learned is not None:  # the weight on learned keys completes each row
            rows = rows + np.nansum(learned[1], axis=-1)
        ok_rows = ~nan.any(axis=-1)
        if mask is not None:
            ok_rows &= mask.any(axis=-1)
        dev = np.where(ok_rows, np.abs(rows - 1.0), 0.0)
        if dev.size and float(dev.max()) > PROB_TOL:
            ly, h, q = np.unravel_index(int(np.argmax(dev)), dev.shape)
            out.append(
                f"{kind}'s rows do not all sum to 1: layer {ly}, head {h}, query {q} sums to {float(rows[ly, h, q]):.4g} "
                "(the weights the values were multiplied with: attention dropout while training drops and rescales "
                "them, a head mask switches a head off, and a mask applied after the softmax without renormalizing "
                "leaves rows short; a model in eval mode without them has rows that sum to 1)."
            )
    return out
