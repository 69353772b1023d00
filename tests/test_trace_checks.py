"""Trace files from anyone (core/traces/trace_io.py): every trace round-trips; every bad file gets one
sentence naming the file and the problem, before any pickled or oversized data is read; what opens
but looks wrong (NaN, a leaking mask, rows not summing to 1) is named by ``problems()``."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnscope.core.errors import TraceFormatError
from attnscope.core.traces import trace_io
from attnscope.core.traces.trace import VALUE_NORMS, AttentionTrace
from attnscope.models import registry


@pytest.fixture(scope="module")
def full() -> AttentionTrace:
    """A trace with every member a core model gives, value norms (format 3) included."""
    return registry.load("reverse").trace(["stressed", "abc"])[1]  # padded: PAD keys are masked


@pytest.fixture(scope="module")
def trace(full) -> AttentionTrace:
    """The same as a format-1 trace (no value norms): the tests of versions build on it."""
    return full.replace(**dict.fromkeys(VALUE_NORMS))


def _npz(arrays: dict, header: dict | str | None = None) -> bytes:
    """An .npz of ``arrays`` and ``header`` (a dict written as JSON, or a header's text as it is)."""
    text = None if header is None else header if isinstance(header, str) else json.dumps(header)
    buf = io.BytesIO()
    np.savez(buf, **arrays, **({} if text is None else {"header": np.array(text)}))
    return buf.getvalue()


def _fields(tr: AttentionTrace) -> tuple[dict, dict]:
    """The members and the header as a written file has them (with its format), the header a copy of its own
    (a test that changes its meta leaves the module's trace as it was)."""
    return tr.to_numpy(), json.loads(json.dumps(trace_io._file_header(tr)))


def _refused(data: bytes, name: str, *words: str) -> str:
    with pytest.raises(TraceFormatError) as info:
        AttentionTrace.from_bytes(data, name)
    msg = str(info.value)
    assert msg.startswith(name) and "\n" not in msg and len(msg) < 420, msg
    for w in words:
        assert w in msg, msg
    return msg


@pytest.mark.parametrize("which", ["full", "trace"])
def test_every_field_round_trips(which, request, tmp_path):
    trace = request.getfixturevalue(which)
    assert trace.topk_tokens is not None and trace.topk_tokens.shape == trace.topk_ids.shape
    for suffix in (".npz", ".json"):
        path = trace.save(tmp_path / f"t{suffix}")
        for back in (AttentionTrace.load(path), AttentionTrace.from_bytes(path.read_bytes(), path.name)):
            assert back.header() == trace.header()
            for name, value in trace.to_numpy().items():
                np.testing.assert_array_equal(back.to_numpy()[name], value, err_msg=name)
                assert back.to_numpy()[name].dtype.kind == value.dtype.kind, name
            assert back.problems() == []


def test_wrong_extension_missing_and_oversized_files(trace, tmp_path):
    with pytest.raises(TraceFormatError, match="ends in .npz or .json"):
        AttentionTrace.load(tmp_path / "t.pkl")
    with pytest.raises(TraceFormatError, match="cannot read"):
        AttentionTrace.load(tmp_path / "missing.npz")
    path = trace.save(tmp_path / "t.npz")
    with pytest.raises(TraceFormatError, match=r"up to 0 MB"):
        AttentionTrace.load(path, max_bytes=100)  # refused from its size, before reading


def test_truncated_and_broken_containers(trace, tmp_path):
    data = trace.to_npz_bytes()
    _refused(data[: len(data) // 2], "cut.npz", "truncated")
    _refused(b"hello", "text.npz", "not a .npz archive")
    _refused(trace.to_json()[:-40].encode(), "cut.json", "truncated or not JSON")
    _refused(b"\xff\xfe", "bin.json", "not UTF-8")
    _refused(b"[1, 2]", "list.json", "not a JSON object")


def test_pickles_are_refused_from_the_header_without_loading(trace):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, arr in trace.to_numpy().items():
            item = io.BytesIO()
            np.save(item, arr)
            z.writestr(f"{name}.npy", item.getvalue())
        item = io.BytesIO()
        np.save(item, np.array([print], dtype=object), allow_pickle=True)  # would call code if unpickled
        z.writestr("header.npy", item.getvalue())
    _refused(buf.getvalue(), "evil.npz", "'header' holds Python objects", "never unpickles")


def test_ten_thousand_tokens_are_refused_from_the_declared_shapes():
    n = 10_000
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, shape, dtype in [("src_tokens", (n,), "<U1"), ("enc_self", (1, 1, n, n), "<f4")]:
            item = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                item, {"descr": dtype, "fortran_order": False, "shape": shape}
            )  # the header alone: a real 10,000-token map would be 400 MB
            z.writestr(f"{name}.npy", item.getvalue())
        item = io.BytesIO()
        np.save(item, np.array(json.dumps({"model": "x"})))
        z.writestr("header.npy", item.getvalue())
    _refused(buf.getvalue(), "huge.npz", "10,000 src tokens", "at most 2,048")
    doc = {"src_tokens": ["a"] * n, "enc_self": []}
    _refused(json.dumps(doc).encode(), "huge.json", "10,000 src tokens")


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda a, h: [a.pop(k) for k in ("enc_self", "dec_self", "cross")], ["holds no attention"]),
        (lambda a, h: a.update(enc_self=a["enc_self"][0]), ["enc_self is", "[layer, head, query, key]"]),
        (lambda a, h: a.update(cross=a["cross"][..., :-1]), ["cross is", "its tokens call for"]),
        (lambda a, h: a.update(enc_self=a["enc_self"].astype(str)), ["enc_self must hold real numbers"]),
        (lambda a, h: a.update(enc_self=a["enc_self"].astype(complex)), ["enc_self must hold real numbers"]),
        (lambda a, h: a.update(dec_self_scores=a["dec_self_scores"][:, :1]), ["dec_self_scores is"]),
        (lambda a, h: a.update(enc_self_mask=a["enc_self_mask"].astype(np.float32) * 3), ["must be booleans"]),
        (lambda a, h: a.update(cross_mask=a["cross_mask"][:, :-1]), ["cross_mask is"]),
        (lambda a, h: a.update(src_ids=a["src_ids"][:-1]), ["src_ids is", "src_tokens"]),
        (lambda a, h: a.update(tgt_ids=a["tgt_ids"].astype(np.float32)), ["tgt_ids must be whole numbers"]),
        (lambda a, h: a.update(topk_probs=a["topk_probs"][:, :2]), ["topk_ids", "topk_probs"]),
        (lambda a, h: a.update(topk_tokens=a["topk_tokens"][:1]), ["topk_tokens is"]),
        (lambda a, h: a.update(out_probs=a["out_probs"][:2]), ["out_probs is"]),
        (lambda a, h: a.update(src_tokens=np.arange(len(a["src_tokens"]))), ["src_tokens must be a list of strings"]),
        (lambda a, h: a.update(enc_self=a["enc_self"] * 5), ["attention probabilities lie in [0, 1]"]),
        (  # weights a trace says dropout scaled up, but past the largest it declares
            lambda a, h: (a.update(enc_self=a["enc_self"] * 5), h.update(meta={"weights_rescaled": 1.25})),
            ["attention probabilities lie in [0, 1.25]"],
        ),
        (lambda a, h: (a.update(enc_self=a["enc_self"] * 5), h.update(meta={"weights_rescaled": 1e9})),
         ["attention probabilities lie in [0, 1]"]),
        (lambda a, h: a.update(enc_self=np.full_like(a["enc_self"], np.inf)), ["infinite"]),
        (lambda a, h: h.update(meta=[1, 2]), ["'meta' is not a JSON object"]),
        (lambda a, h: h.update(model=5), ["'model' is not text"]),
    ],
)  # fmt: skip
def test_wrong_shapes_and_dtypes_get_one_sentence(trace, change, words):
    arrays, header = _fields(trace)
    arrays, header = dict(arrays), json.loads(json.dumps(header))
    change(arrays, header)
    _refused(_npz(arrays, header), "bad.npz", *words)
    if any(v.dtype.kind == "c" for v in arrays.values()):
        return  # JSON has no complex numbers
    doc = {**header, **{k: v.tolist() for k, v in arrays.items()}}
    _refused(json.dumps(doc).encode(), "bad.json", *words)


