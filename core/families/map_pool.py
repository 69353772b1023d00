"""Recycled memory for the attention maps of traced passes (CPU).

A traced pass writes every attention map into fresh memory: at 512 tokens, MiniLM's two-sequence
batch has 151 MB of scores and 151 MB of probabilities. Fresh memory from the operating system
is faulted in and zeroed page by page on first write, which costs about a quarter of such a
traced pass on a small virtual machine (``bench/map_pool.py``). The pool keeps the blocks of
traces that are gone and hands them to the next traced pass, so those pages are written
without the kernel's faults.

A block is free when nothing uses it any more. Each block is owned by one numpy array of
bytes. Every tensor or array made from the block holds one reference to that owner, through
the torch storage that ``torch.from_numpy`` made of it. So the owner's reference count falls
back to the pool's own when the last map is gone. Nothing is handed out twice: a block is
reused only once its count shows no user. Handing out and the free test both run under one
lock, so two threads tracing at once never get the same block.

The pool is off until ``configure`` sets how many bytes of free blocks it may keep (the
dashboard turns it on, ``ATTNSCOPE_MAP_POOL_MB``). While it is off, ``empty`` is
``torch.empty``. Free blocks beyond that budget are given back to the operating system at
the next allocation or ``trim``. Blocks in use are the business of whoever holds the traces
(the dashboard's caches bound those).
"""

from __future__ import annotations

import math
import mmap
import sys
import threading

import numpy as np
import torch

MIN_BYTES = 16 * 2**20  # smaller buffers: the allocator's own free lists already reuse them
FIT = 1.25  # a free block serves a request of at least 1/FIT of its size (no big block for a small trace)
ALIGN = 64  # bytes: the alignment torch's CPU allocator gives


def _block(nbytes: int) -> np.ndarray:
    """Fresh memory for a block: a private anonymous mapping (where there is one) with the system's
    ordinary pages, as torch's allocator gets them. numpy's own allocation asks for huge pages, which
    on a VM short of free 2 MB pages made a fresh process's first traced pass up to 1.3x slower."""
    private, anonymous = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)
    if private is None or anonymous is None:
        return np.empty(nbytes, dtype=np.uint8)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=private | anonymous), dtype=np.uint8)


class MapPool:
    """Blocks of memory for map buffers; see the module's docstring."""

    def __init__(self, keep_bytes: int = 0):
        self.keep_bytes = int(keep_bytes)
        self._blocks: list[np.ndarray] = []  # owners, each np.uint8 (nbytes + ALIGN,)
        self._lock = threading.Lock()
        self.reused = 0  # blocks handed out again (for tests and benchmarks)
        self.created = 0
        self._idle = self._idle_refs() if hasattr(sys, "getrefcount") else None  # (PyPy: the pool stays off)
        if self._idle is None:
            self.keep_bytes = 0

    @staticmethod
    def _refs(blocks: list[np.ndarray], i: int) -> int:
        return sys.getrefcount(blocks[i])

    def _idle_refs(self) -> int:
        """The reference count ``_refs`` reads for a block that only the pool holds."""
        probe = [np.empty(1, dtype=np.uint8)]
        return self._refs(probe, 0)

    def _free(self) -> list[int]:
        idle = self._idle
        if idle is None:  # no reference counts here: the pool is off and holds no block
            return []
        return [i for i in range(len(self._blocks)) if self._refs(self._blocks, i) <= idle]

    def configure(self, keep_bytes: int) -> None:
        """Keep at most ``keep_bytes`` of free blocks (0: the pool is off; its free blocks are dropped)."""
        with self._lock:
            self.keep_bytes = max(0, int(keep_bytes)) if self._idle is not None else 0
            self._trim(self.keep_bytes)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """An uninitialised tensor like ``torch.empty(shape, dtype=dtype, device=device)``, on a
        recycled block when the pool is on, the device is the CPU and the tensor is big."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        need = math.prod(shape) * itemsize
        if self.keep_bytes <= 0 or torch.device(device).type != "cpu" or need < MIN_BYTES:
            return torch.empty(shape, dtype=dtype, device=device)
        with self._lock:
            free = self._free()
            fits = [i for i in free if need <= self._size(i) <= need * FIT]
            if fits:
                i = min(fits, key=self._size)
                owner = self._blocks[i]
                self.reused += 1
            else:
                owner = _block(need + ALIGN)
                self._blocks.append(owner)
                self.created += 1
            # The tensor's storage is the requested bytes only, not the whole block (whose tail may hold an
            # earlier trace's maps: torch.save of a view writes its whole storage). from_numpy takes the
            # reference that marks the block as used: the region's base is the owner (checked; else the
            # storage is the whole owner, which is always safe).
            start = (-owner.ctypes.data) % ALIGN
            region = owner[start : start + need]
            if region.base is owner:
                out = torch.from_numpy(region)
            else:
                out = torch.from_numpy(owner)[start : start + need]
            out = out.view(dtype).view(shape)
            self._trim(self.keep_bytes)
        return out

    def _size(self, i: int) -> int:
        return self._blocks[i].nbytes - ALIGN

    def _trim(self, keep: int) -> int:
        """Drop free blocks, largest first, until at most ``keep`` bytes of them are left. Lock held."""
        free = sorted(self._free(), key=self._size, reverse=True)
        total = sum(self._size(i) for i in free)
        drop = set()
        for i in free:
            if total <= keep:
                break
            drop.add(i)
            total -= self._size(i)
        if drop:
            self._blocks = [b for i, b in enumerate(self._blocks) if i not in drop]
        return len(drop)

    def trim(self) -> int:
        """Give free blocks beyond the budget back to the operating system; returns how many."""
        with self._lock:
            return self._trim(self.keep_bytes)

    def stats(self) -> dict[str, int]:
        """Blocks and bytes held, free and in use."""
        with self._lock:
            free = set(self._free())
            sizes = [self._size(i) for i in range(len(self._blocks))]
        return {
            "blocks": len(sizes),
            "free_blocks": len(free),
            "free_bytes": sum(s for i, s in enumerate(sizes) if i in free),
            "used_bytes": sum(s for i, s in enumerate(sizes) if i not in free),
            "reused": self.reused,
            "created": self.created,
        }


POOL = MapPool()  # the process's pool (off until configured)


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``POOL.empty``: map buffers for core models' traced passes."""
    return POOL.empty(shape, dtype, device)
