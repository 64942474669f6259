"""The hard token cap on chunk length: where a chunk above it is cut at sentence ends."""

from __future__ import annotations

import torch

from qasc.kernels.runs import positions_like, run_bounds


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
