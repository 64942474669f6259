"""Query-gated heading context: how strongly the headings above the candidate rows should move their scores.

Each candidate row may sit under a heading path (its document's level-1 > level-2 markdown headings); c is the
cosine between the query and that path's embedding. The gate looks at the distinct paths among a query's pool
of best rows: when one path matches the query far better than the typical path (spread = best - median), the
headings name what the question is about, and rows under the best paths are lifted (the others lowered) in
proportion to that spread; when all paths match alike (uninformative headings such as "Excerpt 1.2") or no row
has a heading, the boost is (close to) zero and scoring is today's. Used by engine/query.py (Engine.run_batch)
with QascParams.context_weight as the weight.

The heading residual takes out of a row's similarity the part its heading already explains: with h the unit
embedding of the row's heading path, s the row's vector and q the query, q . s - beta (q . h)(h . s) =
q . (I - beta h h^T) s, i.e. the query against what the sentence says beyond its heading. The boost scores the
heading match itself; without the residual a sentence that restates its heading (a title, "This policy
describes ...") is counted twice and outranks the sentence that answers. h . s is query independent (one
float per store row), q . h is the boost's c.
"""

from __future__ import annotations

import torch

from qasc.kernels.gather import gathered_dots
from qasc.kernels.quantize import column_inverse, int8_products, quantize_columns, quantize_rows, row_top_k

SHORTLIST_FACTOR = 4  # best_paths: paths re-scored exactly per path wanted, from a low-precision product
INT8_SHORTLIST_QUERIES = 128  # best_paths' int8 products: queries per block (at 50k paths, blocks of 100-160
# queries ran the product at 2x bf16's speed on an AVX512-VNNI CPU, 136-192 at 1.2-1.5x: bench/RESULTS.md)


