"""The project installs as ``attnscope``: the command works from any folder, ``import attnscope`` works in any
script using the venv, and pyproject.toml pins what requirements.txt pins."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

from bench import harness

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "attnscope"
NOT_INSTALLED = (
    "the attnscope command is missing: run `make setup` (it installs this project in editable mode)"
)


def _pins(lines: list[str]) -> set[str]:
    return {ln.strip() for ln in lines if re.match(r"^[A-Za-z0-9_.\-]+==", ln.strip())}


def test_pyproject_pins_what_requirements_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    req = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    cut = next(i for i, ln in enumerate(req) if ln.startswith("# test and lint tools"))
    build = next(i for i, ln in enumerate(req) if ln.startswith("# build:"))
    assert set(project["dependencies"]) == _pins(req[:cut])
    assert set(project["optional-dependencies"]["test"]) == _pins(req[cut:build])
    assert project["scripts"]["attnscope"] == "attnscope.cli:main"
    constraints = _pins((ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines())
    assert _pins(req) <= constraints  # every direct pin is also in the full constraint set


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as in a fresh shell
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_attnscope_command_from_any_folder(tmp_path):
    assert SCRIPT.exists(), NOT_INSTALLED
    out = _run([str(SCRIPT), "--help"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout.startswith("usage: attnscope ")
        and "{run,view,models,predict,trace,audit,stats}" in out.stdout
    )
    models = _run([str(SCRIPT), "models"], tmp_path)
    assert models.returncode == 0 and re.search(r"^reverse\s", models.stdout, flags=re.M), models.stdout
    bad = _run([str(SCRIPT), "predict", "--model", "no-such-model", "abc"], tmp_path)
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("error: unknown model")
        and "Traceback" not in bad.stderr
    )


def test_import_attnscope_in_any_script(tmp_path):
    code = (
        "import sys, attnscope; light = 'torch' not in sys.modules; "
        "import attnscope.dashboard.plots.attention, attnscope.models.registry; "
        "print(light, attnscope.AttentionTrace.__module__)"
    )
    out = _run([sys.executable, "-c", code], tmp_path)
    assert out.returncode == 0 and out.stdout.split() == ["True", "attnscope.core.traces.trace"], out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_attnscope_run_serves_the_dashboard_from_another_folder(tmp_path):
    assert SCRIPT.exists(), NOT_INSTALLED
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([str(SCRIPT), "run", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        assert harness.wait_healthy(url, proc, 90), f"no dashboard on port {port}; exit code {proc.poll()}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            body = r.read().decode()
            assert r.status == 200 and "<title>Streamlit</title>" in body and 'id="root"' in body, body[:300]
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert f"http://127.0.0.1:{port}" in out
    assert "gatherUsageStats" not in out and "Email" not in out  # the repo's server settings were applied


def test_run_rejects_a_bad_port(capsys):
    from attnscope.cli import main

    assert main(["run", "--port", "70000"]) == 2
    assert "--port must be between 1 and 65535" in capsys.readouterr().err


def test_run_passes_the_repositorys_server_settings():
    from attnscope.cli import dashboard_command

    cmd = dashboard_command(8599, "127.0.0.1", ["--server.headless", "true"])
    assert cmd[:5] == [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "dashboard" / "app.py"),
    ]  # editable
    assert "--browser.gatherUsageStats=false" in cmd and "--server.maxUploadSize=16" in cmd
    assert cmd[-4:] == ["--server.address=127.0.0.1", "--server.port=8599", "--server.headless", "true"][-4:]
    # the explicit port and address come after the file's, so they win
    assert cmd.index("--server.port=8599") > cmd.index("--server.enableCORS=true")


def test_python_m_attnscope_is_the_command(tmp_path):
    out = _run([sys.executable, "-m", "attnscope", "--help"], tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m attnscope ")
    assert not (ROOT / "core" / "__main__.py").exists()  # one command name: `python -m core` is gone
