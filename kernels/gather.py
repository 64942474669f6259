"""Dot products of queries with gathered table rows: the candidate sentences' and heading paths' similarities.

The query path scores each query against a few hundred rows of a large table (the store's vectors, the heading
paths' vectors). The rows are ragged per query and padded to the widest; gathering a padded (Q, L, dim) float
block costs memory traffic for every padding slot and every repeated row. Here only the valid entries are
gathered, a bounded block at a time, and runs of one repeated key (a query's candidate rows share their heading
path for a whole section) are scored once.
"""

from __future__ import annotations

import torch

# gathered table elements per block (2 MiB of float32): a block small enough to stay in cache between the gather,
# the product and the sum (2^19-2^20 ran 2x faster than 2^22 at 1M rows, bench/RESULTS.md)
GATHER_BLOCK_ELEMENTS = 1 << 19
GATHER_BLOCK_ELEMENTS_CUDA = 1 << 22  # on a GPU, fewer and larger blocks (each block is a few kernel launches)


def gathered_dots(table: torch.Tensor, query: torch.Tensor, index: torch.Tensor, valid: torch.Tensor,
                  block_elements: int | None = None) -> torch.Tensor:
    """table (N, D) any float dtype, query (Q, D) float32, index (Q, L) int64 rows of the table, valid (Q, L)
    bool -> (Q, L) float32: query[q] . table[index[q, l]] (the table row cast to float32) where valid, 0
    elsewhere. Invalid entries are never read (their index may be anything); the valid ones are gathered
    about `block_elements` table elements at a time (None: GATHER_BLOCK_ELEMENTS on CPU, GATHER_BLOCK_ELEMENTS_CUDA
    elsewhere), so memory does not grow with Q or with the padding."""
    q, length = index.shape
    out = torch.zeros((q, length), dtype=torch.float32, device=query.device)
    if q == 0 or length == 0:
        return out
    who, col = valid.nonzero(as_tuple=True)  # (E,) entries grouped by query, row-major
    out[who, col] = entry_dots(table, query, who, index[who, col], block_elements)
    return out


def entry_dots(table: torch.Tensor, query: torch.Tensor, who: torch.Tensor, index: torch.Tensor,
               block_elements: int | None = None) -> torch.Tensor:
    """table (N, D) any float dtype, query (Q, D) float32, who (E,) int64 query of each entry, index (E,) int64
    table row of each entry -> (E,) float32: query[who[e]] . table[index[e]] (the row cast to float32), gathered
    about `block_elements` table elements at a time (None: as `gathered_dots`). Each entry's value is its own
    product and row sum, whatever the other entries: a partition that holds a row computes the same bits for it
    as one store of all rows (engine.partition)."""
    if block_elements is None:
        block_elements = GATHER_BLOCK_ELEMENTS if table.device.type == "cpu" else GATHER_BLOCK_ELEMENTS_CUDA
    out = torch.zeros(who.shape[0], dtype=torch.float32, device=query.device)
    step = max(1, block_elements // max(table.shape[1], 1))
    for lo in range(0, who.numel(), step):
        a = who[lo : lo + step]
        rows = table.index_select(0, index[lo : lo + step]).float()  # (e, D): a new tensor (index_select copies)
        # an elementwise product and a row sum: 2x a batch of (1, D) x (D, 1) bmm products on CPU
        out[lo : lo + step] = rows.mul_(query.index_select(0, a)).sum(1)
    return out


def segment_first(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keys (Q, L) int64 -> seg (Q, L) int64, first (Q, U) int64: the runs of equal consecutive keys in each row
    (run j of row q covers the positions where seg[q] == j, numbered from 0 left to right) and each run's key
    (first[q, j]; -1 past the row's last run, U the most runs of any row). first.gather(1, seg) == keys."""
    q, length = keys.shape
    if q == 0 or length == 0:
        return torch.zeros((q, length), dtype=torch.long, device=keys.device), keys.new_full((q, 0), -1)
    change = torch.ones((q, length), dtype=torch.bool, device=keys.device)
    change[:, 1:] = keys[:, 1:] != keys[:, :-1]
    seg = change.long().cumsum(1) - 1
    first = keys.new_full((q, int(seg[:, -1].max()) + 1), -1)
    first[change.nonzero(as_tuple=True)[0], seg[change]] = keys[change]
    return seg, first
