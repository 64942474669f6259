"""Query-adaptive extents: score every short run of sentences by its pooled embedding, pick the best runs.

A chunk's extent is chosen per query and per hit: the candidate extents are all runs of 1..M consecutive
sentences inside one segment (region, or paragraph when clipped) that hold at least one seed; each is
scored by the cosine between the query and the sum of its sentence embeddings. A run of sentences that
together answer the query scores above each of its sentences alone, a lone factoid sentence scores above
any run that dilutes it, so the extent follows the similarity profile around each hit.
Greedy non-overlapping picks (best first) then give the chunks.
"""

from __future__ import annotations

import torch

from kernels.runs import positions_like, region_keys, run_bounds


def neighbour_dots(vectors: torch.Tensor, width: int, block_rows: int = 65536) -> torch.Tensor:
    """vectors (N, D) float -> dots (N, width) float: dots[i, d] = v_i . v_{i+d}, 0 where i + d >= N.

    Query independent: computed once per store (or document), so that the pooled cosine of any run of up to
    `width` consecutive rows needs these N * width numbers, never the (Q, L, D) vectors of a batch. Rows are
    processed in blocks of `block_rows`, so the temporary memory is bounded whatever N is.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    n = vectors.shape[0]
    out = vectors.new_zeros((n, width))
    for lo in range(0, n, block_rows):
        hi = min(lo + block_rows, n)
        for d in range(min(width, n - lo)):
            top = min(hi, n - d)  # rows lo..top-1 have a partner d rows further on
            if top > lo:
                out[lo:top, d] = (vectors[lo:top] * vectors[lo + d : top + d]).sum(-1)
    return out


def run_norms(dots: torch.Tensor, max_len: int) -> torch.Tensor:
    """dots (Q, L, W) float (W >= max_len; see `neighbour_dots`) -> norms (Q, L, max_len) float.

    norms[q, a, n-1] = ||e_a + ... + e_{a+n-1}||, from ||sum e||^2 = sum_i e_i.e_i + 2 sum_{i<j} e_i.e_j with
    every pair of the run at most n-1 positions apart. Adding the sentence j = a+n-1 to a run adds its square
    and its dots with the n-1 earlier sentences, dots[j-d, d] for d = 1..n-1. Positions past the end of the
    row get the norm of the part inside; callers mask runs that leave their segment.
    """
    q, length, width = dots.shape
    if width < max_len:
        raise ValueError(f"neighbour dots of width {width} cannot score runs of {max_len} sentences")
    sq = dots.new_zeros((q, length))
    out = dots.new_zeros((q, length, max_len))
    for n in range(1, max_len + 1):
        j = n - 1  # the new sentence sits j positions after the run's start
        if j < length:
            added = dots[:, j:, 0].clone()  # (Q, L - j): e_j . e_j for run starts a = 0 .. L-1-j
            for d in range(1, n):
                added += 2 * dots[:, j - d : length - d, d]  # e_{a+j-d} . e_{a+j}
            sq[:, : length - j] += added
        out[..., j] = sq.clamp(min=0).sqrt()
    return out


def pooled_extent_scores(
    sims: torch.Tensor,
    dots: torch.Tensor,
    valid: torch.Tensor,
    segment_ids: torch.Tensor,
    seeds: torch.Tensor,
    max_len: int,
    penalty: float = 0.0,
) -> torch.Tensor:
    """sims (Q, L) float, dots (Q, L, W >= max_len) float, valid/seeds (Q, L) bool, segment_ids (Q, L) int64
    -> scores (Q, L, max_len) float.

    scores[q, a, n-1] = (s_a + ... + s_{a+n-1}) / ||e_a + ... + e_{a+n-1}|| - penalty * (n - 1): with
    s_i = query . e_i and a unit query, the cosine between the query and the pooled embedding of the n
    sentences starting at position a (0 when the pooled vector is zero). The norms come from the neighbour
    dots (`run_norms`), so memory and time do not grow with the embedding width D. Sums run left to right.
    -inf where the run leaves its segment (a run of equal segment ids among valid positions), passes the
    end of the row, or holds no seed.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    q, length = sims.shape
    out = torch.full((q, length, max_len), float("-inf"), dtype=sims.dtype, device=sims.device)
    if length == 0:
        return out
    keys = region_keys(segment_ids, valid)
    _, run_end = run_bounds(keys)
    idx = positions_like(sims)
    zero = torch.zeros_like(sims)
    norms = run_norms(torch.where(valid[..., None], dots.to(sims.dtype), 0.0), max_len)
    row_sims = torch.where(valid, sims, zero)
    row_seeds = seeds & valid
    s_sum = zero.clone()
    has_seed = torch.zeros_like(seeds)
    for n in range(1, max_len + 1):
        shift = n - 1  # add the sentence at a + n - 1 to every run starting at a
        if shift >= length:
            break
        s_sum[:, : length - shift] += row_sims[:, shift:]
        has_seed[:, : length - shift] |= row_seeds[:, shift:]
        norm = norms[..., shift]
        cos = torch.where(norm > 0, s_sum / torch.where(norm > 0, norm, torch.ones_like(norm)), zero)
        inside = valid & (keys >= 0) & (idx + shift <= run_end)
        out[..., shift] = torch.where(inside & has_seed, cos - penalty * shift, torch.full_like(cos, float("-inf")))
    return out


def pick_extents(
    scores: torch.Tensor, max_picks: int, margin: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (Q, L, M) float (-inf = not a candidate) -> pick_id (Q, L) int64, value (Q, L) float.

    Greedy non-overlapping selection per row, at most `max_picks` times: take the highest-scoring run
    (ties: the lower start, then the shorter run), then drop every run that overlaps a taken one; runs past
    the end of the row are never candidates. With
    `margin`, only runs scoring >= the row's first pick - margin are taken. pick_id[q, i] = the order
    (0, 1, ...) of the pick covering position i, -1 if none; value[q, i] = that pick's score, -inf if none.
    """
    q, length, m = scores.shape
    pick_id = torch.full((q, length), -1, dtype=torch.long, device=scores.device)
    value = torch.full((q, length), float("-inf"), dtype=scores.dtype, device=scores.device)
    if length == 0 or q == 0 or m == 0:
        return pick_id, value
    idx = positions_like(pick_id)
    run_len = torch.arange(1, m + 1, device=scores.device)
    ends = idx[..., None] + run_len  # (Q, L, M) exclusive end of each run
    avail = torch.where(ends <= length, scores, torch.full_like(scores, float("-inf")))
    ends = ends.clamp(max=length)
    first = None
    for t in range(max_picks):
        best, flat = avail.reshape(q, -1).max(dim=1)
        live = best > float("-inf")
        if margin is not None:
            first = best if first is None else first
            live &= best >= first - margin
        if not bool(live.any()):
            break
        start = flat // m
        stop = start + flat % m + 1
        span = (idx >= start[:, None]) & (idx < stop[:, None]) & live[:, None]
        pick_id = torch.where(span, t, pick_id)
        value = torch.where(span, best[:, None], value)
        taken = torch.nn.functional.pad((pick_id >= 0).long().cumsum(dim=1), (1, 0))  # (Q, L+1)
        hit = taken.gather(1, ends.reshape(q, -1)).reshape(q, length, m) > taken[:, :length, None]
        avail = torch.where(hit, torch.full_like(avail, float("-inf")), avail)
    return pick_id, value
