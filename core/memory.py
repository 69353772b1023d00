"""Big CPU buffers on huge pages (Linux): fewer page faults for the attention maps of a trace.

A traced forward writes every attention map into two fresh buffers (MiniLM at 2 x 512 tokens: 2 x 150
MB). On Linux each 4 KiB page of fresh memory faults into the kernel on its first write; on a virtual
machine that fault is slow (measured here: ~0.1 s of kernel time per traced pass of 2 x 512 tokens,
a fifth of the pass). ``madvise(MADV_HUGEPAGE)`` on the still-untouched buffer lets the kernel back it
with 2 MiB pages instead, one fault per 512 small ones, when transparent huge pages are allowed
("madvise" or "always" in /sys/kernel/mm/transparent_hugepage/enabled); elsewhere it is a no-op. The
numbers in the buffer are the same either way: this changes how memory is mapped, not what is written.
"""

from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MIN_BYTES = 8 * HUGE_PAGE  # smaller buffers gain little

_madvise = None
if sys.platform.startswith("linux"):
    try:
        _madvise = ctypes.CDLL(None, use_errno=True).madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # no libc symbol: leave memory as it is
        _madvise = None


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask the kernel to back ``t``'s memory with huge pages (call it before writing to ``t``). Returns
    whether the advice was taken: False off Linux, for small or non-CPU tensors, or when refused."""
    nbytes = t.numel() * t.element_size()
    if _madvise is None or t.device.type != "cpu" or nbytes < MIN_BYTES:
        return False
    start = -(-t.data_ptr() // HUGE_PAGE) * HUGE_PAGE  # the whole huge pages inside the buffer
    end = (t.data_ptr() + nbytes) // HUGE_PAGE * HUGE_PAGE
    return end > start and _madvise(start, end - start, MADV_HUGEPAGE) == 0
