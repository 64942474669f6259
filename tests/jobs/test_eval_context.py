"""`qasc eval`'s "+ same context" baselines: chunks ranked by cos + QASC's heading boost and heading residual."""

from __future__ import annotations

import numpy as np
import pytest

from qasc.jobs.eval.context import chunk_paths, context_ranked, path_vectors
from qasc.jobs.eval.retrieval import ChunkSet

BODY = "We never sell your personal data to advertisers."
DOCS = {"a": f"# Privacy policy of a.com\n\n{BODY}\n", "b": f"# Privacy policy of b.com\n\n{BODY}\n",
        "c": "Plain notes without a heading. Bread needs a long proof."}


def _chunks(embedder) -> ChunkSet:
    spans = [("a", 0, 24), ("a", 26, 26 + len(BODY)), ("b", 0, 24), ("b", 26, 26 + len(BODY)), ("c", 0, 30),
             ("c", 31, 57)]
    texts = [DOCS[d][s:e] for d, s, e in spans]
    return ChunkSet("test", [d for d, _, _ in spans], np.array([s for _, s, _ in spans]),
                    np.array([e for _, _, e in spans]), np.full(len(spans), 8, np.int32),
                    np.asarray(embedder.encode(texts), np.float32))


def test_chunk_paths_are_the_heading_at_the_chunk_start(embedder):
    chunks = _chunks(embedder)
    paths, ids = chunk_paths(chunks, DOCS)
    assert [paths[i] if i >= 0 else None for i in ids] == [
        "Privacy policy of a.com", "Privacy policy of a.com", "Privacy policy of b.com", "Privacy policy of b.com",
        None, None]
    vecs = path_vectors(paths, None, embedder)  # no store: embedded here
    np.testing.assert_allclose(vecs, embedder.encode(paths), atol=1e-6)


def test_context_ranks_the_named_documents_chunk_first(embedder):
    chunks = _chunks(embedder)
    paths, ids = chunk_paths(chunks, DOCS)
    vecs = path_vectors(paths, None, embedder)
    q = embedder.encode(["[b.com] Do you sell my data?"])
    plain = context_ranked(chunks, q, ids, vecs, 0.0, 6)[0]
    cos = (q @ chunks.emb.T)[0]
    np.testing.assert_allclose([h[4] for h in plain], sorted(cos.tolist(), reverse=True), atol=1e-6)  # w = 0
    a_body, b_body = ([h for h in plain if h[0] == d and h[1] == 26][0] for d in ("a", "b"))
    assert abs(a_body[4] - b_body[4]) < 1e-6  # identical sentences tie without context
    boosted = context_ranked(chunks, q, ids, vecs, 12.0, 6)[0]
    rank = {(h[0], h[1]): i for i, h in enumerate(boosted)}
    assert rank[("b", 26)] < rank[("a", 26)] and rank[("b", 0)] < rank[("a", 0)]
    no_heads = context_ranked(chunks, q, np.full(len(chunks), -1), vecs, 12.0, 6)[0]
    assert no_heads == plain  # no chunk under a heading: the boost is 0


def test_context_residual_takes_the_heading_part_off_each_chunk(embedder):
    """residual beta: each chunk under a heading loses beta * c * (h . chunk), exactly (the engine's rule)."""
    chunks = _chunks(embedder)
    paths, ids = chunk_paths(chunks, DOCS)
    vecs = path_vectors(paths, None, embedder)
    q = embedder.encode(["[b.com] Do you sell my data?"])
    boosted = {(h[0], h[1]): h[4] for h in context_ranked(chunks, q, ids, vecs, 12.0, 6)[0]}
    resid = {(h[0], h[1]): h[4] for h in context_ranked(chunks, q, ids, vecs, 12.0, 6, 0.75)[0]}
    for i, key in enumerate(zip(chunks.doc_ids, chunks.starts.tolist(), strict=True)):
        if ids[i] < 0:
            assert resid[key] == boosted[key]
            continue
        c, hs = float(q[0] @ vecs[ids[i]]), float(chunks.emb[i] @ vecs[ids[i]])
        assert resid[key] == pytest.approx(boosted[key] - 0.75 * c * hs, abs=1e-5)


def test_context_adds_the_same_lexical_term(embedder):
    """The baselines get QASC's lexical term: + alpha * BM25(chunk text) / best, for every query; with the heading
    context on, a chunk's own heading words do not count (the engine's rule)."""
    from qasc.engine.lexical import LexicalIndex
    from qasc.jobs.eval.context import Lexical

    chunks = _chunks(embedder)
    paths, ids = chunk_paths(chunks, DOCS)
    vecs = path_vectors(paths, None, embedder)
    question = "Does bread need a long proof?"
    q = embedder.encode([question])
    texts = [DOCS[d][s:e] for d, s, e in zip(chunks.doc_ids, chunks.starts.tolist(), chunks.ends.tolist(), strict=True)]
    plain = {(h[0], h[1]): h[4] for h in context_ranked(chunks, q, ids, vecs, 0.0, 6)[0]}
    lex = {(h[0], h[1]): h[4] for h in context_ranked(chunks, q, ids, vecs, 0.0, 6, 0.0,
                                                      Lexical(0.8, [question], texts))[0]}
    index = LexicalIndex.build(texts)
    ptr, terms, best = index.query_terms([question])
    bm25 = index.dense_scores(ptr, terms)[0].numpy()
    for i, key in enumerate(zip(chunks.doc_ids, chunks.starts.tolist(), strict=True)):
        assert lex[key] == pytest.approx(plain[key] + 0.8 * bm25[i] / float(best[0]), abs=1e-5)
    assert bm25.max() > 0
    # with the heading context, a chunk's own heading words leave its BM25 ("privacy", "policy" under the policies)
    from qasc.engine.lexical import terms as terms_of

    question = "Does the privacy policy say bread needs a long proof?"
    q = embedder.encode([question])
    boosted = {(h[0], h[1]): h[4] for h in context_ranked(chunks, q, ids, vecs, 12.0, 6)[0]}
    headed = {(h[0], h[1]): h[4] for h in context_ranked(chunks, q, ids, vecs, 12.0, 6, 0.0,
                                                         Lexical(0.8, [question], texts, paths))[0]}
    ptr, q_terms, best = index.query_terms([question])
    asked = set(q_terms.tolist())
    lifted = 0
    for i, key in enumerate(zip(chunks.doc_ids, chunks.starts.tolist(), strict=True)):
        said = {index.vocab[t] for t in terms_of(paths[ids[i]]) if t in index.vocab} if ids[i] >= 0 else set()
        a, b = int(index.row_ptr[i]), int(index.row_ptr[i + 1])
        want = sum(float(w) for t, w in zip(index.row_terms[a:b].tolist(), index.row_weights[a:b].tolist(),
                                            strict=True) if t in asked and t not in said)
        assert headed[key] == pytest.approx(boosted[key] + 0.8 * want / float(best[0]), abs=1e-5)
        lifted += want > 0
    assert lifted > 0 and any(p.lower().startswith("privacy policy") for p in paths)
