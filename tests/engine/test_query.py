"""The query engine: exact spans, batch == one at a time, token cap, no overlap, every chroma question."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from qasc.engine.config import RetrievalConfig
from qasc.kernels.params import QascParams
from tests.conftest import CHROMA

CHROMA_QUESTIONS = CHROMA / "questions.csv"

pytestmark = pytest.mark.slow

QUESTIONS = [
    "How long should sourdough dough proof?",
    "Who invented the lens used in lighthouses?",
    "How big a solar array do I need?",
    "What do lithium iron phosphate batteries tolerate?",
    "Why does the crust darken?",
]
SETTINGS = [
    QascParams(),
    QascParams(percentile=75, radius=2, top_k=None, snap="paragraph", max_tokens=60),
    QascParams(percentile=60, radius=3, adaptive=True, margin=0.15, clip_to_paragraph=True, top_k=3),
    QascParams(percentile=50, radius=1, gap=2, budget_tokens=120, top_k=None, score="window_mean"),
]


@pytest.fixture(scope="module")
def demo_engine(demo_store):
    from qasc.engine.query import Engine

    return Engine.open(str(demo_store), device="cpu")


def _check_chunks(engine, results, params):
    texts = {d.doc_id: d.text for d in engine.store.docs}
    for chunks in results:
        spans = {}
        for c in chunks:
            assert texts[c.doc_id][c.char_start : c.char_end] == c.text
            assert c.n_tokens <= params.max_tokens
            spans.setdefault(c.doc_id, []).append((c.char_start, c.char_end))
        for doc_spans in spans.values():
            doc_spans.sort()
            for (_, e0), (s1, _) in zip(doc_spans, doc_spans[1:], strict=False):
                assert e0 <= s1, "chunks of one query overlap"
        if params.budget_tokens is not None:
            assert sum(c.n_tokens for c in chunks) <= params.budget_tokens


@pytest.mark.parametrize("params", SETTINGS)
def test_spans_exact_capped_disjoint(demo_engine, params):
    results = demo_engine.query(QUESTIONS, params, RetrievalConfig(depth=6, neighbourhood=3))
    assert len(results) == len(QUESTIONS)
    assert any(results)
    _check_chunks(demo_engine, results, params)


@pytest.mark.parametrize("params", SETTINGS)
def test_batch_equals_one_at_a_time(demo_engine, params):
    retrieval = RetrievalConfig(depth=6, neighbourhood=3)
    batch = demo_engine.query(QUESTIONS, params, retrieval)
    for question, got in zip(QUESTIONS, batch, strict=True):
        alone = demo_engine.query([question], params, retrieval)[0]
        assert [(c.doc_id, c.char_start, c.char_end, c.seed_ids) for c in alone] == [
            (c.doc_id, c.char_start, c.char_end, c.seed_ids) for c in got
        ]
        np.testing.assert_allclose([c.score for c in alone], [c.score for c in got], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("params", SETTINGS)
def test_assembly_equals_reference(demo_engine, params):
    """Engine.query_embedded's chunks (vectorized assembly) are those of the per-chunk loop twin."""
    import torch

    from qasc.engine.assemble import assemble_chunks_reference

    emb = demo_engine.embed_queries(QUESTIONS)
    retrieval = RetrievalConfig(depth=6, neighbourhood=3)
    batch, cand = demo_engine.run_batch(emb, params, retrieval)
    rows = torch.where(cand.valid, cand.rows, torch.zeros_like(cand.rows))
    docs = demo_engine.store.docs
    doc_of = torch.as_tensor(np.repeat(np.arange(len(docs)), [len(d) for d in docs]))
    sent_of = torch.as_tensor(np.concatenate([np.arange(len(d)) for d in docs]))
    want = assemble_chunks_reference(batch, docs, doc_of[rows], sent_of[rows])
    assert any(want)
    assert demo_engine.query_embedded(emb, params.replace(budget_fill=False), retrieval) == want  # no passages


def test_answers_the_obvious(demo_engine):
    results = demo_engine.query(["Who introduced the lens of concentric prisms in 1822?"])
    assert "Fresnel" in results[0][0].text


def test_chroma_general_every_question_answered(chroma_store):
    from qasc.engine.query import Engine

    engine = Engine.open(str(chroma_store), device="cpu")
    with open(CHROMA_QUESTIONS, newline="", encoding="utf-8") as fh:
        questions = [row["question"] for row in csv.DictReader(fh)]
    assert len(questions) == 472
    params = QascParams(top_k=3, radius=1)
    results = engine.query(questions, params)
    assert len(results) == 472 and all(results)
    _check_chunks(engine, results, params)


def test_query_refuses_a_bare_string_none_and_dict_settings(demo_engine):
    """A bare string would be answered character by character; None and dicts failed deep inside."""
    with pytest.raises(TypeError, match=r"got one str; pass \[question\]"):
        demo_engine.query("lens")
    with pytest.raises(TypeError, match="got NoneType"):
        demo_engine.query(None)
    with pytest.raises(TypeError, match="query 1 is int"):
        demo_engine.query(["fine?", 3])
    with pytest.raises(TypeError, match="params must be a QascParams"):
        demo_engine.query(["Who invented the Fresnel lens?"], params={"top_k": 1})
    with pytest.raises(TypeError, match="retrieval must be a RetrievalConfig"):
        demo_engine.query(["Who invented the Fresnel lens?"], retrieval={"depth": 4})
    assert demo_engine.query([]) == []
