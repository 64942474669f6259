"""Loop twins of kernels.extents."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _INF, _round, _rows, _segment_ids, _sqrt, _to_tensor


def neighbour_dots(vectors: torch.Tensor, width: int, block_rows: int = 65536) -> torch.Tensor:
    """dots (N, width): dots[i][d] = sum_k v_i[k] * v_{i+d}[k], 0 past the last row."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    rows = vectors.tolist()
    n = len(rows)
    out = [[0.0] * width for _ in range(n)]
    for i in range(n):
        for d in range(width):
            if i + d < n:
                out[i][d] = _round(sum(x * y for x, y in zip(rows[i], rows[i + d], strict=True)), vectors.dtype)
    return _to_tensor(out, (n, width), vectors.dtype, vectors.device)


def run_norms(dots: torch.Tensor, max_len: int) -> torch.Tensor:
    """norms (Q, L, max_len): sqrt of the sum over every ordered pair (i, j) of the run of e_i . e_j, read from
    dots[min(i, j)][|i - j|]; the run is cut at the end of the row."""
    q, length, width = dots.shape
    if width < max_len:
        raise ValueError(f"neighbour dots of width {width} cannot score runs of {max_len} sentences")
    out = [[[0.0] * max_len for _ in range(length)] for _ in range(q)]
    table = dots.tolist()
    for b in range(q):
        for a in range(length):
            for n in range(1, max_len + 1):
                run = [i for i in range(a, a + n) if i < length]
                total = sum(table[b][min(i, j)][abs(i - j)] for i in run for j in run)
                out[b][a][n - 1] = _sqrt(total, dots.dtype)
    return _to_tensor(out, (q, length, max_len), dots.dtype, dots.device)


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
    """scores (Q, L, max_len): cosine of the query with the summed embeddings of each run of n sentences
    starting at a (sims summed left to right; the norm from the pairwise dots of the run's valid sentences),
    plus the mean of the run's boosts (summed left to right, over n) when given, minus penalty * (n - 1); -inf
    unless the run stays in one segment and holds a seed."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    q, length = sims.shape
    dtype = sims.dtype
    out = [[[-_INF] * max_len for _ in range(length)] for _ in range(q)]
    table = dots.to(dtype).tolist()
    boosts = None if boost is None else _rows(boost.to(dtype))
    for b, (row, ok, keys, seed) in enumerate(zip(_rows(sims), _rows(valid), _rows(segment_ids), _rows(seeds),
                                                   strict=True)):
        seg = _segment_ids(keys, ok)
        for a in range(length):
            for n in range(1, max_len + 1):
                run = list(range(a, a + n))
                if run[-1] >= length or seg[a] is None or any(seg[i] != seg[a] for i in run):
                    continue
                if not any(seed[i] for i in run):
                    continue
                total = 0.0
                for i in run:
                    total = _round(total + row[i], dtype)
                square = sum(table[b][min(i, j)][abs(i - j)] for i in run for j in run)
                norm = _sqrt(square, dtype)
                cos = _round(total / norm, dtype) if norm > 0 else 0.0
                if boosts is not None:
                    lift = 0.0
                    for i in run:
                        lift = _round(lift + boosts[b][i], dtype)
                    cos = _round(cos + _round(lift / n, dtype), dtype)
                out[b][a][n - 1] = _round(cos - _round(penalty * (n - 1), dtype), dtype)
    return _to_tensor(out, (q, length, max_len), dtype, sims.device)


def pick_extents(
    scores: torch.Tensor, max_picks: int, margin: float | None = None, lengths: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """pick_id (Q, L) int64, value (Q, L) float: greedy best-first non-overlapping extents (slot m of position
    a covers lengths[a][m] sentences from a, m + 1 without lengths; ties: lower start, then lower slot), at most
    `max_picks`, each >= first pick - margin; -1 / -inf where no pick covers."""
    q, length, m = scores.shape
    ids: list[list[int]] = []
    values: list[list[float]] = []
    sizes = lengths.tolist() if lengths is not None else [[[j + 1 for j in range(m)]] * length] * q
    for row, size in zip(scores.tolist(), sizes, strict=True):
        cands = sorted(((row[a][j], a, max(size[a][j], 1), j) for a in range(length) for j in range(m)
                        if row[a][j] > -_INF and a + max(size[a][j], 1) <= length),
                       key=lambda c: (-c[0], c[1], c[3]))
        pid = [-1] * length
        val = [-_INF] * length
        taken = 0
        first = None
        for score, a, n, _slot in cands:
            if taken >= max_picks:
                break
            if any(pid[i] >= 0 for i in range(a, a + n)):
                continue
            first = score if first is None else first
            if margin is not None and score < first - margin:
                break
            for i in range(a, a + n):
                pid[i], val[i] = taken, score
            taken += 1
        ids.append(pid)
        values.append(val)
    return (_to_tensor(ids, (q, length), torch.long, scores.device),
            _to_tensor(values, (q, length), scores.dtype, scores.device))


def block_stats(vectors: torch.Tensor, block_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sizes (N,) int64, norms (N,) float: rows and norm of the summed vectors of the run of equal consecutive
    keys holding each row."""
    keys = block_keys.tolist()
    rows = vectors.tolist()
    n = len(keys)
    sizes = [0] * n
    norms = [0.0] * n
    a = 0
    while a < n:
        b = a
        while b + 1 < n and keys[b + 1] == keys[a]:
            b += 1
        total = [sum(rows[i][k] for i in range(a, b + 1)) for k in range(vectors.shape[1])]
        norm = _sqrt(sum(x * x for x in total), vectors.dtype)
        for i in range(a, b + 1):
            sizes[i], norms[i] = b - a + 1, norm
        a = b + 1
    return (_to_tensor(sizes, (n,), torch.long, vectors.device), _to_tensor(norms, (n,), vectors.dtype,
                                                                             vectors.device))


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
    """score (Q, L) float, length (Q, L) int64: at the first position of every block of the row (run of equal
    segment and block ids among valid positions) that is complete (as long as block_sizes), holds a seed and
    fits max_tokens, the sum of its sims / block_norms (0 for a zero norm) and its length; -inf / 0 elsewhere."""
    q, length = sims.shape
    score = [[-_INF] * length for _ in range(q)]
    size = [[0] * length for _ in range(q)]
    for b, (row, ok, seg, blk, bs, bn, seed, tok) in enumerate(zip(
            _rows(sims), _rows(valid), _rows(segment_ids), _rows(block_ids), _rows(block_sizes),
            _rows(block_norms), _rows(seeds), _rows(n_tokens), strict=True)):
        seg_of = _segment_ids(seg, ok)
        a = 0
        while a < length:
            if seg_of[a] is None:
                a += 1
                continue
            e = a
            while e + 1 < length and seg_of[e + 1] == seg_of[a] and blk[e + 1] == blk[a]:
                e += 1
            run = range(a, e + 1)
            total = 0.0
            for i in run:
                total = _round(total + row[i], sims.dtype)
            if (e - a + 1 == bs[a] and any(seed[i] for i in run) and sum(tok[i] for i in run) <= max_tokens):
                score[b][a] = _round(total / bn[a], sims.dtype) if bn[a] > 0 else 0.0
                size[b][a] = e - a + 1
            a = e + 1
    return (_to_tensor(score, (q, length), sims.dtype, sims.device),
            _to_tensor(size, (q, length), torch.long, sims.device))
