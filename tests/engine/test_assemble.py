"""Vectorized assembly (engine/assemble.py) against its per-chunk loop twin: random ragged batches (empty and
one-sentence documents, chunks sharing a piece, seeds outside any chunk), real QASC batches of a synthetic
store, and the Arrow batches of Engine.query_batches against Engine.query_embedded's chunks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qasc.engine.assemble import RowTable, assemble_chunks, assemble_chunks_reference, assemble_columns
from qasc.engine.columns import RESULT_COLUMNS, results_schema
from qasc.engine.config import RetrievalConfig
from qasc.engine.types import Sentences
from qasc.kernels.params import QascParams
from qasc.kernels.pipeline import QascBatch


def _docs(rng: np.random.Generator, n_docs: int) -> list[Sentences]:
    docs = []
    for d in range(n_docs):
        n = int(rng.choice([0, 1, int(rng.integers(2, 7))]))  # empty and one-sentence documents included
        words = rng.integers(1, 5, size=n)
        parts, starts, ends, pos = [], [], [], 0
        for i, w in enumerate(words.tolist()):
            sentence = " ".join(f"d{d}s{i}w{j}é" for j in range(w)) + "."
            starts.append(pos)
            ends.append(pos + len(sentence))
            parts.append(sentence)
            pos += len(sentence) + 1
        arr = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
        docs.append(Sentences(f"doc{d}", " ".join(parts), arr(starts), arr(ends), np.zeros(n, np.int32),
                              np.zeros(n, np.int32), np.full(n, 3, np.int32)))
    return docs


def _random_batch(rng: np.random.Generator, docs: list[Sentences], q: int, length: int, k: int):
    """A QascBatch over (q, length) positions whose rows are sorted global rows (chunks stay inside one document)
    -> (batch, rows (q, length) int64)."""
    n = sum(len(d) for d in docs)
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    rows = np.sort(rng.integers(0, max(n, 1), size=(q, length)), axis=1) if n else np.zeros((q, 0), np.int64)
    length = rows.shape[1]
    start = np.zeros((q, k), np.int64)
    end = np.zeros((q, k), np.int64)
    chosen = rng.random((q, k)) < 0.7 if length else np.zeros((q, k), bool)
    for i in range(q):
        for j in range(k):
            if length:
                s = int(rng.integers(0, length))
                same = np.flatnonzero(doc_of[rows[i]] == doc_of[rows[i, s]])
                start[i, j], end[i, j] = s, int(rng.choice(same[same >= s]))
    t = torch.as_tensor
    batch = QascBatch(
        start=t(start), end=t(end), score=t(rng.standard_normal((q, k)).astype(np.float32)),
        tokens=t(rng.integers(1, 50, size=(q, k))), chosen=t(chosen), piece=t(rng.integers(0, k + 2, size=(q, k))),
        labels=t(rng.integers(-1, k + 2, size=(q, length))), kept=t(rng.random((q, length)) < 0.4),
        tau=t(np.zeros(q, np.float32)),
    )
    return batch, rows


@settings(max_examples=200, deadline=None, database=None)
@given(seed=st.integers(0, 2**32 - 1), n_docs=st.integers(0, 5), q=st.integers(0, 4), length=st.integers(1, 9),
       k=st.integers(0, 4))
def test_assemble_equals_reference(seed, n_docs, q, length, k):
    rng = np.random.default_rng(seed)
    docs = _docs(rng, n_docs)
    batch, rows = _random_batch(rng, docs, q, length, k)
    table = RowTable.from_docs(docs)
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    sent_of = np.concatenate([np.arange(len(d)) for d in docs]) if docs else np.zeros(0, np.int64)
    want = assemble_chunks_reference(batch, docs, torch.as_tensor(doc_of[rows]), torch.as_tensor(sent_of[rows]))
    assert assemble_chunks(batch, torch.as_tensor(rows), table) == want
    cols = assemble_columns(batch, rows, table)
    ids = pa.array([f"q{i}" for i in range(q)], pa.string())
    got = cols.to_record_batch(ids, table.doc_id_array)
    assert got.schema.equals(results_schema())
    expect = [{"query_id": f"q{i}", "rank": r, "doc_id": c.doc_id, "char_start": c.char_start, "char_end": c.char_end,
               "score": c.score, "text": c.text, "n_tokens": c.n_tokens, "seed_ids": list(c.seed_ids),
               "sentence_start": c.sentence_start, "sentence_end": c.sentence_end}
              for i, chunks in enumerate(want) for r, c in enumerate(chunks)]
    assert got.to_pylist() == expect
    assert tuple(got.schema.names) == RESULT_COLUMNS


@pytest.fixture(scope="module")
def synthetic_engine():
    from bench.query import synthetic_engine

    return synthetic_engine(3000, "cpu", "torch", with_model=False)


def _queries(engine, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.as_tensor(engine.store.embeddings)[torch.randint(0, engine.n_total, (n,), generator=g)].float()
    return torch.nn.functional.normalize(base + 0.6 * torch.randn(base.shape, generator=g), dim=1)


@pytest.mark.parametrize("params", [
    QascParams(),
    QascParams(max_extent=1, clip_to_paragraph=False, merge_picks=True, min_seeds=16, block_extents="none"),
    QascParams(top_k=None, max_tokens=60, block_extents="paragraph"),
    QascParams(max_extent=3, budget_tokens=120, top_k=None),
])
def test_engine_batches_equal_reference(synthetic_engine, params):
    """Real QASC batches (the default, the context preset's sentences, blocks under a small cap, a budget):
    assembly == the loop twin."""
    eng = synthetic_engine
    batch, cand = eng.run_batch(_queries(eng, 40), params, RetrievalConfig(depth=8, neighbourhood=3))
    rows = torch.where(cand.valid, cand.rows, torch.zeros_like(cand.rows))
    docs = eng.store.docs
    doc_of = torch.as_tensor(np.repeat(np.arange(len(docs)), [len(d) for d in docs]))
    sent_of = torch.as_tensor(np.concatenate([np.arange(len(d)) for d in docs]))
    want = assemble_chunks_reference(batch, docs, doc_of[rows], sent_of[rows])
    assert sum(map(len, want)) > 0
    assert assemble_chunks(batch, rows, eng.row_table) == want


def test_query_batches_are_the_chunks_as_rows(synthetic_engine):
    """query_batches: one RecordBatch per slice, whose rows are query_embedded's chunks (query order, rank)."""
    from qasc.jobs.results import to_table

    eng, q = synthetic_engine, _queries(synthetic_engine, 23, seed=1)
    ids = [f"id{i}" for i in range(23)]
    batches = list(eng.query_batches(q, ids, slice_size=5))
    assert len(batches) == 5 and all(b.schema.equals(results_schema()) for b in batches)
    got = pa.Table.from_batches(batches)
    want = to_table(eng.query_embedded(q, slice_size=5), ids)
    assert got.to_pylist() == want.to_pylist()
    with pytest.raises(Exception, match="3 query ids for 23"):
        next(eng.query_batches(q, ids[:3]))


def test_chunk_sentences_spans_and_seeds():
    """engine.chunk's in-memory path (one document, positions = sentence indices) through the vectorized
    assembly: exact spans, seeds inside their chunk, ranks by score."""
    from qasc.engine.chunker import chunk_sentences
    from qasc.engine.config import EngineConfig

    rng = np.random.default_rng(3)
    doc = _docs(rng, 1)[0]
    while len(doc) < 2:
        doc = _docs(rng, 1)[0]
    emb = torch.nn.functional.normalize(torch.randn(len(doc), 16, generator=torch.Generator().manual_seed(0)), dim=1)
    for max_extent in (1, 2):
        config = EngineConfig(qasc=QascParams(max_extent=max_extent, top_k=None, score_margin=None, focus_gap=None))
        results = chunk_sentences(doc, emb, emb[:2] + 0.1, config)
        assert len(results) == 2 and all(results)
        for chunks in results:
            assert [c.score for c in chunks] == sorted((c.score for c in chunks), reverse=True)
            for c in chunks:
                assert c.text == doc.text[c.char_start : c.char_end] and c.doc_id == doc.doc_id
                assert c.char_start == doc.char_start[c.sentence_start] and c.char_end == doc.char_end[c.sentence_end]
                assert c.seed_ids and all(c.sentence_start <= s <= c.sentence_end for s in c.seed_ids)


def test_search_blocks_do_not_change_results(synthetic_engine, monkeypatch):
    """query_columns searches whole slices at once (SEARCH_BLOCK_QUERIES): any block, one slice at a time or all
    queries in one, gives the same chunks."""
    import qasc.engine.query as query_mod

    eng, q = synthetic_engine, _queries(synthetic_engine, 23, seed=2)
    want = eng.query_embedded(q, slice_size=23)
    for block in (1, 5, 12, 1000):
        monkeypatch.setattr(query_mod, "SEARCH_BLOCK_QUERIES", block)
        assert eng.query_embedded(q, slice_size=4) == want, block


def test_a_short_last_search_joins_the_one_before(synthetic_engine, monkeypatch):
    """A tail of fewer than SEARCH_TAIL_SHARE of a block is searched with the block before it (one search of
    8,192 + 1,808 queries is slower than one of 10,000), in whole slices, with the same chunks."""
    import qasc.engine.query as query_mod

    assert [query_mod.search_block_end(lo, n, 8) for lo, n in ((0, 17), (8, 17), (0, 18), (8, 18), (16, 18))] == [
        8, 17, 8, 16, 18]
    assert query_mod.search_block_end(0, 3, 8) == 3 and query_mod.search_block_end(0, 9, 8) == 9
    eng, q = synthetic_engine, _queries(synthetic_engine, 17, seed=5)
    want = eng.query_embedded(q, slice_size=17)
    monkeypatch.setattr(query_mod, "SEARCH_BLOCK_QUERIES", 8)
    sizes: list[int] = []
    search = eng.retrieval.search
    monkeypatch.setattr(eng.retrieval, "search", lambda emb, depth: sizes.append(emb.shape[0]) or search(emb, depth))
    assert eng.query_embedded(q, slice_size=4) == want
    assert sizes == [8, 9]  # slices 0-3 and 4-7, then 8-11, 12-15 and the last query's: 1 < 0.25 x 8


def test_kernel_blocks_inside_a_slice_do_not_change_results(synthetic_engine, monkeypatch):
    """On CPU a slice's kernels and assembly run KERNEL_SLICE_QUERIES_CPU queries at a time, and the blocks'
    columns are joined (ChunkColumns.concat): any block size gives the same rows, one RecordBatch per slice
    (scores within float32 rounding: a block's padded width changes the order of the sums)."""
    import qasc.engine.query as query_mod
    from qasc.jobs.results import to_table

    eng, q = synthetic_engine, _queries(synthetic_engine, 23, seed=4)
    ids = [f"q{i}" for i in range(23)]
    monkeypatch.setattr(query_mod, "KERNEL_SLICE_QUERIES_CPU", 1000)
    want = to_table(eng.query_embedded(q, slice_size=23), ids).to_pylist()
    assert len(want) > 23
    for step in (1, 4, 7):
        monkeypatch.setattr(query_mod, "KERNEL_SLICE_QUERIES_CPU", step)
        batches = list(eng.query_batches(q, ids, slice_size=10))
        assert len(batches) == 3  # slices of 10, 10, 3 queries, whatever the kernel blocks
        got = pa.Table.from_batches(batches).to_pylist()
        assert [{**r, "score": 0} for r in got] == [{**r, "score": 0} for r in want], step
        np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], atol=1e-6, rtol=0)


