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

from qasc.kernels.runs import positions_like, region_keys, run_bounds


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
    boost: torch.Tensor | None = None,
) -> torch.Tensor:
    """sims (Q, L) float, dots (Q, L, W >= max_len) float, valid/seeds (Q, L) bool, segment_ids (Q, L) int64,
    boost (Q, L) float or None -> scores (Q, L, max_len) float.

    scores[q, a, n-1] = (s_a + ... + s_{a+n-1}) / ||e_a + ... + e_{a+n-1}|| - penalty * (n - 1): with
    s_i = query . e_i and a unit query, the cosine between the query and the pooled embedding of the n
    sentences starting at position a (0 when the pooled vector is zero). The norms come from the neighbour
    dots (`run_norms`), so memory and time do not grow with the embedding width D. Sums run left to right.
    With `boost` (a per-row additive score, e.g. the heading context's), the run's mean boost
    (b_a + ... + b_{a+n-1}) / n is added once: summed into the pooled cosine instead, a boost b on every
    sentence would count n / ||e_a + ... + e_{a+n-1}|| > 1 times and lift a run above its own best sentence
    whenever the heading matches. -inf where the run leaves its segment (a run of equal segment ids among valid
    positions), passes the end of the row, or holds no seed.
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
    b_sum = zero.clone()
    row_boost = None if boost is None else torch.where(valid, boost.to(sims.dtype), zero)
    has_seed = torch.zeros_like(seeds)
    for n in range(1, max_len + 1):
        shift = n - 1  # add the sentence at a + n - 1 to every run starting at a
        if shift >= length:
            break
        s_sum[:, : length - shift] += row_sims[:, shift:]
        has_seed[:, : length - shift] |= row_seeds[:, shift:]
        norm = norms[..., shift]
        cos = torch.where(norm > 0, s_sum / torch.where(norm > 0, norm, torch.ones_like(norm)), zero)
        if row_boost is not None:
            b_sum[:, : length - shift] += row_boost[:, shift:]
            cos = cos + b_sum / n
        inside = valid & (keys >= 0) & (idx + shift <= run_end)
        out[..., shift] = torch.where(inside & has_seed, cos - penalty * shift, torch.full_like(cos, float("-inf")))
    return out


SCAN_MAX = 64  # pick_extents: rows with at most this many candidates within the margin are picked by one scan


def pick_extents(
    scores: torch.Tensor, max_picks: int, margin: float | None = None, lengths: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (Q, L, M) float (-inf = not a candidate), lengths (Q, L, M) int64 or None -> pick_id (Q, L)
    int64, value (Q, L) float.

    Slot m of position a is the extent of lengths[q, a, m] sentences starting at a (None: m + 1, the runs of
    `pooled_extent_scores`). Greedy non-overlapping selection per row, at most `max_picks` times: take the
    highest-scoring extent (ties: the lower start, then the lower slot), then drop every extent that overlaps
    a taken one; extents past the end of the row are never candidates. With
    `margin`, only runs scoring >= the row's first pick - margin are taken. pick_id[q, i] = the order
    (0, 1, ...) of the pick covering position i, -1 if none; value[q, i] = that pick's score, -inf if none.

    With a margin, only the few candidates within it of the row's best can ever be taken: rows with at most
    SCAN_MAX of them are decided in one scan over those candidates in pick order (`_pick_by_scan`); other rows
    (and every row without a margin) take one pick per step over the whole row (`_pick_by_steps`).
    """
    q, length, m = scores.shape
    pick_id = torch.full((q, length), -1, dtype=torch.long, device=scores.device)
    value = torch.full((q, length), float("-inf"), dtype=scores.dtype, device=scores.device)
    if length == 0 or q == 0 or m == 0:
        return pick_id, value
    room = length - torch.arange(length, device=scores.device)[:, None]  # (L, 1) sentences left from each start
    if lengths is None:
        span = torch.arange(1, m + 1, device=scores.device).expand(q, length, m)
        avail = scores.masked_fill(span > room, float("-inf"))  # (Q, L, M), an extent past the end: none
    else:
        span = lengths  # clamped to >= 1 where it is used (a length <= 0 always fits: every row has room >= 1)
        avail = scores.masked_fill(lengths > room, float("-inf"))
    if margin is None:
        return _pick_by_steps(avail, span, max_picks, None, pick_id, value)
    first = avail.reshape(q, -1).amax(dim=1)  # (Q,) every row's first pick
    # may be taken: finite and >= first - margin (+inf: a row without candidates; -max: an infinite margin)
    floor = torch.where(first > float("-inf"), (first - margin).clamp(min=-torch.finfo(avail.dtype).max),
                        float("inf"))
    near = avail >= floor[:, None, None]  # (Q, L, M)
    hits = near.reshape(q, -1).nonzero()  # (N, 2) row, flat index: row-major, so in flat order within a row
    count = torch.bincount(hits[:, 0], minlength=q)
    scan = count <= SCAN_MAX
    if bool(scan.all()):
        return _pick_by_scan(avail, span, hits, count, max_picks, pick_id, value)
    rows = scan.nonzero()[:, 0]
    sub = near[rows].reshape(rows.shape[0], length * m).nonzero()
    ids, vals = _pick_by_scan(avail[rows], span[rows], sub, count[rows], max_picks, pick_id[rows], value[rows])
    pick_id[rows], value[rows] = ids, vals
    rows = (~scan).nonzero()[:, 0]
    ids, vals = _pick_by_steps(avail[rows], span[rows], max_picks, margin, pick_id[rows], value[rows])
    pick_id[rows], value[rows] = ids, vals
    return pick_id, value


