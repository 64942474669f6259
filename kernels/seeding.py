"""Percentile seeding: per-row threshold tau over valid similarities, seeds at or above it."""

from __future__ import annotations

import torch


def percentile_threshold(
    sims: torch.Tensor, valid: torch.Tensor, percentile: float | torch.Tensor
) -> torch.Tensor:
    """sims (Q, L) float, valid (Q, L) bool, percentile float or (Q,) in [0, 100] -> tau (Q,) float.

    numpy's default ("linear") percentile over each row's valid entries; +inf for rows with none.
    """
    q, length = sims.shape
    pct = torch.as_tensor(percentile, dtype=sims.dtype, device=sims.device).expand(q)
    n_valid = valid.sum(dim=1)
    if length == 0:
        return torch.full((q,), float("inf"), dtype=sims.dtype, device=sims.device)
    ordered = torch.where(valid, sims, torch.full_like(sims, float("inf"))).sort(dim=1).values
    pos = pct / 100 * (n_valid - 1).clamp(min=0).to(sims.dtype)
    lo = pos.floor().long().clamp(0, length - 1)
    hi = pos.ceil().long().clamp(0, length - 1)
    frac = pos - lo.to(sims.dtype)
    v_lo = ordered.gather(1, lo[:, None]).squeeze(1)
    v_hi = ordered.gather(1, hi[:, None]).squeeze(1)
    tau = torch.where(hi == lo, v_lo, v_lo + (v_hi - v_lo) * frac)
    return torch.where(n_valid > 0, tau, torch.full_like(tau, float("inf")))


def similarity_ranks(sims: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """sims (Q, L) float, valid (Q, L) bool -> rank (Q, L) int64.

    0 = most similar valid sentence; ties go to the earlier position; invalid entries rank last.
    """
    keyed = torch.where(valid, sims, torch.full_like(sims, float("-inf")))
    order = keyed.sort(dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(sims.shape[1], device=sims.device).expand_as(order))
    return rank


def top_ranked(sims: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """sims (Q, L) float, valid (Q, L) bool -> (Q, L) bool: similarity_ranks(sims, valid) < k, without a sort.

    The k-th largest key v of each row (a top-k): keys above v rank below k, and of the keys equal to v the
    first k - (number above v) in row order do (ties go to the earlier position, as in similarity_ranks).
    """
    q, length = sims.shape
    if k <= 0 or length == 0:
        return torch.zeros_like(valid)
    if k >= length:
        return torch.ones_like(valid)
    keyed = torch.where(valid, sims, torch.full_like(sims, float("-inf")))
    if bool(keyed.isnan().any()):  # NaN has no place in a comparison: the sort decides
        return similarity_ranks(sims, valid) < k
    kth = keyed.topk(k, dim=1).values[:, -1:]  # (Q, 1)
    above = keyed > kth
    tied = keyed == kth
    room = k - above.sum(dim=1, keepdim=True)  # >= 1: the rank slots left for the ties
    return above | (tied & (tied.cumsum(dim=1) <= room))


def percentile_seeds(
    sims: torch.Tensor,
    valid: torch.Tensor,
    percentile: float | torch.Tensor,
    min_seeds: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sims (Q, L) float, valid (Q, L) bool -> tau (Q,) float, seeds (Q, L) bool.

    seeds = valid & sims >= tau; then the `min_seeds` most similar valid sentences are always seeds (ties broken
    by position). Rows with no valid entry have no seeds.
    """
    tau = percentile_threshold(sims, valid, percentile)
    seeds = valid & ((sims >= tau[:, None]) | top_ranked(sims, valid, min_seeds))
    return tau, seeds
