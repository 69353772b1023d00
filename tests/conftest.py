"""Shared fixtures: tiny untrained models saved as model folders (no zoo needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnscope.core.families.native import LoadedModel, load_folder
from attnscope.core.transformer import checkpoint
from attnscope.core.transformer.config import tiny as tiny_config
from attnscope.core.transformer.model import Transformer
from attnscope.core.transformer.tokenizer import CharTokenizer

# Tiny models on a small shared machine: one intra-op thread is ~40x faster than two that
# spin-wait for each other when the cores are busy.
torch.set_num_threads(1)

# Letters, digits, space and the characters of `</script><script>alert(1)</script>`.
MAX_LEN = 48  # inputs of up to 47 characters; greedy decoding stops after 47 tokens
TINY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 <>/()'\"=;&"


def _save_tiny(folder: Path, **changes) -> Path:
    tok = CharTokenizer.fit([TINY_CHARS])
    torch.manual_seed(0)
    cfg = tiny_config(vocab_size=len(tok), max_len=MAX_LEN, **changes)
    model = Transformer(cfg).eval()
    is_clf = cfg.is_encoder_only and cfg.n_classes > 0
    meta = {
        "task": "none",
        "summary": "tiny untrained " + ("classifier" if is_clf else "seq2seq") + " (test fixture)",
        "examples": ["hello world", "abc", "attention is all you need"],
        "metrics": {"heldout_accuracy" if is_clf else "heldout_exact_match": 0.0},
    }
    if is_clf:
        meta["labels"] = ["no", "yes"]
    card = f"# {folder.name}\n\nAn untrained tiny model for tests.\n"
    return checkpoint.save(folder, model, tok, None if cfg.is_encoder_only else tok, card=card, meta=meta)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """Encoder-decoder, sinusoidal positions, 2+2 layers, 4 heads, d_model 16, max_len 64."""
    return _save_tiny(tmp_path_factory.mktemp("models") / "tiny-seq2seq")


@pytest.fixture(scope="session")
def tiny_clf_folder(tmp_path_factory) -> Path:
    """Encoder-only classifier with learned positions (2 layers, 4 heads, 2 classes)."""
    return _save_tiny(
        tmp_path_factory.mktemp("models") / "tiny-classifier",
        n_dec_layers=0,
        n_classes=2,
        pos_encoding="learned",
    )


@pytest.fixture(scope="session")
def tiny_model(tiny_folder) -> LoadedModel:
    return load_folder(tiny_folder, name="tiny-seq2seq")


@pytest.fixture(scope="session")
def tiny_clf(tiny_clf_folder) -> LoadedModel:
    return load_folder(tiny_clf_folder, name="tiny-classifier")


@pytest.fixture()
def extra_models(monkeypatch, tiny_folder, tiny_clf_folder) -> list[str]:
    """Make the dashboard list the tiny models (after the zoo) via ATTNSCOPE_MODELS."""
    paths = [str(tiny_folder), str(tiny_clf_folder)]
    monkeypatch.setenv("ATTNSCOPE_MODELS", os.pathsep.join(paths))
    return paths


# -- Streamlit AppTest (helpers in apptest_helpers.py) -----------------------------------------------


@pytest.fixture()
def make_app(extra_models):
    """AppTest factory (apptest_helpers.run_app) with fresh caches; the tiny fixture models are
    listed after the zoo."""
    import streamlit as st  # here, not at the top: most test files never start the app
    from apptest_helpers import run_app

    st.cache_data.clear()
    st.cache_resource.clear()
    return run_app


@pytest.fixture()
def tiny(extra_models) -> str:
    """The tiny seq2seq fixture model, as the sidebar lists it."""
    return extra_models[0]