def _pick_by_scan(avail, span, hits, count, max_picks, pick_id, value):
    """pick_extents for rows whose candidates within the margin (hits (N, 2): row and flat index of each, in
    flat order within a row; count (Q,) per row) are few:
    sorted best first (ties: lower start, then lower slot), each is taken unless it overlaps one taken before
    it or `max_picks` are taken: the greedy steps' picks, in the same order."""
    q, length, m = avail.shape
    k = int(count.max()) if q else 0
    if k == 0:
        return pick_id, value
    row, flat = hits[:, 0], hits[:, 1]
    rank = torch.arange(row.shape[0], device=avail.device) - (count.cumsum(0) - count)[row]
    cand = torch.full((q, k), -1, dtype=torch.long, device=avail.device)
    cand[row, rank] = flat  # (Q, K) flat index of each row's candidates, in flat order, -1 = none
    present = cand >= 0
    score = torch.where(present, avail.reshape(q, -1).gather(1, cand.clamp(min=0)), float("-inf"))
    order = score.sort(dim=1, descending=True, stable=True).indices  # best first; ties: lower flat index
    cand, present, score = cand.gather(1, order), present.gather(1, order), score.gather(1, order)
    flat = cand.clamp(min=0)
    start = flat // m
    stop = start + span.reshape(q, -1).gather(1, flat).clamp(min=1)  # (Q, K) exclusive
    clash = (start[:, :, None] < stop[:, None, :]) & (start[:, None, :] < stop[:, :, None])  # (Q, K, K)
    taken = torch.zeros_like(present)
    n_taken = torch.zeros(q, dtype=torch.long, device=avail.device)
    for i in range(k):
        ok = present[:, i] & (n_taken < max_picks) & ~(clash[:, i, :i] & taken[:, :i]).any(dim=1)
        taken[:, i] = ok
        n_taken += ok
    # taken extents are disjoint: +t+1 at the start of pick t and -(t+1) at its stop, summed left to right
    t = torch.where(taken, taken.long().cumsum(dim=1), 0)
    mark = torch.zeros((q, length + 1), dtype=torch.long, device=avail.device)
    mark.scatter_add_(1, torch.where(taken, start, 0), t)
    mark.scatter_add_(1, torch.where(taken, stop, 0), -t)
    pick_id = mark[:, :length].cumsum(dim=1) - 1
    # value of pick t: the t-th taken score
    slot = torch.where(taken, t - 1, k)
    by_pick = torch.full((q, k + 1), float("-inf"), dtype=avail.dtype, device=avail.device)
    by_pick.scatter_(1, slot, torch.where(taken, score, float("-inf")))
    value = torch.where(pick_id >= 0, by_pick.gather(1, pick_id.clamp(min=0)), value)
    return pick_id, value


def _pick_by_steps(avail, span, max_picks, margin, pick_id, value):
    """pick_extents one pick per step: the best available extent of each row, then every extent overlapping it
    is dropped (avail (Q, L, M) with -inf = none, span (Q, L, M) its sentences)."""
    q, length, m = avail.shape
    if q == 0:
        return pick_id, value
    idx = torch.arange(length, device=avail.device)
    starts = idx[:, None].expand(length, m).reshape(-1)  # (L * M,) start of each flat extent
    span = span.clamp(min=1)
    ends = (idx[:, None] + span).reshape(q, -1)  # (Q, L * M) exclusive
    avail = avail.reshape(q, -1)  # our own copy: dropped extents are written in place
    first = None
    for t in range(max_picks):
        best, flat = avail.max(dim=1)
        live = best > float("-inf")
        if margin is not None:
            first = best if first is None else first
            live &= best >= first - margin
        if not bool(live.any()):
            break
        start = flat // m
        stop = start + span.reshape(q, -1).gather(1, flat[:, None])[:, 0]
        cover = (idx >= start[:, None]) & (idx < stop[:, None]) & live[:, None]
        pick_id = torch.where(cover, t, pick_id)
        value = torch.where(cover, best[:, None], value)
        hit = (starts < stop[:, None]) & (ends > start[:, None]) & live[:, None]  # overlaps the new pick
        avail.masked_fill_(hit, float("-inf"))
    return pick_id, value


