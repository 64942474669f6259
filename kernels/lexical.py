"""Lexical (BM25) evidence for the candidate rows: one of the scoring model's signals (kernels.signals).

A store row's BM25 weights are kept as CSR over its distinct terms (`engine.lexical.LexicalIndex`): row r holds
terms row_terms[row_ptr[r]:row_ptr[r+1]] with weights idf(t) (k1 + 1) tf / (tf + k1 (1 - b + b dl / avgdl)).
A query is the set of its known terms (CSR too: query_ptr, query_terms). The BM25 score of a row for a query is
the sum of the row's weights over the terms the query has; divided by the most any row could score for that
query (sum of idf(t) (k1 + 1) over its terms: `LexicalIndex.query_terms`), it lies in [0, 1] and does not depend
on which other rows or queries share the batch.

Heading terms: with the rows' heading paths given (their terms as CSR too: path_ptr, path_terms), a query term
that the row's own heading path holds does not count for that row. The heading already says it: a question that
names its subject ("What are the symptoms of glaucoma?") matches every sentence under "Glaucoma" in that word, and
BM25 would favour the sentences that repeat it, not the answer. This is the lexical twin of the heading residual
(kernels.context.heading_residual): the heading's evidence is the heading signal's, counted once.
"""

from __future__ import annotations

import torch

DENSE_LOOKUP_ELEMENTS = 1 << 26  # lexical_scores: a (Q, V) bool table of the queries' terms up to this size (64 MB)


def lexical_scores(
    row_ptr: torch.Tensor, row_terms: torch.Tensor, row_weights: torch.Tensor,
    query_ptr: torch.Tensor, query_terms: torch.Tensor, vocab_size: int,
    rows: torch.Tensor, valid: torch.Tensor, paths: torch.Tensor | None = None, path_ptr: torch.Tensor | None = None,
    path_terms: torch.Tensor | None = None,
) -> torch.Tensor:
    """row_ptr (N+1,) int64, row_terms (nnz,) int32 or int64, row_weights (nnz,) float32: the store's rows as CSR;
    query_ptr (Q+1,) int64, query_terms (T,) int64 (each query's distinct terms, sorted), vocab_size (every term
    id < it); rows (Q, L) int64 candidate rows, valid (Q, L) bool -> (Q, L) float32: the sum of row
    rows[q, l]'s weights over the terms query q has, 0 where invalid (invalid rows are never read). paths (Q, L)
    int64 each entry's heading path (-1: none), path_ptr (H+1,) int64 and path_terms (nnz,) int64 (each path's
    distinct terms, sorted): a term its row's path holds is left out of that row's sum (None: nothing left out)."""
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
    if paths is not None and path_terms is not None and path_terms.numel():
        hit = has.nonzero().squeeze(1)  # only the postings of query terms can be left out (few of the P)
        path = paths[qi, li][entry[hit]]  # each such posting's row's heading path
        n_paths = path_ptr.shape[0] - 1
        path_owner = torch.repeat_interleave(torch.arange(n_paths, device=rows.device), path_ptr[1:] - path_ptr[:-1])
        said = torch.isin(path.clamp(min=0) * vocab_size + term[hit], path_owner * vocab_size + path_terms)
        has[hit[said & (path >= 0)]] = False
    score = torch.zeros(qi.numel(), dtype=torch.float32, device=rows.device)
    score.index_add_(0, entry, torch.where(has, row_weights[pos], torch.zeros_like(row_weights[pos])))
    out[qi, li] = score
    return out
