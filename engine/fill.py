"""The budget fill (engine.passages): rank a store's passages for a batch of queries, merge them by score with
each query's best single rows (the pre-retrieval ranking's, Engine.fill_rows), and append the best units to each
query's chunks until its token budget is spent.

Ranking mirrors the sentences': the PASSAGE_POOL best passages by cosine (an exact scan in blocks of
PASSAGE_BLOCK_ELEMENTS scores, memory bounded whatever the store's size), then, as for the rows, the query-gated
heading signals (the gate over the first CONTEXT_POOL of them, a passage's heading path the one in force at its
first row) and the lexical one (BM25 over the passages' texts), combined by the scoring model (kernels.signals)
with the query's QascParams; ties keep the higher cosine first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from qasc.engine.assemble import ChunkColumns, RowTable
from qasc.engine.lexical import LexicalIndex, TermCounts
from qasc.engine.passages import Passages, fill_budget
from qasc.engine.store.index import exact_topk, sort_top
from qasc.kernels.context import heading_gate
from qasc.kernels.gather import gathered_dots
from qasc.kernels.lexical import lexical_scores
from qasc.kernels.params import QascParams
from qasc.kernels.signals import normalised_lexical, row_scores

PASSAGE_POOL = 64  # passages re-ranked per query: the best by cosine
PASSAGE_BLOCK_ELEMENTS = 1 << 24  # cosine scan: about this many scores held at once
HS_BLOCK_PASSAGES = 1 << 14  # passages cast to float32 at a time for their heading dots (two 24 MiB blocks)
CONTEXT_POOL = 32  # the heading gate's pool, as for the rows (engine.query.CONTEXT_POOL)


def passage_top_cosine(emb: torch.Tensor, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """emb (P, dim), query (Q, dim) float32, k <= P -> cos (Q, k) float32 and ids (Q, k) int64: the k best
    passages by an exact scan (`exact_topk`, blocks of PASSAGE_BLOCK_ELEMENTS scores), their cosines then taken
    entry by entry (`gathered_dots`: the same bits whatever else the scan held, so a collection's partitions score
    a passage as one store does; a matrix product's bits may change with its shape), ordered by cosine descending,
    equal ones lower id first."""
    _, ids = exact_topk(emb, query, k, PASSAGE_BLOCK_ELEMENTS)
    return sort_top(gathered_dots(emb, query, ids.clamp(min=0), ids >= 0), ids)


def passage_path_dots(emb: torch.Tensor, path: torch.Tensor, heading_emb: torch.Tensor) -> torch.Tensor:
    """emb (P, dim) passages' vectors (any float dtype), path (P,) int64 each one's heading path (-1: none),
    heading_emb (H, dim) float32 -> (P,) float32 each passage's dot with its path's embedding (0 without one),
    HS_BLOCK_PASSAGES passages cast to float32 at a time."""
    hs = torch.zeros(path.shape[0], device=heading_emb.device)
    ok = path >= 0
    for lo in range(0, path.shape[0], HS_BLOCK_PASSAGES):
        hi = min(lo + HS_BLOCK_PASSAGES, path.shape[0])
        hs[lo:hi] = gathered_dots(heading_emb, emb[lo:hi].float(), path[lo:hi].clamp(min=0)[:, None],
                                  ok[lo:hi, None])[:, 0]
    return hs


class PassageTier:
    """A store's passages on the engine's device: first (P,) int64 global row, count (P,), n_tokens (P,), emb
    (P, dim) in the store's dtype, path (P,) int64 heading path of the first row (-1: none), hs (P,) float32 each
    passage's dot with its path's embedding (0 without headings).

    texts: the passages' texts in order, or a function returning them afresh (an iterator): read only to build
    the lexical index on first use, never held (at 1M rows a second copy of the documents' text). counts: a
    function returning the passages' term counts per shard (`Store.passage_term_counts`, saved at ingest) or
    None; where it gives them, the lexical index is made from them and the texts are not read."""

    def __init__(self, passages: Passages, texts: Sequence[str] | Callable[[], Iterable[str]], device: torch.device,
                 headings: tuple[torch.Tensor, ...] | None, heading_paths: Sequence[str] = (),
                 counts: Callable[[], Iterable[TermCounts] | None] | None = None, partitions=None) -> None:
        self.device = device
        self.first = torch.as_tensor(np.asarray(passages.first, np.int64), device=device)
        self.count = np.asarray(passages.count, np.int64)
        self.count_t = torch.as_tensor(self.count, device=device)
        # a collection served by its partitions (engine.partition.PartitionedVectors) keeps the passages' vectors
        # there: the cosine scan and the heading dots are theirs
        self.partitions = partitions
        self.emb = torch.as_tensor(np.asarray(passages.emb), device=device) if partitions is None else None
        self._texts = texts
        self._counts = counts
        n = len(self.count)
        self.path = torch.full((n,), -1, dtype=torch.long, device=device)
        self.hs = torch.zeros(n, device=device)
        if headings is not None and n:
            heading_emb, row_heading = headings[0], headings[1]
            self.path = row_heading[self.first]
            self.hs = (passage_path_dots(self.emb, self.path, heading_emb) if partitions is None else
                       partitions.passage_path_dots(heading_emb, self.path))
        self._lexical: LexicalIndex | None = None
        self.heading_paths = list(heading_paths)  # (H,) the paths' texts: their terms leave the lexical signal
        self._heading_terms: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.count)

    def lexical(self) -> LexicalIndex:
        if self._lexical is None:
            saved = self._counts() if self._counts is not None else None
            texts = self._texts
            self._lexical = LexicalIndex.from_counts_or_texts(saved, texts if callable(texts) else lambda: texts,
                                                              self.device)
        return self._lexical

    def heading_terms(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The heading paths' terms in the passages' lexical vocabulary (CSR: path_ptr (H+1,), path_terms)."""
        if self._heading_terms is None:
            self._heading_terms = self.lexical().query_terms(self.heading_paths)[:2]
        return self._heading_terms

    def top_cosine(self, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """query (Q, dim) float32, k <= P -> cos (Q, k) float32 descending and ids (Q, k) int64: the k best passages
        (`passage_top_cosine`, or a collection's partitions' merged; equal scores lower id first)."""
        if self.partitions is not None:
            return self.partitions.passage_topk(query, k)
        return passage_top_cosine(self.emb, query, k)

    def rank(self, query: torch.Tensor, params: QascParams, questions: Sequence[str] | None,
             heading_emb: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """query (Q, dim) float32 -> ids (Q, K) int64 and scores (Q, K) float32, best first, K = min(P,
        PASSAGE_POOL): the scoring model's (kernels.signals) plain score + heading boost, with params' weights (the
        heading signals only with heading_emb, the lexical one only with the questions' texts)."""
        cos, ids = self.top_cosine(query, min(PASSAGE_POOL, len(self)))
        valid = torch.ones_like(ids, dtype=torch.bool)
        heading, lex = {}, None
        if heading_emb is not None and params.context_weight > 0:
            path = self.path[ids]
            c = gathered_dots(heading_emb, query, path.clamp(min=0), path >= 0)
            g = min(CONTEXT_POOL, ids.shape[1])
            spread, cref = heading_gate(c[:, :g], path[:, :g], valid[:, :g])
            heading = {"c": c, "path": path, "hs": self.hs[ids], "spread": spread, "cref": cref}
        if questions is not None and params.lexical_weight > 0:
            index = self.lexical()
            ptr, terms, best = index.query_terms(questions)
            heads = (heading["path"], *self.heading_terms()) if heading else ()  # the heading's words are its own
            lex = normalised_lexical(lexical_scores(index.row_ptr, index.row_terms, index.row_weights, ptr, terms,
                                                    index.vocab_size, ids, valid, *heads), best)
        score = row_scores(params.scoring, cos, valid, lex=lex, **heading).total
        order = torch.sort(score, dim=1, descending=True, stable=True).indices
        return ids.gather(1, order), score.gather(1, order)


class FillUnits(NamedTuple):
    """One query's budget-fill units, best first: first (n,) int64 global row, count (n,) int64 rows, score (n,)
    float32 (passages, and candidate rows as units of one)."""

    first: np.ndarray
    count: np.ndarray
    score: np.ndarray


def merge_units(tier: PassageTier, ids: torch.Tensor, scores: torch.Tensor, rows: torch.Tensor, rows_on: torch.Tensor,
                row_score: torch.Tensor) -> list[FillUnits]:
    """ids/scores (Q, K) ranked passages, rows/rows_on/row_score (Q, L) candidate rows, whether each may be a unit
    of its own and its score -> per query the passages and the allowed rows in one list by score (descending; on
    equal scores passages first, then in their own order)."""
    q = ids.shape[0]
    first = torch.cat([tier.first[ids], rows.long()], dim=1)
    count = torch.cat([tier.count_t[ids], torch.ones_like(rows, dtype=torch.long)], dim=1)
    score = torch.cat([scores.float(), row_score.float()], dim=1)
    ok = torch.cat([torch.ones_like(ids, dtype=torch.bool), rows_on], dim=1)
    order = torch.sort(torch.where(ok, score, torch.full_like(score, float("-inf"))), dim=1, descending=True,
                       stable=True).indices
    first, count, score, ok = (t.gather(1, order).cpu().numpy() for t in (first, count, score, ok))
    return [FillUnits(first[i][ok[i]], count[i][ok[i]], score[i][ok[i]]) for i in range(q)]


def fill_columns(cols: ChunkColumns, units: Sequence[FillUnits], budget: int, table: RowTable,
                 doc_offsets: np.ndarray, row_tokens: np.ndarray, row_sections: np.ndarray | None = None,
                 diversity: float = 0.0) -> ChunkColumns:
    """A block's chunks (cols) and its queries' fill units -> the same chunks with each query's fill pieces
    (engine.passages.fill_budget, with each row's section key and the diversity) after its own, ranked on:
    seed_ids empty, score the unit's."""
    q_of = cols.query
    rows0 = doc_offsets[cols.doc] + cols.sentence_start
    rows1 = doc_offsets[cols.doc] + cols.sentence_end
    add_q, add_rank, add_r0, add_r1, add_tok, add_score = [], [], [], [], [], []
    bounds = np.searchsorted(q_of, np.arange(cols.n_queries + 1))
    for q in range(cols.n_queries):
        a, b = int(bounds[q]), int(bounds[q + 1])
        taken = list(zip(rows0[a:b].tolist(), rows1[a:b].tolist(), strict=True))
        used = int(cols.n_tokens[a:b].sum())
        u = units[q]
        pieces = fill_budget(taken, used, budget, range(len(u.first)), u.score.tolist(), u.first, u.count, row_tokens,
                             row_sections, diversity)
        for k, (r0, r1, tok, sc) in enumerate(pieces):
            add_q.append(q)
            add_rank.append(b - a + k)
            add_r0.append(r0)
            add_r1.append(r1)
            add_tok.append(tok)
            add_score.append(sc)
    if not add_q:
        return cols
    r0, r1 = np.asarray(add_r0, np.int64), np.asarray(add_r1, np.int64)
    doc = table.doc[r0].astype(np.int64)
    c0, c1 = table.char_start[r0].astype(np.int64), table.char_end[r1].astype(np.int64)
    texts = table.texts
    extra = ChunkColumns(
        n_queries=cols.n_queries, query=np.asarray(add_q, np.int64), rank=np.asarray(add_rank, np.int32), doc=doc,
        char_start=c0, char_end=c1, score=np.asarray(add_score, np.float32), n_tokens=np.asarray(add_tok, np.int32),
        sentence_start=table.sent[r0].astype(np.int32), sentence_end=table.sent[r1].astype(np.int32),
        seed_offsets=np.zeros(len(add_q) + 1, np.int32), seed_ids=np.zeros(0, np.int32),
        text=[texts[d][x:y] for d, x, y in zip(doc.tolist(), c0.tolist(), c1.tolist(), strict=True)])
    return interleave(cols, extra)


def interleave(cols: ChunkColumns, extra: ChunkColumns) -> ChunkColumns:
    """Two ChunkColumns over the same queries -> one, in query order then rank (extra's ranks follow cols')."""
    both = ChunkColumns.concat([cols, extra])  # concat shifts query ids by n_queries: undo for the second part
    query = np.concatenate([cols.query, extra.query])
    order = np.lexsort((np.concatenate([cols.rank, extra.rank]), query))
    seeds = [both.seed_ids[both.seed_offsets[j]:both.seed_offsets[j + 1]] for j in order.tolist()]
    counts = np.asarray([len(s) for s in seeds], np.int64)
    offsets = np.zeros(len(order) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return ChunkColumns(
        n_queries=cols.n_queries, query=query[order], rank=both.rank[order], doc=both.doc[order],
        char_start=both.char_start[order], char_end=both.char_end[order], score=both.score[order],
        n_tokens=both.n_tokens[order], sentence_start=both.sentence_start[order],
        sentence_end=both.sentence_end[order], seed_offsets=offsets,
        seed_ids=np.concatenate(seeds).astype(np.int32) if seeds else np.zeros(0, np.int32),
        text=[both.text[j] for j in order.tolist()], rerank=None if both.rerank is None else both.rerank[order])