def block_stats(vectors: torch.Tensor, block_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vectors (N, D) float, block_keys (N,) int64 -> sizes (N,) int64, norms (N,) float.

    A block is a run of equal consecutive keys (a paragraph or section of one document); sizes[i] is the number
    of rows of the block holding row i and norms[i] the norm of the sum of that block's vectors. Query
    independent: computed once per store, so that a whole block's pooled cosine with any query is the sum of
    its sentence similarities over this norm.
    """
    n = vectors.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=vectors.device), vectors.new_zeros(0)
    label = torch.ones(n, dtype=torch.long, device=vectors.device)
    label[1:] = (block_keys[1:] != block_keys[:-1]).long()
    label = label.cumsum(0) - 1  # (N,) block index 0..B-1
    n_blocks = int(label[-1]) + 1
    sums = vectors.new_zeros((n_blocks, vectors.shape[1])).index_add_(0, label, vectors)
    sizes = torch.bincount(label, minlength=n_blocks)
    return sizes[label], torch.linalg.vector_norm(sums, dim=-1)[label]


def block_extent_scores(
    sims: torch.Tensor,
    valid: torch.Tensor,
    segment_ids: torch.Tensor,
    block_ids: torch.Tensor,
    block_sizes: torch.Tensor,
    block_norms: torch.Tensor,
    seeds: torch.Tensor,
    n_tokens: torch.Tensor,
    max_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sims (Q, L) float, valid/seeds (Q, L) bool, segment_ids/block_ids (Q, L) int64, block_sizes (Q, L)
    int64, block_norms (Q, L) float, n_tokens (Q, L) int64 -> score (Q, L) float, length (Q, L) int64.

    Whole blocks (paragraphs or sections) as candidate extents. A block of the row is a run of equal segment
    and block ids among valid positions; it is a candidate when the row holds all of it (the run is as long
    as block_sizes says the block is), it holds a seed and its tokens fit `max_tokens`. Its score, placed at
    its first position with length = its sentences, is its pooled cosine: the sum of its similarities over
    block_norms. Everywhere else score is -inf and length 0. The runs are found as (first, last) position
    pairs, so the work after a few (Q, L) passes is per run, not per position.
    """
    q, length = sims.shape
    score = torch.full_like(sims, float("-inf"))
    size = torch.zeros_like(n_tokens)
    if length == 0 or q == 0:
        return score, size
    # a run ends between i and i + 1 when the segment, the block or validity changes there
    cut = (segment_ids[:, 1:] != segment_ids[:, :-1]) | (block_ids[:, 1:] != block_ids[:, :-1])
    cut |= valid[:, 1:] != valid[:, :-1]
    first = valid.clone()
    first[:, 1:] &= cut
    last = valid.clone()
    last[:, :-1] &= cut
    # row-major order pairs the k-th first position of a row with its k-th last position
    row, a = first.nonzero().unbind(1)  # (N,) one entry per run
    e = last.nonzero()[:, 1]
    before = a - 1  # the position before each run (-1 at the row's start: nothing before)

    def run_sum(cs: torch.Tensor) -> torch.Tensor:  # (Q, L) cumulative sums -> (N,) sum over each run
        head = cs[row, before.clamp(min=0)]
        return cs[row, e] - torch.where(before >= 0, head, torch.zeros_like(head))

    total = run_sum(torch.where(valid, sims, 0.0).cumsum(dim=1))  # the same full-row sums as before
    span = e - a + 1
    ok = (span == block_sizes[row, a]) & (run_sum(seeds.cumsum(dim=1, dtype=torch.long)) > 0)
    ok &= run_sum(n_tokens.cumsum(dim=1)) <= max_tokens
    norms = block_norms[row, a]
    cos = torch.where(norms > 0, total / torch.where(norms > 0, norms, torch.ones_like(norms)).to(sims.dtype),
                      torch.zeros_like(total))
    row, a = row[ok], a[ok]
    score[row, a] = cos[ok]
    size[row, a] = span[ok]
    return score, size
