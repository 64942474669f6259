"""`engine.chunk` input checks: they run before any model loads, so a bad call costs nothing."""

from __future__ import annotations

import pytest

from engine.chunker import chunk


@pytest.mark.parametrize("text", [b"bytes are not text", None, 42])
def test_text_must_be_str(text):
    with pytest.raises(TypeError, match="text must be a str"):
        chunk(text, ["a question?"])


def test_a_bare_string_is_not_a_query_list():
    with pytest.raises(TypeError, match=r"got one str; pass \[question\]"):
        chunk("Some text.", "Why")


def test_generator_queries_are_read_once_and_checked():
    with pytest.raises(ValueError, match="query 1 is ''"):
        chunk("Some text.", (q for q in ["fine?", ""]))
