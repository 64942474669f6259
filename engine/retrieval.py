"""Pre-retrieval: the search, the heading context's rerank of its hits, and the budget fill's single rows.

Heading context (QascParams.context_weight > 0, stores with heading paths): c(row) = cosine of the query and
the row's heading path; the gate (kernels.context.heading_gate) over the distinct paths of the top
CONTEXT_POOL rows by cosine gives spread and cref. The `depth` hits are the best rows by the scoring model
(kernels.signals: plain + boost) among that pool and the rows of the CONTEXT_PATHS best-matching paths, the lexical
term on each query's LEXICAL_RERANK_ROWS (or depth, if more) best of them by the other signals (BM25 over all of
them, up to CONTEXT_PATHS x CONTEXT_PATH_ROWS a query, was a large part of the term's cost; the same held-out F1:
bench/LOG.md, "The scoring model's cost on the query path").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qasc.engine.config import RetrievalConfig
from qasc.engine.fill import FillUnits, merge_units
from qasc.engine.signals import HeadingGate, LexicalTerm, RowSignals
from qasc.kernels.context import best_paths, heading_gate, packed_path_rows
from qasc.kernels.params import QascParams
from qasc.kernels.signals import ScoringModel

CONTEXT_POOL = 32  # heading context: the gate's pool, the top rows by raw cosine
FILL_ROWS = 16  # budget fill: the single rows that compete with the passages (the pre-retrieval's best)
CONTEXT_PATHS = 8  # pre-retrieval: the rows of this many best-matching heading paths join the rerank
CONTEXT_PATH_ROWS = 512  # ... at most this many rows of each (its first, in store order)
LEXICAL_RERANK_ROWS = 32  # the rerank's lexical term: each query's this many (at least depth) best rows by the rest


class StoreSearch:
    """A store's own search: `StoreSearch(store, device)(query_emb, depth)`."""

    def __init__(self, store, device: torch.device) -> None:
        self.store = store
        self.device = device

    def __call__(self, query_emb: torch.Tensor, depth: int) -> torch.Tensor:
        """query_emb (Q, dim) -> hits (Q, depth) int64 global rows (-1 where the store has fewer).

        Stores with `search_tensor` (engine.store.Store) search on their own vectors' device (exact, blocked)
        or through FAISS; others (duck-typed stores) through numpy `search`."""
        if hasattr(self.store, "search_tensor"):
            _, rows = self.store.search_tensor(query_emb, depth)
            return rows.to(device=self.device, dtype=torch.long)
        _, rows = self.store.search(query_emb.float().cpu().numpy(), depth)
        return torch.as_tensor(rows, dtype=torch.long, device=self.device)


