"""Run-length helpers over padded rows: where does the run of equal keys around each position start/end."""

from __future__ import annotations

import torch


def positions_like(x: torch.Tensor) -> torch.Tensor:
    """x (Q, L) -> idx (Q, L) int64 with idx[q, i] = i, on x's device."""
    q, length = x.shape
    return torch.arange(length, device=x.device).expand(q, length)


def run_bounds(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keys (Q, L) int64 -> run_start (Q, L) int64, run_end (Q, L) int64 (inclusive).

    A run is a maximal stretch of equal consecutive keys in a row; run_start[q, i] / run_end[q, i]
    are the first / last position of the run that holds position i.
    """
    q, length = keys.shape
    idx = positions_like(keys)
    if length == 0:
        return idx.clone(), idx.clone()
    starts_here = torch.ones_like(keys, dtype=torch.bool)
    starts_here[:, 1:] = keys[:, 1:] != keys[:, :-1]
    ends_here = torch.ones_like(keys, dtype=torch.bool)
    ends_here[:, :-1] = keys[:, :-1] != keys[:, 1:]
    run_start = torch.where(starts_here, idx, torch.zeros_like(idx)).cummax(dim=1).values
    flipped = torch.where(ends_here, idx, torch.full_like(idx, length - 1)).flip(1)
    run_end = flipped.cummin(dim=1).values.flip(1)
    return run_start, run_end


def region_keys(segment_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """segment_ids (Q, L) int64, valid (Q, L) bool -> keys (Q, L) int64.

    Valid positions keep their segment id shifted to be >= 0; invalid positions get -1, so that a run
    never crosses from valid into padding.
    """
    shifted = segment_ids - segment_ids.min().clamp(max=0) if segment_ids.numel() else segment_ids
    return torch.where(valid, shifted, torch.full_like(segment_ids, -1))


def combine_keys(outer: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
    """outer (Q, L), inner (Q, L) int64 -> keys (Q, L) int64 whose runs break where either key changes.

    Each row's runs are numbered anew, so the result is a run label, not a hash that could collide.
    """
    q, length = outer.shape
    if length == 0:
        return outer.clone()
    change = torch.zeros_like(outer, dtype=torch.bool)
    change[:, 1:] = (outer[:, 1:] != outer[:, :-1]) | (inner[:, 1:] != inner[:, :-1])
    labels = change.long().cumsum(dim=1)
    return torch.where(outer < 0, torch.full_like(labels, -1), labels)
