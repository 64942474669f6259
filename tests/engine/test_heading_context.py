"""Heading context in the query engine: a question that names the document's heading gets that document's
sentence first; w = 0 and stores without heading paths are exactly today's path; the pre-retrieval rerank
equals a dense cos + boost ranking when every path's rows are in it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import RetrievalConfig
from engine.store import ingest
from kernels.context import context_boost, heading_gate
from tests.engine.test_store import write_corpus

pytestmark = pytest.mark.slow

POLICY = ("# Privacy policy of {site}\n\nWe never sell your personal data to advertisers. We collect your email "
          "address and name when you create an account.\n\nWe use cookies to remember your preferences. Payment "
          "details are handled by our payment provider.\n")
BAKING = ("# Sourdough baking guide\n\nFeed the starter twice a day with flour and water. The dough should proof "
          "until it has doubled in size.\n")
WIDE = RetrievalConfig(depth=16, neighbourhood=4)  # every row of these tiny documents is a candidate
QUESTIONS = ["[b.com] Do you sell my data?", "[a.com] Do you sell my personal data?",
             "How long should the dough proof?", "[b.com] What do you collect when I create an account?"]


@pytest.fixture(scope="module")
def policy_engine(tmp_path_factory):
    from engine.query import Engine

    root = tmp_path_factory.mktemp("policies")
    docs = {"a": POLICY.format(site="a.com"), "b": POLICY.format(site="b.com"), "c": BAKING}
    ingest([str(write_corpus(root / "src", docs))], root / "store")
    return Engine.open(str(root / "store"), device="cpu")


@pytest.fixture(scope="module")
def plain_engine(tmp_path_factory):
    from engine.query import Engine

    root = tmp_path_factory.mktemp("plain")
    docs = {"a": POLICY.format(site="a.com").replace("#", ""), "c": BAKING.replace("#", "")}
    ingest([str(write_corpus(root / "src", docs))], root / "store")
    return Engine.open(str(root / "store"), device="cpu")


def _never_sell(chunks, doc_id):
    return [c for c in chunks if c.doc_id == doc_id and "never sell" in c.text]


def test_the_named_heading_wins_by_default_and_not_without_context(policy_engine):
    """Sentences identical but for their document's heading: "[b.com] ..." gets b's sentence first by default;
    with --context-weight 0 the two sentences score the same (runs only, every chunk returned, so no chunk holds
    the differing heading line and no selection rule hides one of them; every row a candidate, so that the
    percentile seeds both sentences)."""
    default = policy_engine.config.qasc
    assert default.context_weight > 0
    first = policy_engine.query([QUESTIONS[0]])[0][0]
    assert first.doc_id == "b" and "never sell" in first.text
    every = default.replace(block_extents="none", focus_gap=None, far_margin=None, score_margin=None, top_k=None)
    on = policy_engine.query([QUESTIONS[0]], every, WIDE)[0]
    assert on[0].doc_id == "b" and "never sell" in on[0].text
    assert all(c.score < on[0].score - 0.05 for c in _never_sell(on, "a"))
    off = policy_engine.query([QUESTIONS[0]], every.replace(context_weight=0.0), WIDE)[0]
    a, b = _never_sell(off, "a"), _never_sell(off, "b")
    assert a and b and a[0].score == pytest.approx(b[0].score, abs=1e-6)  # identical sentences: no preference
    other = policy_engine.query([QUESTIONS[1]], every, WIDE)[0]  # and the other way round
    assert _never_sell(other, "a")[0].score > _never_sell(other, "b")[0].score


def test_store_without_headings_is_unchanged_by_the_weight(plain_engine):
    assert plain_engine.heading_tensors() is None
    params = plain_engine.config.qasc
    on = plain_engine.query(QUESTIONS, params)
    off = plain_engine.query(QUESTIONS, params.replace(context_weight=0.0))
    assert on == off


def test_rerank_equals_dense_cos_plus_boost(policy_engine):
    """With every path's rows in the rerank (5 paths <= CONTEXT_PATHS), the hits are the dense top rows."""
    eng = policy_engine
    q = torch.as_tensor(eng.embedder.encode(QUESTIONS))
    weight, depth = 12.0, 6
    hits, spread, cref = eng.context_hits(q, depth, weight)
    emb = eng.embeddings
    cos = q @ emb.T  # (Q, N)
    heading_emb, row_heading = eng.heading_tensors()[:2]
    path = row_heading.expand_as(cos)
    c = torch.where(path >= 0, (q @ heading_emb.T).gather(1, path.clamp(min=0)), torch.zeros_like(cos))
    pool = cos.topk(min(32, eng.n_total), dim=1).indices
    s_ref, r_ref = heading_gate(c.gather(1, pool), path.gather(1, pool), torch.ones_like(pool, dtype=torch.bool))
    torch.testing.assert_close(spread, s_ref)
    torch.testing.assert_close(cref, r_ref)
    assert (spread[:2] > 0).all()
    score = cos + context_boost(c, path, torch.ones_like(path, dtype=torch.bool), s_ref, r_ref, weight)
    order = np.lexsort((np.arange(eng.n_total)[None, :].repeat(len(q), 0), -score.numpy()), axis=1)[:, :depth]
    np.testing.assert_array_equal(hits.numpy(), order)


def test_weight_zero_is_todays_path(policy_engine, monkeypatch):
    """w = 0 never touches the heading code: the same hits as a plain FAISS search, the same sims."""
    eng = policy_engine
    params = eng.config.qasc.replace(context_weight=0.0)
    monkeypatch.setattr(type(eng), "context_hits", lambda *a, **k: pytest.fail("context used with w = 0"))
    batch, cand = eng.run_batch(torch.as_tensor(eng.embedder.encode(QUESTIONS)), params, RetrievalConfig())
    assert batch is not None and cand.rows.shape[0] == len(QUESTIONS)