def test_chunk_columns_concat_shifts_queries_and_seeds():
    from qasc.engine.assemble import ChunkColumns

    def cols(n_queries, query, seeds_per_chunk, first_seed):
        m = len(query)
        offsets = np.concatenate([[0], np.cumsum(seeds_per_chunk)]).astype(np.int32)
        i64, i32 = np.arange(m, dtype=np.int64), np.arange(m, dtype=np.int32)
        return ChunkColumns(n_queries, np.asarray(query, np.int64), i32, i64, i64, i64 + 1, i64.astype(np.float32),
                            i32, i32, i32, offsets, np.arange(first_seed, first_seed + offsets[-1], dtype=np.int32),
                            [f"t{first_seed}-{j}" for j in range(m)])

    a, b, empty = cols(2, [0, 0, 1], [1, 2, 1], 0), cols(3, [1, 2], [2, 1], 100), cols(1, [], [], 0)
    got = ChunkColumns.concat([a, empty, b])
    assert got.n_queries == 6 and got.query.tolist() == [0, 0, 1, 4, 5]
    assert got.seed_offsets.tolist() == [0, 1, 3, 4, 6, 7] and got.seed_offsets.dtype == np.int32
    assert got.seed_ids.tolist() == [0, 1, 2, 3, 100, 101, 102]
    assert got.text == a.text + b.text and ChunkColumns.concat([a]) is a
    assert ChunkColumns.concat([]).n_queries == 0
