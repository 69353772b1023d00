"""The example notebook (examples/attention_in_a_notebook.ipynb) runs, top to bottom, in a fresh kernel
of this venv (nbclient), so it cannot rot: its figures are drawn and its traces open again."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from attnscope.core.traces.trace import AttentionTrace

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "attention_in_a_notebook.ipynb"
PLOTLY = ("application/vnd.plotly.v1+json", "text/html")


def test_the_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_the_notebook_runs_and_its_traces_open(tmp_path, monkeypatch):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("ATTNSCOPE_NOTEBOOK_OUT", str(tmp_path))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel is this interpreter (ipykernel's own spec runs sys.executable), started in tmp_path.
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    try:
        client.execute()
    except CellExecutionError as exc:  # the cell's traceback, not nbclient's
        pytest.fail(str(exc)[-3000:])
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    figures = [
        o for o in outputs if o.get("output_type") == "display_data" and "plotly" in str(o.get("data", {}))
    ]
    assert len(figures) >= 6, [o.get("output_type") for o in outputs]
    html = str(figures[0]["data"].get("text/html", ""))
    assert len(html) > 1_000_000 and "plotly.js v" in html  # plotly.js embedded in the page, never fetched
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "output: desserts" in text and "captured = computed; kinds found: ('dec_self',)" in text, text
    assert "<bound method" not in text and " object at 0x" not in text, (
        text
    )  # (an API call printed as an object)

    reverse = AttentionTrace.load(tmp_path / "reverse.npz")
    assert reverse.src_tokens[:8] == tuple("stressed") and reverse.output_text == "desserts"
    mine = AttentionTrace.load(tmp_path / "tinygpt.npz")
    assert mine.tgt_tokens == tuple("hello world") and mine.dec_self.shape == (2, 4, 11, 11)
    assert mine.problems() == [] and not mine.dec_self_mask[0, 1]  # causal: no position sees a later one
