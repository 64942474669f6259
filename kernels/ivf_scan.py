"""Batched inverted-file scan: many queries at once over the 8-bit scalar-quantised lists of an IVF index.

A FAISS IVF search walks its lists one query at a time, decoding codes with scalar code (about 35-75 queries/s at
1M rows and 250 of 3,998 lists probed on 2 cores, bench/RESULTS.md). Here the loop runs over lists instead: every
query that probes a list is scored against the list's codes in one matrix product, so the decode becomes a
GEMM. The codes are not decoded into a copy: with x = c + vmin + (code + 0.5) / 255 * vdiff (FAISS's 8-bit
decoding of a residual to the list's centroid c),

    q . x = q . c + q . vmin + 0.5 / 255 * (q . vdiff) + (q * vdiff / 255) . code,

so one (m, D) x (D, n) product per list over the raw codes (cast to float, exact) gives every score.

The top k per query is kept without sorting every list's scores: a first pass scores each query against its
nearest list only (all of it), which fixes a k-th best score per query; later lists keep only the scores at or
above that running threshold (raised after 1, 2, 4, ... lists, then every `REFRESH_LISTS`, by merging the new
entries' best into dense (Q, k) tables, one int64 key per entry: `rank_keys`), so only a few hundred entries per
query are ever sorted. A list's queries are scored SCAN_TILE_ELEMENTS products at a time (the memory bounded
whatever the batch and the list's size, the tile still in cache for the threshold test). The result is
the exact top k of the scanned codes (the threshold never drops an entry that could reach the final k), equal
scores resolved to the lower row whatever the batch.

With int8=True the query side is 8-bit too: q * vdiff / 255 rounded per query to steps of max / 127, each list's
product an int8 x int8 -> int32 GEMM over the codes' bytes shifted to int8 (no float copy of a list), thresholds
compared in those integer units; scores are then approximate (bounded by the rounding), which the caller's exact
re-rank absorbs (bench/RESULTS.md: the same recall@16 at 1M, 1.5-2x the float scan).

`ivf_vectors_topk` runs the same loop (`_scan`) over an IVF whose lists index a table of full vectors (the store's
own: no second copy): each list's rows are gathered per product, in float32 / float16 / bfloat16, or rounded to 8
bits per dimension on the fly (`quantize_columns`) against 8-bit query weights for int8 products. What differs
between the kinds of list is one scorer object each (`_FloatCodes`, `_Int8Codes`, `_Vectors`, `_Int8Vectors`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

REFRESH_LISTS = 256  # lists scanned between two raises of the running thresholds (after the first 1, 2, 4, ...)
MAX_CANDIDATES = 1 << 20  # candidate entries held before an early merge (20 MiB of queries, scores, rows)
PROBE_BLOCK_ELEMENTS = 1 << 22  # query x centroid scores per block of the coarse search
SCAN_TILE_ELEMENTS = 1 << 20  # query x row products per block of one list (4 MiB of int32): bounds the scan's memory


def probe_lists(query: torch.Tensor, centroids: torch.Tensor, nprobe: int) -> tuple[torch.Tensor, torch.Tensor]:
    """query (Q, D) float32, centroids (C, D) float32, nprobe <= C -> centroid scores (Q, nprobe) float32 and
    lists (Q, nprobe) int64, nearest first, computed a block of queries at a time (no dense (Q, C) matrix)."""
    n_q, n_c = query.shape[0], centroids.shape[0]
    vals = torch.empty((n_q, nprobe), dtype=torch.float32, device=query.device)
    lists = torch.empty((n_q, nprobe), dtype=torch.long, device=query.device)
    step = max(1, PROBE_BLOCK_ELEMENTS // max(n_c, 1))
    for lo in range(0, n_q, step):
        vals[lo : lo + step], lists[lo : lo + step] = (query[lo : lo + step] @ centroids.T).topk(nprobe, dim=1)
    return vals, lists


def rank_keys(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """scores float32, rows int64 (-1: none) of one shape -> int64 keys of that shape whose ascending order is
    score descending, then row ascending (rows -1 last among equal scores): the score's float32 bits mapped to an
    order-preserving int32 (-0.0 taken as 0.0) in the high half, the row in the low half (rows < 2**32 - 1)."""
    bits = (scores.to(torch.float32) + 0.0).view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed order of the ints = order of the floats (no NaN)
    low = torch.where(rows >= 0, rows, torch.full_like(rows, 0xFFFFFFFF))
    return ((-ordered.to(torch.int64)) << 32) | low


def top_k_per_query(query_of: torch.Tensor, scores: torch.Tensor, rows: torch.Tensor, n_queries: int,
                    k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate entries (E,) query int64, score float32, row int64 -> per query its k best: scores (Q, k)
    float32 (-inf where fewer), rows (Q, k) int64 (-1 there), by score descending, equal scores lower row first
    (one sort by `rank_keys`, then a stable one by query)."""
    out_s = torch.full((n_queries, k), float("-inf"), dtype=torch.float32, device=scores.device)
    out_r = torch.full((n_queries, k), -1, dtype=torch.long, device=scores.device)
    if scores.numel() == 0:
        return out_s, out_r
    order = torch.sort(rank_keys(scores, rows)).indices
    order = order[torch.sort(query_of[order], stable=True).indices]  # by query, then score desc, then row asc
    q_sorted = query_of[order].long()
    counts = torch.bincount(q_sorted, minlength=n_queries)
    rank = torch.arange(order.numel(), device=scores.device) - (torch.cumsum(counts, 0) - counts)[q_sorted]
    keep = rank < k
    out_s[q_sorted[keep], rank[keep]] = scores[order[keep]]
    out_r[q_sorted[keep], rank[keep]] = rows[order[keep]]
    return out_s, out_r


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


