"""The C allocator's settings for a process that makes and drops many mid-sized numpy arrays.

The upload works on chunks of 2^17 reports: each numpy step makes a temporary of 0.1-1 MB and drops
it. glibc serves an allocation above its mmap threshold (128 kB, raised as such blocks are freed)
with a fresh mapping, and gives memory above its trim threshold back to the system when it is
freed: the next chunk's arrays then fault in every page again. On the benchmark's machine (a VM)
that was most of the check pass's CPU time: the check of 10^6 reports took ~0.1 s with the
defaults and ~0.03 s with the settings below (same code, ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` set in the environment).

:func:`keep_freed_memory` sets them for the process (``mallopt``): blocks below ``MMAP_BYTES`` come
from the heap, and up to ``TRIM_BYTES`` of freed heap stay with the process for the next chunk. The
resident memory stays what the process used at its peak (memory not in use is only kept, not
touched again). Not glibc (macOS, musl): nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_freed_memory"]

MMAP_BYTES = 8 << 20
TRIM_BYTES = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_done: list[bool] = []


def keep_freed_memory() -> bool:
    """Set the thresholds (once per process); whether the C library took them."""
    if _done:
        return _done[0]
    took = False
    try:
        name = ctypes.util.find_library("c")
        mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
        if mallopt is not None and hasattr(ctypes.CDLL(name), "gnu_get_libc_version"):
            took = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(
                mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES)
            )
    except OSError:
        took = False
    _done.append(took)
    return took
