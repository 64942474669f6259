"""The host heap: memory freed by Python, numpy and torch goes back to glibc's malloc, which keeps it for reuse (in
each thread's arena too: torch's worker threads allocate in their own), so a process that built a large temporary
keeps it resident. `trim_heap` hands the free pages back to the system (glibc's `malloc_trim(0)`).

The engine calls it where a large temporary has just been freed: after a store is read (the shards' columns) and
after each per-store table is built (the lexical index's counted blocks). Measured at 1M sentences (bench/RESULTS.md,
"The host heap"): 0.08 GiB returned after the store opens, 0.22 GiB after the lexical index is built."""

from __future__ import annotations

import ctypes
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim(size_t pad) -> int, from the process's own symbols; None without glibc (macOS, musl)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Returns the heap's free pages to the system (every arena); True when some memory was released, False when
    none was or the C library has no malloc_trim. Never changes a live object."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