class Retrieval:
    """The search and the heading context's rerank over the rows' signals it holds: `Retrieval(signals,
    searcher)`; searcher(query_emb (Q, dim), depth) -> hits (Q, depth) int64 global rows, -1 where fewer
    (`StoreSearch`: the store's own)."""

    def __init__(self, signals: RowSignals, searcher) -> None:
        self.signals = signals
        self.tables = signals.tables
        self.searcher = searcher

    def search(self, query_emb: torch.Tensor, depth: int) -> torch.Tensor:
        """query_emb (Q, dim) -> hits (Q, depth) int64 global rows (-1 where the store has fewer)."""
        return self.searcher(query_emb, depth)

    def pool_width(self, params: QascParams, retrieval: RetrievalConfig) -> int:
        """The rows one search returns per query for `run_batch`: the depth, or the heading context's pool."""
        depth = min(retrieval.depth, max(self.tables.n_total, 1))
        return min(max(depth, CONTEXT_POOL), self.tables.n_total) if self.signals.uses_context(params) else depth

    def context_hits(
        self, query_emb: torch.Tensor, depth: int, model: ScoringModel, pool: torch.Tensor | None = None,
        lexical: LexicalTerm | None = None, scores_out: list | None = None,
    ) -> tuple[torch.Tensor, HeadingGate]:
        """query_emb (Q, dim), depth, the scoring model (heading weight > 0) -> hits (Q, depth) int64 (-1 where
        missing) and the batch's HeadingGate: one search of max(depth, CONTEXT_POOL) rows; the gate over its first
        CONTEXT_POOL; the hits are the best `depth` rows by the model's score (plain + boost) among those rows and
        the first CONTEXT_PATH_ROWS rows of each of the CONTEXT_PATHS paths most similar to the query (ties: lower
        row first). pool: that search's result when already done (`pool_width` rows per query). lexical: the
        batch's lexical signal (`lexical_term`). scores_out: a list that gets the hits' scores (Q, depth) float32
        appended (-inf where a hit is missing)."""
        _, row_heading, path_start, path_count, path_rows = self.tables.heading_tensors()
        query = query_emb.to(device=self.tables.device, dtype=torch.float32)
        q, n = query.shape[0], self.tables.n_total
        if pool is None:
            pool = self.search(query_emb, min(max(depth, CONTEXT_POOL), n))  # (Q, M) by raw cosine
        pool_valid = pool >= 0
        pool = pool.clamp(min=0)
        g = min(CONTEXT_POOL, pool.shape[1])
        gate_path = torch.where(pool_valid[:, :g], row_heading[pool[:, :g]], torch.full_like(pool[:, :g], -1))
        gate = HeadingGate(*heading_gate(self.signals.heading_sims(query, gate_path), gate_path, pool_valid[:, :g]))
        heading_emb = self.tables.heading_tensors()[0]
        low, low_scale = self.tables.heading_low()
        best = best_paths(query, heading_emb, CONTEXT_PATHS, low, low_scale=low_scale)[1]  # (Q, J)
        extra, extra_valid = packed_path_rows(best, path_start, path_count.clamp(max=CONTEXT_PATH_ROWS), path_rows)
        rows = torch.cat([pool, extra], dim=1)
        valid = torch.cat([pool_valid, extra_valid], dim=1)
        key, _ = torch.where(valid, rows, torch.full_like(rows, n)).sort(dim=1)  # rows ascending, invalid last
        valid = key < n
        valid[:, 1:] &= key[:, 1:] != key[:, :-1]  # a pool row under a best path counts once
        rows = key.clamp(max=n - 1)
        score = self.signals.score_rows(query, rows, valid, model, gate, lexical, max(LEXICAL_RERANK_ROWS, depth)).total
        score = torch.where(valid, score, torch.full_like(score, float("-inf")))
        order = score.sort(dim=1, descending=True, stable=True).indices[:, :depth]
        hits = torch.where(valid.gather(1, order), rows.gather(1, order), torch.full_like(order, -1))
        if scores_out is not None:
            scores_out.append(score.gather(1, order))
        if hits.shape[1] < depth:
            hits = torch.cat([hits, hits.new_full((q, depth - hits.shape[1]), -1)], dim=1)
            if scores_out is not None:
                scores_out[-1] = torch.cat([scores_out[-1], scores_out[-1].new_full((q, depth - order.shape[1]),
                                                                                     float("-inf"))], dim=1)
        return hits, gate

    def fill_rows(self, query_emb: torch.Tensor, params: QascParams, pool: torch.Tensor | None,
                  questions: Sequence[str] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """A block's queries (Q, dim) -> the budget fill's single-sentence units, the same whatever the setting's
        depth and neighbourhood: rows (Q, FILL_ROWS) int64 (-1: none) and their scores (Q, FILL_ROWS) float32 (the
        pre-retrieval ranking's: the scoring model's plain score + heading boost). pool: the block's search hits
        when they are at least FILL_ROWS wide."""
        k = min(FILL_ROWS, self.tables.n_total)
        lexical = self.signals.lexical_term(params, questions, query_emb.shape[0])
        if self.signals.uses_context(params):
            scores: list = []
            use = pool if pool is not None and pool.shape[1] >= max(k, min(CONTEXT_POOL, self.tables.n_total)) else None
            rows, _ = self.context_hits(query_emb, k, params.scoring, use, lexical, scores)
            return rows, scores[0]
        rows = pool[:, :k] if pool is not None and pool.shape[1] >= k else self.search(query_emb, k)
        valid = rows >= 0
        safe = rows.clamp(min=0)
        query = query_emb.to(device=self.tables.device, dtype=torch.float32)
        score = self.signals.score_rows(query, safe, valid, params.scoring, None, lexical).total
        score = torch.where(valid, score, torch.full_like(score, float("-inf")))
        order = score.sort(dim=1, descending=True, stable=True).indices
        return rows.gather(1, order), score.gather(1, order)

    def fill_units(self, query_emb: torch.Tensor, params: QascParams, questions: Sequence[str] | None,
                   pool: torch.Tensor | None = None) -> list[FillUnits]:
        """A block's queries (Q, dim) -> per query, the units the budget fill draws on, best first
        (`engine.fill.merge_units`): the store's passages, ranked (`PassageTier.rank`), and the FILL_ROWS best
        single rows (`fill_rows`), all scored by the same model."""
        tier = self.tables.passage_tier()
        heading_emb = self.tables.heading_tensors()[0] if self.signals.uses_context(params) else None
        query = query_emb.to(device=self.tables.device, dtype=torch.float32)
        ids, scores = tier.rank(query, params, questions, heading_emb)
        rows, row_score = self.fill_rows(query, params, pool, questions)
        return merge_units(tier, ids, scores, rows.clamp(min=0), rows >= 0, row_score)
