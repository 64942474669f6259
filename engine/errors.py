"""One exception type for every user-facing failure: the CLI prints its message on one line and exits 2."""

from __future__ import annotations


class QascError(Exception):
    """Bad input, a store that does not match, a corrupted file: what went wrong and where."""


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (at most 300 characters), for one-line errors."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
