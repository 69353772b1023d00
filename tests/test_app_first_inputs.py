"""The first five minutes: every zoo and pretrained model opens on an input that shows what it does
(models/registry.py FIRST_INPUTS), and the model gets that input right.

The input is read back from the sidebar after picking the model there (Streamlit AppTest), so the
test follows the path a user takes: registry table -> loaders.examples -> state._fill_examples.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from apptest_helpers import ZOO, assert_clean

from attnscope.dashboard import keys as K
from attnscope.models import registry, tasks


def _embedding(lm, text: str) -> torch.Tensor:
    """The mean-pooled sentence embedding of a pretrained encoder (what its predict() reports)."""
    ids = torch.tensor(np.array(lm.trace([text])[0].src_ids))[None]
    with torch.no_grad():
        out = lm.model(ids, return_hidden=True)
    return lm.model.pool(out.hidden, ids != lm.cfg.pad_id)[0]


def _assert_right(name: str, source: str) -> None:
    lm = registry.load(name)
    (prediction,) = lm.predict([source])
    task = str(lm.meta.get("task", ""))
    if task in tasks.TASKS:
        assert tasks.check(task, source, prediction), (name, source, prediction)
        if task == "reverse":
            assert prediction == source[::-1]
        return
    # a sentence encoder has no single right output: it reads every word of the sentence, and
    # places the sentence nearer a paraphrase than an unrelated sentence
    (trace,) = lm.trace([source])
    assert trace.src_tokens[0] == "[CLS]" and "[UNK]" not in trace.src_tokens, trace.src_tokens
    first = _embedding(lm, source)
    cos = torch.nn.functional.cosine_similarity
    near = cos(first, _embedding(lm, "A cat is sitting on a mat."), dim=0)
    far = cos(first, _embedding(lm, "Stock markets fell sharply on Monday."), dim=0)
    assert near > far, (float(near), float(far))


def test_every_registry_model_has_a_first_input():
    assert set(registry.all_names()) <= set(registry.FIRST_INPUTS)
    assert registry.first_input(registry.DEFAULT_MODEL) == registry.FIRST_INPUTS[registry.DEFAULT_MODEL]
    assert registry.first_input("not-a-model") is None
    # a folder that is not the zoo's gets the ordinary examples, even under a zoo name
    assert registry.first_input("reverse", folder=registry.ZOO_DIR) is None


def test_reverse_opens_on_attention():
    assert registry.FIRST_INPUTS["reverse"] == "attention"
    assert registry.load("reverse").predict(["attention"]) == ["noitnetta"]


@pytest.mark.parametrize("name", ZOO)
def test_picking_a_model_fills_its_first_input(make_app, name):
    other = next(n for n in ZOO if n != name)
    at = make_app(other)  # start on another model, then pick this one in the sidebar
    assert at.sidebar.text_input(key=K.SOURCE).value == registry.FIRST_INPUTS[other]
    at.sidebar.selectbox(key=K.MODEL).set_value(name).run()
    assert_clean(at)
    assert at.sidebar.selectbox(key=K.MODEL).value == name
    source = at.sidebar.text_input(key=K.SOURCE).value
    assert source == registry.FIRST_INPUTS[name]
    _assert_right(name, source)
