"""engine.heap.trim_heap: freed heap memory that malloc keeps (a fragmented heap: every tenth block still alive) is
handed back to the system, and live data is untouched."""

from __future__ import annotations

import numpy as np
import pytest

from qasc.engine.heap import _malloc_trim, trim_heap


def rss_anon() -> int:
    """Bytes of anonymous resident memory (/proc/self/status RssAnon)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(_malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
def test_trim_heap_returns_the_free_pages_of_a_fragmented_heap() -> None:
    trim_heap()
    blocks = [np.full(16 * 1024, i % 251, dtype=np.uint8) for i in range(12_000)]  # 16 KiB each, below mmap's 128
    kept = blocks[::10]  # every tenth block stays alive: the heap cannot shrink from its top alone
    del blocks
    before = rss_anon()
    assert trim_heap()  # ~170 MiB of free chunks between the live ones
    released = before - rss_anon()
    assert released > 100 * 2**20, released
    assert all(int(b[0]) == (10 * i) % 251 and int(b[-1]) == (10 * i) % 251 for i, b in enumerate(kept))


def test_trim_heap_without_malloc_trim_is_a_no_op(monkeypatch) -> None:
    import qasc.engine.heap as heap

    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.trim_heap() is False
