"""Boundary snapping to paragraph/section blocks and the hard token cap on chunk length."""

from __future__ import annotations

import torch

from qasc.kernels.merging import segment_spans
from qasc.kernels.runs import combine_keys, positions_like, region_keys, run_bounds


def snap_to_blocks(
    labels: torch.Tensor,
    n_segments: int,
    segment_ids: torch.Tensor,
    block_ids: torch.Tensor,
    valid: torch.Tensor,
    n_tokens: torch.Tensor,
    max_tokens: int,
) -> torch.Tensor:
    """labels (Q, L) int64, segment_ids/block_ids/n_tokens (Q, L) int64, valid (Q, L) bool -> covered (Q, L) bool.

    Each segment [s, e] grows to [first sentence of s's block, last sentence of e's block] (blocks =
    runs of equal block id inside a segment: paragraphs or sections) when the grown span holds at
    most `max_tokens` tokens; otherwise it stays as it is. Returns the union of the snapped spans.
    """
    q, length = labels.shape
    if length == 0 or n_segments == 0:
        return labels >= 0
    keys = combine_keys(region_keys(segment_ids, valid), block_ids)
    block_start, block_end = run_bounds(keys)
    starts, ends = segment_spans(labels, n_segments)  # (Q, S)
    present = ends >= 0
    s = starts.clamp(min=0)
    e = ends.clamp(min=0)
    new_s = block_start.gather(1, s)
    new_e = block_end.gather(1, e)
    cum = torch.where(valid, n_tokens, torch.zeros_like(n_tokens)).cumsum(dim=1)
    before = torch.cat([torch.zeros_like(cum[:, :1]), cum], dim=1)  # before[:, i] = tokens in [0, i)
    grown_tokens = before.gather(1, new_e + 1) - before.gather(1, new_s)
    fits = present & (grown_tokens <= max_tokens)
    final_s = torch.where(fits, new_s, s)
    final_e = torch.where(fits, new_e, e)
    delta = torch.zeros((q, length + 1), dtype=torch.long, device=labels.device)
    one = present.long()
    delta.scatter_add_(1, torch.where(present, final_s, torch.zeros_like(final_s)), one)
    delta.scatter_add_(1, torch.where(present, final_e + 1, torch.zeros_like(final_e)), -one)
    return delta.cumsum(dim=1)[:, :length] > 0


def cap_breaks(labels: torch.Tensor, n_tokens: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """labels (Q, L) int64 (-1 = none), n_tokens (Q, L) int64 -> breaks (Q, L) bool.

    Cuts every labelled run greedily, left to right, into pieces of at most `max_tokens` tokens:
    breaks[q, i] is True where a new piece starts inside a run. A sentence longer than the cap alone
    forms a piece (callers keep sentences below the cap). Loops once per piece index, not per sentence.
    """
    q, length = labels.shape
    breaks = torch.zeros_like(labels, dtype=torch.bool)
    if length == 0:
        return breaks
    idx = positions_like(labels)
    tokens = torch.where(labels >= 0, n_tokens, torch.zeros_like(n_tokens))
    cum = tokens.cumsum(dim=1)
    before = cum - tokens
    _, run_end = run_bounds(labels)
    first = labels >= 0
    if length > 1:
        first[:, 1:] &= labels[:, 1:] != labels[:, :-1]
    frontier = first
    # common case first: every run fits whole (cum is non-decreasing), so no piece is cut and no search is needed
    if not bool((first & (cum.gather(1, run_end) > before + max_tokens)).any()):
        return breaks
    while bool(frontier.any()):
        limit = before + max_tokens  # a piece starting at p may end at the last j with cum[j] <= limit[p]
        last = torch.searchsorted(cum, limit, right=True) - 1
        end = torch.maximum(torch.minimum(last, run_end), idx)
        nxt = end + 1
        more = frontier & (end < run_end)
        frontier = torch.zeros_like(frontier)
        frontier.scatter_(1, torch.where(more, nxt, torch.zeros_like(nxt)), more)
        frontier &= labels >= 0
        breaks |= frontier
    return breaks