def test_ragged_json_lists(trace):
    doc = json.loads(trace.to_json())
    doc["enc_self"][0][0][0] = doc["enc_self"][0][0][0][:-1]
    _refused(json.dumps(doc).encode(), "ragged.json", "enc_self", "ragged")


def test_nan_a_leaking_mask_and_bad_rows_open_with_problems_named(trace):
    probs = trace.enc_self.copy()
    probs[1, 2, 0, :] = np.nan
    cross = trace.cross.copy()
    mask = trace.cross_mask.copy()
    mask[:, 0] = False  # the mask forbids key 0, which the maps use
    dec = trace.dec_self.copy()
    dec[0, 3, 1] *= 0.5
    odd = trace.replace(enc_self=probs, cross=cross, cross_mask=mask, dec_self=dec)
    back = AttentionTrace.from_bytes(odd.to_npz_bytes(), "odd.npz")
    found = back.problems()
    assert len(found) == 3, found
    assert "enc_self holds NaN" in found[0] and "layer 1, head 2" in found[0]
    assert "cross's mask disagrees" in found[2] or "cross's mask disagrees" in " ".join(found)
    assert any("dec_self's rows do not all sum to 1: layer 0, head 3, query 1" in p for p in found), found


def test_a_clean_padded_batch_has_no_problems():
    tr = registry.load("reverse").trace(["abcdefghij" * 2, "ab"])[1]
    assert trace_io.problems(tr) == []


