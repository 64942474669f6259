"""Lexical (BM25) evidence for the candidate rows, gated per query by the heading context's spread.

A store row's BM25 weights are kept as CSR over its distinct terms (`engine.lexical.LexicalIndex`): row r holds
terms row_terms[row_ptr[r]:row_ptr[r+1]] with weights idf(t) (k1 + 1) tf / (tf + k1 (1 - b + b dl / avgdl)).
A query is the set of its known terms (CSR too: query_ptr, query_terms). The BM25 score of a row for a query is
the sum of the row's weights over the terms the query has; divided by the most any row could score for that
query (sum of idf(t) (k1 + 1) over its terms: `LexicalIndex.query_terms`), it lies in [0, 1] and does not depend
on which other rows or queries share the batch.

The gate: where the headings already name what the question is about (the heading gate's spread is large: one
heading path matches the query far better than the typical one), the question's key words run through the whole
section and BM25 favours the sentences densest in them rather than the answer, so the lexical term is off there;
where headings are absent or alike (spread small), it is on. bench/RESULTS.md, "Session 14: a lexical lever".
"""

from __future__ import annotations

import torch

DENSE_LOOKUP_ELEMENTS = 1 << 26  # lexical_scores: a (Q, V) bool table of the queries' terms up to this size (64 MB)


def lexical_scores(
    row_ptr: torch.Tensor, row_terms: torch.Tensor, row_weights: torch.Tensor,
    query_ptr: torch.Tensor, query_terms: torch.Tensor, vocab_size: int,
    rows: torch.Tensor, valid: torch.Tensor,
) -> torch.Tensor:
    """row_ptr (N+1,) int64, row_terms (nnz,) int32 or int64, row_weights (nnz,) float32: the store's rows as CSR;
    query_ptr (Q+1,) int64, query_terms (T,) int64 (each query's distinct terms, sorted), vocab_size (every term
    id < it); rows (Q, L) int64 candidate rows, valid (Q, L) bool -> (Q, L) float32: the sum of row
    rows[q, l]'s weights over the terms query q has, 0 where invalid (invalid rows are never read)."""
    n_q, n_l = rows.shape
    out = torch.zeros((n_q, n_l), dtype=torch.float32, device=rows.device)
    if n_q == 0 or n_l == 0 or query_terms.numel() == 0:
        return out
    qi, li = valid.nonzero(as_tuple=True)  # (E,) the valid entries
    r = rows[qi, li]
    start = row_ptr[r]
    count = row_ptr[r + 1] - start  # (E,) terms of each entry's row
    total = int(count.sum())
    if total == 0:
        return out
    entry = torch.repeat_interleave(torch.arange(qi.numel(), device=rows.device), count)  # (P,)
    first = torch.cumsum(count, 0) - count  # (E,) each entry's first posting
    pos = start[entry] + torch.arange(total, device=rows.device) - first[entry]
    owner = torch.repeat_interleave(torch.arange(n_q, device=rows.device), query_ptr[1:] - query_ptr[:-1])  # (T,)
    term = row_terms[pos].long()  # (P,)
    if n_q * vocab_size <= DENSE_LOOKUP_ELEMENTS:  # a (Q, V) table of the queries' terms: one gather per posting
        table = torch.zeros((n_q, vocab_size), dtype=torch.bool, device=rows.device)
        table[owner, query_terms] = True
        has = table[qi[entry], term]
    else:  # (query, term) keys: a sorted membership test
        has = torch.isin(qi[entry] * vocab_size + term, owner * vocab_size + query_terms)
    score = torch.zeros(qi.numel(), dtype=torch.float32, device=rows.device)
    score.index_add_(0, entry, torch.where(has, row_weights[pos], torch.zeros_like(row_weights[pos])))
    out[qi, li] = score
    return out


def lexical_on(best: torch.Tensor, spread: torch.Tensor, max_spread: float | None) -> torch.Tensor:
    """best (Q,) float32 the most a row could score per query, spread (Q,) float32 the heading gate's spread,
    max_spread t (None: no gate) -> (Q,) bool: the queries whose lexical term is on (best > 0 and spread < t).
    The others get a zero boost, so their rows' BM25 scores need not be computed (`Engine.lexical_boost`)."""
    on = best > 0
    return on & (spread < max_spread) if max_spread is not None else on


def lexical_boost(
    scores: torch.Tensor, valid: torch.Tensor, best: torch.Tensor, spread: torch.Tensor, weight: float,
    max_spread: float | None,
) -> torch.Tensor:
    """scores (Q, L) float32 BM25 of the candidate rows (`lexical_scores`), valid (Q, L) bool, best (Q,) float32
    the most a row could score per query, spread (Q,) float32 the heading gate's spread (0 without headings),
    weight alpha >= 0, max_spread t (None: no gate) -> boost (Q, L) float32 = alpha * scores / best where
    spread < t (and best > 0), 0 elsewhere and on invalid entries: add it to the rows' similarities."""
    on = lexical_on(best, spread, max_spread)
    scale = torch.where(on, weight / best.clamp(min=1e-12), torch.zeros_like(best))
    return torch.where(valid, scores * scale[:, None], torch.zeros_like(scores))
