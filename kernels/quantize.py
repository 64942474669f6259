"""Top-k with deterministic ties and 8-bit quantisers: the pieces the int8 heading table (kernels.context) and the
exact search (engine.store.index.exact_topk) are built from.

`row_top_k` keeps, among equal scores at the cut, the lower rows (torch.topk picks among them arbitrarily);
`quantize_rows` rounds each row to 8 bits (steps of its max / 127), `quantize_columns` each dimension (steps of its
largest |x| / 127, `column_inverse`); `int8_products` multiplies int8 codes into int32 (`torch._int_mm`: VNNI / AMX
where the CPU has them).
"""

from __future__ import annotations

import torch


def row_top_k(scores: torch.Tensor, k: int, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (m, n) float32, k, rows (n,) int64 the columns' rows (None: the columns themselves) -> per score
    row its min(k, n) best: scores (m, k') and rows (m, k'); equal scores at the cut keep the lower rows
    (torch.topk picks among them arbitrarily)."""
    kk = min(k, scores.shape[1])
    best, col = scores.topk(kk, dim=1)
    tied = (scores >= best[:, -1:]).sum(1) > kk  # more than k' scores reach the k'-th: a tie at the cut
    if kk and bool(tied.any()):
        by_row = None if rows is None else rows.argsort(stable=True)  # columns in row order, then by score
        sub = scores[tied] if by_row is None else scores[tied][:, by_row]
        picked = torch.sort(sub, dim=1, descending=True, stable=True).indices[:, :kk]
        col[tied] = picked if by_row is None else by_row[picked]
        best[tied] = scores[tied].gather(1, col[tied])
    return best, col if rows is None else rows[col]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (Q, D) float32 -> codes (Q, D) int8 and step (Q,) float32 with x ~ step * codes: symmetric per-row
    8-bit quantisation, step = max |x| / 127 (1e-30 for a zero row), |x - step * codes| <= step / 2."""
    step = x.abs().amax(1).clamp(min=1e-30) / 127 if x.shape[1] else torch.full((x.shape[0],), 1e-30)
    return torch.round(x / step[:, None]).to(torch.int8), step


def int8_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (m, D) int8, b (n, D) int8 -> a @ b.T (m, n) int32: `torch._int_mm` (VNNI on CPUs that have it) when D is
    a multiple of 8 (torch 2.13's CPU kernel returns garbage for D = 1), else an int32 product."""
    if a.shape[1] % 8 == 0 and a.shape[1]:
        return torch._int_mm(a, b.T)
    return a.to(torch.int32) @ b.to(torch.int32).T


def column_inverse(scale: torch.Tensor) -> torch.Tensor:
    """scale (D,) float32 each dimension's largest |x| -> (D,) float32 127 / scale (0 where the scale is 0)."""
    return torch.where(scale > 0, 127 / scale.clamp(min=1e-30), torch.zeros_like(scale))


def quantize_columns(x: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """x (n, D) float rows, inverse (D,) float32 (`column_inverse`) -> (n, D) int8 round(x * inverse), clamped to
    [-127, 127]: x ~ codes * scale / 127, off by at most scale / 254 per dimension."""
    # one float32 temporary, rounded in place: each further MiB-sized temporary is fresh memory from the allocator
    # (page faults), 5-10x the arithmetic; a float32 x is not written to
    y = x.to(torch.float32)
    y = y * inverse if y is x else y.mul_(inverse)
    return y.round_().clamp_(-127, 127).to(torch.int8)
