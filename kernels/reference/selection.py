"""Loop twins of kernels.selection."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _INF, _rows, _to_tensor


def select_chunks(
    scores: torch.Tensor,
    n_tokens: torch.Tensor,
    top_k: int | None = None,
    budget_tokens: int | None = None,
    score_margin: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """order (Q, S) int64 by descending score (ties: lower index), chosen (Q, S) bool for the returned prefix.

    Walking the order, a chunk is returned while it is present (score > -inf), among the first `top_k`,
    scores >= best - `score_margin`, and keeps the running token total within `budget_tokens`; the first chunk
    failing any of these ends the selection.
    """
    q, s = scores.shape
    orders: list[list[int]] = []
    chosen: list[list[bool]] = []
    for row, tok in zip(_rows(scores), _rows(n_tokens), strict=True):
        order = sorted(range(s), key=lambda j: (-row[j], j))
        picked = [False] * s
        total = 0
        best = row[order[0]] if s else -_INF
        for rank, j in enumerate(order):
            if row[j] == -_INF:
                break
            if top_k is not None and rank >= top_k:
                break
            if score_margin is not None and row[j] < best - score_margin:
                break
            if budget_tokens is not None:
                if total + tok[j] > budget_tokens:
                    break
                total += tok[j]
            picked[rank] = True
        orders.append(order)
        chosen.append(picked)
    return (
        _to_tensor(orders, (q, s), torch.long, scores.device),
        _to_tensor(chosen, (q, s), torch.bool, scores.device),
    )


def focus_on_best(
    scores: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    regions: torch.Tensor,
    gap: int | None,
    far_margin: float | None = None,
) -> torch.Tensor:
    """scores with -inf for chunks other than the row's best (first maximum) unless in its region with at most
    `gap` sentences between them, or (far_margin) scoring >= best - far_margin; unchanged for gap None."""
    if gap is None:
        return scores.clone()
    if gap < 0:
        raise ValueError(f"gap must be >= 0, got {gap}")
    q, s = scores.shape
    out: list[list[float]] = []
    for row, st, en, rg in zip(_rows(scores), _rows(starts), _rows(ends), _rows(regions), strict=True):
        if not row:
            out.append([])
            continue
        b = max(range(s), key=lambda j: (row[j], -j))
        kept = []
        for j in range(s):
            if j == b:
                kept.append(row[j])
                continue
            between = (st[j] - en[b] - 1) if st[j] > en[b] else (st[b] - en[j] - 1)
            near = rg[j] == rg[b] and between <= gap
            strong = far_margin is not None and row[j] >= row[b] - far_margin
            kept.append(row[j] if near or strong else -_INF)
        out.append(kept)
    return _to_tensor(out, (q, s), scores.dtype, scores.device)
