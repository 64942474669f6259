"""The gated lexical term: BM25 weights by hand on a tiny corpus, the dense product equals the candidate gather,
and in the engine (real model) the term moves a sentence that shares the question's rare words to the top,
equals alpha * BM25 / best on every candidate row, is off where the headings name the subject, and is left out
for queries given as vectors only."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qasc.engine.config import RetrievalConfig
from qasc.engine.errors import QascError
from qasc.engine.lexical import BM25_B, BM25_K1, LexicalIndex, terms
from qasc.kernels.lexical import lexical_scores
from qasc.kernels.params import QascParams

TEXTS = ["The cat sat on the mat.", "A dog and a cat.", "Dogs bark; cats purr, cats sleep.", "", "The the the."]


def test_terms_drop_stop_words_and_keep_letter_digit_runs() -> None:
    assert terms("The QX7 model, sold in Norway's north_east!") == ["qx7", "model", "sold", "norway", "s", "north",
                                                                    "east"]


def test_bm25_weights_by_hand() -> None:
    index = LexicalIndex.build(TEXTS)
    dl = [3, 2, 6, 0, 0]  # cat sat mat | dog cat | dogs bark cats purr cats sleep | (none) | (stop words only)
    avgdl = sum(dl) / len(dl)
    n = len(TEXTS)
    idf_cat = math.log1p((n - 2 + 0.5) / (2 + 0.5))  # 'cat' in rows 0 and 1
    idf_cats = math.log1p((n - 1 + 0.5) / (1 + 0.5))
    ptr = index.row_ptr.tolist()
    row1 = dict(zip((index.row_terms[ptr[1] : ptr[2]]).tolist(), index.row_weights[ptr[1] : ptr[2]].tolist(),
                    strict=True))
    want = idf_cat * (BM25_K1 + 1) * 1 / (1 + BM25_K1 * (1 - BM25_B + BM25_B * dl[1] / avgdl))
    assert row1[index.vocab["cat"]] == pytest.approx(want, rel=1e-5)
    row2 = dict(zip((index.row_terms[ptr[2] : ptr[3]]).tolist(), index.row_weights[ptr[2] : ptr[3]].tolist(),
                    strict=True))
    want2 = idf_cats * (BM25_K1 + 1) * 2 / (2 + BM25_K1 * (1 - BM25_B + BM25_B * dl[2] / avgdl))
    assert row2[index.vocab["cats"]] == pytest.approx(want2, rel=1e-5)
    assert ptr[3] == ptr[4] == ptr[5]  # empty and stop-word-only rows hold no terms
    ptr_q, q_terms, best = index.query_terms(["cat on a unicorn", "the", "cats cats"])
    assert ptr_q.tolist() == [0, 1, 1, 2]  # unknown and stop words dropped, duplicates once
    assert best.tolist() == pytest.approx([idf_cat * (BM25_K1 + 1), 0.0, idf_cats * (BM25_K1 + 1)], rel=1e-5)


@pytest.mark.parametrize("block_rows", [1, 2, 3, 7])
def test_the_build_by_blocks_equals_one_block(block_rows) -> None:
    """Blocks are counted, then written into the index one at a time: the same arrays whatever the block size
    (rows with no terms at block edges included)."""
    rng = np.random.default_rng(block_rows)
    words = ["alpha", "beta", "gamma", "delta", "the", "of", "x1", "zeta"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 9)))) for _ in range(23)] + TEXTS
    whole, parts = LexicalIndex.build(texts, block_rows=10**6), LexicalIndex.build(texts, block_rows=block_rows)
    assert whole.vocab == parts.vocab and np.array_equal(whole.idf, parts.idf)
    for name in ("row_ptr", "row_terms", "row_weights"):
        assert torch.equal(getattr(whole, name), getattr(parts, name)), name
    assert parts.n_rows == len(texts)


def test_dense_scores_equal_the_candidate_gather() -> None:
    index = LexicalIndex.build(TEXTS * 3)
    ptr, q_terms, _ = index.query_terms(["cat dog", "purr sleep bark", "mat", "nothing known"])
    dense = index.dense_scores(ptr, q_terms)
    rows = torch.arange(index.n_rows).expand(4, -1).contiguous()
    gathered = lexical_scores(index.row_ptr, index.row_terms, index.row_weights, ptr, q_terms, index.vocab_size,
                              rows, torch.ones_like(rows, dtype=torch.bool))
    torch.testing.assert_close(dense, gathered)
    assert bool((dense[3] == 0).all()) and bool((dense[0] > 0).any())


# ------------------------------------------------------------------------------------- engine (real model)

PLAIN = ("Our support team answers every message within two working days.\n\n"
         "Replacement parts are shipped from the central warehouse.\n\n"
         "Firmware build QX7 was withdrawn after overheating reports.\n\n"
         "Customers can track an order from their account page.\n")
WIDE = RetrievalConfig(depth=16, neighbourhood=4)  # every row of the tiny document is a candidate
QUESTION = "How long does support take to reply about QX7?"  # by cosine: the support-team sentence


@pytest.fixture(scope="module")
def plain_engine(tmp_path_factory):
    from qasc.engine.query import Engine
    from qasc.engine.store import ingest
    from tests.engine.test_store import write_corpus

    root = tmp_path_factory.mktemp("lexical")
    ingest([str(write_corpus(root / "src", {"a": PLAIN, "b": PLAIN.replace("QX7", "ZR2")}))], root / "store")
    return Engine.open(str(root / "store"), device="cpu")


def _sentences(params: QascParams) -> QascParams:
    return params.replace(max_extent=1, clip_to_paragraph=False, block_extents="none", length_bonus=0.0,
                          focus_gap=None, far_margin=None, top_k=3, score_margin=None)


@pytest.mark.slow
def test_the_term_lifts_the_sentence_with_the_rare_words(plain_engine) -> None:
    base = _sentences(plain_engine.config.qasc)
    off = plain_engine.query([QUESTION], base.replace(lexical_weight=0.0), WIDE)[0]
    on = plain_engine.query([QUESTION], base.replace(lexical_weight=0.8), WIDE)[0]
    assert "support team" in off[0].text
    assert "QX7" in on[0].text and on[0].doc_id == "a"


@pytest.mark.slow
def test_the_boost_is_alpha_bm25_over_best_on_every_candidate(plain_engine, monkeypatch) -> None:
    import qasc.engine.query as engine_query

    seen = []
    real = engine_query.run_qasc
    monkeypatch.setattr(engine_query, "run_qasc", lambda sims, *a, **k: (seen.append(sims), real(sims, *a, **k))[1])
    base = _sentences(plain_engine.config.qasc).replace(top_k=None)
    emb = plain_engine.embed_queries([QUESTION])
    _, cand = plain_engine.run_batch(emb, base.replace(lexical_weight=0.0), WIDE)
    _, cand2 = plain_engine.run_batch(emb, base.replace(lexical_weight=0.8), WIDE,
                                      questions=[QUESTION])
    assert torch.equal(cand.rows, cand2.rows) and len(seen) == 2
    index = plain_engine.tables.lexical_index()
    ptr, q_terms, best = index.query_terms([QUESTION])
    dense = index.dense_scores(ptr, q_terms)[0]
    rows = torch.where(cand.valid, cand.rows, torch.zeros_like(cand.rows))[0]
    valid = cand.valid[0]
    want = 0.8 * dense[rows] / best[0]
    torch.testing.assert_close((seen[1] - seen[0])[0][valid], want[valid])
    assert float(want[valid].max()) > 0


@pytest.mark.slow
def test_the_signal_is_bm25_over_best_for_every_query(plain_engine) -> None:
    """The engine's lexical signal of any rows equals the sparse BM25 of those rows over each query's best."""
    base = _sentences(plain_engine.config.qasc)
    term = plain_engine.signals.lexical_term(base.replace(lexical_weight=0.8), [QUESTION, "purr", QUESTION], 3)
    rows = torch.arange(plain_engine.n_total).expand(3, -1)
    valid = torch.ones_like(rows, dtype=torch.bool)
    valid[2, ::2] = False
    index = plain_engine.tables.lexical_index()
    full = lexical_scores(index.row_ptr, index.row_terms, index.row_weights, term.query_ptr, term.query_terms,
                          index.vocab_size, rows, valid)
    got = plain_engine.signals.lexical_signal(term, rows, valid)
    scale = torch.where(term.best > 0, 1 / term.best.clamp(min=1e-12), torch.zeros_like(term.best))
    torch.testing.assert_close(got, full * scale[:, None])
    assert float(got[0].max()) > 0 and float(got[2][::2].abs().sum()) == 0


@pytest.mark.slow
def test_vectors_without_texts_leave_the_term_out(plain_engine) -> None:
    emb = plain_engine.embed_queries([QUESTION])
    base = _sentences(plain_engine.config.qasc)
    on, off = base.replace(lexical_weight=0.8), base.replace(lexical_weight=0.0)
    assert plain_engine.query_embedded(emb, on, WIDE) == plain_engine.query_embedded(emb, off, WIDE)
    with pytest.raises(QascError, match="2 question texts for 1 query vectors"):
        plain_engine.query_embedded(emb, on, WIDE, questions=[QUESTION, QUESTION])
    got = plain_engine.query_embedded(emb, on, WIDE, questions=[QUESTION])
    assert got == plain_engine.query([QUESTION], on, WIDE)
    assert got != plain_engine.query_embedded(emb, off, WIDE)
    assert np.isfinite([c.score for c in got[0]]).all()


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3, 100])
def test_lexical_rows_scores_only_the_best_rows_by_the_other_signals(plain_engine, k) -> None:
    """score_rows(lexical_rows=k) (the heading rerank's, engine.retrieval.LEXICAL_RERANK_ROWS): rows at least as
    good as a query's k-th best by the other signals score exactly as with the term on every row, the others
    exactly as without it."""
    from qasc.kernels.signals import ScoringModel

    questions = [QUESTION, "track an order", QUESTION]
    query = plain_engine.embed_queries(questions)
    rows = torch.arange(plain_engine.n_total).expand(3, -1).contiguous()
    valid = torch.ones_like(rows, dtype=torch.bool)
    valid[2, ::2] = False
    term = plain_engine.signals.lexical_term(QascParams(), questions, 3)
    model = ScoringModel()
    full = plain_engine.signals.score_rows(query, rows, valid, model, None, term).total
    other = plain_engine.signals.score_rows(query, rows, valid, model, None, None).total
    got = plain_engine.signals.score_rows(query, rows, valid, model, None, term, lexical_rows=k).total
    masked = torch.where(valid, other, torch.full_like(other, float("-inf")))
    kth = masked.topk(min(k, rows.shape[1]), dim=1).values[:, -1:]
    best = valid & (masked >= kth) if k < rows.shape[1] else valid
    assert torch.equal(got[best], full[best]) and torch.equal(got[~best], other[~best])
    assert int(best[0].sum()) >= min(k, int(valid[0].sum())) and bool((full[0] > other[0]).any())
