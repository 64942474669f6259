"""Slow, loop-based twins of the QASC kernels, written from their docstring contracts for the tests.

Every function has the signature and the output shapes/dtypes of its vectorized counterpart, but works one
query row and one sentence at a time on plain Python lists. Nothing here calls the vectorized kernels, so a
disagreement between the two points at a bug in one of them. The module can be passed as
`kernels.pipeline.run_qasc(..., ops=kernels.reference)`.

Conventions shared by all functions:

* a "segment" of a row is a maximal run of equal consecutive keys among valid positions; an invalid position
  belongs to no segment and always separates segments;
* "block" (snapping) is a maximal run of consecutive valid positions with the same segment key and the same
  block id;
* chunk labels are >= 0; -1 means "no chunk".
"""

from __future__ import annotations

import math

import torch

_INF = float("inf")


# --------------------------------------------------------------------------------------------------- helpers


def _rows(x: torch.Tensor) -> list[list]:
    """(Q, L) tensor -> list of Q Python lists (works for Q == 0 and L == 0)."""
    return [row.tolist() for row in x]


def _to_tensor(rows: list[list], shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Python nested lists -> tensor of exactly `shape` (empty lists would otherwise lose their shape)."""
    return torch.tensor(rows, dtype=dtype).reshape(shape).to(device)


def _segment_ids(keys: list[int], valid: list[bool]) -> list[int | None]:
    """Per position: the index of the segment (run of equal consecutive valid keys) holding it; None if invalid."""
    out: list[int | None] = []
    current = -1
    for i, (key, ok) in enumerate(zip(keys, valid, strict=True)):
        if not ok:
            out.append(None)
            continue
        if i == 0 or not valid[i - 1] or keys[i - 1] != key:
            current += 1
        out.append(current)
    return out


def _block_ids(keys: list[int], blocks: list[int], valid: list[bool]) -> list[int | None]:
    """Per position: the index of its block (run of equal (segment key, block id) among valid positions)."""
    return _segment_ids([(k, b) for k, b in zip(keys, blocks, strict=True)], valid)  # type: ignore[misc]


def _label_runs(labels: list[int]) -> list[tuple[int, int]]:
    """Maximal runs [start, end] (inclusive) of equal consecutive labels >= 0."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(labels):
        if labels[i] < 0:
            i += 1
            continue
        j = i
        while j + 1 < len(labels) and labels[j + 1] == labels[i]:
            j += 1
        runs.append((i, j))
        i = j + 1
    return runs


# --------------------------------------------------------------------------------------------------- seeding


def percentile_threshold(sims: torch.Tensor, valid: torch.Tensor, percentile: float | torch.Tensor) -> torch.Tensor:
    """tau (Q,): numpy's "linear" percentile of each row's valid sims; +inf for rows without valid entries.

    Position p = percentile / 100 * (n - 1) among the sorted valid values, tau = v[lo] + (v[hi] - v[lo]) * frac,
    evaluated with 0-d tensors in sims.dtype so that the result is bit-identical to any implementation of the
    same formula in the same dtype.
    """
    q, _ = sims.shape
    dtype = sims.dtype
    pcts = torch.as_tensor(percentile, dtype=dtype).expand(q).tolist()
    taus: list[float] = []
    for row, ok, pct in zip(_rows(sims), _rows(valid), pcts, strict=True):
        values = sorted(v for v, good in zip(row, ok, strict=True) if good)
        n = len(values)
        if n == 0:
            taus.append(_INF)
            continue
        pos = torch.tensor(pct, dtype=dtype) / 100 * torch.tensor(float(n - 1), dtype=dtype)
        lo = math.floor(pos.item())
        hi = math.ceil(pos.item())
        if lo == hi:
            taus.append(values[lo])
            continue
        frac = pos - torch.tensor(float(lo), dtype=dtype)
        v_lo = torch.tensor(values[lo], dtype=dtype)
        v_hi = torch.tensor(values[hi], dtype=dtype)
        taus.append((v_lo + (v_hi - v_lo) * frac).item())
    return torch.tensor(taus, dtype=dtype).reshape(q).to(sims.device)


def percentile_seeds(
    sims: torch.Tensor,
    valid: torch.Tensor,
    percentile: float | torch.Tensor,
    min_seeds: int = 1,
    max_seeds: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tau (Q,), seeds (Q, L) bool: valid sims >= tau, plus the `min_seeds` most similar, capped to `max_seeds`."""
    q, length = sims.shape
    tau = percentile_threshold(sims, valid, percentile)
    out: list[list[bool]] = []
    for row, ok, t in zip(_rows(sims), _rows(valid), tau.tolist(), strict=True):
        ranked = sorted((i for i in range(length) if ok[i]), key=lambda i: (-row[i], i))
        chosen = {i for i in range(length) if ok[i] and row[i] >= t}
        chosen |= set(ranked[:min_seeds])
        if max_seeds is not None:
            chosen &= set(ranked[:max_seeds])
        out.append([i in chosen for i in range(length)])
    return tau, _to_tensor(out, (q, length), torch.bool, sims.device)


# --------------------------------------------------------------------------------------------------- windows


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


# --------------------------------------------------------------------------------------------------- merging


def coverage(kept: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """covered (Q, L) bool: union of the inclusive windows [start, end] of the kept seeds."""
    q, length = kept.shape
    out: list[list[bool]] = []
    for keep, st, en in zip(_rows(kept), _rows(starts), _rows(ends), strict=True):
        covered = [False] * length
        for r in range(length):
            if keep[r]:
                for i in range(st[r], en[r] + 1):
                    covered[i] = True
        out.append(covered)
    return _to_tensor(out, (q, length), torch.bool, kept.device)


def fill_gaps(covered: torch.Tensor, segment_ids: torch.Tensor, valid: torch.Tensor, gap: int) -> torch.Tensor:
    """covered (Q, L) bool: uncovered stretches of <= `gap` sentences between two covered sentences of one
    segment become covered."""
    if gap < 0:
        raise ValueError(f"gap must be >= 0, got {gap}")
    q, length = covered.shape
    out: list[list[bool]] = []
    for cov, keys, ok in zip(_rows(covered), _rows(segment_ids), _rows(valid), strict=True):
        seg = _segment_ids(keys, ok)
        new = list(cov)
        # covered sentences (valid positions) grouped by segment, in row order
        by_segment: dict[int, list[int]] = {}
        for i in range(length):
            if cov[i] and seg[i] is not None:
                by_segment.setdefault(seg[i], []).append(i)
        for positions in by_segment.values():
            for a, b in zip(positions, positions[1:], strict=False):
                if 0 < b - a - 1 <= gap:
                    for i in range(a + 1, b):
                        new[i] = True
        out.append(new)
    return _to_tensor(out, (q, length), torch.bool, covered.device)


def label_segments(
    covered: torch.Tensor, segment_ids: torch.Tensor, valid: torch.Tensor, breaks: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """labels (Q, L) int64, count (Q,) int64: maximal runs of covered valid sentences inside one segment,
    numbered 0, 1, ... in row order (-1 elsewhere); `breaks` forces a new run at a position."""
    q, length = covered.shape
    brk_rows = _rows(breaks) if breaks is not None else [[False] * length for _ in range(q)]
    labels: list[list[int]] = []
    counts: list[int] = []
    for cov, keys, ok, brk in zip(_rows(covered), _rows(segment_ids), _rows(valid), brk_rows, strict=True):
        seg = _segment_ids(keys, ok)
        row = [-1] * length
        n = 0
        for i in range(length):
            if not (cov[i] and ok[i]):
                continue
            continues = i > 0 and row[i - 1] >= 0 and seg[i - 1] == seg[i] and not brk[i]
            if not continues:
                n += 1
            row[i] = n - 1
        labels.append(row)
        counts.append(n)
    return (
        _to_tensor(labels, (q, length), torch.long, covered.device),
        _to_tensor(counts, (q,), torch.long, covered.device),
    )


def segment_spans(labels: torch.Tensor, n_segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    """starts, ends (Q, S) int64: first/last position carrying each label 0..S-1; -1 for absent labels."""
    q, _ = labels.shape
    starts: list[list[int]] = []
    ends: list[list[int]] = []
    for row in _rows(labels):
        where = [[i for i, lab in enumerate(row) if lab == s] for s in range(n_segments)]
        starts.append([min(p) if p else -1 for p in where])
        ends.append([max(p) if p else -1 for p in where])
    return (
        _to_tensor(starts, (q, n_segments), torch.long, labels.device),
        _to_tensor(ends, (q, n_segments), torch.long, labels.device),
    )


def segment_sums(labels: torch.Tensor, values: torch.Tensor, n_segments: int) -> torch.Tensor:
    """sums (Q, S) in values.dtype: total of `values` over the positions carrying each label."""
    q, _ = labels.shape
    out: list[list] = []
    for row, vals in zip(_rows(labels), _rows(values), strict=True):
        sums = [0] * n_segments
        for lab, v in zip(row, vals, strict=True):
            if lab >= 0:
                sums[lab] += v
        out.append(sums)
    return _to_tensor(out, (q, n_segments), values.dtype, values.device)


def segment_scores(
    labels: torch.Tensor, values: torch.Tensor, include: torch.Tensor, n_segments: int, how: str = "max"
) -> torch.Tensor:
    """scores (Q, S): max or mean of `values` over each label's included positions; -inf when there are none."""
    if how not in ("max", "mean"):
        raise ValueError(f"how must be 'max' or 'mean', got {how!r}")
    q, _ = labels.shape
    out: list[list[float]] = []
    for row, vals, inc in zip(_rows(labels), _rows(values), _rows(include), strict=True):
        picked: list[list[float]] = [[] for _ in range(n_segments)]
        for lab, v, use in zip(row, vals, inc, strict=True):
            if use and lab >= 0:
                picked[lab].append(v)
        if how == "max":
            out.append([max(p) if p else -_INF for p in picked])
        else:
            out.append([sum(p) / len(p) if p else -_INF for p in picked])
    return _to_tensor(out, (q, n_segments), values.dtype, values.device)


# --------------------------------------------------------------------------------------------------- snapping


def snap_to_blocks(
    labels: torch.Tensor,
    n_segments: int,
    segment_ids: torch.Tensor,
    block_ids: torch.Tensor,
    valid: torch.Tensor,
    n_tokens: torch.Tensor,
    max_tokens: int,
) -> torch.Tensor:
    """covered (Q, L) bool: union of the label spans [s, e], each grown to [start of s's block, end of e's block]
    when the grown span holds at most `max_tokens` tokens of valid sentences."""
    q, length = labels.shape
    out: list[list[bool]] = []
    for lab, keys, blk, ok, tok in zip(
        _rows(labels), _rows(segment_ids), _rows(block_ids), _rows(valid), _rows(n_tokens), strict=True
    ):
        block = _block_ids(keys, blk, ok)
        covered = [False] * length
        for s_label in range(n_segments):
            where = [i for i in range(length) if lab[i] == s_label]
            if not where:
                continue
            s, e = min(where), max(where)
            new_s, new_e = s, e
            if block[s] is not None:
                while new_s > 0 and block[new_s - 1] == block[s]:
                    new_s -= 1
            if block[e] is not None:
                while new_e < length - 1 and block[new_e + 1] == block[e]:
                    new_e += 1
            grown = sum(tok[i] for i in range(new_s, new_e + 1) if ok[i])
            if grown <= max_tokens:
                s, e = new_s, new_e
            for i in range(s, e + 1):
                covered[i] = True
        out.append(covered)
    return _to_tensor(out, (q, length), torch.bool, labels.device)


def cap_breaks(labels: torch.Tensor, n_tokens: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """breaks (Q, L) bool: where a new piece starts inside a labelled run when each run is packed greedily,
    left to right, into pieces of at most `max_tokens` tokens (an oversized sentence is a piece of its own)."""
    q, length = labels.shape
    out: list[list[bool]] = []
    for lab, tok in zip(_rows(labels), _rows(n_tokens), strict=True):
        breaks = [False] * length
        for start, end in _label_runs(lab):
            total = tok[start]
            for i in range(start + 1, end + 1):
                if total + tok[i] > max_tokens:
                    breaks[i] = True
                    total = tok[i]
                else:
                    total += tok[i]
        out.append(breaks)
    return _to_tensor(out, (q, length), torch.bool, labels.device)


# --------------------------------------------------------------------------------------------------- extents


def _round(x: float, dtype: torch.dtype) -> float:
    """x rounded to `dtype` (each step of the pooled cosine is rounded like the tensor op it mirrors)."""
    return torch.tensor(x, dtype=dtype).item()


def _sqrt(x: float, dtype: torch.dtype) -> float:
    """sqrt(max(x, 0)) rounded as torch rounds it (torch's CPU sqrt can differ from math.sqrt by one ulp)."""
    return torch.tensor(max(x, 0.0), dtype=dtype).sqrt().item()


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


# --------------------------------------------------------------------------------------------------- selection


def select_chunks(
    scores: torch.Tensor,
    n_tokens: torch.Tensor,
    top_k: int | None = None,
    budget_tokens: int | None = None,
    score_margin: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """order (Q, S) int64 by descending score (ties: lower index), chosen (Q, S) bool for the returned prefix.

    Walking the order, a chunk is returned while it is present (score > -inf), among the first `top_k`,
    scores >= best - `score_margin`, and keeps the running token total within `budget_tokens`; the first chunk
    failing any of these ends the selection.
    """
    q, s = scores.shape
    orders: list[list[int]] = []
    chosen: list[list[bool]] = []
    for row, tok in zip(_rows(scores), _rows(n_tokens), strict=True):
        order = sorted(range(s), key=lambda j: (-row[j], j))
        picked = [False] * s
        total = 0
        best = row[order[0]] if s else -_INF
        for rank, j in enumerate(order):
            if row[j] == -_INF:
                break
            if top_k is not None and rank >= top_k:
                break
            if score_margin is not None and row[j] < best - score_margin:
                break
            if budget_tokens is not None:
                if total + tok[j] > budget_tokens:
                    break
                total += tok[j]
            picked[rank] = True
        orders.append(order)
        chosen.append(picked)
    return (
        _to_tensor(orders, (q, s), torch.long, scores.device),
        _to_tensor(chosen, (q, s), torch.bool, scores.device),
    )


def focus_on_best(
    scores: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    regions: torch.Tensor,
    gap: int | None,
    far_margin: float | None = None,
) -> torch.Tensor:
    """scores with -inf for chunks other than the row's best (first maximum) unless in its region with at most
    `gap` sentences between them, or (far_margin) scoring >= best - far_margin; unchanged for gap None."""
    if gap is None:
        return scores.clone()
    if gap < 0:
        raise ValueError(f"gap must be >= 0, got {gap}")
    q, s = scores.shape
    out: list[list[float]] = []
    for row, st, en, rg in zip(_rows(scores), _rows(starts), _rows(ends), _rows(regions), strict=True):
        if not row:
            out.append([])
            continue
        b = max(range(s), key=lambda j: (row[j], -j))
        kept = []
        for j in range(s):
            if j == b:
                kept.append(row[j])
                continue
            between = (st[j] - en[b] - 1) if st[j] > en[b] else (st[b] - en[j] - 1)
            near = rg[j] == rg[b] and between <= gap
            strong = far_margin is not None and row[j] >= row[b] - far_margin
            kept.append(row[j] if near or strong else -_INF)
        out.append(kept)
    return _to_tensor(out, (q, s), scores.dtype, scores.device)


def candidate_rows(
    hits: torch.Tensor, doc_first: torch.Tensor, doc_last: torch.Tensor, neighbourhood: int, n_total: int,
    block_first: torch.Tensor | None = None, block_last: torch.Tensor | None = None, block_rows: int = 0,
):
    """Per query: the set of rows within `neighbourhood` of a hit inside the hit's document, plus the rows
    from the hit's block_first to its block_last (when given) inside that document, sorted; rows padded with
    n_total to the widest query; a new region wherever a row does not follow the previous one in the same
    document."""
    from kernels.candidates import CandidateRows

    first, last = doc_first.tolist(), doc_last.tolist()
    b_first = block_first.tolist() if block_first is not None else None
    b_last = block_last.tolist() if block_last is not None else None
    per_query: list[list[int]] = []
    for row in _rows(hits):
        found: set[int] = set()
        for h in row:
            if h < 0:
                continue
            for r in range(h - neighbourhood, h + neighbourhood + 1):
                if first[h] <= r <= last[h]:
                    found.add(r)
            if b_first is not None and b_last is not None:
                found.update(r for r in range(b_first[h], b_last[h] + 1) if first[h] <= r <= last[h])
        per_query.append(sorted(found))
    q = hits.shape[0]
    width = max((len(c) for c in per_query), default=0)
    rows = [[n_total] * width for _ in range(q)]
    valid = [[False] * width for _ in range(q)]
    region = [[-1] * width for _ in range(q)]
    for i, cand in enumerate(per_query):
        current = 0
        for j, r in enumerate(cand):
            if j == 0 or r != cand[j - 1] + 1 or first[r] != first[cand[j - 1]]:
                current += 1
            rows[i][j], valid[i][j], region[i][j] = r, True, current
    dev = hits.device
    return CandidateRows(_to_tensor(rows, (q, width), torch.long, dev), _to_tensor(valid, (q, width), torch.bool, dev),
                         _to_tensor(region, (q, width), torch.long, dev))


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


def heading_gate(
    pool_c: torch.Tensor, pool_path: torch.Tensor, pool_valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    spreads, crefs = [], []
    for cs, paths, oks in zip(_rows(pool_c), _rows(pool_path), _rows(pool_valid), strict=True):
        first: dict[int, float] = {}
        for c, p, ok in zip(cs, paths, oks, strict=True):
            if ok and p >= 0 and p not in first:
                first[p] = c
        values = sorted(first.values())
        if not values:
            spreads.append(0.0)
            crefs.append(0.0)
            continue
        n = len(values)
        med = (values[(n - 1) // 2] + values[n // 2]) / 2
        crefs.append(med)
        spreads.append(max(values) - med)
    shape = (pool_c.shape[0],)
    return (_to_tensor(spreads, shape, pool_c.dtype, pool_c.device),
            _to_tensor(crefs, shape, pool_c.dtype, pool_c.device))


def context_boost(
    c: torch.Tensor, path: torch.Tensor, valid: torch.Tensor, spread: torch.Tensor, cref: torch.Tensor,
    weight: float,
) -> torch.Tensor:
    out = []
    for cs, paths, oks, s, r in zip(_rows(c), _rows(path), _rows(valid), spread.tolist(), cref.tolist(), strict=True):
        out.append([weight * s * (x - r) if ok and p >= 0 else 0.0 for x, p, ok in zip(cs, paths, oks, strict=True)])
    return _to_tensor(out, tuple(c.shape), c.dtype, c.device)


def heading_residual(
    c: torch.Tensor, hs: torch.Tensor, path: torch.Tensor, valid: torch.Tensor, beta: float
) -> torch.Tensor:
    out = []
    for cs, hss, paths, oks in zip(_rows(c), _rows(hs), _rows(path), _rows(valid), strict=True):
        out.append([-beta * x * h if ok and p >= 0 else 0.0 for x, h, p, ok in zip(cs, hss, paths, oks, strict=True)])
    return _to_tensor(out, tuple(c.shape), c.dtype, c.device)


def ivf_sq8_topk(query, centroids, list_codes, list_rows, vmin, vdiff, nprobe, k, by_residual=True, int8=False,
                 max_codes=0):
    """Twin of kernels.ivf_scan.ivf_sq8_topk: per query, the probed lists by centroid score (ties: lower list),
    each code decoded to its vector one at a time (FAISS's 8-bit decoding), the inner products in float64, then
    the k best (score descending, equal scores lower row first). int8: the code term sum_d q_d vdiff_d / 255 code_d
    is step * sum_d w_d code_d instead, w the query's weights q * vdiff / 255 rounded to steps of max |w| / 127.
    max_codes > 0: the lists' codes are taken in probe order until max_codes of them are scanned (FAISS's rule)."""
    device = centroids.device
    q_rows, cents = _rows(query.double()), _rows(centroids.double())
    lo, span = [float(v) for v in vmin.double()], [float(v) for v in vdiff.double()]
    codes = [[[int(c) for c in row] for row in _rows(t)] for t in list_codes]
    rows = [[int(r) for r in t.tolist()] for t in list_rows]
    per_query = []
    for i, q in enumerate(q_rows):
        by_list = sorted(range(len(cents)), key=lambda c: (-sum(a * b for a, b in zip(q, cents[c], strict=True)), c))
        if int8:  # the same float32 operations as the kernel's quantize_rows, one query at a time
            w = query[i].to("cpu", torch.float32) * (vdiff.to("cpu", torch.float32) / 255)
            step = w.abs().max().clamp(min=1e-30) / 127 if len(w) else torch.tensor(1e-30)
            weights, step = [int(v) for v in torch.round(w / step).tolist()], float(step)
        found, scanned = [], 0
        for c in by_list[: max(1, min(nprobe, len(cents)))]:
            if max_codes > 0 and scanned >= max_codes:
                break
            base = cents[c] if by_residual else [0.0] * len(q)
            take = len(codes[c]) if max_codes <= 0 else min(len(codes[c]), max_codes - scanned)
            scanned += take
            for code, row in zip(codes[c][:take], rows[c][:take], strict=True):
                if int8:
                    x = [b + m + 0.5 / 255 * d for b, m, d in zip(base, lo, span, strict=True)]
                    score = sum(a * b for a, b in zip(q, x, strict=True)) + step * sum(
                        a * b for a, b in zip(weights, code, strict=True))
                else:
                    x = [b + m + (v + 0.5) / 255 * d for b, m, v, d in zip(base, lo, code, span, strict=True)]
                    score = sum(a * b for a, b in zip(q, x, strict=True))
                found.append((-score, row))
        per_query.append(found)
    return _best_of(per_query, k, device)


def _best_of(per_query: list[list[tuple[float, int]]], k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query its (-score, row) entries -> scores (Q, k) float32 and rows (Q, k) int64 of the k best, by score
    descending then row ascending, padded with -inf / -1."""
    out_s, out_r = [], []
    for found in per_query:
        best = sorted(found)[:k]
        best += [(math.inf, -1)] * max(0, k - len(best))
        out_s.append([-s for s, _ in best])
        out_r.append([r for _, r in best])
    n = len(per_query)
    return (_to_tensor(out_s, (n, k), torch.float32, device), _to_tensor(out_r, (n, k), torch.long, device))


def gathered_dots(table: torch.Tensor, query: torch.Tensor, index: torch.Tensor, valid: torch.Tensor,
                  block_elements: int = 0) -> torch.Tensor:
    """Twin of kernels.gather.gathered_dots: each valid entry's dot product in float64, one at a time."""
    rows = _rows(table.double())
    out = []
    for q, idx, oks in zip(_rows(query.double()), _rows(index), _rows(valid), strict=True):
        out.append([sum(a * b for a, b in zip(q, rows[i], strict=True)) if ok else 0.0
                    for i, ok in zip(idx, oks, strict=True)])
    return _to_tensor(out, tuple(index.shape), torch.float32, query.device)


def segment_first(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of kernels.gather.segment_first: walk each row, a new run wherever the key changes."""
    seg, first = [], []
    for row in _rows(keys):
        ids, heads = [], []
        for j, key in enumerate(row):
            if j == 0 or key != row[j - 1]:
                heads.append(key)
            ids.append(len(heads) - 1)
        seg.append(ids)
        first.append(heads)
    width = max((len(h) for h in first), default=0)
    first = [h + [-1] * (width - len(h)) for h in first]
    return (_to_tensor(seg, tuple(keys.shape), torch.long, keys.device),
            _to_tensor(first, (keys.shape[0], width), torch.long, keys.device))


def best_paths(query: torch.Tensor, heading_emb: torch.Tensor, j: int, heading_low: torch.Tensor | None = None,
               block_elements: int = 0, low_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of kernels.context.best_paths: every path's cosine in float64, sorted (score descending, path
    ascending), the first min(j, H) kept (heading_low and low_scale are ignored: the twin is always exact)."""
    table = _rows(heading_emb.double())
    jj = min(j, len(table))
    scores, paths = [], []
    for q in _rows(query.double()):
        ranked = sorted(range(len(table)), key=lambda p: (-sum(a * b for a, b in zip(q, table[p], strict=True)), p))
        paths.append(ranked[:jj])
        scores.append([sum(a * b for a, b in zip(q, table[p], strict=True)) for p in ranked[:jj]])
    n = query.shape[0]
    return (_to_tensor(scores, (n, jj), torch.float32, query.device),
            _to_tensor(paths, (n, jj), torch.long, query.device))


def packed_path_rows(paths: torch.Tensor, path_start: torch.Tensor, path_count: torch.Tensor,
                     path_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of kernels.context.packed_path_rows: per query, its paths' rows appended one path after the other; rows
    past a query's end are -1 (invalid)."""
    per_query = []
    for q_paths in paths.tolist():
        got = []
        for p in q_paths:
            s, c = int(path_start[p]), int(path_count[p])
            got.extend(int(r) for r in path_rows[s : s + c].tolist())
        per_query.append(got)
    width = max((len(g) for g in per_query), default=0)
    rows = torch.tensor([g + [-1] * (width - len(g)) for g in per_query], dtype=torch.long).reshape(len(paths), width)
    return rows, rows >= 0


def lexical_scores(row_ptr, row_terms, row_weights, query_ptr, query_terms, vocab_size, rows, valid, paths=None,
                   path_ptr=None, path_terms=None):
    """Twin of kernels.lexical.lexical_scores: per valid entry, a walk over its row's postings, each weight added
    when the term is in the query's set and not in the entry's heading path's set (float64 sums, rounded to
    float32 at the end)."""
    ptr, terms, weights = row_ptr.tolist(), row_terms.tolist(), row_weights.tolist()
    qptr, qterms = query_ptr.tolist(), query_terms.tolist()
    heads = []
    if paths is not None and path_terms is not None:
        pp, pt = path_ptr.tolist(), path_terms.tolist()
        heads = [set(pt[pp[h] : pp[h + 1]]) for h in range(len(pp) - 1)]
    out = []
    for q, (rs, oks) in enumerate(zip(_rows(rows), _rows(valid), strict=True)):
        have = set(qterms[qptr[q] : qptr[q + 1]])
        row_out = []
        for j, (r, ok) in enumerate(zip(rs, oks, strict=True)):
            h = int(paths[q, j]) if heads else -1
            said = heads[h] if h >= 0 else set()
            hits = (weights[i] for i in range(ptr[r], ptr[r + 1]) if terms[i] in have and terms[i] not in said)
            row_out.append(sum(hits) if ok else 0.0)
        out.append(row_out)
    return _to_tensor(out, tuple(rows.shape), torch.float32, rows.device)


def normalised_lexical(bm25, best):
    """Twin of kernels.signals.normalised_lexical: each score over its query's best, 0 where best is 0."""
    out = [[x / b if b > 0 else 0.0 for x in row] for row, b in zip(_rows(bm25), best.tolist(), strict=True)]
    return _to_tensor(out, tuple(bm25.shape), bm25.dtype, bm25.device)


def row_scores(model, cos, valid, c=None, path=None, hs=None, spread=None, cref=None, lex=None):
    """Twin of kernels.signals.row_scores, from its contract, one entry at a time: plain = cos - beta c hs (rows
    with a heading, heading weight > 0) + alpha lex; boost = w spread (c - cref) on rows with a heading; 0 where
    invalid. Returns (plain, boost) tensors."""
    q, n = cos.shape
    heading = c is not None and model.heading > 0
    plain, boost = [[0.0] * n for _ in range(q)], [[0.0] * n for _ in range(q)]
    for i in range(q):
        for j in range(n):
            if not bool(valid[i, j]):
                continue
            x = float(cos[i, j])
            if heading and int(path[i, j]) >= 0:
                cij = float(c[i, j])
                boost[i][j] = model.heading * float(spread[i]) * (cij - float(cref[i]))
                if model.residual > 0:
                    x -= model.residual * cij * float(hs[i, j])
            if lex is not None and model.lexical > 0:
                x += model.lexical * float(lex[i, j])
            plain[i][j] = x
    return (_to_tensor(plain, (q, n), cos.dtype, cos.device), _to_tensor(boost, (q, n), cos.dtype, cos.device))


def ivf_vectors_topk(query, centroids, vectors, list_rows, nprobe, k, dtype=torch.float32, max_codes=0,
                     int8_scale=None):
    """Twin of kernels.ivf_scan.ivf_vectors_topk: per query, the probed lists by centroid score (ties: lower list),
    each listed row's vector read from `vectors` one at a time, the query and the vector rounded to `dtype`, their
    inner product in float64 rounded to `dtype` (a half-precision product's output), then the k best (score
    descending, equal scores lower row first); max_codes > 0: rows taken in probe order until max_codes of them are
    scanned. int8_scale: each row rounded to 8 bits per dimension (round(x * 127 / scale), clamped to +-127, 0 where
    the scale is 0), the query's weights q * scale / 127 to steps of max / 127; score = step * (integer dot)."""
    device = vectors.device
    q_rows, cents = _rows(query.double()), _rows(centroids.double())
    q_low = _rows(query.to(dtype).double())
    table = _rows(vectors.to(dtype).double()) if len(vectors) else []
    if int8_scale is not None:  # the same float32 operations as the kernel's, one row / one query at a time
        scale = int8_scale.to(torch.float32)
        inverse = torch.where(scale > 0, 127 / scale.clamp(min=1e-30), torch.zeros_like(scale))
        table = [[int(v) for v in torch.round(row.to(torch.float32) * inverse).clamp(-127, 127).tolist()]
                 for row in vectors]
        q_low, steps = [], []
        for row in query.to(torch.float32):
            w = row * (scale / 127)
            step = w.abs().max().clamp(min=1e-30) / 127 if len(w) else torch.tensor(1e-30)
            q_low.append([int(v) for v in torch.round(w / step).tolist()])
            steps.append(step)
    rows = [[int(r) for r in t.tolist()] for t in list_rows]
    per_query = []
    for i, (q, ql) in enumerate(zip(q_rows, q_low, strict=True)):
        by_list = sorted(range(len(cents)), key=lambda c: (-sum(a * b for a, b in zip(q, cents[c], strict=True)), c))
        found, scanned = [], 0
        for c in by_list[: max(1, min(nprobe, len(cents)))]:
            if max_codes > 0 and scanned >= max_codes:
                break
            take = len(rows[c]) if max_codes <= 0 else min(len(rows[c]), max_codes - scanned)
            scanned += take
            for row in rows[c][:take]:
                score = sum(a * b for a, b in zip(ql, table[row], strict=True))
                if int8_scale is not None:
                    found.append((-float(steps[i] * torch.tensor(float(score))), row))
                else:
                    found.append((-float(torch.tensor(score, dtype=torch.float64).to(dtype)), row))
        per_query.append(found)
    return _best_of(per_query, k, device)


def shortlist_top(scores: torch.Tensor, wide: int, group: int = 0) -> torch.Tensor:
    """Twin of kernels.context.shortlist_top: per row, all columns sorted by (score descending, column ascending),
    the first `wide` kept (group is ignored; the kernel may pick other columns among equal scores at the cut)."""
    out = [sorted(range(len(row)), key=lambda c: (-row[c], c))[:wide] for row in scores.tolist()]
    return _to_tensor(out, (scores.shape[0], wide), torch.long, scores.device)
