"""Loop twins of kernels.runs: positions, and the runs of equal keys in a row."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _rows, _to_tensor


def positions_like(x: torch.Tensor) -> torch.Tensor:
    """idx (Q, L) int64 with idx[q][i] = i."""
    q, length = x.shape
    return _to_tensor([list(range(length)) for _ in range(q)], (q, length), torch.long, x.device)


def run_bounds(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """run_start, run_end (Q, L) int64: first / last position (inclusive) of the maximal run of equal consecutive
    keys holding each position."""
    q, length = keys.shape
    starts, ends = [], []
    for row in _rows(keys):
        s, e = [0] * length, [0] * length
        for i in range(length):
            a = i
            while a > 0 and row[a - 1] == row[i]:
                a -= 1
            b = i
            while b + 1 < length and row[b + 1] == row[i]:
                b += 1
            s[i], e[i] = a, b
        starts.append(s)
        ends.append(e)
    return (_to_tensor(starts, (q, length), torch.long, keys.device),
            _to_tensor(ends, (q, length), torch.long, keys.device))


def region_keys(segment_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """keys (Q, L) int64: valid positions keep their id minus the smallest id of the whole tensor when that is
    negative (so that every key is >= 0), invalid positions get -1."""
    q, length = segment_ids.shape
    ids = _rows(segment_ids)
    low = min((min(row) for row in ids if row), default=0)
    shift = low if low < 0 else 0
    out = [[k - shift if ok else -1 for k, ok in zip(row, oks, strict=True)]
           for row, oks in zip(ids, _rows(valid), strict=True)]
    return _to_tensor(out, (q, length), torch.long, segment_ids.device)


def combine_keys(outer: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
    """keys (Q, L) int64: per row, the run number (0 at the row's start, + 1 wherever outer or inner changes from
    the previous position), -1 where outer < 0."""
    q, length = outer.shape
    out = []
    for o, n in zip(_rows(outer), _rows(inner), strict=True):
        row, label = [], 0
        for i in range(length):
            if i > 0 and (o[i] != o[i - 1] or n[i] != n[i - 1]):
                label += 1
            row.append(label if o[i] >= 0 else -1)
        out.append(row)
    return _to_tensor(out, (q, length), torch.long, outer.device)
