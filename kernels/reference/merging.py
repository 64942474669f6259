"""Loop twins of kernels.merging."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _INF, _rows, _segment_ids, _to_tensor


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
