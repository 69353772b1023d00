"""The README's picture (docs/images/attention.png, written by ``make screenshot``) still shows the page.

Runs bench/screenshot.py's capture into tmp_path and compares what the page shows now (headings,
charts, sidebar widgets, model, input: attention.json) with the committed attention.json; and checks
that the committed PNG decodes at the size the script makes. Structure, not pixels: when this fails,
the page changed: run ``make screenshot`` and commit docs/images/.
"""

from __future__ import annotations

import json

import pytest
from PIL import Image
from test_browser import _require_browser

from bench import screenshot

pytestmark = pytest.mark.browser

COMMITTED_PNG = screenshot.OUT / f"{screenshot.NAME}.png"
COMMITTED_JSON = screenshot.OUT / f"{screenshot.NAME}.json"
STALE = "the committed picture no longer matches the page: run `make screenshot` and commit docs/images/"


def test_committed_png_decodes_at_the_scripts_size():
    assert COMMITTED_PNG.is_file(), f"{COMMITTED_PNG.name} is missing: run `make screenshot`"
    with Image.open(COMMITTED_PNG) as img:
        assert img.format == "PNG"
        img.load()  # decodes every pixel (a truncated file raises here)
        size = img.size
        colours = img.convert("RGB").resize((64, 64)).getcolors(64 * 64)
    expected = (
        screenshot.VIEWPORT["width"] * screenshot.SCALE,
        screenshot.VIEWPORT["height"] * screenshot.SCALE,
    )
    assert size == expected, (size, expected, STALE)
    assert colours is None or len(colours) > 16, "the picture is (nearly) one colour"


def test_committed_structure_matches_the_page(tmp_path):
    _require_browser()
    png, structure_file = screenshot.take(tmp_path)
    assert png.parent == tmp_path and structure_file.parent == tmp_path  # nothing written into the tree
    fresh = json.loads(structure_file.read_text(encoding="utf-8"))
    committed = json.loads(COMMITTED_JSON.read_text(encoding="utf-8"))
    # what the picture is of: the Attention page of reverse on its first input, the grid drawn
    assert (
        fresh["model"] == screenshot.MODEL and fresh["input"] == screenshot.registry.FIRST_INPUTS["reverse"]
    )
    assert fresh["charts"]["count"] >= 1 and "click a tile" in fresh["charts"]["titles"][0]
    for key in sorted(committed.keys() | fresh.keys()):
        assert fresh.get(key) == committed.get(key), (key, fresh.get(key), committed.get(key), STALE)
    with Image.open(png) as img:
        assert img.size == (
            screenshot.VIEWPORT["width"] * screenshot.SCALE,
            screenshot.VIEWPORT["height"] * screenshot.SCALE,
        )
