"""Helpers shared by the Streamlit AppTest suites (test_app, test_app_analysis, test_app_real_models,
test_hostile_ui): start the app on a model, read back figures, messages and errors.

AppTest cannot look inside a Plotly chart, so the figures are read back from the chart
protos' JSON spec (numpy arrays arrive there base64-encoded; ``_array`` decodes them).
The ``make_app`` and ``tiny`` fixtures built on these live in conftest.py.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from attnscope.dashboard import keys as K
from attnscope.models import registry

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
PAGES = {  # the pages that show a model's attention, decoding, masks, positions, bertviz, summary
    "attention": "app_pages/attention.py",
    "decoding": "app_pages/decoding.py",
    "masks": "app_pages/masks.py",
    "positional": "app_pages/positional.py",
    "bertviz": "app_pages/bertviz_view.py",
    "model": "app_pages/model_info.py",
}
ANALYSIS_PAGES = {  # mask audit, mask lab, head analytics, compare
    "audit": "app_pages/audit.py",
    "lab": "app_pages/mask_lab.py",
    "heads": "app_pages/head_analytics.py",
    "compare": "app_pages/compare.py",
}
TIMEOUT = 60  # first run imports torch/plotly; a busy 2-core machine can be slow
ZOO = getattr(registry, "all_names", registry.zoo_names)()  # the zoo and installed pretrained models
HAS_MINILM = "minilm" in registry.all_names()


def run_app(
    model: str | None = None, page: str | None = None, *, timeout: float = TIMEOUT, **session
) -> AppTest:
    """A fresh AppTest of the dashboard: ``model`` picked in the sidebar and ``session`` keys set
    before the first run, then switched to ``page`` (a key of PAGES or ANALYSIS_PAGES)."""
    at = AppTest.from_file(str(APP), default_timeout=timeout)
    if model is not None:
        at.session_state[K.MODEL] = model
    for key, value in session.items():
        at.session_state[key] = value
    at.run()
    if page is not None:
        at.switch_page({**PAGES, **ANALYSIS_PAGES}[page]).run()
    return at


def load_path(at: AppTest, text: str) -> AppTest:
    """Type a model path into the sidebar's path box and press Load."""
    at.sidebar.text_input(key=K.LOAD_PATH).input(text)
    at.sidebar.button(key=K.LOAD_PATH_BUTTON).click().run()
    return at


# -- reading the page back ----------------------------------------------------------------------


def _array(value) -> np.ndarray:
    """A Plotly JSON array: a list, or {"dtype", "bdata" (base64), "shape"}."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = [int(s) for s in str(value.get("shape", len(arr))).split(",")]
        return arr.reshape(shape)
    return np.asarray(value)


def figures(at: AppTest) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def titles(at: AppTest) -> list[str]:
    return [f["layout"]["title"]["text"] for f in figures(at)]


def figure(at: AppTest, title_part: str) -> dict:
    """The one figure whose title contains ``title_part``."""
    found = [f for f in figures(at) if title_part in f["layout"]["title"]["text"]]
    assert len(found) == 1, (title_part, titles(at))
    return found[0]


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def assert_no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def assert_clean(at: AppTest) -> None:
    """No exception and no error on the page."""
    assert_no_exception(at)
    assert not at.error, errors(at)
