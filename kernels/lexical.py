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
INT32_INDEX_LIMIT = 1 << 31  # lexical_scores: its passes over the postings index in int32 below this many entries


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
    distinct terms, sorted): a term its row's path holds is left out of that row's sum (None: nothing left out).

    Each sum adds the row's matching weights in CSR order (ascending term id), one float32 addition at a time from
    0, as the loop twin does. Cost: a few passes over the P postings of the valid entries' rows, in 32-bit
    integers where the sizes allow (their places in row_terms and their query's row of a (Q, V) table of the
    queries' terms, each by a cumulative sum with a jump at each entry's first posting: no per-posting entry index,
    no sort); only the postings of query terms (K of the P) are then weighed, tested against their heading path
    (a binary search in the paths' sorted (path, term) keys) and summed."""
    n_q, n_l = rows.shape
    device = rows.device
    out = torch.zeros((n_q, n_l), dtype=torch.float32, device=device)
    if n_q == 0 or n_l == 0 or query_terms.numel() == 0:
        return out
    flat = valid.reshape(-1).nonzero().squeeze(1)  # (E,) the valid entries, query-major
    r = rows.reshape(-1).index_select(0, flat)
    start = row_ptr.index_select(0, r)
    count = row_ptr.index_select(0, r + 1) - start  # (E,) terms of each entry's row
    if not bool((count > 0).all()):  # entries without terms score 0 and own no posting
        keep = (count > 0).nonzero().squeeze(1)
        flat, start, count = flat[keep], start[keep], count[keep]
    total = int(count.sum()) if count.numel() else 0
    if total == 0:
        return out
    qi = flat // n_l
    owner = torch.repeat_interleave(torch.arange(n_q, device=device), query_ptr[1:] - query_ptr[:-1])  # (T,)
    dense = n_q * vocab_size <= DENSE_LOOKUP_ELEMENTS
    if dense:  # a (Q, V) table of the queries' terms
        width = vocab_size
        cell = owner * width + query_terms
    else:  # a (Q, U) table over the U distinct terms of the batch's queries; any other term -> column U (False)
        batch_terms, local = torch.unique(query_terms, return_inverse=True)
        width = batch_terms.numel() + 1
        cell = owner * width + local
    idx = torch.int32 if max(int(row_ptr[-1]), n_q * width) < INT32_INDEX_LIMIT else torch.long  # the passes
    if not dense:
        to_slot = torch.full((vocab_size,), width - 1, dtype=idx, device=device)
        to_slot[batch_terms] = torch.arange(width - 1, dtype=idx, device=device)
    table = torch.zeros(n_q * width, dtype=torch.bool, device=device)
    table[cell] = True
    first = torch.cumsum(count, 0) - count  # (E,) each entry's first posting
    step = torch.ones(total, dtype=idx, device=device)  # +1 along a row's postings, a jump to the next row's first
    step[first] = (start - torch.cat([start.new_zeros(1), start[:-1] + count[:-1] - 1])).to(idx)
    pos = step.cumsum_(0)  # (P,) each posting's place in row_terms
    term = row_terms.index_select(0, pos)  # (P,)
    qstep = torch.zeros(total, dtype=idx, device=device)  # likewise each posting's query row of the table
    qstep[first] = ((qi - torch.cat([qi.new_zeros(1), qi[:-1]])) * width).to(idx)
    slot = qstep.cumsum_(0).add_(term.to(idx) if dense else to_slot.index_select(0, term))  # (P,) table cells
    hit = table.index_select(0, slot).nonzero().squeeze(1)  # (K,) postings of their query's terms, ascending
    entry = torch.searchsorted(first, hit, right=True) - 1  # (K,) their entries
    hit_pos = pos.index_select(0, hit)
    if paths is not None and path_terms is not None and path_terms.numel() and hit.numel():
        path = paths.reshape(-1).index_select(0, flat.index_select(0, entry))  # each hit's row's heading path
        n_paths = path_ptr.shape[0] - 1
        path_owner = torch.repeat_interleave(torch.arange(n_paths, device=device), path_ptr[1:] - path_ptr[:-1])
        said = path_owner * vocab_size + path_terms  # (path, term) keys, ascending: terms sorted within a path
        key = path.clamp(min=0) * vocab_size + term.index_select(0, hit).long()
        at = torch.searchsorted(said, key).clamp(max=said.numel() - 1)
        kept = ((said.index_select(0, at) != key) | (path < 0)).nonzero().squeeze(1)
        entry, hit_pos = entry.index_select(0, kept), hit_pos.index_select(0, kept)
    score = torch.zeros(flat.numel(), dtype=torch.float32, device=device)
    score.index_add_(0, entry, row_weights.index_select(0, hit_pos))  # in posting order: CSR order within each sum
    out.view(-1)[flat] = score
    return out
