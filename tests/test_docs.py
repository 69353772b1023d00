"""The README and docs/ say what the code does: short front page, links that resolve, commands that
exist, a capture snippet that runs, no machine paths."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, len(lines)
    names = {p.name for p in DOCS}
    for needed in ("dashboard.md", "cli.md", "your-model.md", "capture.md", "trace-format.md", "deploy.md",
                   "architecture.md"):  # fmt: skip
        assert needed in names, needed
    assert not (ROOT / "docs" / "HELPERS.md").exists()


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).resolve().exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_commands_named_in_the_docs_exist():
    """Every `attnscope X` a page shows (in code) is a real command, and cli.md shows every command."""
    from attnscope.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    real = set(sub.choices)
    command = re.compile(r"(?:`|bin/|-m |^\$ )attnscope ([a-z]+)", flags=re.MULTILINE)
    for page in PAGES:
        named = set(command.findall(page.read_text(encoding="utf-8")))
        assert named <= real, (page.name, sorted(named - real))
    documented = set(command.findall((ROOT / "docs" / "cli.md").read_text(encoding="utf-8")))
    assert documented == real, sorted(real - documented)


def test_no_machine_paths_or_old_spellings():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for bad in ("/work/", "/root/", "/home/", "python -m core", "import core\n", "from core."):
            assert bad not in text, (page.name, bad)


def test_the_readme_snippet_runs(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", readme, flags=re.S)[0]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "enc_self (2, 4, 7, 7)"
    assert any(ln.startswith("PASS padding_leak") for ln in lines) and not any(
        ln.startswith("FAIL") for ln in lines
    )
    assert (tmp_path / "reverse.npz").is_file()