def test_files_are_written_in_the_documented_layout(trace, tmp_path):
    """trace_io writes what docs say, checked with plain numpy, zipfile and json (not with our reader):
    one .npy member per array plus a JSON ``header``; the .json file is the header's keys and nested lists."""
    import zipfile

    header = {k: trace.header()[k] for k in ("model", "config_name", "device", "output_text", "meta")}
    header["format"] = 1  # files carry the oldest format version that holds their members
    arrays = trace.to_numpy()
    for data in (trace.save(tmp_path / "t.npz").read_bytes(), trace.to_npz_bytes()):
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            assert sorted(zf.namelist()) == sorted([f"{n}.npy" for n in arrays] + ["header.npy"])
            assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in zf.infolist())
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            assert json.loads(str(npz["header"])) == header
            for name, value in arrays.items():
                np.testing.assert_array_equal(npz[name], value, err_msg=name)
    for text in (
        trace.save(tmp_path / "t.json").read_text(),
        trace.to_json(),
    ):
        doc = json.loads(text)
        assert set(doc) == set(header) | set(arrays)
        assert {k: doc[k] for k in header} == header
        for name, value in arrays.items():
            assert doc[name] == value.tolist(), name
    with pytest.raises(TraceFormatError, match="must end in .npz or .json"):
        trace.save(tmp_path / "t.pkl")


# -- files that try to cost more than they are worth --------------------------------------------------


def _member(name: str, arr: np.ndarray | None = None, header: dict | None = None) -> tuple[str, bytes]:
    item = io.BytesIO()
    if arr is not None:
        np.lib.format.write_array(item, arr, allow_pickle=False)
    else:
        np.lib.format.write_array_header_1_0(item, header)
    return f"{name}.npy", item.getvalue()


