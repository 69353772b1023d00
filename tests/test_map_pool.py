"""attnscope.core.families.map_pool: recycled memory for traced passes' maps. Never handed out while in use, the same numbers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from attnscope.core.families import map_pool
from attnscope.core.families.map_pool import MapPool
from attnscope.dashboard import trace_cache

MB = 2**20
TEXTS = ["hello world", "abc"]
ARRAYS = ("enc_self", "enc_self_scores", "dec_self", "dec_self_scores", "cross", "cross_scores")


@pytest.fixture()
def pool(monkeypatch) -> MapPool:
    """A fresh pool for core's traced passes that takes every map buffer, however small."""
    p = MapPool(keep_bytes=64 * MB)
    monkeypatch.setattr(map_pool, "POOL", p)
    monkeypatch.setattr(map_pool, "MIN_BYTES", 0)
    return p


def _copy(traces) -> list[dict[str, np.ndarray]]:
    return [{n: np.array(getattr(t, n)) for n in ARRAYS} for t in traces]


def _ptr(trace) -> int:
    return trace.enc_self.__array_interface__["data"][0]


def test_off_by_default_is_torch_empty():
    p = MapPool()
    t = p.empty((2, 3), torch.float32, "cpu")
    assert t.shape == (2, 3) and t.dtype == torch.float32
    assert p.stats()["blocks"] == 0


def test_traces_from_the_pool_have_the_same_numbers(tiny_model, pool, monkeypatch):
    monkeypatch.setattr(map_pool, "POOL", MapPool())  # off
    plain = _copy(tiny_model.trace(TEXTS))
    monkeypatch.setattr(map_pool, "POOL", pool)
    for _ in range(3):  # new blocks, then recycled ones
        got = _copy(tiny_model.trace(TEXTS))
        for a, b in zip(plain, got, strict=True):
            for name in ARRAYS:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert pool.stats()["reused"] >= 6  # 3 kinds x (scores, probs), second and third pass


def test_recycled_blocks_hold_the_new_traces_numbers_not_the_old(tiny_model, pool, monkeypatch):
    """Blocks recycled for traces of other content (other texts, of the same and other lengths)
    hold exactly what a pass without the pool computes: nothing of the previous traces shows through."""
    batches = [
        TEXTS,
        ["world hello", "cab"],
        ["attention please", "xyz"],
        ["dlrow olleh", "bca"],
        ["hi", "abcd"],
    ]
    monkeypatch.setattr(map_pool, "POOL", MapPool())  # off
    plain = [_copy(tiny_model.trace(texts)) for texts in batches]
    monkeypatch.setattr(map_pool, "POOL", pool)
    for texts, want in zip(batches, plain, strict=True):
        got = _copy(tiny_model.trace(texts))  # the previous batch's traces are gone: its blocks come back
        for a, b in zip(want, got, strict=True):
            for name in ARRAYS:
                np.testing.assert_array_equal(a[name], b[name], err_msg=f"{texts} {name}")
    assert pool.stats()["reused"] >= 2 * 6  # passes of the first's lengths ran on recycled blocks
    assert not np.array_equal(plain[0][0]["enc_self"], plain[1][0]["enc_self"])  # the contents differ


def test_a_block_in_use_is_never_handed_out(tiny_model, pool):
    first = tiny_model.trace(TEXTS)
    kept = _copy(first)
    second = tiny_model.trace(TEXTS[::-1])  # the first traces are alive: new blocks
    assert not any(
        np.shares_memory(getattr(a, n), getattr(b, n)) for a in first for b in second for n in ARRAYS
    )
    for copy, trace in zip(kept, first, strict=True):
        for name in ARRAYS:
            np.testing.assert_array_equal(copy[name], getattr(trace, name))
    assert pool.stats()["reused"] == 0
    view = first[1].cross[0]  # one small view keeps its whole block in use
    where = _ptr(first[0])
    del first, trace  # (a batch's traces are views of its buffers: the last one frees them)
    third = tiny_model.trace(TEXTS)
    assert pool.stats()["reused"] == 5  # every buffer but the cross-attention probabilities
    assert _ptr(third[0]) == where  # the first traces' encoder block, written again
    np.testing.assert_array_equal(view, kept[1]["cross"][0])  # and the kept view is untouched


