"""Loop twins of kernels.seeding: percentile threshold, similarity ranks and seeds, one row at a time."""

from __future__ import annotations

import math

import torch

from qasc.kernels.reference._common import _INF, _rows, _to_tensor


def percentile_threshold(sims: torch.Tensor, valid: torch.Tensor, percentile: float | torch.Tensor) -> torch.Tensor:
    """tau (Q,): numpy's "linear" percentile of each row's valid sims; +inf for rows without valid entries.

    Position p = percentile / 100 * (n - 1) among the sorted valid values, tau = v[lo] + (v[hi] - v[lo]) * frac,
    evaluated with 0-d tensors in sims.dtype so that the result is bit-identical to any implementation of the
    same formula in the same dtype.
    """
    q, _ = sims.shape
    dtype = sims.dtype
    pcts = torch.as_tensor(percentile, dtype=dtype).expand(q).tolist()
    taus: list[float] = []
    for row, ok, pct in zip(_rows(sims), _rows(valid), pcts, strict=True):
        values = sorted(v for v, good in zip(row, ok, strict=True) if good)
        n = len(values)
        if n == 0:
            taus.append(_INF)
            continue
        pos = torch.tensor(pct, dtype=dtype) / 100 * torch.tensor(float(n - 1), dtype=dtype)
        lo = math.floor(pos.item())
        hi = math.ceil(pos.item())
        if lo == hi:
            taus.append(values[lo])
            continue
        frac = pos - torch.tensor(float(lo), dtype=dtype)
        v_lo = torch.tensor(values[lo], dtype=dtype)
        v_hi = torch.tensor(values[hi], dtype=dtype)
        taus.append((v_lo + (v_hi - v_lo) * frac).item())
    return torch.tensor(taus, dtype=dtype).reshape(q).to(sims.device)


def similarity_ranks(sims: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """rank (Q, L) int64: 0 for the most similar valid sentence, ties to the earlier position; invalid entries
    rank after every valid one (as -inf similarities, in position order among equal keys)."""
    q, length = sims.shape
    out = []
    for row, ok in zip(_rows(sims), _rows(valid), strict=True):
        key = [row[i] if ok[i] else -_INF for i in range(length)]
        rank = [0] * length
        for r, i in enumerate(sorted(range(length), key=lambda i: (-key[i], i))):
            rank[i] = r
        out.append(rank)
    return _to_tensor(out, (q, length), torch.long, sims.device)


def top_ranked(sims: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """(Q, L) bool: the positions whose similarity rank (`similarity_ranks`: ties to the earlier position,
    invalid entries last) is below k."""
    return similarity_ranks(sims, valid) < k


def percentile_seeds(
    sims: torch.Tensor,
    valid: torch.Tensor,
    percentile: float | torch.Tensor,
    min_seeds: int = 1,
    max_seeds: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tau (Q,), seeds (Q, L) bool: valid sims >= tau, plus the `min_seeds` most similar, capped to `max_seeds`."""
    q, length = sims.shape
    tau = percentile_threshold(sims, valid, percentile)
    out: list[list[bool]] = []
    for row, ok, t in zip(_rows(sims), _rows(valid), tau.tolist(), strict=True):
        ranked = sorted((i for i in range(length) if ok[i]), key=lambda i: (-row[i], i))
        chosen = {i for i in range(length) if ok[i] and row[i] >= t}
        chosen |= set(ranked[:min_seeds])
        if max_seeds is not None:
            chosen &= set(ranked[:max_seeds])
        out.append([i in chosen for i in range(length)])
    return tau, _to_tensor(out, (q, length), torch.bool, sims.device)