def int8_heading_table(heading_emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """heading_emb (H, D) float -> (H, D) int8 codes and (D,) float32 scale (each dimension's largest |x|): the
    table `best_paths` takes as its int8 shortlist (x ~ codes * scale / 127 per dimension)."""
    emb = heading_emb.to(torch.float32)
    scale = emb.abs().amax(0) if len(emb) else emb.new_zeros(emb.shape[1])
    return quantize_columns(emb, column_inverse(scale)), scale


def heading_gate(
    pool_c: torch.Tensor, pool_path: torch.Tensor, pool_valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """pool_c (Q, M) float, pool_path (Q, M) int64 (-1 = no heading), pool_valid (Q, M) bool -> spread (Q,),
    cref (Q,) float.

    Over the distinct paths of each row's valid pool entries with a heading (a path's c is taken from its first
    position): cref = their median c (mean of the two middle values for an even count), spread = max c - cref.
    Both are 0 for rows with no such entry.
    """
    q, m = pool_c.shape
    zeros = pool_c.new_zeros(q)
    if m == 0:
        return zeros, zeros.clone()
    ok = pool_valid & (pool_path >= 0)
    big = torch.iinfo(torch.int64).max
    key = torch.where(ok, pool_path, torch.full_like(pool_path, big))
    skey, order = key.sort(dim=1, stable=True)
    sc = pool_c.gather(1, order)
    first = skey != big
    first[:, 1:] &= skey[:, 1:] != skey[:, :-1]
    n = first.sum(dim=1)
    vals = torch.where(first, sc, torch.full_like(sc, float("inf"))).sort(dim=1).values
    lo = ((n - 1).clamp(min=0) // 2)[:, None]
    hi = (n // 2).clamp(max=m - 1)[:, None]
    cref = (vals.gather(1, lo) + vals.gather(1, hi)).squeeze(1) / 2
    best = torch.where(first, sc, torch.full_like(sc, float("-inf"))).max(dim=1).values
    has = n > 0
    return torch.where(has, best - cref, zeros), torch.where(has, cref, zeros)


def context_boost(
    c: torch.Tensor, path: torch.Tensor, valid: torch.Tensor, spread: torch.Tensor, cref: torch.Tensor,
    weight: float,
) -> torch.Tensor:
    """c (Q, L) float, path (Q, L) int64 (-1 = no heading), valid (Q, L) bool, spread/cref (Q,) float, weight
    -> boost (Q, L) float: weight * spread * (c - cref) on valid rows with a heading, 0 elsewhere (add it to the
    rows' similarities before seeding and extents)."""
    boost = weight * spread[:, None] * (c - cref[:, None])
    return torch.where(valid & (path >= 0), boost, torch.zeros_like(boost))


def heading_residual(
    c: torch.Tensor, hs: torch.Tensor, path: torch.Tensor, valid: torch.Tensor, beta: float
) -> torch.Tensor:
    """c (Q, L) float (cosine of the query and each row's heading path), hs (Q, L) float (each row's dot with its
    own heading path's embedding, query independent), path (Q, L) int64 (-1 = no heading), valid (Q, L) bool,
    beta >= 0 -> (Q, L) float: -beta * c * hs on valid rows with a heading, 0 elsewhere (add it to the rows'
    similarities, next to the boost)."""
    out = -beta * c * hs.to(c.dtype)
    return torch.where(valid & (path >= 0), out, torch.zeros_like(out))


SHORTLIST_GROUP = 64  # shortlist_top: columns per group whose maximum is taken first
SHORTLIST_MIN_GROUPS_PER_WIDE = 8  # ... and only with more groups than this x wide (torch.topk was faster at 5k
# columns, 78 groups for a top 32; 2.8x slower at 50k: bench.query_parts)


def shortlist_top(scores: torch.Tensor, wide: int, group: int = SHORTLIST_GROUP) -> torch.Tensor:
    """scores (m, H) int32 | float, wide <= H -> (m, wide) int64 columns of `wide` best scores per row (equal
    scores at the cut picked arbitrarily, as torch.topk). Each row's columns are cut into groups of `group`; the
    `wide` groups with the largest maximum hold every score above the wide-th best and enough equal to it, so the
    top is taken over those groups' columns (and the last, partial group's) rather than over all H: one pass of
    maxima instead of a selection over every column (~3x torch.topk at H = 50k, wide = 32)."""
    m, n = scores.shape
    n_groups = n // group
    if n_groups <= SHORTLIST_MIN_GROUPS_PER_WIDE * wide:  # few groups: the extra passes cost more than they save
        return scores.topk(wide, dim=1).indices
    full = n_groups * group
    maxima = scores.as_strided((m, n_groups, group), (scores.stride(0), group, scores.stride(1))).amax(2)
    top_groups = maxima.topk(wide, dim=1).indices  # (m, wide)
    cols = (top_groups[:, :, None] * group + torch.arange(group, device=scores.device)).reshape(m, wide * group)
    if full < n:  # the partial last group: always a candidate
        cols = torch.cat([cols, torch.arange(full, n, device=scores.device).expand(m, n - full)], dim=1)
    return cols.gather(1, scores.gather(1, cols).topk(wide, dim=1).indices)


def best_paths(query: torch.Tensor, heading_emb: torch.Tensor, j: int, heading_low: torch.Tensor | None = None,
               block_elements: int = 1 << 23,
               low_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """query (Q, D) float32, heading_emb (H, D) float32, j -> scores (Q, j') float32 and paths (Q, j') int64,
    j' = min(j, H): each query's j' best heading paths by cosine, score descending, equal scores lower path first.

    heading_low: the same table in a faster product type, or None: bfloat16 (CPUs with native bf16 instructions),
    or int8 codes with low_scale (D,) float32 (`int8_heading_table`; CPUs with int8 dot products: an int8 x int8 ->
    int32 product against the query's weights q * scale / 127 rounded to 8 bits per query, as the IVF scan's).
    With it a shortlist of min(H, SHORTLIST_FACTOR j') paths per query comes from the low-precision product (a
    block of queries x all H at a time, about `block_elements` scores) and is re-scored exactly in float32; a
    path outside the shortlist would need a rounding error larger than the gap between the j'-th and the
    (SHORTLIST_FACTOR j')-th best scores (bf16 and the 8-bit steps keep about 3 significant digits), so the j'
    best differ from the exact ones only in such near-ties (and equal scores at the shortlist's cut are kept
    arbitrarily). Without it the product is float32 and the result exact, equal scores at the cut keeping the
    lower paths."""
    n_q, n_h = query.shape[0], heading_emb.shape[0]
    jj = min(j, n_h)
    low = heading_low is not None
    int8 = low and heading_low.dtype == torch.int8
    if int8 and low_scale is None:
        raise ValueError("an int8 heading_low needs its low_scale (int8_heading_table)")
    wide = min(n_h, SHORTLIST_FACTOR * jj) if low else jj
    table = heading_low if low else heading_emb
    short = torch.empty((n_q, wide), dtype=torch.long, device=query.device)
    step = max(1, block_elements // max(n_h, 1))
    if int8:  # the query side: q * scale / 127 per dimension, then 8 bits per query (the steps do not change
        q_int = quantize_rows(query * (low_scale / 127))[0]  # the order within a query's row)
        step = min(step, INT8_SHORTLIST_QUERIES)
    for lo in range(0, n_q, step):
        # exact: equal scores at the cut keep the lower paths; low precision: near-ties are approximate anyway
        if int8:
            short[lo : lo + step] = shortlist_top(int8_products(q_int[lo : lo + step], table), wide)  # int32 scores
        else:
            scores = query[lo : lo + step].to(table.dtype) @ table.T  # (step, H)
            short[lo : lo + step] = scores.topk(wide, dim=1).indices if low else row_top_k(scores, wide)[1]
    short = short.sort(dim=1).values  # path order, so that the stable sort below keeps equal scores lower first
    exact = gathered_dots(heading_emb, query, short, torch.ones_like(short, dtype=torch.bool))  # (Q, wide) float32
    order = exact.sort(dim=1, descending=True, stable=True).indices[:, :jj]
    return exact.gather(1, order), short.gather(1, order)


def packed_path_rows(paths: torch.Tensor, path_start: torch.Tensor, path_count: torch.Tensor,
                     path_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """paths (Q, J) int64 heading paths per query, path_start / path_count (H,) int64 each path's first entry and
    entries in path_rows (R,) int64 (CSR) -> rows (Q, T) int64 and valid (Q, T) bool: each query's paths' rows
    laid end to end in path order (path j's count rows, then path j + 1's), T = the most rows of any query. Packed,
    not padded per path: a block whose queries mostly pick short paths is not as wide as J x its longest path."""
    n_q, n_j = paths.shape
    count = path_count[paths] if n_j else paths.new_zeros((n_q, 0))  # (Q, J)
    ends = count.cumsum(1)  # (Q, J) entries up to and including path j
    total = ends[:, -1] if n_j else paths.new_zeros(n_q)
    width = int(total.max()) if n_q else 0
    t = torch.arange(width, device=paths.device).expand(n_q, width)  # (Q, T)
    valid = t < total[:, None]
    if width == 0:
        return paths.new_zeros((n_q, 0)), valid
    j = torch.searchsorted(ends, t.contiguous(), right=True).clamp(max=n_j - 1)  # (Q, T) the path holding entry t
    at = path_start[paths].gather(1, j) + t - (ends - count).gather(1, j)
    return path_rows[at.clamp(min=0, max=max(len(path_rows) - 1, 0))], valid