def test_two_threads_at_once_get_their_own_blocks(tiny_model, pool):
    expect = {t: _copy(tiny_model.trace([t])) for t in TEXTS}
    for _ in range(5):
        got: dict[str, list] = {}
        ths = [
            threading.Thread(target=lambda t=t, got=got: got.setdefault(t, tiny_model.trace([t])))
            for t in TEXTS
        ]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        a, b = got[TEXTS[0]][0], got[TEXTS[1]][0]
        assert not any(np.shares_memory(getattr(a, n), getattr(b, n)) for n in ARRAYS)
        for t in TEXTS:
            for name in ARRAYS:
                np.testing.assert_array_equal(getattr(got[t][0], name), expect[t][0][name])
    assert pool.stats()["reused"] > 0


def test_free_blocks_beyond_the_budget_go_back():
    p = MapPool(keep_bytes=256 * MB)
    a = p.empty((MB // 4,), torch.float32, "cpu")  # 1 MB each (MIN_BYTES: below it, no pool)
    b = p.empty((MB // 4,), torch.float32, "cpu")
    assert p.stats()["blocks"] == 0  # under MIN_BYTES the pool is not used
    big = 2 * map_pool.MIN_BYTES // 4  # float32 elements of a block of twice the pool's minimum
    a = p.empty((big,), torch.float32, "cpu")
    b = p.empty((big,), torch.float32, "cpu")
    assert p.stats()["used_bytes"] == 2 * big * 4 and p.stats()["free_blocks"] == 0
    del a, b
    assert p.stats()["free_blocks"] == 2
    p.configure(big * 4)  # room for one free block
    assert p.stats()["free_blocks"] == 1 and p.stats()["blocks"] == 1
    c = p.empty((big,), torch.float32, "cpu")
    assert p.reused == 1 and p.stats()["free_blocks"] == 0
    small = p.empty((big // 2,), torch.float32, "cpu")  # half: a block of its own, not a big one cut
    assert p.created == 3
    del c, small
    p.configure(0)  # off: every free block dropped
    assert p.stats()["blocks"] == 0


def test_a_recycled_tensor_holds_only_its_own_bytes():
    """A smaller request on a recycled block: its storage is the requested bytes, so nothing that
    writes a tensor's whole storage (torch.save of a view) carries the earlier user's maps along."""
    p = MapPool(keep_bytes=256 * MB)
    big = 5 * map_pool.MIN_BYTES // 16  # float32 elements: 1.25 x the minimum
    a = p.empty((big,), torch.float32, "cpu")
    a.fill_(42.0)
    del a
    b = p.empty((map_pool.MIN_BYTES // 4,), torch.float32, "cpu")
    assert p.reused == 1
    assert b.untyped_storage().nbytes() == map_pool.MIN_BYTES
    assert p.stats()["free_blocks"] == 0  # and the block counts as used while b lives
    del b
    assert p.stats()["free_blocks"] == 1


def test_blocks_are_aligned_and_typed():
    p = MapPool(keep_bytes=256 * MB)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        n = map_pool.MIN_BYTES // torch.empty((), dtype=dtype).element_size()
        t = p.empty((2, n // 2), dtype, "cpu")
        assert t.dtype == dtype and t.shape == (2, n // 2) and t.is_contiguous()
        assert t.data_ptr() % map_pool.ALIGN == 0
        t.fill_(1.5)
        assert float(t.float().sum()) == 1.5 * t.numel()
    assert p.empty((4,), torch.float32, "meta").device.type == "meta"  # only CPU memory is pooled


def test_cache_eviction_gives_free_blocks_back(tiny_model, pool):
    store = trace_cache.TraceStore(max_bytes=10**9, max_entries=1)
    store.put("a", tiny_model.trace(TEXTS))
    pool.configure(1)  # keep (almost) nothing free
    store.put("b", tiny_model.trace(TEXTS))  # "a" is evicted: its blocks are free, then dropped
    s = pool.stats()
    assert s["free_blocks"] == 0 and s["blocks"] == 6  # only "b"'s blocks are held


@pytest.mark.parametrize(("env", "expect"), [(None, 1024 * MB), ("0", 0), ("5", 5 * MB)])
def test_the_dashboard_turns_the_pool_on_with_its_budget(env, expect):
    environ = {k: v for k, v in os.environ.items() if k != "ATTNSCOPE_MAP_POOL_MB"}
    if env is not None:
        environ["ATTNSCOPE_MAP_POOL_MB"] = env
    code = (
        "import attnscope.dashboard.loaders as L, attnscope.core.families.map_pool as m; "
        "before = m.POOL.keep_bytes; L.configure_process(); print(before, m.POOL.keep_bytes)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=environ, cwd=Path(__file__).resolve().parents[1],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    before, after = map(int, out.stdout.split()[-2:])
    assert before == 0 and after == expect  # importing the dashboard changes nothing; app.py configures
