"""The scoring model's inputs for a batch of candidate rows (engine side of kernels.signals).

Gathers each candidate row's signals from the store's tables (cosine, heading match and h . s, BM25 without the
heading's terms) and hands them to `kernels.signals.row_scores`, the one place where they become a score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from qasc.engine.errors import QascError
from qasc.engine.tables import StoreTables
from qasc.kernels.gather import gathered_dots, segment_first
from qasc.kernels.lexical import lexical_scores
from qasc.kernels.params import QascParams
from qasc.kernels.signals import RowScores, ScoringModel, normalised_lexical, row_scores


class LexicalTerm(NamedTuple):
    """One batch's lexical signal: the queries' known terms (CSR) and the most a row can score per query
    (engine.lexical, kernels.lexical)."""

    query_ptr: torch.Tensor  # (Q+1,) int64
    query_terms: torch.Tensor  # (T,) int64
    best: torch.Tensor  # (Q,) float32


class HeadingGate(NamedTuple):
    """One batch's heading gate (kernels.context.heading_gate): spread (Q,) and cref (Q,) float32."""

    spread: torch.Tensor
    cref: torch.Tensor


class RowSignals:
    """The per-batch signals of a store's rows (`score_rows`), read from the tables it holds: `RowSignals(tables)`."""

    def __init__(self, tables: StoreTables) -> None:
        self.tables = tables

    def candidate_sims(self, query_emb: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """query_emb (Q, dim), rows/valid (Q, L) -> sims (Q, L) float32 (0 where invalid).

        Only the valid entries' vectors are gathered (padding costs nothing), GATHER_BLOCK_ELEMENTS floats at a
        time, in the store's dtype and then cast to float32, so memory stays bounded whatever Q is."""
        query = query_emb.to(device=self.tables.device, dtype=torch.float32)
        if self.tables.partitions is not None:  # a collection: each row's dot where its vector is
            return self.tables.partitions.dots(query, rows, valid)
        return gathered_dots(self.tables.embeddings, query, rows, valid)

    def heading_sims(self, query: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        """query (Q, dim) float32, path (Q, L) int64 (-1: none) -> c (Q, L) float32, cosine of the query and
        the path's embedding (0 where path < 0). A query's candidates come in runs under one path (rows in store
        order), so each run's path is scored once (`segment_first`) and the score spread over the run."""
        seg, first_path = segment_first(path)
        c = gathered_dots(self.tables.heading_tensors()[0], query, first_path.clamp(min=0), first_path >= 0)
        return torch.where(path >= 0, c.gather(1, seg), torch.zeros(path.shape, device=c.device))

    def uses_context(self, params: QascParams) -> bool:
        return params.context_weight > 0 and self.tables.n_total > 0 and self.tables.heading_tensors() is not None

    def lexical_term(self, params: QascParams, questions: Sequence[str] | None, n: int) -> LexicalTerm | None:
        """The lexical signal of a batch of n queries: None when params.lexical_weight is 0, the store is empty or
        the questions' texts are not given (queries as vectors only: there are no words to match); QascError when
        their count is not n."""
        if params.lexical_weight <= 0 or self.tables.n_total == 0 or questions is None:
            return None
        if len(questions) != n:
            raise QascError(f"{len(questions)} question texts for {n} query vectors")
        return LexicalTerm(*self.tables.lexical_index().query_terms(questions))

    def lexical_signal(self, term: LexicalTerm, rows: torch.Tensor, valid: torch.Tensor,
                       paths: torch.Tensor | None = None) -> torch.Tensor:
        """rows/valid (Q, L) -> (Q, L) float32 each row's BM25 / the most a row could score for its query. paths
        (Q, L) int64 the rows' heading paths (-1: none): the query terms a row's path holds do not count for it
        (kernels.lexical; None: every term counts)."""
        index = self.tables.lexical_index()
        heads = self.tables.heading_terms() if paths is not None else (None, None)
        scores = lexical_scores(index.row_ptr, index.row_terms, index.row_weights, term.query_ptr,
                                term.query_terms, index.vocab_size, rows, valid, paths, *heads)
        return normalised_lexical(scores, term.best)

    def score_rows(self, query: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, model: ScoringModel,
                   gate: HeadingGate | None, lexical: LexicalTerm | None,
                   lexical_rows: int | None = None) -> RowScores:
        """query (Q, dim) float32, rows/valid (Q, L) -> the scoring model's (kernels.signals.row_scores) plain
        scores and heading boost of those rows: their cosines, with the gate their heading signals, with the
        lexical term their BM25 (without the terms their heading paths hold, when the gate is on; invalid entries
        are never read). lexical_rows: BM25 only for each query's rows that score at least its lexical_rows-th
        best by the other signals (ties all in); the rest score as without the lexical term (None: every row)."""
        cos = self.candidate_sims(query, rows, valid)
        heading, path = {}, None
        if gate is not None:
            path = torch.where(valid, self.tables.heading_tensors()[1][rows], torch.full_like(rows, -1))
            heading = {"c": self.heading_sims(query, path), "path": path, "hs": self.tables.heading_row_dots()[rows],
                       "spread": gate.spread, "cref": gate.cref}
        lex = None
        if lexical is not None:
            scored = valid
            if lexical_rows is not None and 0 < lexical_rows < rows.shape[1] and model.lexical > 0:
                other = row_scores(model, cos, valid, **heading).total
                other = torch.where(valid, other, torch.full_like(other, float("-inf")))
                kth = other.topk(lexical_rows, dim=1).values[:, -1:]  # (Q, 1) the lexical_rows-th best
                scored = valid & (other >= kth)
            lex = self.lexical_signal(lexical, rows, scored, path)
        return row_scores(model, cos, valid, lex=lex, **heading)
