"""Loop twins of kernels.ivf_scan."""

from __future__ import annotations

import math

import torch

from kernels.reference._common import _rows, _to_tensor


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
