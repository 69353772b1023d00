"""core.memory: the trace's map buffers on huge pages change how memory is mapped, never the numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from core import memory, model
from models import registry

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    """The selected mode ([always] madvise never), or None where the kernel has no such file."""
    try:
        text = THP.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")]


def test_big_cpu_buffers_are_advised_where_the_kernel_allows_it():
    big = torch.empty(16 * memory.HUGE_PAGE // 4, dtype=torch.float32)  # 32 MiB
    allowed = sys.platform.startswith("linux") and _thp_mode() in ("always", "madvise")
    assert memory.advise_huge_pages(big) is allowed
    big.fill_(1.5)  # the memory is used as before
    assert float(big.sum()) == 1.5 * big.numel()


def test_small_buffers_are_left_alone():
    assert memory.advise_huge_pages(torch.empty(1000)) is False
    assert memory.advise_huge_pages(torch.empty(memory.MIN_BYTES // 4 - 1)) is False


def test_a_trace_has_the_same_maps_with_and_without_the_advice(monkeypatch):
    """MiniLM at 300 tokens: each map buffer is 26 MB, so the advice applies (where the kernel allows
    it); the numbers equal those of buffers left on small pages, bit for bit."""
    lm = registry.load("minilm")
    text = " ".join(["the cat sat on the mat"] * 50)
    taken: list[bool] = []
    real = memory.advise_huge_pages
    monkeypatch.setattr(model, "advise_huge_pages", lambda t: taken.append(real(t)) or taken[-1])
    advised = lm.trace([text])[0]
    assert len(taken) == 2 and advised.probs("enc_self").nbytes >= memory.MIN_BYTES
    assert all(taken) is (_thp_mode() in ("always", "madvise") and sys.platform.startswith("linux"))
    monkeypatch.setattr(model, "advise_huge_pages", lambda t: False)
    plain = lm.trace([text])[0]
    np.testing.assert_array_equal(advised.probs("enc_self"), plain.probs("enc_self"))
    np.testing.assert_array_equal(advised.scores("enc_self"), plain.scores("enc_self"))


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="no transparent huge pages here")
def test_map_buffers_of_a_long_trace_are_advised(monkeypatch):
    """map_buffers asks for huge pages for both maps once they are big enough (MiniLM-sized at 512 tokens)."""
    calls: list[tuple[int, bool]] = []
    real = memory.advise_huge_pages
    monkeypatch.setattr(
        model, "advise_huge_pages", lambda t: calls.append((t.numel(), real(t))) or calls[-1][1]
    )
    maps, layers = model.map_buffers(6, (1, 12, 512, 512), torch.empty(1))
    assert calls == [(6 * 12 * 512 * 512, True)] * 2
    assert maps.probs.shape == (1, 6, 12, 512, 512) and len(layers) == 6
