"""Window expansion around seeds (fixed or adaptive radius) and decay-weighted window scoring."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from qasc.kernels.runs import positions_like, region_keys, run_bounds


def _neighbours(x: torch.Tensor, radius: int, fill: float | int) -> torch.Tensor:
    """x (Q, L) -> (Q, L, 2*radius+1): [..., radius + d] = x[:, i + d], `fill` outside the row."""
    if x.dtype == torch.bool:
        return _neighbours(x.to(torch.uint8), radius, int(fill)).bool()
    padded = F.pad(x, (radius, radius), value=fill)
    return padded.unfold(1, 2 * radius + 1, 1)


def expand_windows(
    sims: torch.Tensor,
    valid: torch.Tensor,
    seeds: torch.Tensor,
    segment_ids: torch.Tensor,
    radius: int,
    threshold: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sims (Q, L) float, valid/seeds (Q, L) bool, segment_ids (Q, L) int64 -> starts, ends (Q, L) int64.

    For each seed r the window [start, end] (inclusive) grows outward one sentence at a time, on each
    side independently, up to `radius` sentences, never leaving r's segment (a run of equal segment
    ids: document, region or paragraph). With `threshold` (Q, L) float, given per seed, a side stops
    growing at the first neighbour whose similarity is below threshold[r] (adaptive window); without
    it the radius is fixed. Non-seed positions get start = end = -1.
    """
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    idx = positions_like(sims)
    keys = region_keys(segment_ids, valid)
    run_start, run_end = run_bounds(keys)
    if threshold is None or radius == 0 or sims.shape[1] == 0:
        starts = torch.maximum(idx - radius, run_start)
        ends = torch.minimum(idx + radius, run_end)
    else:
        neg_inf = float("-inf")
        near_sims = _neighbours(torch.where(valid, sims, torch.full_like(sims, neg_inf)), radius, neg_inf)
        near_keys = _neighbours(keys, radius, -1)
        ok = (near_sims >= threshold[..., None]) & (near_keys == keys[..., None])  # (Q, L, 2R+1)
        left = ok[..., :radius].flip(-1).long().cumprod(-1).sum(-1)  # neighbours i-1, i-2, ...
        right = ok[..., radius + 1 :].long().cumprod(-1).sum(-1)  # neighbours i+1, i+2, ...
        starts, ends = idx - left, idx + right
    none = torch.full_like(idx, -1)
    return torch.where(seeds, starts, none), torch.where(seeds, ends, none)


def decay_window_scores(
    sims: torch.Tensor,
    valid: torch.Tensor,
    seeds: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    decay: float,
) -> torch.Tensor:
    """sims (Q, L) float, valid/seeds (Q, L) bool, starts/ends (Q, L) int64 -> scores (Q, L) float.

    score[r] = sum_i a_i s_i / sum_i a_i over valid i in [start_r, end_r], a_i = exp(-decay * |i - r|);
    -inf where r is not a seed. Evaluated as s_r + sum_d [a_d (s_{r-d} - s_r) + a_d (s_{r+d} - s_r)] / sum_i a_i,
    the two sentences at each distance d added first: a window of equally similar sentences scores exactly
    s_r and a mirrored window scores exactly the same, so windows that tie in exact arithmetic tie in floating
    point too (and the tie is broken by position downstream, not by rounding noise). The order of every
    operation is part of the contract (weights a_d = math.exp(-decay * d), the pair terms accumulated in
    increasing d): other windows can tie in exact arithmetic too (geometric weights make
    (a + 2a^2 + a^3) / (1 + 2a + 2a^2 + a^3) == (a + a^2) / (1 + a + a^2)), and a fixed order gives any
    implementation of the contract the same floats, hence the same ranking.
    """
    q, length = sims.shape
    if length == 0:
        return sims.clone()
    idx = positions_like(sims)
    reach = torch.where(seeds, torch.maximum(idx - starts, ends - idx), torch.zeros_like(idx))  # seeds only
    radius = int(reach.clamp(min=0).max().item()) if seeds.any() else 0
    radius = min(radius, length)
    offsets = torch.arange(-radius, radius + 1, device=sims.device)
    # (2R+1,): Python's exp, as the contract fixes it (torch.exp may differ from it in the last bit)
    weights = torch.tensor([math.exp(-decay * abs(d)) for d in range(-radius, radius + 1)], dtype=sims.dtype,
                           device=sims.device)
    near_sims = _neighbours(torch.where(valid, sims, torch.zeros_like(sims)), radius, 0.0)
    near_valid = _neighbours(valid, radius, False)
    pos = idx[..., None] + offsets  # (Q, L, 2R+1)
    inside = near_valid & (pos >= starts[..., None]) & (pos <= ends[..., None])
    w = torch.where(inside, weights.expand_as(near_sims), torch.zeros_like(near_sims))
    centre = torch.where(valid, sims, torch.zeros_like(sims))  # s_r
    terms = w * (near_sims - centre[..., None])  # a_i (s_i - s_r), 0 outside the window
    # pair the neighbours at distance d (offsets -d and +d) before summing over d: symmetric in left/right;
    # the pairs are accumulated in increasing d, one (Q, L) add each (a reduction's order is not fixed)
    num_pairs = terms[..., :radius].flip(-1) + terms[..., radius + 1 :]  # (Q, L, R): [..., d - 1] = distance d
    den_pairs = w[..., :radius].flip(-1) + w[..., radius + 1 :]
    num, den = terms[..., radius], w[..., radius]
    for d in range(radius):
        num = num + num_pairs[..., d]
        den = den + den_pairs[..., d]
    scores = centre + num / den.clamp(min=torch.finfo(sims.dtype).tiny)
    return torch.where(seeds, scores, torch.full_like(scores, float("-inf")))


def keep_windows(
    scores: torch.Tensor, seeds: torch.Tensor, tau: torch.Tensor, factor: float | None
) -> torch.Tensor:
    """scores (Q, L) float, seeds (Q, L) bool, tau (Q,) float -> kept (Q, L) bool.

    Seeds whose window score is >= factor * tau; every seed when factor is None (no filter).
    """
    if factor is None:
        return seeds.clone()
    return seeds & (scores >= factor * tau[:, None])
