"""A shared, byte-bounded cache for attention traces (every session reads the same objects).

``st.cache_data`` pickles a result into the cache and unpickles a copy on every hit: for MiniLM at
512 tokens that is ~150 MB copied on every widget click (bench/cache_hit.py measures it).
AttentionTrace is frozen with read-only arrays, so sessions can share one object, as
``st.cache_resource`` does; but cache_resource bounds only the number of entries, and one trace
can be anything from kilobytes to the runner's MAX_TRACE_MB. ``TraceStore`` bounds both the
entries and their bytes (least recently used first), drops entries unused for ``ttl_s``, and
computes a key once when several sessions ask for it at the same time.

The store itself lives in ``st.cache_resource``, so ``st.cache_resource.clear()`` empties it.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

import numpy as np

from attnscope.core.families import map_pool

MB = 2**20


def nbytes(value: Any) -> int:
    """Bytes of the numpy arrays in a value: a trace, a dataclass holding traces (an audit report),
    or lists/tuples of them (an array shared by two values is counted in each: an upper bound)."""
    if isinstance(value, list | tuple):
        return sum(nbytes(v) for v in value)
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    fields = getattr(value, "__dataclass_fields__", None)
    if fields:
        return sum(nbytes(getattr(value, f)) for f in fields)
    return 0


class TraceStore:
    """LRU of computed values, at most ``max_entries`` and ``max_bytes``; thread-safe."""

    def __init__(self, max_bytes: int, max_entries: int, ttl_s: float | None = None):
        self.max_bytes, self.max_entries, self.ttl_s = max_bytes, max_entries, ttl_s
        self._items: OrderedDict[Hashable, tuple[Any, int, float]] = OrderedDict()  # value, bytes, last use
        self._lock = threading.Lock()
        self._inflight: dict[Hashable, threading.Lock] = {}
        self.bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def _expire(self, now: float) -> int:
        """Drop the entries unused for ``ttl_s``; returns how many (the lock is held)."""
        if self.ttl_s is None:
            return 0
        old = [k for k, (_, _, used) in self._items.items() if now - used > self.ttl_s]
        for key in old:
            self.bytes -= self._items.pop(key)[1]
        return len(old)

    @staticmethod
    def _released(dropped: int) -> None:
        """After entries left (outside the lock): the maps they held, beyond the pool's budget, go back
        to the system (core/families/map_pool.py)."""
        if dropped:
            map_pool.POOL.trim()

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            now = time.monotonic()
            dropped = self._expire(now)
            item = self._items.get(key)
            if item is not None:
                self._items[key] = (item[0], item[1], now)
                self._items.move_to_end(key)
                self.hits += 1
        self._released(dropped)
        return default if item is None else item[0]

    def put(self, key: Hashable, value: Any) -> None:
        size = nbytes(value)
        dropped = 0
        with self._lock:
            if key in self._items:
                self.bytes -= self._items.pop(key)[1]
                dropped += 1
            if size <= self.max_bytes:  # else bigger than the whole budget: returned to the caller, not kept
                self._items[key] = (value, size, time.monotonic())
                self.bytes += size
                while self._items and (len(self._items) > self.max_entries or self.bytes > self.max_bytes):
                    self.bytes -= self._items.popitem(last=False)[1][1]
                    dropped += 1
        self._released(dropped)

    def get_or_compute(
        self, key: Hashable, compute: Callable[[], Any], on_miss: Callable | None = None
    ) -> Any:
        """The cached value, or ``compute()`` (once per key even when sessions ask at the same time)."""
        missing = object()
        value = self.get(key, missing)
        if value is not missing:
            return value
        with self._lock:
            key_lock = self._inflight.setdefault(key, threading.Lock())
        with key_lock:
            value = self.get(key, missing)  # another session may have computed it meanwhile
            if value is not missing:
                return value
            self.misses += 1
            try:
                value = on_miss(compute) if on_miss else compute()
            finally:
                with self._lock:
                    self._inflight.pop(key, None)
            self.put(key, value)
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0


def shared_cache(max_mb: float, max_entries: int, ttl_s: float | None, spinner: str, env: str | None = None):
    """Decorator: cache ``fn(*args)`` (hashable args) in one TraceStore per process.

    ``env`` names an environment variable that overrides ``max_mb``. A hit returns a new list
    (``list(value)``) for list values, so a caller cannot change the cached list itself.
    """

    def deco(fn: Callable) -> Callable:
        import streamlit as st

        budget = float(os.environ.get(env, max_mb)) if env else max_mb

        # One store per decorated function: every ``_store`` has the same code, so st.cache_resource
        # tells them apart only by the name passed in (hashed; defaults would not be). A shared store
        # would also deadlock: a cached function calling another with the same arguments waits for itself.
        store_name = f"{fn.__module__}.{fn.__qualname__}"

        @st.cache_resource(show_spinner=False)
        def _named_store(name: str) -> TraceStore:
            del name  # the cache key
            return TraceStore(int(budget * MB), max_entries, ttl_s)

        def _store() -> TraceStore:
            return _named_store(store_name)

        def with_spinner(compute):
            with st.spinner(spinner):
                return compute()

        def _key(*args, **kwargs) -> Hashable:
            return (args, tuple(sorted(kwargs.items())))

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            key = _key(*args, **kwargs)
            value = _store().get_or_compute(key, lambda: fn(*args, **kwargs), on_miss=with_spinner)
            return list(value) if isinstance(value, list) else value

        def submit(executor, prepare: Callable[[], Callable[[], Any]], *args, **kwargs) -> Future:
            """A Future of ``wrapper(*args, **kwargs)``: a cached value comes back as a done Future; else
            ``prepare()`` runs here and returns the function that computes the value in ``executor`` (no
            spinner). That function must touch no Streamlit (a worker thread has no script context), so
            ``prepare`` looks up what it needs first. A key that another session is computing is waited
            for, not computed twice."""
            store, key = _store(), _key(*args, **kwargs)
            value = store.get(key)
            if value is not None:
                done: Future = Future()
                done.set_result(value)
                return done
            return executor.submit(store.get_or_compute, key, prepare())

        wrapper.store = _store  # type: ignore[attr-defined]
        wrapper.key = _key  # type: ignore[attr-defined]
        # The cached value for these arguments, or None: never computes.
        wrapper.cached = lambda *a, **kw: _store().get(_key(*a, **kw))  # type: ignore[attr-defined]
        wrapper.submit = submit  # type: ignore[attr-defined]
        wrapper.clear = lambda: _store().clear()  # type: ignore[attr-defined]
        return wrapper

    return deco


class FigureCache:
    """Figures built from a trace, kept while that trace object lives (a weak reference: the figure
    never keeps a trace's maps alive), at most ``max_entries``, least recently used out first.

    A rerun that only picks another head rebuilt the whole grid (0.2-0.4 s for a 12 x 12-head model
    at 1,024 tokens); reruns and sessions showing the same trace with the same options now share one
    figure. Figures are read-only once built (st.plotly_chart serialises, it does not change them)."""

    def __init__(self, max_entries: int = 16):
        self.max_entries = max_entries
        self._items: OrderedDict[Hashable, tuple[Any, Any]] = OrderedDict()  # key -> (weakref, figure)
        self._lock = threading.Lock()

    def get(self, owner: Any, key: tuple, build: Callable[[], Any]) -> Any:
        """The figure for (``owner``, ``key``), built by ``build()`` the first time."""
        full = (id(owner), *key)
        with self._lock:
            item = self._items.get(full)
            if item is not None and item[0]() is owner:
                self._items.move_to_end(full)
                return item[1]
        fig = build()
        with self._lock:
            for dead in [k for k, (ref, _) in self._items.items() if ref() is None]:
                del self._items[dead]  # figures of traces that are gone
            self._items[full] = (weakref.ref(owner), fig)
            self._items.move_to_end(full)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)
        return fig


figures = FigureCache()
