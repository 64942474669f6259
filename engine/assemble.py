"""Turn a QascBatch (row positions) into result columns: one entry per returned chunk, no per-chunk loop over L.

`assemble_columns` gathers the chosen chunks' spans, scores and seeds with array indexing (seeds as a list
column: offsets + values) and slices each chunk's text once; `ChunkColumns` turns into an Arrow RecordBatch
in `results_schema()` (the rows of `qasc query --out`) or into the Chunk lists of `Engine.query`.
`assemble_chunks_reference` is the old per-chunk loop, kept as the slow twin the tests compare against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from qasc.engine.columns import results_schema
from qasc.engine.types import Chunk, Sentences
from qasc.kernels.pipeline import QascBatch


@dataclass(frozen=True)
class RowTable:
    """Per global sentence row of a store (documents laid end to end): doc (N,) int32 its document, sent (N,)
    int32 its index in the document, char_start/char_end (N,) its span (int32, int64 for a document of 2^31
    characters or more); per document its id and text. Half the bytes of int64 (4 MB per array at 1M rows)."""

    doc: np.ndarray
    sent: np.ndarray
    char_start: np.ndarray
    char_end: np.ndarray
    doc_ids: list[str]
    texts: Sequence[str]  # a list, or a mapped store's texts read by shard on first use (engine.store.documents)
    doc_id_array: pa.Array  # doc_ids as an Arrow string array (the doc_id column is a take() from it)

    @classmethod
    def from_docs(cls, docs: Sequence[Sentences]) -> RowTable:
        lengths = np.asarray([len(d) for d in docs], dtype=np.int64)
        cat = (lambda name: np.concatenate([np.asarray(getattr(d, name)) for d in docs])) if len(docs) else (
            lambda name: np.zeros(0, dtype=np.int64))
        return cls.from_arrays([d.doc_id for d in docs], lengths, cat("char_start"), cat("char_end"),
                               [d.text for d in docs])

    @classmethod
    def from_arrays(cls, doc_ids: list[str], lengths: np.ndarray, char_start: np.ndarray, char_end: np.ndarray,
                    texts: Sequence[str]) -> RowTable:
        """doc_ids (D), lengths (D,) each document's sentences, char_start/char_end (N,) the rows' spans, texts
        (D) -> the table; spans int32 unless an offset reaches 2^31."""
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if int(offsets[-1]) >= 2**31:
            raise ValueError(f"{int(offsets[-1])} sentences: RowTable holds int32 rows")
        doc = np.repeat(np.arange(len(doc_ids), dtype=np.int32), lengths)
        span = np.int32 if int(np.max(char_end, initial=0)) < 2**31 else np.int64
        sent = (np.arange(int(offsets[-1]), dtype=np.int64) - offsets[doc]).astype(np.int32)
        return cls(doc, sent, np.asarray(char_start, dtype=span), np.asarray(char_end, dtype=span), list(doc_ids),
                   texts, pa.array(doc_ids, pa.string()))


@dataclass(frozen=True)
class ChunkColumns:
    """The returned chunks of Q queries, M in all, in query order then rank: query (M,) int64 query index,
    rank (M,) int32, doc (M,) int64 document index, char_start/char_end (M,) int64, score (M,) float32,
    n_tokens/sentence_start/sentence_end (M,) int32 (sentence_end inclusive), seed_offsets (M+1,) int32 and
    seed_ids (S,) int32 (chunk j's seeds: seed_ids[seed_offsets[j]:seed_offsets[j+1]]), text (M) str; rerank (M,)
    float32 the cross-encoder's score (NaN: a row it did not score), None without the rerank stage (engine.rerank)."""

    n_queries: int
    query: np.ndarray
    rank: np.ndarray
    doc: np.ndarray
    char_start: np.ndarray
    char_end: np.ndarray
    score: np.ndarray
    n_tokens: np.ndarray
    sentence_start: np.ndarray
    sentence_end: np.ndarray
    seed_offsets: np.ndarray
    seed_ids: np.ndarray
    text: list[str]
    rerank: np.ndarray | None = None

    @classmethod
    def empty(cls, n_queries: int) -> ChunkColumns:
        """No chunk for any of n_queries queries (an empty store)."""
        i64, i32 = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
        return cls(n_queries, i64, i32, i64, i64, i64, np.zeros(0, dtype=np.float32), i32, i32, i32,
                   np.zeros(1, dtype=np.int32), i32, [])

    @classmethod
    def concat(cls, parts: Sequence[ChunkColumns]) -> ChunkColumns:
        """Columns of consecutive blocks of queries -> one ChunkColumns over all their queries, in order (query
        indices and seed offsets shifted by the blocks before)."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty(0)
        q_base = np.cumsum([0] + [p.n_queries for p in parts[:-1]])
        s_base = np.cumsum([0] + [len(p.seed_ids) for p in parts[:-1]])
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return cls(
            int(sum(p.n_queries for p in parts)),
            np.concatenate([p.query + b for p, b in zip(parts, q_base, strict=True)]).astype(np.int64),
            cat("rank"), cat("doc"), cat("char_start"), cat("char_end"), cat("score"), cat("n_tokens"),
            cat("sentence_start"), cat("sentence_end"),
            np.concatenate([np.zeros(1, np.int64)] + [p.seed_offsets[1:] + b for p, b in zip(parts, s_base,
                                                                                            strict=True)]).astype(np.int32),
            cat("seed_ids"), [t for p in parts for t in p.text],
            None if all(p.rerank is None for p in parts) else np.concatenate([p.rerank_or_nan() for p in parts]),
        )

    def rerank_or_nan(self) -> np.ndarray:
        """(M,) float32 rerank scores, NaN where none (all NaN without the rerank stage)."""
        return np.full(len(self.query), np.nan, np.float32) if self.rerank is None else self.rerank

    def __len__(self) -> int:
        return len(self.query)

    def to_chunks(self, doc_ids: Sequence[str]) -> list[list[Chunk]]:
        """-> per query, its Chunks in rank order (doc_ids: the id of each document index)."""
        out: list[list[Chunk]] = [[] for _ in range(self.n_queries)]
        seeds, off = self.seed_ids.tolist(), self.seed_offsets.tolist()
        cols = (self.query, self.doc, self.char_start, self.char_end, self.score, self.n_tokens,
                self.sentence_start, self.sentence_end)
        rerank = [None] * len(self) if self.rerank is None else [None if x != x else x for x in self.rerank.tolist()]
        for j, (q, d, c0, c1, s, n, first, last) in enumerate(zip(*(c.tolist() for c in cols), strict=True)):
            out[q].append(Chunk(doc_ids[d], c0, c1, self.text[j], s, tuple(seeds[off[j] : off[j + 1]]), n, first,
                                last, rerank[j]))
        return out

    def to_record_batch(self, query_ids: pa.Array, doc_id_array: pa.Array, reranker: str | None = None
                        ) -> pa.RecordBatch:
        """query_ids (n_queries,) string array, doc_id_array (documents,) string array -> a RecordBatch of
        M rows in results_schema(); reranker: the rerank stage's model name, which adds its two columns."""
        seeds = pa.ListArray.from_arrays(pa.array(self.seed_offsets, pa.int32()), pa.array(self.seed_ids, pa.int32()))
        arrays = [
            query_ids.take(pa.array(self.query)), pa.array(self.rank, pa.int32()),
            doc_id_array.take(pa.array(self.doc)),
            pa.array(self.char_start, pa.int64()), pa.array(self.char_end, pa.int64()),
            pa.array(self.score, pa.float32()), pa.array(self.text, pa.large_string()),
            pa.array(self.n_tokens, pa.int32()), seeds, pa.array(self.sentence_start, pa.int32()),
            pa.array(self.sentence_end, pa.int32()),
        ]
        if reranker is not None:
            rerank = self.rerank_or_nan()
            arrays += [pa.array([reranker] * len(self), pa.string()),
                       pa.array(rerank, pa.float32(), mask=np.isnan(rerank))]
        return pa.RecordBatch.from_arrays(arrays, schema=results_schema(reranker is not None))


def _np(t: torch.Tensor | np.ndarray) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def assemble_columns(batch: QascBatch, rows: torch.Tensor | np.ndarray, table: RowTable) -> ChunkColumns:
    """batch over (Q, L) positions, rows (Q, L) int64 the global row (index into `table`) at each position
    (read only at chunk ends and kept seeds, so invalid positions may hold anything in range) -> ChunkColumns.

    A chunk's seeds are the kept positions whose label is its piece, in position order (as the reference)."""
    chosen = _np(batch.chosen).astype(bool)
    rows = _np(rows).astype(np.int64, copy=False)
    qi, ki = np.nonzero(chosen)  # row-major: query order, then rank order
    rank = (np.cumsum(chosen, axis=1, dtype=np.int64) - 1)[qi, ki]
    r0 = rows[qi, _np(batch.start)[qi, ki]]
    r1 = rows[qi, _np(batch.end)[qi, ki]]
    doc = table.doc[r0].astype(np.int64)
    c0, c1 = table.char_start[r0].astype(np.int64), table.char_end[r1].astype(np.int64)
    # seeds: kept positions sorted by (query, label, position); each chunk takes the run of its (query, piece)
    kept, labels, piece = _np(batch.kept).astype(bool), _np(batch.labels), _np(batch.piece)
    sq, si = np.nonzero(kept & (labels >= 0))
    span = 1 + max(int(labels.max()) if labels.size else 0, int(piece.max()) if piece.size else 0)
    skey = sq * span + labels[sq, si]
    order = np.argsort(skey, kind="stable")
    skey, seed_rows = skey[order], rows[sq[order], si[order]]
    ckey = qi * span + piece[qi, ki]
    lo = np.searchsorted(skey, ckey, side="left")
    counts = np.searchsorted(skey, ckey, side="right") - lo
    offsets = np.zeros(len(qi) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    take = np.repeat(lo - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
    texts = table.texts
    text = [texts[d][a:b] for d, a, b in zip(doc.tolist(), c0.tolist(), c1.tolist(), strict=True)]
    return ChunkColumns(
        n_queries=chosen.shape[0], query=qi.astype(np.int64), rank=rank.astype(np.int32), doc=doc,
        char_start=c0, char_end=c1, score=_np(batch.score.float())[qi, ki].astype(np.float32),
        n_tokens=_np(batch.tokens)[qi, ki].astype(np.int32), sentence_start=table.sent[r0].astype(np.int32),
        sentence_end=table.sent[r1].astype(np.int32), seed_offsets=offsets.astype(np.int32),
        seed_ids=table.sent[seed_rows[take]].astype(np.int32), text=text,
    )


def assemble_chunks(batch: QascBatch, rows: torch.Tensor | np.ndarray, table: RowTable) -> list[list[Chunk]]:
    """assemble_columns(...) as per query, its chosen Chunks in rank order."""
    return assemble_columns(batch, rows, table).to_chunks(table.doc_ids)


def assemble_chunks_reference(
    batch: QascBatch, docs: Sequence[Sentences], doc_index: torch.Tensor, sent_index: torch.Tensor
) -> list[list[Chunk]]:
    """Slow twin of assemble_chunks: batch over (Q, L) rows; doc_index/sent_index (Q, L) int64 map row positions
    to docs[d] sentence i. A loop over queries and chosen chunks, with a mask over L per chunk."""
    start = batch.start.cpu().numpy()
    end = batch.end.cpu().numpy()
    score = batch.score.float().cpu().numpy()
    tokens = batch.tokens.cpu().numpy()
    chosen = batch.chosen.cpu().numpy()
    piece = batch.piece.cpu().numpy()
    labels = batch.labels.cpu().numpy()
    kept = batch.kept.cpu().numpy()
    doc_index = doc_index.cpu().numpy()
    sent_index = sent_index.cpu().numpy()
    out: list[list[Chunk]] = []
    for q in range(start.shape[0]):
        row: list[Chunk] = []
        for k in np.flatnonzero(chosen[q]).tolist():
            s, e = int(start[q, k]), int(end[q, k])
            doc = docs[int(doc_index[q, s])]
            first, last = int(sent_index[q, s]), int(sent_index[q, e])
            c0, c1 = int(doc.char_start[first]), int(doc.char_end[last])
            seeds = np.flatnonzero(kept[q] & (labels[q] == piece[q, k]))
            row.append(Chunk(
                doc_id=doc.doc_id, char_start=c0, char_end=c1, text=doc.text[c0:c1],
                score=float(score[q, k]), seed_ids=tuple(int(sent_index[q, i]) for i in seeds),
                n_tokens=int(tokens[q, k]), sentence_start=first, sentence_end=last,
            ))
        out.append(row)
    return out
