"""Head analytics over a corpus (dashboard/corpus_view.py) under AppTest: a stats file opens from a path
inside the allowed folders or an upload, draws the mean and the spread per head over all its inputs,
lists the most atypical inputs of the picked head, and "Trace" puts one in the sidebar; bad files get
one sentence and the page keeps working. (Chromium: test_browser_corpus.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from apptest_helpers import _array, assert_clean, figure, run_app

from attnscope.core.analysis import corpus
from attnscope.dashboard import keys as K
from attnscope.models import registry

HEADS = "app_pages/head_analytics.py"
LINES = ["hello", "attention", "abc", "zzzzzz", "stressed", "desserts", "qwerty", "a", "mississippi", "kayak"]


@pytest.fixture(scope="module")
def stats_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stats")
    lines = [*LINES, "Not Lowercase"]  # the last is outside reverse's vocabulary: counted
    acc = corpus.run(registry.load("reverse"), lines, batch=4)
    out = folder / "reverse.parquet"
    corpus.write(
        acc, lines, out, {"model": "reverse", "input_file": "lines.txt", "n_lines": len(lines), "world": 1}
    )
    return out


def _heads_page(monkeypatch, folder):
    monkeypatch.setenv("ATTNSCOPE_MODEL_DIRS", str(folder))
    at = run_app("reverse")
    return at.switch_page(HEADS).run()


def _open_path(at, path):
    at.text_input(key=K.HA_CORPUS_PATH).input(str(path))
    return at.button(key=K.HA_CORPUS_PATH_BUTTON).click().run()


def test_stats_file_draws_the_corpus_numbers(stats_file, monkeypatch):
    at = _open_path(_heads_page(monkeypatch, stats_file.parent), stats_file)
    assert_clean(at)
    assert any("statistics over 10 inputs" in s.value for s in at.success)
    frame, meta = corpus.read(stats_file)
    assert meta["skipped"] == {"outside the vocabulary": 1}
    at.radio(key=K.HA_C_KIND).set_value("cross").run()
    at.selectbox(key=K.HA_C_STAT).set_value("entropy").run()
    mean = figure(at, "mean entropy (nats) over 10 inputs")
    np.testing.assert_allclose(_array(mean["data"][0]["z"]), corpus.stat_matrix(frame, "cross", "entropy"))
    spread = figure(at, "spread of entropy (nats) across inputs")
    np.testing.assert_allclose(
        _array(spread["data"][0]["z"]), corpus.stat_matrix(frame, "cross", "entropy", "std")
    )
    # the picked head's most atypical inputs, each one click from its trace
    at.selectbox(key=K.HA_C_LAYER).set_value(1).run()
    at.selectbox(key=K.HA_C_HEAD).set_value(2).run()
    row = frame[
        (frame["kind"] == "cross")
        & (frame["stat"] == "entropy")
        & (frame["layer"] == 1)
        & (frame["head"] == 2)
    ]
    top = json.loads(row.iloc[0]["top_high"])
    shown = [t.value for t in at.text]
    assert any(f"line {top[0]['line'] + 1}: {top[0]['text']}" == s for s in shown), shown
    at.button(key=f"{K.HA_C_TRACE}_highest_0").click().run()
    assert_clean(at)
    assert at.sidebar.text_input(key=K.SOURCE).value == top[0]["text"]
    assert any(top[0]["text"] in c.value for c in at.caption)
    # the per-input analytics below now show that input
    heads = figure(at, "· layer 0 · head 0 ·")
    assert len(heads["layout"]["xaxis"]["ticktext"]) == len(top[0]["text"]) + 1  # its characters + EOS
    at.button(key=K.HA_CORPUS_CLOSE).click().run()
    assert_clean(at)
    assert not [f for f in at.get("plotly_chart") if "over 10 inputs" in f.proto.spec]


def test_upload_and_bad_files_get_one_sentence(stats_file, monkeypatch, tmp_path):
    at = _heads_page(monkeypatch, tmp_path)
    at.file_uploader(key=K.HA_CORPUS_UPLOAD).set_value(
        [("s.parquet", stats_file.read_bytes(), "application/octet-stream")]
    )
    at.button(key=K.HA_CORPUS_UPLOAD_BUTTON).click().run()
    assert_clean(at)
    assert figure(at, "over 10 inputs")
    for name, data in (("cut.parquet", stats_file.read_bytes()[:200]), ("junk.parquet", b"PAR1 not really")):
        at.file_uploader(key=K.HA_CORPUS_UPLOAD).set_value([(name, data, "application/octet-stream")])
        at.button(key=K.HA_CORPUS_UPLOAD_BUTTON).click().run()
        assert not at.exception
        assert any("Cannot open" in e.value and "not a readable Parquet file" in e.value for e in at.error), (
            name
        )
    outside = _open_path(at, "/etc/passwd")
    assert not outside.exception
    assert any("outside the folders" in e.value for e in outside.error)
