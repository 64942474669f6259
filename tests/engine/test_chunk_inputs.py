"""`engine.chunk` input checks: they run before any model loads, so a bad call costs nothing."""

from __future__ import annotations

import pytest

from qasc.engine.chunker import chunk


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


def test_none_queries_and_non_str_doc_id_are_refused():
    with pytest.raises(TypeError, match="got NoneType"):
        chunk("Some text.", None)
    with pytest.raises(TypeError, match="doc_id must be a str, got int"):
        chunk("Some text.", ["why?"], doc_id=5)


def test_overlong_sentences_are_cut_as_ingest_cuts_them():
    """A sentence beyond the model's window would be embedded from its first tokens only: chunk() cuts it at
    the ingest's sentence cap (128 tokens), so every returned chunk is covered by what was embedded."""
    text = "word " * 2000  # no sentence end: one 2,000-token sentence before the cap
    chunks = chunk(text, ["word"])[0]
    assert chunks and all(c.n_tokens <= 128 * (c.sentence_end - c.sentence_start + 1) for c in chunks)
    assert max(c.sentence_end for c in chunks) >= 1  # cut into several sentences
