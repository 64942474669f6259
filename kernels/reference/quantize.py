"""Loop twins of kernels.quantize: the top k with ties to the lower row and the 8-bit quantisers, one element at a
time.

They round per element as the kernel's docstrings define the quantisation (steps of max / 127, halves to even,
float32 arithmetic written out with `_f32`): nothing here calls kernels.quantize, so a bug there shows up as a
disagreement.
"""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _f32, _int8, _rows, _to_tensor

_TINY = _f32(1e-30)  # the step of an all-zero row (quantize_rows)


def row_top_k(scores: torch.Tensor, k: int, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (m, k') and rows (m, k'), k' = min(k, n): each score row's k' best columns by score descending,
    equal scores lower row (rows[column], or the column) first."""
    m, n = scores.shape
    kk = min(k, n)
    row_of = list(range(n)) if rows is None else rows.tolist()
    best_s, best_r = [], []
    for row in scores.tolist():
        order = sorted(range(n), key=lambda c: (-row[c], row_of[c]))[:kk]
        best_s.append([row[c] for c in order])
        best_r.append([row_of[c] for c in order])
    return (_to_tensor(best_s, (m, kk), scores.dtype, scores.device),
            _to_tensor(best_r, (m, kk), torch.long, scores.device))


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes (Q, D) int8, step (Q,) float32: per row step = max |x| / 127 in float32 (1e-30 for a zero row) and
    codes round(x / step), each element rounded on its own (halves to even)."""
    codes, steps = [], []
    for row in _rows(x.to(torch.float32)):
        top = max((abs(v) for v in row), default=0.0)
        step = _f32(top / 127) if top > 0 else _TINY
        codes.append([_int8(_f32(v / step)) for v in row])
        steps.append(step)
    return (_to_tensor(codes, tuple(x.shape), torch.int8, x.device),
            _to_tensor(steps, (x.shape[0],), torch.float32, x.device))


def int8_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(m, n) int32: a[i] . b[j] as exact integer sums."""
    b_rows = b.tolist()
    out = [[sum(x * y for x, y in zip(r, c, strict=True)) for c in b_rows] for r in a.tolist()]
    return _to_tensor(out, (a.shape[0], b.shape[0]), torch.int32, a.device)


def column_inverse(scale: torch.Tensor) -> torch.Tensor:
    """(D,) float32: 127 / scale per dimension in float32, 0 where the scale is 0. The float32 quotient is torch's
    for a number over a tensor, the reciprocal rounded, then times 127 rounded (not the correctly rounded 127 /
    scale, one ulp off for about a quarter of the scales): written out so the 8-bit codes agree bit for bit."""
    out = [_f32(_f32(1 / s) * 127) if s > 0 else 0.0 for s in scale.to(torch.float32).tolist()]
    return _to_tensor(out, tuple(scale.shape), torch.float32, scale.device)


def quantize_columns(x: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """(n, D) int8: each element round(x * inverse[d]) (float32 product, halves to even), clamped to [-127, 127]."""
    inv = inverse.to(torch.float32).tolist()
    out = [[_int8(_f32(v * i)) for v, i in zip(row, inv, strict=True)] for row in _rows(x.to(torch.float32))]
    return _to_tensor(out, tuple(x.shape), torch.int8, x.device)
