"""dashboard/files.py: the one place a user's file, upload or path becomes bytes, a path, or a sentence."""

from __future__ import annotations

import pytest

from attnscope.dashboard import files, user_models


def test_error_sentence_is_one_bounded_sentence():
    long = ValueError("line one\n  line two " + "x" * 5000)
    text = files.error_sentence("Cannot open t.npz", long)
    assert text.startswith("Cannot open t.npz: line one line two x") and text.endswith(".")
    assert "\n" not in text and len(text) <= len("Cannot open t.npz: ") + files.MESSAGE_CHARS + 1
    assert files.error_sentence("Cannot load the upload", KeyError()) == "Cannot load the upload: KeyError."
    assert files.error_sentence("", RuntimeError("already a sentence!")) == "Already a sentence!"


def test_sentence_capitalises_and_ends_once():
    assert files.sentence("the input has 3 tokens") == "The input has 3 tokens."
    assert files.sentence("  done (2 of 3)  ") == "Done (2 of 3)"
    assert files.sentence("") == ""


def test_resolve_allowed_file_refuses_what_is_outside_or_wrong(tmp_path, monkeypatch):
    monkeypatch.setenv(user_models.MODEL_DIRS_ENV, str(tmp_path))
    good = tmp_path / "t.npz"
    good.write_bytes(b"x")
    (tmp_path / "t.txt").write_bytes(b"x")
    assert files.resolve_allowed_file(f"'{good}'", (".npz",), "a trace") == good.resolve()
    with pytest.raises(ValueError, match="type the path of a trace"):
        files.resolve_allowed_file("  ", (".npz",), "a trace")
    with pytest.raises(ValueError, match="t.txt is not a trace"):
        files.resolve_allowed_file(str(tmp_path / "t.txt"), (".npz",), "a trace")
    with pytest.raises(ValueError, match="does not exist"):
        files.resolve_allowed_file(str(tmp_path / "missing.npz"), (".npz",), "a trace")
    with pytest.raises(user_models.PathRefused):
        files.resolve_allowed_file("/etc/passwd.npz", (".npz",), "a trace")
