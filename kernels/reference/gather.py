"""Loop twins of kernels.gather: dot products with gathered table rows, runs of equal keys."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _rows, _to_tensor


def gathered_dots(table: torch.Tensor, query: torch.Tensor, index: torch.Tensor, valid: torch.Tensor,
                  block_elements: int = 0) -> torch.Tensor:
    """(Q, L) float32: query[q] . table[index[q, l]] (float64 sum) where valid, 0 elsewhere (invalid entries are
    never read); block_elements only bounds the kernel's memory."""
    rows = _rows(table.double())
    out = []
    for q, idx, oks in zip(_rows(query.double()), _rows(index), _rows(valid), strict=True):
        out.append([sum(a * b for a, b in zip(q, rows[i], strict=True)) if ok else 0.0
                    for i, ok in zip(idx, oks, strict=True)])
    return _to_tensor(out, tuple(index.shape), torch.float32, query.device)


def entry_dots(table: torch.Tensor, query: torch.Tensor, who: torch.Tensor, index: torch.Tensor,
               block_elements: int = 0) -> torch.Tensor:
    """(E,) float32: query[who[e]] . table[index[e]] (float64 sum); block_elements only bounds the kernel's
    memory."""
    rows, queries = _rows(table.double()), _rows(query.double())
    out = [sum(a * b for a, b in zip(queries[w], rows[i], strict=True)) for w, i in
           zip(who.tolist(), index.tolist(), strict=True)]
    return _to_tensor(out, (len(out),), torch.float32, query.device)


def segment_first(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """seg (Q, L) int64, first (Q, U) int64: runs of equal consecutive keys numbered 0, 1, ... per row, and each
    run's key (-1 past a row's last run, U the most runs of any row)."""
    seg, first = [], []
    for row in _rows(keys):
        ids, heads = [], []
        for j, key in enumerate(row):
            if j == 0 or key != row[j - 1]:
                heads.append(key)
            ids.append(len(heads) - 1)
        seg.append(ids)
        first.append(heads)
    width = max((len(h) for h in first), default=0)
    first = [h + [-1] * (width - len(h)) for h in first]
    return (_to_tensor(seg, tuple(keys.shape), torch.long, keys.device),
            _to_tensor(first, (keys.shape[0], width), torch.long, keys.device))
