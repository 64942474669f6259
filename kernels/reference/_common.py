"""Shared loop helpers of the twins: rows as Python lists, segments and runs of a row, rounding."""

from __future__ import annotations

import math
import struct

import torch

_INF = float("inf")


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


def _round(x: float, dtype: torch.dtype) -> float:
    """x rounded to `dtype` (each step of the pooled cosine is rounded like the tensor op it mirrors)."""
    return torch.tensor(x, dtype=dtype).item()


def _sqrt(x: float, dtype: torch.dtype) -> float:
    """sqrt(max(x, 0)) rounded as torch rounds it (torch's CPU sqrt can differ from math.sqrt by one ulp)."""
    return torch.tensor(max(x, 0.0), dtype=dtype).sqrt().item()


def _f32(x: float) -> float:
    """x rounded to the nearest float32 (+-inf past its range): one IEEE float32 operation on float32 inputs is
    the float64 result rounded this way (float64 holds the exact product, sum or quotient to round once)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _int8(x: float) -> int:
    """x rounded to the nearest integer (halves to even, as torch.round), clamped to [-127, 127]."""
    if not math.isfinite(x):
        return 127 if x > 0 else -127
    return max(-127, min(127, round(x)))
