"""Loop twins of kernels.context: the heading gate, boost and residual one entry at a time, the nearest heading
paths by exact float64 cosines, and the paths' rows laid end to end."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _rows, _to_tensor
from qasc.kernels.reference.quantize import column_inverse, quantize_columns


def int8_heading_table(heading_emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes (H, D) int8, scale (D,) float32: scale = each dimension's largest |x| (0 without paths), codes each
    element rounded to 8 bits against it (round(x * 127 / scale), clamped to +-127, 0 where the scale is 0)."""
    emb = _rows(heading_emb.to(torch.float32))
    scale = [max((abs(row[d]) for row in emb), default=0.0) for d in range(heading_emb.shape[1])]
    scale_t = torch.tensor(scale, dtype=torch.float32, device=heading_emb.device)
    return quantize_columns(heading_emb, column_inverse(scale_t)), scale_t


def heading_gate(
    pool_c: torch.Tensor, pool_path: torch.Tensor, pool_valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """spread (Q,), cref (Q,): over the distinct paths of each row's valid pool entries with a heading (a path's c
    from its first position), cref = their median c, spread = max c - cref; both 0 without such an entry."""
    spreads, crefs = [], []
    for cs, paths, oks in zip(_rows(pool_c), _rows(pool_path), _rows(pool_valid), strict=True):
        first: dict[int, float] = {}
        for c, p, ok in zip(cs, paths, oks, strict=True):
            if ok and p >= 0 and p not in first:
                first[p] = c
        values = sorted(first.values())
        if not values:
            spreads.append(0.0)
            crefs.append(0.0)
            continue
        n = len(values)
        med = (values[(n - 1) // 2] + values[n // 2]) / 2
        crefs.append(med)
        spreads.append(max(values) - med)
    shape = (pool_c.shape[0],)
    return (_to_tensor(spreads, shape, pool_c.dtype, pool_c.device),
            _to_tensor(crefs, shape, pool_c.dtype, pool_c.device))


def context_boost(
    c: torch.Tensor, path: torch.Tensor, valid: torch.Tensor, spread: torch.Tensor, cref: torch.Tensor,
    weight: float,
) -> torch.Tensor:
    """boost (Q, L): weight * spread * (c - cref) on valid rows with a heading (path >= 0), 0 elsewhere."""
    out = []
    for cs, paths, oks, s, r in zip(_rows(c), _rows(path), _rows(valid), spread.tolist(), cref.tolist(), strict=True):
        out.append([weight * s * (x - r) if ok and p >= 0 else 0.0 for x, p, ok in zip(cs, paths, oks, strict=True)])
    return _to_tensor(out, tuple(c.shape), c.dtype, c.device)


def heading_residual(
    c: torch.Tensor, hs: torch.Tensor, path: torch.Tensor, valid: torch.Tensor, beta: float
) -> torch.Tensor:
    """(Q, L): -beta * c * hs on valid rows with a heading (path >= 0), 0 elsewhere."""
    out = []
    for cs, hss, paths, oks in zip(_rows(c), _rows(hs), _rows(path), _rows(valid), strict=True):
        out.append([-beta * x * h if ok and p >= 0 else 0.0 for x, h, p, ok in zip(cs, hss, paths, oks, strict=True)])
    return _to_tensor(out, tuple(c.shape), c.dtype, c.device)


def shortlist_top(scores: torch.Tensor, wide: int, group: int = 0) -> torch.Tensor:
    """(m, wide) int64: each row's `wide` best columns, all columns sorted by (score descending, column
    ascending), the first `wide` kept (group is ignored; the kernel may pick other columns among equal scores at
    the cut)."""
    out = [sorted(range(len(row)), key=lambda c: (-row[c], c))[:wide] for row in scores.tolist()]
    return _to_tensor(out, (scores.shape[0], wide), torch.long, scores.device)


def best_paths(query: torch.Tensor, heading_emb: torch.Tensor, j: int, heading_low: torch.Tensor | None = None,
               block_elements: int = 0, low_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (Q, j') float32, paths (Q, j') int64, j' = min(j, H): each query's j' best heading paths by
    cosine (float64 sums), score descending, equal scores lower path first (heading_low, low_scale and
    block_elements are ignored: the twin is always exact)."""
    table = _rows(heading_emb.double())
    jj = min(j, len(table))
    scores, paths = [], []
    for q in _rows(query.double()):
        ranked = sorted(range(len(table)), key=lambda p: (-sum(a * b for a, b in zip(q, table[p], strict=True)), p))
        paths.append(ranked[:jj])
        scores.append([sum(a * b for a, b in zip(q, table[p], strict=True)) for p in ranked[:jj]])
    n = query.shape[0]
    return (_to_tensor(scores, (n, jj), torch.float32, query.device),
            _to_tensor(paths, (n, jj), torch.long, query.device))


def packed_path_rows(paths: torch.Tensor, path_start: torch.Tensor, path_count: torch.Tensor,
                     path_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (Q, T) int64, valid (Q, T) bool: each query's paths' rows (CSR path_start / path_count into
    path_rows) appended one path after the other, T the most of any query; rows past a query's end are -1 (invalid)."""
    per_query = []
    for q_paths in paths.tolist():
        got = []
        for p in q_paths:
            s, c = int(path_start[p]), int(path_count[p])
            got.extend(int(r) for r in path_rows[s : s + c].tolist())
        per_query.append(got)
    width = max((len(g) for g in per_query), default=0)
    rows = torch.tensor([g + [-1] * (width - len(g)) for g in per_query], dtype=torch.long).reshape(len(paths), width)
    return rows, rows >= 0
