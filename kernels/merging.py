"""Interval merging per row: windows -> covered sentences -> labelled segments with aggregated scores."""

from __future__ import annotations

import torch

from qasc.kernels.runs import positions_like, region_keys, run_bounds


def coverage(kept: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """kept (Q, L) bool, starts/ends (Q, L) int64 inclusive -> covered (Q, L) bool (union of kept windows)."""
    q, length = kept.shape
    delta = torch.zeros((q, length + 1), dtype=torch.long, device=kept.device)
    one = kept.long()
    delta.scatter_add_(1, torch.where(kept, starts, torch.zeros_like(starts)), one)
    delta.scatter_add_(1, torch.where(kept, ends + 1, torch.zeros_like(ends)), -one)
    return delta.cumsum(dim=1)[:, :length] > 0


def fill_gaps(
    covered: torch.Tensor, segment_ids: torch.Tensor, valid: torch.Tensor, gap: int
) -> torch.Tensor:
    """covered (Q, L) bool, segment_ids (Q, L) int64, valid (Q, L) bool -> covered (Q, L) bool.

    Uncovered stretches of at most `gap` sentences between two covered sentences of the same segment
    (one run of equal segment ids among valid positions: an id that recurs later in the row is another
    segment) become covered (gap 0 changes nothing: adjacent windows already touch).
    """
    if gap < 0:
        raise ValueError(f"gap must be >= 0, got {gap}")
    q, length = covered.shape
    if gap == 0 or length == 0:
        return covered.clone()
    idx = positions_like(covered)
    keys = region_keys(segment_ids, valid)
    prev_cov = torch.where(covered, idx, torch.full_like(idx, -1)).cummax(dim=1).values
    next_cov = torch.where(covered, idx, torch.full_like(idx, length)).flip(1).cummin(dim=1).values.flip(1)
    has_both = (prev_cov >= 0) & (next_cov < length)
    # same segment = same run of keys (an id may recur later in the row as a different segment)
    run_start, _ = run_bounds(keys)
    prev_run = run_start.gather(1, prev_cov.clamp(0, length - 1))
    same_run = prev_run == run_start.gather(1, next_cov.clamp(0, length - 1))
    fill = ~covered & has_both & same_run & (next_cov - prev_cov - 1 <= gap) & (keys >= 0)
    return covered | fill


def label_segments(
    covered: torch.Tensor, segment_ids: torch.Tensor, valid: torch.Tensor, breaks: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """covered (Q, L) bool, segment_ids (Q, L) int64, valid (Q, L) bool -> labels (Q, L) int64, count (Q,).

    Maximal runs of covered valid sentences within one segment get labels 0, 1, ... in row order;
    uncovered positions get -1. `breaks` (Q, L) bool optionally forces a new run at a position.
    """
    q, length = covered.shape
    covered = covered & valid
    keys = region_keys(segment_ids, valid)
    first = covered.clone()
    if length > 1:
        first[:, 1:] &= ~covered[:, :-1] | (keys[:, 1:] != keys[:, :-1])
    if breaks is not None:
        first |= covered & breaks
    labels = first.long().cumsum(dim=1) - 1
    return torch.where(covered, labels, torch.full_like(labels, -1)), first.sum(dim=1)


def segment_spans(labels: torch.Tensor, n_segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    """labels (Q, L) int64 (-1 = none) -> starts, ends (Q, S) int64 inclusive, -1 for absent segments."""
    q, length = labels.shape
    idx = positions_like(labels)
    slot = torch.where(labels >= 0, labels, torch.full_like(labels, n_segments))  # dump slot S
    big = torch.full((q, n_segments + 1), length, dtype=torch.long, device=labels.device)
    starts = big.scatter_reduce(1, slot, idx, reduce="amin", include_self=True)[:, :n_segments]
    ends = torch.full_like(big, -1).scatter_reduce(1, slot, idx, reduce="amax", include_self=True)
    ends = ends[:, :n_segments]
    return torch.where(ends >= 0, starts, torch.full_like(starts, -1)), ends


def segment_sums(labels: torch.Tensor, values: torch.Tensor, n_segments: int) -> torch.Tensor:
    """labels (Q, L) int64, values (Q, L) numeric -> sums (Q, S) of values over each segment."""
    q, _ = labels.shape
    slot = torch.where(labels >= 0, labels, torch.full_like(labels, n_segments))
    out = torch.zeros((q, n_segments + 1), dtype=values.dtype, device=values.device)
    return out.scatter_add(1, slot, values)[:, :n_segments]


def segment_scores(
    labels: torch.Tensor, values: torch.Tensor, include: torch.Tensor, n_segments: int, how: str = "max"
) -> torch.Tensor:
    """labels (Q, L) int64, values (Q, L) float, include (Q, L) bool -> scores (Q, S) float.

    Max or mean of `values` over the included positions of each segment; -inf where a segment has none.
    """
    if how not in ("max", "mean"):
        raise ValueError(f"how must be 'max' or 'mean', got {how!r}")
    q, _ = labels.shape
    use = include & (labels >= 0)
    slot = torch.where(use, labels, torch.full_like(labels, n_segments))
    vals = torch.where(use, values, torch.zeros_like(values))
    if how == "max":
        out = torch.full((q, n_segments + 1), float("-inf"), dtype=values.dtype, device=values.device)
        vals = torch.where(use, values, torch.full_like(values, float("-inf")))
        return out.scatter_reduce(1, slot, vals, reduce="amax", include_self=True)[:, :n_segments]
    total = segment_sums(torch.where(use, labels, -1), vals, n_segments)
    count = segment_sums(torch.where(use, labels, -1), use.to(values.dtype), n_segments)
    mean = total / count.clamp(min=1)
    return torch.where(count > 0, mean, torch.full_like(mean, float("-inf")))
