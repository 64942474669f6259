"""One exception type for every user-facing failure: the CLI prints its message on one line and exits 2."""

from __future__ import annotations


class QascError(Exception):
    """Bad input, a store that does not match, a corrupted file: what went wrong and where."""
