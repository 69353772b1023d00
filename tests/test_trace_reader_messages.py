"""The trace reader's sentences name what is actually wrong (core/traces/trace_io.py): a member misshaped is
named, not another member's size; a header that is no object, or nests too deep, says so; numbers that do not
fit float32 say that, with no numpy warning; meta entries the app reads have their types checked, and the
dashboard and the command line take odd ones without a traceback; ``view``'s first line names the port
streamlit is told to use."""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest
import test_trace_checks as checks
from test_trace_checks import _fields, _npz

from attnscope.core.traces.trace import AttentionTrace
from attnscope.models import registry


@pytest.fixture(scope="module")
def full() -> AttentionTrace:
    """A trace with every member a core model gives (value norms included)."""
    return registry.load("reverse").trace(["stressed", "abc"])[1]


def _refused(data: bytes, name: str, *words: str) -> str:
    """test_trace_checks' one-sentence refusal, with a numpy warning on the way a failure too."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return checks._refused(data, name, *words)


# -- meta entries the app reads ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "meta,words",
    [
        ({"capture_notes": 5}, ["meta 'capture_notes' must be a list of strings", "not a number"]),
        ({"capture_notes": ["a", {"b": 1}]}, ["'capture_notes' must be a list of strings", "an object"]),
        ({"warnings": "truncated"}, ["meta 'warnings' must be a list of strings", "not text"]),
        ({"labels": [0, 1]}, ["meta 'labels' must be a list of strings"]),
        ({"embedding_head": 3}, ["meta 'embedding_head' must be a list of numbers"]),
        ({"embedding_head": ["x"]}, ["meta 'embedding_head' must be a list of numbers"]),
        ({"prompt_len": "3"}, ["meta 'prompt_len' must be a whole number from 0"]),
        ({"prompt_len": 999}, ["meta 'prompt_len' must be a whole number from 0", "tgt_tokens"]),
    ],
)
def test_meta_entries_of_the_wrong_type_are_one_sentence_naming_them(full, meta, words):
    arrays, header = _fields(full)
    header["meta"] = {**header["meta"], **meta}
    _refused(_npz(arrays, header), "meta.npz", *words)
    doc = {**header, **{k: v.tolist() for k, v in arrays.items()}}
    _refused(json.dumps(doc).encode(), "meta.json", *words)


def test_meta_entries_of_the_right_type_open(full):
    arrays, header = _fields(full)
    header["meta"] = {**header["meta"], "capture_notes": ["a note"], "warnings": [], "labels": ["x"],
                      "embedding_head": [0.5, 1], "prompt_len": 2, "forward_ms": "odd, and shown only where it fits"}  # fmt: skip
    back = AttentionTrace.from_bytes(_npz(arrays, header), "ok.npz")
    assert back.meta["capture_notes"] == ["a note"] and back.meta["prompt_len"] == 2


def test_the_dashboard_and_the_command_line_take_odd_notes_without_an_exception(full, monkeypatch, capsys):
    """A trace made in memory (an adapter's meta) is not read by the reader: its notes and warnings, whatever
    their type, are shown where they are strings and never raise."""
    from attnscope import cli
    from attnscope.dashboard import state

    shown: list[str] = []
    monkeypatch.setattr(state.st, "warning", lambda text, **_: shown.append(text))
    for odd in (5, None, {"a": 1}, [1, None], "one note"):
        tr = full.replace(meta={"capture_notes": odd, "warnings": odd})
        state.show_capture_flags([tr])
        state.show_warnings([tr], batch=False)
        cli._capture_warnings(tr.meta)
    assert len(shown) == 2 and "one note" in shown[0] + shown[1]  # the lone string, as a note and a warning
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]  # (no logs)
    assert err == ["warning: capture's notes on the model's attention, what it could not verify, left out, or drew "
                   "from another row or step (1 note, one "
                   "per module and reason):", "warning:   one note"]  # fmt: skip


# -- a misshaped member is the member named ------------------------------------------------------------


@pytest.mark.parametrize(
    "member,change,words",
    [
        ("tgt_tokens", lambda a: a[None], ["tgt_tokens must be a list of strings", "1x"]),
        ("src_tokens", lambda a: a.reshape(1, -1, 1), ["src_tokens must be a list of strings"]),
        ("dec_self", lambda a: np.array(1.0, dtype=a.dtype), ["dec_self is a scalar", "its tokens call for"]),
        ("dec_self", lambda a: a[:, :0], ["dec_self is", "at least one layer and one head"]),
        ("enc_self", lambda a: a[:0], ["enc_self is", "at least one layer and one head"]),
        ("cross", lambda a: a[..., :1, :1], ["cross is", "its tokens call for"]),
        ("dec_self_value_norms", lambda a: a.astype(str), ["dec_self_value_norms is <U", "not real numbers"]),
        ("enc_self_residual_norms", lambda a: a.astype(str), ["enc_self_residual_norms is <U"]),
        ("enc_self_scores", lambda a: a.astype(str), ["enc_self_scores is <U", "not real numbers"]),
        ("src_ids", lambda a: a.astype(str), ["src_ids must be whole numbers"]),
        ("topk_probs", lambda a: a.astype(str), ["topk_ids", "topk_probs", "<U"]),
        ("enc_self_mask", lambda a: a[None], ["enc_self_mask is", "[query, key]"]),
        ("cross_mask", lambda a: a.astype(str), ["cross_mask must be booleans"]),
    ],
)
def test_a_misshaped_member_is_named_before_any_size_and_before_any_data_is_read(full, monkeypatch, member, change,
                                                                                words):  # fmt: skip
    arrays, header = _fields(full)
    arrays[member] = change(arrays[member])
    data = _npz(arrays, header)
    read: list[int] = []
    monkeypatch.setattr(np.lib.format, "read_array", lambda *a, **k: read.append(1))
    msg = _refused(data, "blame.npz", *words)
    assert "declares" not in msg and "more than a trace of" not in msg, msg
    assert read == []  # refused from the .npy headers alone


def test_a_header_member_that_is_no_single_string_says_so(full):
    arrays, header = _fields(full)
    buf = io.BytesIO()
    np.savez(buf, **arrays, header=np.array([json.dumps(header)]))
    _refused(buf.getvalue(), "h.npz", "its header is", "not one JSON string")


# -- the .npz header -----------------------------------------------------------------------------------


def test_a_header_that_is_no_json_object_or_nests_too_deep_says_so(full):
    arrays, header = _fields(full)
    msg = _refused(_npz(arrays, "[1, 2]"), "list.npz", "its header is not a JSON object")
    assert "format 1" not in msg
    deep = json.dumps(header)[:-1] + ', "deep": ' + "[" * 5000 + "]" * 5000 + "}"
    _refused(_npz(arrays, deep), "deep.npz", "its header nests deeper than 16 levels")
    _refused(_npz(arrays, '"text"'), "text.npz", "its header is not a JSON object")


# -- numbers that do not fit what attnscope keeps them in ----------------------------------------------


@pytest.mark.parametrize(
    "member", ["dec_self_value_norms", "enc_self_residual_norms", "cross_scores", "out_probs", "topk_probs"]
)
def test_float64_past_float32s_range_is_too_large_not_negative_and_warns_nothing(full, member):
    arrays, header = _fields(full)
    arrays[member] = arrays[member].astype(np.float64) * 1e300 + (1e300 if member.endswith("norms") else 0)
    assert np.isfinite(arrays[member]).all()
    msg = _refused(_npz(arrays, header), "big.npz", member, "too large for float32")
    assert "negative" not in msg and "non-finite" not in msg
    doc = {**header, **{k: v.tolist() for k, v in arrays.items()}}
    _refused(json.dumps(doc).encode(), "big.json", member, "too large for float32")


def test_a_float64_map_past_float32s_range_is_out_of_range_not_infinite(full):
    arrays, header = _fields(full)
    arrays["enc_self"] = arrays["enc_self"].astype(np.float64) * 1e300
    msg = _refused(_npz(arrays, header), "big.npz", "enc_self holds values from 0 to", "lie in [0, 1]")
    assert "infinite" not in msg


def test_ids_past_int64_are_refused(full):
    arrays, header = _fields(full)
    arrays["src_ids"] = arrays["src_ids"].astype(np.uint64) + np.uint64(2**63)
    _refused(_npz(arrays, header), "ids.npz", "src_ids holds", "past the largest id")


def test_view_prints_one_line_and_no_numpy_warning_for_float64_norms(full, tmp_path):
    import subprocess
    import sys

    arrays, header = _fields(full)
    arrays["dec_self_value_norms"] = arrays["dec_self_value_norms"].astype(np.float64) * 1e300
    path = tmp_path / "vn64.npz"
    path.write_bytes(_npz(arrays, header))
    r = subprocess.run([sys.executable, "-m", "attnscope", "view", str(path)], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "too large for float32" in r.stderr and "RuntimeWarning" not in r.stderr


# -- .json text ----------------------------------------------------------------------------------------


def test_a_json_trace_with_a_byte_order_mark_opens(full):
    back = AttentionTrace.from_bytes(b"\xef\xbb\xbf" + full.to_json().encode(), "bom.json")
    assert back.header() == full.header() and back.kinds == full.kinds


def test_a_number_too_long_for_python_is_named(full):
    text = full.to_json()
    msg = _refused((text[:-1] + ', "model": ' + "7" * 5000 + "}").encode(), "digits.json", "whole number",
                   "digits")  # fmt: skip
    assert "truncated or not JSON" not in msg
    arrays, header = _fields(full)
    head = json.dumps(header)[:-1] + ', "n": ' + "7" * 5000 + "}"
    _refused(_npz(arrays, head), "digits.npz", "its header holds a whole number")


# -- attnscope run / view: the line names where the server will be --------------------------------------


@pytest.mark.parametrize(
    "argv,url",
    [
        (["run"], "http://127.0.0.1:8501"),
        (["run", "--port", "9000"], "http://127.0.0.1:9000"),
        (["run", "--server.port", "8765", "--server.headless", "true"], "http://127.0.0.1:8765"),
        (["run", "--server.port=8766"], "http://127.0.0.1:8766"),
        (["run", "--port", "9000", "--server.port", "8767"], "http://127.0.0.1:8767"),
        (["run", "--server.address", "0.0.0.0", "--server.port", "8768"], "http://0.0.0.0:8768"),
        (["run", "--server.address=localhost"], "http://localhost:8501"),
    ],
)
def test_the_first_line_names_the_port_and_address_streamlit_is_told(monkeypatch, capsys, argv, url):
    import os

    from attnscope import cli

    ran: list[list[str]] = []
    monkeypatch.setattr(os, "execve", lambda exe, cmd, env: ran.append(cmd))
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("attnscope: serving the dashboard on ") and f"on {url} (" in out, out
    port = url.rsplit(":", 1)[1]
    last = [a for a in ran[0] if a.startswith("--server.port")][-1]  # what streamlit takes: the last one
    assert last == f"--server.port={port}" or ran[0][ran[0].index(last) + 1] == port


def test_a_server_port_that_is_no_port_is_one_line(monkeypatch, capsys):
    import os

    from attnscope import cli

    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("served"))
    assert cli.main(["run", "--server.port", "http"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: --server.port must be a port between 1 and 65535, got 'http'"
    )