class _Candidates:
    """The k best (score, row) per query so far as dense (Q, k) tables, entries (query, score, row) found since
    the last merge, and per query the k-th best score (the threshold an entry must reach to be kept)."""

    def __init__(self, n_queries: int, k: int, device: torch.device) -> None:
        self.n_queries, self.k = n_queries, k
        self.best_s = torch.full((n_queries, k), float("-inf"), dtype=torch.float32, device=device)
        self.best_r = torch.full((n_queries, k), -1, dtype=torch.long, device=device)
        self.parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.size = 0
        self.threshold = self.best_s[:, -1].clone()

    def add(self, query_of: torch.Tensor, scores: torch.Tensor, rows: torch.Tensor) -> None:
        self.parts.append((query_of, scores, rows))
        self.size += scores.numel()
        if self.size > MAX_CANDIDATES:
            self.merge()

    def merge(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> the k best per query (Q, k) so far, score descending, equal scores lower row first: the new
        entries' k best per query merged into the tables (row by row, dense), the thresholds raised to their
        k-th. An entry tied with the k-th is never dropped before (the threshold keeps ties), so the result does
        not depend on when merges happen (nor on the other queries of the batch)."""
        if self.parts:
            query_of, scores, rows = (torch.cat(t) for t in zip(*self.parts, strict=True))
            new_s, new_r = top_k_per_query(query_of, scores, rows, self.n_queries, self.k)
            self.best_s, self.best_r = torch.cat([self.best_s, new_s], 1), torch.cat([self.best_r, new_r], 1)
            self.parts, self.size = [], 0
        order = torch.topk(rank_keys(self.best_s, self.best_r), self.k, dim=1, largest=False).indices
        self.best_s, self.best_r = self.best_s.gather(1, order), self.best_r.gather(1, order)
        self.threshold = self.best_s[:, -1].clone()
        return self.best_s, self.best_r


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (Q, D) float32 -> codes (Q, D) int8 and step (Q,) float32 with x ~ step * codes: symmetric per-row
    8-bit quantisation, step = max |x| / 127 (1e-30 for a zero row), |x - step * codes| <= step / 2."""
    step = x.abs().amax(1).clamp(min=1e-30) / 127 if x.shape[1] else torch.full((x.shape[0],), 1e-30)
    return torch.round(x / step[:, None]).to(torch.int8), step


def _signed_codes(codes: torch.Tensor) -> torch.Tensor:
    """codes (n, D) uint8 -> the same bytes as int8 codes - 128 (a new tensor; 8 bytes at a time when it can)."""
    if codes.is_contiguous() and codes.shape[1] % 8 == 0 and codes.storage_offset() % 8 == 0:
        return torch.bitwise_xor(codes.view(torch.int64), _HIGH_BITS).view(torch.int8)
    return torch.bitwise_xor(codes, 128).view(torch.int8)


_HIGH_BITS = torch.tensor(-0x7F7F7F7F7F7F7F80, dtype=torch.int64)  # 0x8080808080808080: each byte's top bit


def int8_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (m, D) int8, b (n, D) int8 -> a @ b.T (m, n) int32: `torch._int_mm` (VNNI on CPUs that have it) when D is
    a multiple of 8 (torch 2.13's CPU kernel returns garbage for D = 1), else an int32 product."""
    if a.shape[1] % 8 == 0 and a.shape[1]:
        return torch._int_mm(a, b.T)
    return a.to(torch.int32) @ b.to(torch.int32).T


def _hits(raw: torch.Tensor, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """raw (m, n) scores, limit (m,) -> (row, column) of the entries >= their row's limit; the rows whose best
    entry misses the limit (most of them once the thresholds settle) are skipped before the comparison."""
    live = (raw.amax(1) >= limit).nonzero().squeeze(1)
    if live.numel() == 0:
        return live, live
    a, c = (raw.index_select(0, live) >= limit.index_select(0, live)[:, None]).nonzero(as_tuple=True)
    return live.index_select(0, a), c


def scan_budget(probes: torch.Tensor, sizes: Sequence[int], max_codes: int) -> torch.Tensor | None:
    """probes (Q, P) int64 each query's probed lists, nearest first, sizes C the lists' lengths, max_codes ->
    (Q, P) int64: how many of each probed list's codes the query scans under a budget of max_codes codes (FAISS's
    `IndexIVF.max_codes`: whole lists in probe order, the one that crosses the budget cut short, none after it);
    None when max_codes <= 0 (no budget: every probed list whole)."""
    if max_codes <= 0:
        return None
    size = torch.tensor(list(sizes), dtype=torch.long, device=probes.device)[probes]  # (Q, P)
    before = size.cumsum(1) - size  # codes scanned before each list
    return (max_codes - before).clamp(min=0).minimum(size)


class _FloatCodes:
    """8-bit codes scored in float32: each list's codes cast to a (D, n) float copy, score = off + q_scaled . code."""

    def __init__(self, q_scaled: torch.Tensor, list_codes: Sequence[torch.Tensor]) -> None:
        self.q_scaled, self.list_codes = q_scaled, list_codes

    def side(self, lst: int) -> torch.Tensor:
        return self.list_codes[lst].T.to(torch.float32)

    def products(self, who: torch.Tensor, off: torch.Tensor | None, side: torch.Tensor) -> torch.Tensor:
        return torch.addmm(off[:, None], self.q_scaled.index_select(0, who), side)  # (m, n) scores

    def scores(self, raw: torch.Tensor, who: torch.Tensor, off: torch.Tensor | None) -> torch.Tensor:
        return raw

    def limit(self, threshold: torch.Tensor, who: torch.Tensor, off: torch.Tensor | None) -> torch.Tensor:
        return threshold

    def values(self, got: torch.Tensor, who: torch.Tensor, off: torch.Tensor | None) -> torch.Tensor:
        return got


class _Int8Codes(_FloatCodes):
    """8-bit codes against 8-bit query weights: raw = q_int . (code - 128) int32 (no float copy of a list), score =
    off + step * raw; thresholds compared in raw units, rounded down one step (a superset: the merge decides)."""

    def __init__(self, q_int: torch.Tensor, step: torch.Tensor, list_codes: Sequence[torch.Tensor]) -> None:
        super().__init__(q_int, list_codes)
        self.step = step

    def side(self, lst: int) -> torch.Tensor:
        return _signed_codes(self.list_codes[lst])

    def products(self, who: torch.Tensor, off: torch.Tensor | None, side: torch.Tensor) -> torch.Tensor:
        return int8_products(self.q_scaled.index_select(0, who), side)  # (m, n) int32

    def scores(self, raw: torch.Tensor, who: torch.Tensor, off: torch.Tensor | None) -> torch.Tensor:
        scaled = self.step.index_select(0, who)[:, None] * raw.to(torch.float32)
        return scaled if off is None else off[:, None] + scaled

    def limit(self, threshold: torch.Tensor, who: torch.Tensor, off: torch.Tensor | None) -> torch.Tensor:
        scale = self.step.index_select(0, who)
        above = threshold if off is None else threshold - off
        return (above / scale).floor().clamp(-(2.0**30), 2.0**30).to(torch.int32) - 1

    def values(self, got: torch.Tensor, who: torch.Tensor, off: torch.Tensor | None) -> torch.Tensor:
        scaled = self.step.index_select(0, who) * got.to(torch.float32)
        return scaled if off is None else off + scaled


class _Vectors(_FloatCodes):
    """Full vectors, the lists being rows of one (N, D) table: each list's rows gathered and cast to `dtype` (the
    product's precision), score = q . x accumulated in float32 (no offset: lists hold vectors, not residuals)."""

    def __init__(self, query: torch.Tensor, vectors: torch.Tensor, list_rows: Sequence[torch.Tensor],
                 dtype: torch.dtype) -> None:
        super().__init__(query.to(dtype), [])
        self.vectors, self.list_rows, self.dtype = vectors, list_rows, dtype

    def side(self, lst: int) -> torch.Tensor:
        return self.vectors.index_select(0, self.list_rows[lst]).to(self.dtype)  # (n, D)

    def products(self, who: torch.Tensor, off: torch.Tensor | None, side: torch.Tensor) -> torch.Tensor:
        return (self.q_scaled.index_select(0, who) @ side.T).to(torch.float32)  # (m, n)


class _Int8Vectors(_Int8Codes):
    """Full vectors scored as 8-bit codes made per product: each list's gathered rows rounded to steps of
    scale / 127 per dimension (`quantize_columns`), the query's weights q * scale / 127 to 8 bits per query; raw
    int32 as `_Int8Codes` (no offset)."""

    def __init__(self, query: torch.Tensor, vectors: torch.Tensor, list_rows: Sequence[torch.Tensor],
                 scale: torch.Tensor) -> None:
        q_int, step = quantize_rows(query * (scale / 127))
        super().__init__(q_int, step, [])
        self.vectors, self.list_rows, self.inverse = vectors, list_rows, column_inverse(scale)

    def side(self, lst: int) -> torch.Tensor:
        return quantize_columns(self.vectors.index_select(0, self.list_rows[lst]), self.inverse)


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


def ivf_sq8_topk(
    query: torch.Tensor,
    centroids: torch.Tensor,
    list_codes: Sequence[torch.Tensor],
    list_rows: Sequence[torch.Tensor],
    vmin: torch.Tensor,
    vdiff: torch.Tensor,
    nprobe: int,
    k: int,
    by_residual: bool = True,
    int8: bool = False,
    max_codes: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query (Q, D) float, centroids (C, D) float32, list_codes C tensors (n_c, D) uint8, list_rows C tensors
    (n_c,) int64 (the rows the codes stand for), vmin, vdiff (D,) float32 (the quantiser's per-dimension range),
    nprobe, k -> scores (Q, k) float32 (-inf where the probed lists hold fewer than k rows), rows (Q, k) int64
    (-1 there): the k best inner products over the codes of each query's `nprobe` nearest lists, as FAISS's
    IndexIVFScalarQuantizer (QT_8bit, inner product) scores them; by score descending, equal scores lower row
    first. by_residual: codes encode x - centroid (FAISS's default) rather than x. Lists live on any device;
    the query is moved there.

    int8: the code-side weights q * vdiff / 255 are themselves quantised to 8 bits per query (`quantize_rows`)
    and each list is scored by an int8 x int8 -> int32 product (`torch._int_mm`, a CPU feature here): ~4x fewer
    cycles per multiply-add than float32 and no cast of the codes to float. Scores are then approximate, off by
    at most step / 2 * sum(code) (step: the query's quantisation step), the top k exact for those scores; callers
    re-rank the hits from full vectors (Store.search_tensor does).

    max_codes > 0: each query scans at most that many codes, as FAISS's `IndexIVF.max_codes`: its probed lists in
    order, nearest first, until max_codes codes are scanned, the list that crosses the budget cut to its first
    codes (0: every probed list whole). With lists of unequal sizes this bounds the work per query."""
    q = query.to(device=centroids.device, dtype=torch.float32)
    if q.shape[0] == 0 or centroids.shape[0] == 0 or k < 1:
        return _no_hits(q.shape[0], k, centroids.device)
    probe_s, probes = probe_lists(q, centroids.float(), max(1, min(int(nprobe), centroids.shape[0])))  # (Q, P)
    offset = (q @ vmin + (0.5 / 255) * (q @ vdiff))[:, None] + (probe_s if by_residual else torch.zeros_like(probe_s))
    del probe_s
    q_scaled = q * (vdiff / 255)  # (Q, D)
    if int8:  # q_scaled . code = step * (q_int . (code - 128)) + step * 128 * sum(q_int)
        q_scaled, step = quantize_rows(q_scaled)
        offset += (step * 128 * q_scaled.sum(1, dtype=torch.float32))[:, None]
        scorer: _FloatCodes = _Int8Codes(q_scaled, step, list_codes)
    else:
        scorer = _FloatCodes(q_scaled, list_codes)
    sizes = [int(c.shape[0]) for c in list_codes]
    return _scan(probes, offset, sizes, list_rows, k, scan_budget(probes, sizes, max_codes), scorer)


def ivf_vectors_topk(
    query: torch.Tensor,
    centroids: torch.Tensor,
    vectors: torch.Tensor,
    list_rows: Sequence[torch.Tensor],
    nprobe: int,
    k: int,
    dtype: torch.dtype = torch.float32,
    max_codes: int = 0,
    int8_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query (Q, D) float, centroids (C, D) float32, vectors (N, D) float (the store's own: no second copy),
    list_rows C tensors (n_c,) int64 (each list's rows of `vectors`), nprobe, k -> scores (Q, k) float32 (-inf
    where the probed lists hold fewer than k rows), rows (Q, k) int64 (-1 there): the k best inner products q . x
    over the rows of each query's `nprobe` nearest lists (an IVF whose lists index the stored vectors, as FAISS's
    IndexIVFFlat scores them), by score descending, equal scores lower row first. Same scan as `ivf_sq8_topk`
    (lists in turn, every query probing a list in one product, running thresholds; max_codes as there), each
    list's rows gathered from `vectors` per product.

    dtype: the products' precision. float32 gives exact scores (float32 sums); float16 (GPUs) or bfloat16 round the
    query, the rows and each product's output to that type (scores off by a few units of its last place): callers
    re-rank the hits from the full vectors (Store.search_tensor does).

    int8_scale (D,) float32, each dimension's largest |x| over the vectors: int8 products instead (`dtype` unused):
    each list's gathered rows rounded to 8 bits per dimension (`quantize_columns`), the query's weights q * scale /
    127 to 8 bits per query (`quantize_rows`), an int8 x int8 -> int32 product per list as `ivf_sq8_topk`'s int8
    path; scores approximate (both roundings), re-ranked by the caller."""
    q = query.to(device=vectors.device, dtype=torch.float32)
    if q.shape[0] == 0 or centroids.shape[0] == 0 or k < 1:
        return _no_hits(q.shape[0], k, vectors.device)
    probes = probe_lists(q, centroids.to(vectors.device, torch.float32),
                         max(1, min(int(nprobe), centroids.shape[0])))[1]  # (Q, P)
    sizes = [int(r.shape[0]) for r in list_rows]
    scorer = _Vectors(q, vectors, list_rows, dtype) if int8_scale is None else _Int8Vectors(
        q, vectors, list_rows, int8_scale.to(vectors.device, torch.float32))
    return _scan(probes, None, sizes, list_rows, k, scan_budget(probes, sizes, max_codes), scorer)


def _no_hits(n_q: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.full((n_q, max(k, 0)), float("-inf"), device=device),
            torch.full((n_q, max(k, 0)), -1, dtype=torch.long, device=device))


def _scan(probes: torch.Tensor, offset: torch.Tensor | None, sizes: Sequence[int], list_rows: Sequence[torch.Tensor],
          k: int, budget: torch.Tensor | None, scorer: _FloatCodes) -> tuple[torch.Tensor, torch.Tensor]:
    """probes (Q, P) int64 each query's lists nearest first, offset (Q, P) float32 each pair's score offset (None:
    0), sizes C the lists' lengths, list_rows C tensors (n_c,) int64, k, budget (Q, P) codes to scan of each probed
    list (None: all), scorer (the products of one kind of list) -> the k best (scores, rows) per query (Q, k)."""
    device = probes.device
    n_q, n_c = probes.shape[0], len(sizes)
    probes = probes.to(torch.int32)  # (Q, P): the (query, probed list) pairs, int32 to halve the pair arrays
    cand = _Candidates(n_q, k, device)
    every = torch.arange(n_q, device=device)
    query_limit = None  # without offsets: each query's limit, computed once per merge rather than per tile
    for first in (True, False):  # each query's nearest list first (column 0): it sets the thresholds
        cols = probes[:, :1] if first else probes[:, 1:]  # (Q, P') lists of this phase's pairs
        width = cols.shape[1]
        if width == 0:
            continue
        part = None if budget is None else (budget[:, :1] if first else budget[:, 1:]).reshape(-1)
        if part is not None:  # pairs past a query's budget go to list n_c: sorted last, never scanned
            cols = torch.where((part > 0).view(cols.shape), cols, torch.full_like(cols, n_c))
        by_list, pairs = torch.sort(cols.reshape(-1), stable=True)  # pairs grouped by list: index q * P' + j
        counts = torch.bincount(by_list, minlength=n_c + 1)[:n_c]
        del by_list
        pair_off = None if offset is None else (offset[:, :1] if first else offset[:, 1:]).reshape(-1)[pairs]
        who_all = torch.div(pairs, width, rounding_mode="floor").to(torch.int32)  # (pairs,) their queries
        pair_cut = None if part is None else part[pairs]  # (pairs,) the codes of its list each pair scans
        del pairs
        ends, counts_l = torch.cumsum(counts, 0).tolist(), counts.tolist()
        scanned, next_merge = 0, 1
        for lst in counts.nonzero().squeeze(1).tolist():
            n, rows = sizes[lst], list_rows[lst]
            if n == 0:
                continue
            side = scorer.side(lst)
            tile = max(1, SCAN_TILE_ELEMENTS // n)  # queries per product: (tile, n) scores at most
            for lo in range(ends[lst] - counts_l[lst], ends[lst], tile):
                who = who_all[lo : min(lo + tile, ends[lst])].long()  # (m,) queries probing this list
                off = None if pair_off is None else pair_off[lo : lo + who.shape[0]]  # (m,) or None: 0
                cut = None if pair_cut is None else pair_cut[lo : lo + who.shape[0]]  # (m,) codes each scans
                if cut is not None and bool((cut >= n).all()):
                    cut = None  # every query of the tile scans the whole list
                raw = scorer.products(who, off, side)  # (m, n)
                if first:  # each query once: its best k of this list go straight into its table row
                    scores = scorer.scores(raw, who, off)
                    if cut is not None:  # codes past the budget: no score, no row
                        beyond = torch.arange(n, device=device)[None, :] >= cut[:, None]
                        scores = scores.masked_fill(beyond, float("-inf"))
                    best, got = row_top_k(scores, k, rows)
                    if cut is not None:
                        got = torch.where(torch.isfinite(best), got, torch.full_like(got, -1))
                    cand.best_s[who, : best.shape[1]], cand.best_r[who, : best.shape[1]] = best, got
                    continue
                limit = query_limit.index_select(0, who) if query_limit is not None and off is None else (
                    scorer.limit(cand.threshold.index_select(0, who), who, off))  # a stale one is lower: a superset
                hit_q, hit_c = _hits(raw, limit)
                if cut is not None and hit_q.numel():  # only the codes within each query's budget
                    inside = hit_c < cut.index_select(0, hit_q)
                    hit_q, hit_c = hit_q[inside], hit_c[inside]
                if hit_q.numel():
                    hit_who = who.index_select(0, hit_q)
                    cand.add(hit_who, scorer.values(raw[hit_q, hit_c], hit_who, None if off is None else
                                                    off.index_select(0, hit_q)), rows.index_select(0, hit_c))
            scanned += 1
            if not first and scanned >= next_merge:  # loose thresholds early: raise them after 1, 2, 4, ... lists
                # (the first phase writes its tables directly and reads no threshold: one merge at its end)
                cand.merge()
                query_limit = scorer.limit(cand.threshold, every, None) if offset is None else None
                next_merge = scanned + min(scanned, REFRESH_LISTS)
        del who_all, pair_off
        cand.merge()  # after the nearest lists: the first thresholds
        query_limit = scorer.limit(cand.threshold, every, None) if offset is None else None
    return cand.merge()
