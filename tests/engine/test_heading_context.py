"""Heading context in the query engine: a question that names the document's heading gets that document's
sentence first; w = 0 and stores without heading paths are exactly today's path; the pre-retrieval rerank
equals a dense cos + boost (+ heading residual) ranking when every path's rows are in it; the heading residual
puts the answering sentence before one that restates the heading."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qasc.engine.config import RetrievalConfig
from qasc.engine.store import ingest
from qasc.kernels.context import context_boost, heading_gate
from qasc.kernels.signals import ScoringModel
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
    from qasc.engine.query import Engine

    root = tmp_path_factory.mktemp("policies")
    docs = {"a": POLICY.format(site="a.com"), "b": POLICY.format(site="b.com"), "c": BAKING}
    ingest([str(write_corpus(root / "src", docs))], root / "store")
    return Engine.open(str(root / "store"), device="cpu")


RESTATED = ("# Privacy policy of {site}\n\nThis privacy policy of {site} explains how {site} handles your data. "
            "We delete your account data within 30 days after you close your account.\n\n"
            "We use cookies to remember your preferences.\n")


@pytest.fixture(scope="module")
def restated_engine(tmp_path_factory):
    from qasc.engine.query import Engine

    root = tmp_path_factory.mktemp("restated")
    docs = {"a": RESTATED.format(site="a.com"), "b": RESTATED.format(site="b.com")}
    ingest([str(write_corpus(root / "src", docs))], root / "store")
    return Engine.open(str(root / "store"), device="cpu")


@pytest.fixture(scope="module")
def plain_engine(tmp_path_factory):
    from qasc.engine.query import Engine

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
    assert plain_engine.tables.heading_tensors() is None
    params = plain_engine.config.qasc
    on = plain_engine.query(QUESTIONS, params)
    off = plain_engine.query(QUESTIONS, params.replace(context_weight=0.0))
    assert on == off


def test_rerank_equals_dense_cos_plus_boost(policy_engine):
    """With every path's rows in the rerank (5 paths <= CONTEXT_PATHS), the hits are the dense top rows."""
    eng = policy_engine
    q = torch.as_tensor(eng.embedder.encode(QUESTIONS))
    weight, depth = 12.0, 6
    hits, (spread, cref) = eng.retrieval.context_hits(q, depth, ScoringModel(weight, 0.0, 0.0))
    hits_r = eng.retrieval.context_hits(q, depth, ScoringModel(weight, 0.75, 0.0))[0]
    emb = eng.embeddings
    cos = q @ emb.T  # (Q, N)
    heading_emb, row_heading = eng.tables.heading_tensors()[:2]
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
    # the heading residual: each row's cosine loses 0.75 * c * (h . s), h . s from the row's own path
    hs = torch.where(row_heading >= 0, (emb.float() * heading_emb[row_heading.clamp(min=0)]).sum(1), 0.0)
    torch.testing.assert_close(eng.tables.heading_row_dots(), hs)
    score = score - torch.where(path >= 0, 0.75 * c * hs[None, :], 0.0)
    order = np.lexsort((np.arange(eng.n_total)[None, :].repeat(len(q), 0), -score.numpy()), axis=1)[:, :depth]
    np.testing.assert_array_equal(hits_r.numpy(), order)


def test_heading_residual_puts_the_answer_before_the_restated_heading(restated_engine):
    """A question that names the policy: by cosine the sentence restating the heading ("This privacy policy of
    a.com explains ...") and the heading line itself come first; with the default heading residual the sentence
    that answers does, still in the named site's policy (every sentence a candidate and returned)."""
    eng = restated_engine
    every = eng.config.qasc.replace(block_extents="none", focus_gap=None, far_margin=None, score_margin=None,
                                    top_k=None, max_extent=1, percentile=0.0, lexical_weight=0.0)  # the residual alone
    assert every.heading_residual > 0
    question = ["[a.com] What does the privacy policy of a.com say about deleting my account data?"]
    on = eng.query(question, every, WIDE)[0]
    off = eng.query(question, every.replace(heading_residual=0.0), WIDE)[0]
    assert off[0].doc_id == "a" and "explains how" in off[0].text
    assert on[0].doc_id == "a" and on[0].text.startswith("We delete your account data")
    assert [c.text for c in on if c.doc_id == "a"].index(off[0].text) > 0


def test_weight_zero_is_todays_path(policy_engine, monkeypatch):
    """w = 0 never touches the heading code: the same hits as a plain FAISS search, the same sims."""
    eng = policy_engine
    params = eng.config.qasc.replace(context_weight=0.0)
    monkeypatch.setattr(type(eng.retrieval), "context_hits", lambda *a, **k: pytest.fail("context used with w = 0"))
    batch, cand = eng.run_batch(torch.as_tensor(eng.embedder.encode(QUESTIONS)), params, RetrievalConfig())
    assert batch is not None and cand.rows.shape[0] == len(QUESTIONS)


def test_a_pooled_run_takes_the_heading_boost_once(policy_engine):
    """The baking guide's heading matches the question, so every one of its rows is boosted. Pooling boosted
    similarities would count the boost n / ||sum e|| > 1 times in a run of n and lift the pair "Feed the starter
    ... The dough should proof ..." above the answering sentence; the model adds it once per run, so the
    answering sentence alone comes first (runs only, every chunk returned)."""
    every = policy_engine.config.qasc.replace(block_extents="none", focus_gap=None, far_margin=None,
                                              score_margin=None, top_k=None)
    on = policy_engine.query(["How long should the dough proof?"], every, WIDE)[0]
    assert on[0].text.startswith("The dough should proof") and "Feed the starter" not in on[0].text


@pytest.mark.parametrize("kind", ["int8", "bf16"])
def test_low_precision_heading_shortlist_gives_the_same_chunks(policy_engine, monkeypatch, kind):
    """The int8 (CPUs with int8 dot products) and bf16 (native bf16) shortlists of the best heading paths, used on
    large stores, return what the float32 product returns: forced on for this tiny store, every question's chunks
    are the same."""
    import qasc.engine.tables as query_module  # the heading paths' tables live there

    monkeypatch.setattr(query_module, "HEADING_SHORTLIST_MIN_PATHS", 0)
    monkeypatch.setattr(query_module, "cpu_has_int8_dot", lambda: kind == "int8")
    monkeypatch.setattr(query_module, "cpu_has_native_bf16", lambda: kind == "bf16")
    policy_engine.tables._tables.pop(("heading_low",), None)
    try:
        table, scale = policy_engine.tables.heading_low()
        assert table.dtype == (torch.int8 if kind == "int8" else torch.bfloat16)
        assert (scale is not None) == (kind == "int8")
        fast = policy_engine.query(QUESTIONS, retrieval=WIDE)
    finally:
        policy_engine.tables._tables.pop(("heading_low",), None)
    monkeypatch.setattr(query_module, "cpu_has_int8_dot", lambda: False)
    monkeypatch.setattr(query_module, "cpu_has_native_bf16", lambda: False)
    assert policy_engine.tables.heading_low() == (None, None)
    exact = policy_engine.query(QUESTIONS, retrieval=WIDE)
    policy_engine.tables._tables.pop(("heading_low",), None)
    assert [[(c.doc_id, c.char_start, c.char_end) for c in cs] for cs in fast] == \
        [[(c.doc_id, c.char_start, c.char_end) for c in cs] for cs in exact]
    assert all(a.score == pytest.approx(b.score, abs=1e-6) for x, y in zip(fast, exact, strict=True)
               for a, b in zip(x, y, strict=True))
