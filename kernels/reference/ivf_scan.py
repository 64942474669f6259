"""Loop twins of kernels.ivf_scan: the coarse probe, the top-k bookkeeping, the 8-bit quantisers and the two IVF
scans, one query, one list and one code at a time.

The int8 paths round per element as the kernel's docstrings define the quantisation (steps of max / 127, halves to
even, float32 arithmetic written out with `_f32`), with this module's own `quantize_rows` / `quantize_columns`
twins: nothing here calls kernels.ivf_scan, so a bug in its quantisers shows up as a disagreement.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import torch

from qasc.kernels.reference._common import _f32, _int8, _rows, _to_tensor

_TINY = _f32(1e-30)  # the step of an all-zero row (quantize_rows)


def probe_lists(query: torch.Tensor, centroids: torch.Tensor, nprobe: int) -> tuple[torch.Tensor, torch.Tensor]:
    """centroid scores (Q, nprobe) float32, lists (Q, nprobe) int64: each query's nprobe best centroids by inner
    product (float64 sums), nearest first (equal scores: lower list first)."""
    cents = _rows(centroids.double())
    scores, lists = [], []
    for q in _rows(query.double()):
        dots = [sum(a * b for a, b in zip(q, c, strict=True)) for c in cents]
        best = sorted(range(len(cents)), key=lambda c: (-dots[c], c))[:nprobe]
        scores.append([dots[c] for c in best])
        lists.append(best)
    n = query.shape[0]
    return (_to_tensor(scores, (n, nprobe), torch.float32, query.device),
            _to_tensor(lists, (n, nprobe), torch.long, query.device))


def rank_keys(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """int64 keys (shape of scores) whose ascending order is score descending, then row ascending (-1 last): per
    entry, the float32 bits of score + 0.0 read as a signed int, its negative bits flipped but the sign (an int in
    the floats' order), negated into the high 32 bits; the row (2**32 - 1 for -1) in the low 32 bits."""
    keys = []
    for s, r in zip(scores.to(torch.float32).reshape(-1).tolist(), rows.reshape(-1).tolist(), strict=True):
        bits = struct.unpack("<i", struct.pack("<f", s + 0.0))[0]
        ordered = bits if bits >= 0 else bits ^ 0x7FFFFFFF
        key = ((-ordered) << 32) | (r if r >= 0 else 0xFFFFFFFF)
        keys.append(key - (1 << 64) if key >= 1 << 63 else key)  # as a signed int64
    return _to_tensor(keys, tuple(scores.shape), torch.long, scores.device)


def top_k_per_query(query_of: torch.Tensor, scores: torch.Tensor, rows: torch.Tensor, n_queries: int,
                    k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (Q, k) float32, rows (Q, k) int64: each query's k best entries (score descending, equal scores lower
    row first), padded with -inf / -1."""
    found: list[list[tuple[float, int]]] = [[] for _ in range(n_queries)]
    for q, s, r in zip(query_of.tolist(), scores.tolist(), rows.tolist(), strict=True):
        found[q].append((-s, r))
    return _best_of(found, k, scores.device)


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


def scan_budget(probes: torch.Tensor, sizes: Sequence[int], max_codes: int) -> torch.Tensor | None:
    """(Q, P) int64 codes each query scans of each probed list under max_codes (whole lists in probe order until the
    budget runs out, the one that crosses it cut short, then none); None when max_codes <= 0."""
    if max_codes <= 0:
        return None
    out = []
    for lists in probes.tolist():
        left, row = max_codes, []
        for lst in lists:
            take = min(int(sizes[lst]), left)
            row.append(take)
            left -= take
        out.append(row)
    return _to_tensor(out, tuple(probes.shape), torch.long, probes.device)


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


def _probe_order(q: list[float], cents: list[list[float]], nprobe: int) -> list[int]:
    """The lists one query probes: by centroid inner product (float64) descending, ties lower list first."""
    dots = [sum(a * b for a, b in zip(q, c, strict=True)) for c in cents]
    return sorted(range(len(cents)), key=lambda c: (-dots[c], c))[: max(1, min(nprobe, len(cents)))]


def _taken(lists: list[int], sizes: list[int], max_codes: int) -> list[tuple[int, int]]:
    """(list, codes scanned of it) in probe order under FAISS's max_codes rule (0: every list whole)."""
    out, scanned = [], 0
    for c in lists:
        if max_codes > 0 and scanned >= max_codes:
            break
        take = sizes[c] if max_codes <= 0 else min(sizes[c], max_codes - scanned)
        scanned += take
        out.append((c, take))
    return out


def _query_weights(query: torch.Tensor, per_dim: list[float]) -> list[tuple[list[int], float]]:
    """Per query its 8-bit weights and step: w_d = q_d * per_dim[d] in float32, rounded as `quantize_rows`."""
    weights = [[_f32(v * s) for v, s in zip(row, per_dim, strict=True)] for row in _rows(query.to(torch.float32))]
    codes, steps = quantize_rows(torch.tensor(weights, dtype=torch.float32).reshape(query.shape[0], len(per_dim)))
    return list(zip(_rows(codes), steps.tolist(), strict=True))


def ivf_sq8_topk(query, centroids, list_codes, list_rows, vmin, vdiff, nprobe, k, by_residual=True, int8=False,
                 max_codes=0):
    """scores (Q, k) float32, rows (Q, k) int64: the k best inner products of each query with the codes of its
    nprobe nearest lists (ties: lower list), each code decoded as FAISS's 8-bit scalar quantiser decodes it,
    x = centroid (by_residual) + vmin + (code + 0.5) / 255 * vdiff, in float64; by score descending, equal scores
    lower row first, padded with -inf / -1. int8: the code term q . (code * vdiff / 255) is step * (w_int . code),
    w_int the query's weights q * vdiff / 255 in 8 bits (`quantize_rows`). max_codes > 0: codes taken in probe order
    until max_codes of them are scanned (FAISS's rule)."""
    q_rows, cents = _rows(query.double()), _rows(centroids.double())
    lo, span = [float(v) for v in vmin.double()], [float(v) for v in vdiff.double()]
    codes = [[[int(c) for c in row] for row in _rows(t)] for t in list_codes]
    rows = [[int(r) for r in t.tolist()] for t in list_rows]
    sizes = [len(c) for c in codes]
    if int8:
        scaled = [_f32(d / 255) for d in vdiff.to(torch.float32).tolist()]
        weights = _query_weights(query, scaled) if len(q_rows) else []
    per_query = []
    for i, q in enumerate(q_rows):
        found = []
        for c, take in _taken(_probe_order(q, cents, nprobe), sizes, max_codes):
            base = cents[c] if by_residual else [0.0] * len(q)
            for code, row in zip(codes[c][:take], rows[c][:take], strict=True):
                if int8:
                    w, step = weights[i]
                    x = [b + m + 0.5 / 255 * d for b, m, d in zip(base, lo, span, strict=True)]
                    score = sum(a * b for a, b in zip(q, x, strict=True)) + step * sum(
                        a * b for a, b in zip(w, code, strict=True))
                else:
                    x = [b + m + (v + 0.5) / 255 * d for b, m, v, d in zip(base, lo, code, span, strict=True)]
                    score = sum(a * b for a, b in zip(q, x, strict=True))
                found.append((-score, row))
        per_query.append(found)
    return _best_of(per_query, k, centroids.device)


def ivf_vectors_topk(query, centroids, vectors, list_rows, nprobe, k, dtype=torch.float32, max_codes=0,
                     int8_scale=None):
    """scores (Q, k) float32, rows (Q, k) int64: the k best inner products q . x over the rows of each query's
    nprobe nearest lists (ties: lower list), query and row rounded to `dtype`, the float64 sum rounded to `dtype`
    (a half-precision product's output); by score descending, equal scores lower row first, padded with -inf / -1;
    max_codes as `ivf_sq8_topk`. int8_scale: each row rounded to 8 bits per dimension (round(x * 127 / scale),
    clamped to +-127, 0 where the scale is 0: `quantize_columns`), the query's weights q * scale / 127 to 8 bits
    (`quantize_rows`); score = step * (integer dot) in float32."""
    q_rows, cents = _rows(query.double()), _rows(centroids.double())
    if int8_scale is None:
        q_low = _rows(query.to(dtype).double())
        table = _rows(vectors.to(dtype).double())
    else:
        table = _rows(quantize_columns(vectors, column_inverse(int8_scale)))
        per_dim = [_f32(s / 127) for s in int8_scale.to(torch.float32).tolist()]
        weights = _query_weights(query, per_dim) if len(q_rows) else []
        q_low = [w for w, _ in weights]
    rows = [[int(r) for r in t.tolist()] for t in list_rows]
    sizes = [len(r) for r in rows]
    per_query = []
    for i, (q, ql) in enumerate(zip(q_rows, q_low, strict=True)):
        found = []
        for c, take in _taken(_probe_order(q, cents, nprobe), sizes, max_codes):
            for row in rows[c][:take]:
                dot = sum(a * b for a, b in zip(ql, table[row], strict=True))
                if int8_scale is not None:
                    score = _f32(weights[i][1] * dot)
                else:
                    score = torch.tensor(dot, dtype=torch.float64).to(dtype).item()
                found.append((-score, row))
        per_query.append(found)
    return _best_of(per_query, k, vectors.device)


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
