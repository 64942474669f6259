"""Loop twin of kernels.lexical: BM25 of the candidate rows, one posting at a time."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _rows, _to_tensor


def lexical_scores(row_ptr, row_terms, row_weights, query_ptr, query_terms, vocab_size, rows, valid, paths=None,
                   path_ptr=None, path_terms=None):
    """(Q, L) float32: per valid entry, the sum of its row's weights (CSR row_ptr / row_terms / row_weights) over
    the terms in its query's set (CSR query_ptr / query_terms) and not in its heading path's set (CSR path_ptr /
    path_terms; paths None: none left out); 0 where invalid. Float64 sums, rounded to float32 at the end."""
    ptr, terms, weights = row_ptr.tolist(), row_terms.tolist(), row_weights.tolist()
    qptr, qterms = query_ptr.tolist(), query_terms.tolist()
    heads = []
    if paths is not None and path_terms is not None:
        pp, pt = path_ptr.tolist(), path_terms.tolist()
        heads = [set(pt[pp[h] : pp[h + 1]]) for h in range(len(pp) - 1)]
    out = []
    for q, (rs, oks) in enumerate(zip(_rows(rows), _rows(valid), strict=True)):
        have = set(qterms[qptr[q] : qptr[q + 1]])
        row_out = []
        for j, (r, ok) in enumerate(zip(rs, oks, strict=True)):
            h = int(paths[q, j]) if heads else -1
            said = heads[h] if h >= 0 else set()
            hits = (weights[i] for i in range(ptr[r], ptr[r + 1]) if terms[i] in have and terms[i] not in said)
            row_out.append(sum(hits) if ok else 0.0)
        out.append(row_out)
    return _to_tensor(out, tuple(rows.shape), torch.float32, rows.device)
