"""The wheel, as a user gets it: built from the repository's tracked files, installed in a fresh venv,
used from a project that has its own ``models.py`` and ``core/`` package.

The fresh venv gets the dependencies the project's venv already has without copying them: a ``.pth``
file points at a folder of links to every entry of that venv's site-packages except attnscope's own
(its editable finder and metadata). attnscope itself is installed from the wheel with ``--no-deps``, so
every ``attnscope`` import in that venv comes from the wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from bench import harness

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"])
pytestmark = pytest.mark.slow

USER_MODELS_PY = "WHO = 'the user project models.py'\n"
USER_CORE = "WHO = 'the user project core package'\n"


def _run(args: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert out.returncode == 0, f"{args}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def _own(name: str) -> bool:
    """attnscope's own entries in the project venv (editable finder, .pth, metadata)."""
    low = name.lower()
    return low.startswith(("attnscope", "__editable__")) or low in ("core", "models", "dashboard")


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    clone = base / "clone"  # the tracked files only, as a clean clone has them
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src, dst = ROOT / rel, clone / rel
        if src.is_symlink() or not src.is_file():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())
    dist = base / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, clone],
        base,
    )
    (wheel,) = dist.glob("attnscope-*.whl")

    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    new_site = Path(
        _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base).stdout.strip()
    )
    deps = base / "deps" / "site-packages"  # streamlit tells an installed copy by this folder name
    deps.mkdir(parents=True)
    for entry in SITE.iterdir():
        if not _own(entry.name) and not entry.name.endswith(".pth"):
            (deps / entry.name).symlink_to(entry)
    (new_site / "project-deps.pth").write_text(f"{deps}\n", encoding="utf-8")
    _run(
        [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel], base
    )

    project = base / "project"  # a user's project with generic top-level names of its own
    (project / "core").mkdir(parents=True)
    (project / "models.py").write_text(USER_MODELS_PY, encoding="utf-8")
    (project / "core" / "__init__.py").write_text(USER_CORE, encoding="utf-8")
    return {"wheel": wheel, "py": py, "bin": env_dir / "bin", "project": project, "site": new_site}


def test_the_wheel_installs_only_attnscope_at_the_top_level(wheel_env):
    names = zipfile.ZipFile(wheel_env["wheel"]).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"attnscope", next(t for t in top if t.endswith(".dist-info"))}, top
    for needed in (
        "attnscope/core/families/capture.py",
        "attnscope/dashboard/app.py",
        "attnscope/dashboard/server.toml",
        "attnscope/dashboard/static/vendor/require-2.3.6.js",  # bertviz offline
        "attnscope/dashboard/static/favicon.png",
        "attnscope/dashboard/app_pages/attention.py",
        "attnscope/models/reverse/model.safetensors",
        "attnscope/models/reverse/run/run.json",
        "attnscope/models/reverse/run/scalars.jsonl",
        "attnscope/models/reverse/run/steps/step-0000000010/weights.safetensors",
    ):
        assert any(n.startswith(needed) for n in names), needed


def test_capture_load_and_the_users_own_modules(wheel_env):
    code = """
import sys
import attnscope, models, core
assert 'torch' not in sys.modules, 'import attnscope must stay light'
print(models.WHO); print(core.WHO)
print(attnscope.__file__)
import torch
from torch import nn
mha = nn.MultiheadAttention(8, 2, batch_first=True)
x = torch.randn(1, 5, 8)
with attnscope.capture_attention(mha) as cap:
    _, w = mha(x, x, x, average_attn_weights=False)
print(len(cap.records), torch.allclose(cap.records[0].probs, w, atol=1e-6))
lm = attnscope.load('reverse')
print(lm.predict(['attention'])[0])
report = attnscope.audit(lm, ['hello', 'abc'])
print(sorted({v.status for v in report} - {'pass', 'skip', 'info'}), len(report) == len(report.verdicts) > 5)
tr = lm.trace(['abc'])[0]
tr.save('t.npz')
print(attnscope.AttentionTrace.load('t.npz').kinds)
"""
    out = _run([wheel_env["py"], "-c", code], wheel_env["project"]).stdout.splitlines()
    assert out[0] == "the user project models.py" and out[1] == "the user project core package"
    assert Path(out[2]).resolve().is_relative_to(wheel_env["site"].resolve()), out[2]  # from the wheel
    assert out[3] == "1 True", out
    assert "noitnetta" in out[4], out
    assert out[5] == "[] True", out  # no check failed; a report iterates over its verdicts
    assert out[6] == "('enc_self', 'dec_self', 'cross')"


def test_the_command_line(wheel_env):
    cli = wheel_env["bin"] / "attnscope"
    models = _run([cli, "models"], wheel_env["project"]).stdout
    assert any(line.startswith("reverse") for line in models.splitlines()), models
    pred = _run([cli, "predict", "--model", "reverse", "attention"], wheel_env["project"]).stdout
    assert "noitnetta" in pred
    help_m = _run([wheel_env["py"], "-m", "attnscope", "--help"], wheel_env["project"]).stdout
    assert help_m.startswith("usage: python -m attnscope")


def test_attnscope_run_serves_a_page(wheel_env):
    port = harness.free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen(
        [str(wheel_env["bin"] / "attnscope"), "run", "--port", str(port), "--server.fileWatcherType", "none"],
        cwd=wheel_env["project"], env={**env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert harness.wait_healthy(url, proc, 90), f"no dashboard on port {port}; exit code {proc.poll()}"
        problem = harness.chromium_problem()
        if problem and os.environ.get("ATTNSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ATTNSCOPE_REQUIRE_BROWSER=1 but {problem}")
        if problem is None:  # the page itself, drawn by the wheel's app in a real browser
            from playwright.sync_api import sync_playwright

            with sync_playwright() as p:
                browser = harness.launch_chromium(p)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    page.goto(f"{url}/attention", wait_until="domcontentloaded")
                    page.wait_for_selector(".js-plotly-plot", timeout=90_000)
                    assert page.locator('[data-testid="stException"]').count() == 0
                finally:
                    browser.close()
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert f"{url}" in out
    assert "gatherUsageStats" not in out and "Email" not in out  # the package's server settings applied
    assert str(ROOT) not in out  # nothing was served from the checkout