def _zip(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members:
            z.writestr(name, data)
    return buf.getvalue()


def test_a_member_that_unpacks_far_past_its_trace_is_refused_before_it_is_read(trace, monkeypatch):
    """A mask of zeros declared 6,000 x 6,000 (288 MB unpacked, a few hundred KB in the zip) beside a
    trace of a few tokens: refused from its .npy header, and numpy never reads a member's data."""
    arrays, header = _fields(trace)
    members = [_member(k, v) for k, v in arrays.items() if k != "enc_self_mask"]
    members.append(_member("header", np.array(json.dumps(header))))
    members.append(_member("enc_self_mask", np.zeros((6000, 6000), dtype=np.int64)))
    data = _zip(members)
    assert len(data) < 2**20
    read = []
    monkeypatch.setattr(np.lib.format, "read_array", lambda *a, **k: read.append(1))
    msg = _refused(data, "bomb.npz", "enc_self_mask declares 6000x6000", "more than a trace of")
    assert read == [] and "MB" in msg


def test_members_outside_the_format_and_newer_versions_are_refused(trace):
    arrays, header = _fields(trace)
    members = [_member(k, v) for k, v in arrays.items()] + [_member("header", np.array(json.dumps(header)))]
    _refused(_zip([*members, _member("payload", np.zeros(3))]), "extra.npz", "'payload.npy'", "not a member")
    _refused(_zip([*members, ("notes.txt", b"hi")]), "extra.npz", "'notes.txt'")
    newer = [m for m in members if m[0] != "header.npy"] + [
        _member("header", np.array(json.dumps({**header, "format": 99})))
    ]
    _refused(_zip(newer), "new.npz", "trace format 99", "newer attnscope")
    doc = json.loads(trace.to_json())
    assert doc["format"] == 1 < trace_io.FORMAT_VERSION  # no learned keys: readable by a format-1 reader
    _refused(json.dumps({**doc, "format": 99}).encode(), "new.json", "trace format 99")
    _refused(json.dumps({**doc, "payload": [1, 2]}).encode(), "extra.json", "'payload'")
    _refused(json.dumps({**doc, "format": "one"}).encode(), "odd.json", "not a version number")
    old = {k: v for k, v in doc.items() if k != "format"}  # written before the format had a version
    assert AttentionTrace.from_bytes(json.dumps(old).encode(), "old.json").kinds == trace.kinds


def test_a_member_larger_than_the_zip_directory_says_is_refused(trace):
    arrays, header = _fields(trace)
    members = [_member(k, v) for k, v in arrays.items() if k != "enc_self"]
    members.append(_member("header", np.array(json.dumps(header))))
    head = {"descr": "<f4", "fortran_order": False, "shape": arrays["enc_self"].shape}
    members.append(_member("enc_self", header=head))  # the header, and no data behind it
    _refused(_zip(members), "short.npz", "'enc_self.npy'", "truncated")


def test_json_nested_beyond_a_trace_is_one_sentence():
    deep = "[" * 200_000 + "]" * 200_000
    _refused(deep.encode(), "deep.json", "nests deeper than")
    _refused(('{"src_tokens": ' + deep + "}").encode(), "deep.json", "nests deeper than")
    _refused(
        b'{"model": "' + b"[" * 50_000 + b'", "enc_self": []}', "str.json", "enc_self is"
    )  # brackets in a string do not count


# -- fuzz: any bytes are a trace, or one sentence ---------------------------------------------------


@pytest.fixture(scope="module")
def valid_files(full):
    return {"npz": full.to_npz_bytes(), "json": full.to_json().encode()}


def _opens_or_one_sentence(data: bytes, name: str) -> None:
    try:
        AttentionTrace.from_bytes(data, name)
    except TraceFormatError as exc:
        msg = str(exc)
        assert "\n" not in msg and len(msg) < 420, msg


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=4096), suffix=st.sampled_from([".npz", ".json"]))
def test_random_bytes(data, suffix):
    _opens_or_one_sentence(data, f"random{suffix}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_truncated_and_mutated_valid_files(valid_files, data):
    kind = data.draw(st.sampled_from(["npz", "json"]))
    raw = bytearray(valid_files[kind])
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    else:
        for _ in range(data.draw(st.integers(1, 8))):
            if raw:
                raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    _opens_or_one_sentence(bytes(raw), f"fuzzed.{kind}")


@pytest.mark.parametrize("where", ["central directory", "local header"])
def test_a_zip_version_or_compression_zipfile_cannot_read_is_one_sentence(valid_files, where):
    """A .npz whose directory asks for zip version 6.4, or whose member uses a compression method
    zipfile does not know (zipfile raises NotImplementedError for both): refused in one sentence."""
    raw = bytearray(valid_files["npz"])
    if where == "central directory":
        at = raw.index(b"PK\x01\x02")
        raw[at + 6] = 64  # version needed to extract
    else:
        for sig in (b"PK\x01\x02", b"PK\x03\x04"):  # compression method 99 in every header
            at = raw.find(sig)
            while at >= 0:
                raw[at + (10 if sig == b"PK\x01\x02" else 8)] = 99
                at = raw.find(sig, at + 4)
    _refused(bytes(raw), "v.npz")


def test_learned_keys_make_a_format_2_file_that_round_trips_and_is_checked(trace):
    """Weights on learned keys outside the sequence (memory keys, a null key) are trace format 2:
    written and read back as they are, counted in the rows' sums; a format-1 file may not hold
    them, and their shape and labels are checked like every member."""
    p = trace.probs("enc_self")
    extra = np.full((*p.shape[:3], 2), 0.0, dtype=np.float32)
    extra[..., 0] = 0.25  # a quarter of each row on <mem 0>: the tokens keep three quarters
    learned = trace.replace(
        enc_self=(p * 0.75).astype(np.float32),
        enc_self_learned=extra,
        meta={**trace.meta, "learned_keys": {"enc_self": ["<mem 0>", "<mem 1>"]}},
    )
    assert trace_io.problems(learned) == [] and trace_io.problems(learned.replace(enc_self_learned=None))
    doc = json.loads(learned.to_json())
    assert doc["format"] == 2
    for data, name in ((learned.to_npz_bytes(), "l.npz"), (learned.to_json().encode(), "l.json")):
        back = AttentionTrace.from_bytes(data, name)
        labels, weights = back.learned("enc_self")
        assert labels == ("<mem 0>", "<mem 1>") and np.array_equal(weights, extra)
    _refused(json.dumps({**doc, "format": 1}).encode(), "old.json", "'enc_self_learned'", "format 1")
    unnamed = {**doc, "meta": {**doc["meta"], "learned_keys": {"enc_self": ["<mem 0>"]}}}
    _refused(json.dumps(unnamed).encode(), "unnamed.json", "does not name each one")
    wrong = {**doc, "enc_self_learned": np.zeros((1, 1, 1, 2)).tolist()}
    _refused(json.dumps(wrong).encode(), "wrong.json", "enc_self_learned is", "[layer, head, query")
    huge = {**doc, "enc_self_learned": (np.ones_like(extra) * 3).tolist()}
    _refused(json.dumps(huge).encode(), "huge.json", "outside [0, 1]")


def test_a_row_with_no_key_allowed_is_left_to_the_audit_not_called_a_leak():
    """A left-padded decoder's padding queries see no key; a very negative finite fill spreads their weight
    evenly over keys the mask forbids. That was "the mask disagrees with its maps" on every page; such rows are
    the mask audit's (its fully-masked check says whether one is a real query's). A row that sees some key
    and weighs a forbidden one is still said."""
    import math

    import torch
    from torch import nn

    from attnscope.core.analysis.audit import static
    from attnscope.core.families.capture import capture_attention

    class LeftPadded(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(20, 16), nn.Linear(16, 48)

        def forward(self, ids):
            b, t = ids.shape
            q, k, v = self.qkv(self.emb(ids)).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
            keep = torch.ones(t, t, dtype=torch.bool).tril()[None, None] & (ids != 0)[:, None, None, :]
            s = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~keep, -1e9)
            return s.softmax(-1) @ v

    torch.manual_seed(0)
    model = LeftPadded().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[0, 0, 3, 4, 5]]))
    tr = cap.trace(0, tgt_tokens=["<pad>", "<pad>", "c", "d", "e"])
    assert tr.dec_self[0, 0, 0, 0] == 0.2  # (the fill spread the padding query's weight evenly)
    assert tr.problems() == []
    verdict = static.check_fully_masked([tr], "dec_self")  # (the rows are the audit's to name)
    assert "-> uniform" in verdict.detail, verdict.line()
    leak = tr.dec_self.copy()
    leak[0, 1, 3] = [0.0, 0.0, 0.5, 0.25, 0.25]  # a real query that weighs a key after it
    found = tr.replace(dec_self=leak).problems()
    assert len(found) == 1 and "mask disagrees" in found[0] and "query 3" in found[0], found
