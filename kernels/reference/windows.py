"""Loop twins of kernels.windows."""

from __future__ import annotations

import math

import torch

from qasc.kernels.reference._common import _INF, _rows, _segment_ids, _to_tensor


def _may_take(j: int, r: int, seg: list[int | None], sims: list[float], threshold: list[float] | None) -> bool:
    """May seed r's window take position j: same segment as r and, if adaptive, similar enough?"""
    if not 0 <= j < len(seg) or seg[j] is None or seg[j] != seg[r]:
        return False
    return threshold is None or sims[j] >= threshold[r]


def expand_windows(
    sims: torch.Tensor,
    valid: torch.Tensor,
    seeds: torch.Tensor,
    segment_ids: torch.Tensor,
    radius: int,
    threshold: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """starts, ends (Q, L) int64: each seed's window grown one sentence at a time per side within its segment.

    A side stops after `radius` steps, at the segment's edge, or (with `threshold`) before the first neighbour
    whose similarity is below the seed's threshold. Non-seeds get -1.
    """
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    q, length = sims.shape
    thr_rows = _rows(threshold) if threshold is not None else [None] * q
    starts: list[list[int]] = []
    ends: list[list[int]] = []
    for row, ok, seed, keys, thr in zip(
        _rows(sims), _rows(valid), _rows(seeds), _rows(segment_ids), thr_rows, strict=True
    ):
        seg = _segment_ids(keys, ok)
        row_s = [-1] * length
        row_e = [-1] * length
        for r in range(length):
            if not seed[r]:
                continue

            s = r
            while r - s < radius and _may_take(s - 1, r, seg, row, thr):
                s -= 1
            e = r
            while e - r < radius and _may_take(e + 1, r, seg, row, thr):
                e += 1
            row_s[r], row_e[r] = s, e
        starts.append(row_s)
        ends.append(row_e)
    return (
        _to_tensor(starts, (q, length), torch.long, sims.device),
        _to_tensor(ends, (q, length), torch.long, sims.device),
    )


def decay_window_scores(
    sims: torch.Tensor,
    valid: torch.Tensor,
    seeds: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    decay: float,
) -> torch.Tensor:
    """scores (Q, L): decay-weighted mean of the valid sims of each seed's window; -inf for non-seeds.

    score[r] = sum_i a_i s_i / sum_i a_i over valid i in [start_r, end_r], a_i = exp(-decay |i - r|), evaluated
    as the contract asks: s_r + sum over d = 1, 2, ... of [a_d (s_{r-d} - s_r) + a_d (s_{r+d} - s_r)] / sum_i a_i,
    so that constant and mirrored windows tie exactly; a_d = math.exp(-decay * d) and the pairs are added in
    increasing d, the order the contract fixes (other windows tie in exact arithmetic too, and the same order
    gives them the same floats). A window without any valid sentence (outside the contract: the seed itself is
    valid and inside) scores s_r.
    """
    q, length = sims.shape
    out: list[list[float]] = []
    for row, ok, seed, st, en in zip(_rows(sims), _rows(valid), _rows(seeds), _rows(starts), _rows(ends), strict=True):
        scores = [-_INF] * length
        for r in range(length):
            if not seed[r]:
                continue
            lo, hi = max(st[r], 0), min(en[r], length - 1)
            inside = [lo <= i <= hi and bool(ok[i]) for i in range(length)]
            num = 0.0
            den = 1.0 if inside[r] else 0.0  # a_0 = 1; the seed adds a_0 (s_r - s_r) = 0 to num
            for d in range(1, length):
                a = math.exp(-decay * d)
                has_left = r - d >= 0 and inside[r - d]
                has_right = r + d < length and inside[r + d]
                left = a * (row[r - d] - row[r]) if has_left else 0.0
                right = a * (row[r + d] - row[r]) if has_right else 0.0
                num += left + right
                den += (a if has_left else 0.0) + (a if has_right else 0.0)
            scores[r] = row[r] + (num / den if den > 0 else 0.0)
        out.append(scores)
    return _to_tensor(out, (q, length), sims.dtype, sims.device)


def keep_windows(scores: torch.Tensor, seeds: torch.Tensor, tau: torch.Tensor, factor: float | None) -> torch.Tensor:
    """kept (Q, L) bool: seeds whose window score is >= factor * tau (all seeds when factor is None)."""
    q, length = scores.shape
    out: list[list[bool]] = []
    for row, seed, t in zip(_rows(scores), _rows(seeds), tau.tolist(), strict=True):
        out.append([bool(seed[i]) and (factor is None or row[i] >= factor * t) for i in range(length)])
    return _to_tensor(out, (q, length), torch.bool, scores.device)
