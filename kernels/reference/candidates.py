"""Loop twins of kernels.candidates."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _rows, _to_tensor


def candidate_rows(
    hits: torch.Tensor, doc_first: torch.Tensor, doc_last: torch.Tensor, neighbourhood: int, n_total: int,
    block_first: torch.Tensor | None = None, block_last: torch.Tensor | None = None, block_rows: int = 0,
):
    """Per query: the set of rows within `neighbourhood` of a hit inside the hit's document, plus the rows
    from the hit's block_first to its block_last (when given) inside that document, sorted; rows padded with
    n_total to the widest query; a new region wherever a row does not follow the previous one in the same
    document."""
    from qasc.kernels.candidates import CandidateRows

    first, last = doc_first.tolist(), doc_last.tolist()
    b_first = block_first.tolist() if block_first is not None else None
    b_last = block_last.tolist() if block_last is not None else None
    per_query: list[list[int]] = []
    for row in _rows(hits):
        found: set[int] = set()
        for h in row:
            if h < 0:
                continue
            for r in range(h - neighbourhood, h + neighbourhood + 1):
                if first[h] <= r <= last[h]:
                    found.add(r)
            if b_first is not None and b_last is not None:
                found.update(r for r in range(b_first[h], b_last[h] + 1) if first[h] <= r <= last[h])
        per_query.append(sorted(found))
    q = hits.shape[0]
    width = max((len(c) for c in per_query), default=0)
    rows = [[n_total] * width for _ in range(q)]
    valid = [[False] * width for _ in range(q)]
    region = [[-1] * width for _ in range(q)]
    for i, cand in enumerate(per_query):
        current = 0
        for j, r in enumerate(cand):
            if j == 0 or r != cand[j - 1] + 1 or first[r] != first[cand[j - 1]]:
                current += 1
            rows[i][j], valid[i][j], region[i][j] = r, True, current
    dev = hits.device
    return CandidateRows(_to_tensor(rows, (q, width), torch.long, dev), _to_tensor(valid, (q, width), torch.bool, dev),
                         _to_tensor(region, (q, width), torch.long, dev))
