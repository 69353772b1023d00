"""Heads a training loss forced into a pattern (meta.json "hinted_heads", written by models/train.py).

A picture of such a head shows what the model was told to do, not what it found, so every page that
draws one marks it "trained to look like this" (the grid outlines its tile, line plots dash it, and a
caption says which heads and why).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import streamlit as st

NOTE = "trained to look like this"


def hinted(meta: Mapping[str, Any] | None, kind: str) -> dict[tuple[int, int], str]:
    """(layer, head) -> the pattern it was trained to show, for the heads of ``kind`` in ``meta``."""
    out: dict[tuple[int, int], str] = {}
    for item in (meta or {}).get("hinted_heads", []) or []:
        try:
            if item.get("kind") == kind:
                out[(int(item["layer"]), int(item["head"]))] = str(item.get("pattern", ""))
        except (AttributeError, KeyError, TypeError, ValueError):
            continue  # a malformed entry marks nothing
    return out


def describe(marked: Mapping[tuple[int, int], str]) -> str:
    """One sentence naming the marked heads ('' when none)."""
    if not marked:
        return ""
    heads = "; ".join(
        f"layer {ly} head {h}" + (f" ({p})" if p else "") for (ly, h), p in sorted(marked.items())
    )
    return (
        f"▣ {NOTE.capitalize()}: {heads}. An extra loss term during training forced "
        f"{'this head' if len(marked) == 1 else 'these heads'} into the pattern the model card calls right; "
        "the model did not find it on its own."
    )


def caption(marked: Mapping[tuple[int, int], str]) -> None:
    if marked:
        st.caption(describe(marked))
