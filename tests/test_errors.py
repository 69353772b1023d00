"""One class per error a user can cause (attnscope.core.errors), raised by every model family and
caught by that name everywhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from attnscope.core import errors
from attnscope.models import registry

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("InputError", "ModelLoadError", "ConfigError", "TokenizerError", "TraceFormatError")


def test_each_user_error_is_defined_once():
    defined: dict[str, list[str]] = {n: [] for n in NAMES}
    for folder in ("core", "models", "dashboard", "attnscope"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and node.name in defined:
                    defined[node.name].append(str(path.relative_to(ROOT)))
    assert defined == {n: ["core/errors.py"] for n in NAMES}


@pytest.mark.parametrize("model", ["reverse", "examples/my_adapter.py"])
def test_every_family_raises_the_one_input_error(model):
    lm = registry.load(model if "/" not in model else str(ROOT / model))
    with pytest.raises(errors.InputError):
        lm.trace(["\x00" * 5000])  # far past any model's length and vocabulary


def test_the_front_ends_catch_the_same_classes():
    from attnscope.core.families import native
    from attnscope.core.transformer import checkpoint

    assert native.InputError is errors.InputError and checkpoint.ModelLoadError is errors.ModelLoadError
    source = (ROOT / "attnscope" / "cli.py").read_text(encoding="utf-8")
    assert "from attnscope.core.errors import" in source  # the CLI turns these into one line each
