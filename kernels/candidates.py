"""Candidate rows of the hybrid path: the sentences around each query's FAISS hits, as one padded row."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CandidateRows:
    """rows (Q, L) int64 global sentence rows (N_total for padding), valid (Q, L) bool, region (Q, L) int64
    (1, 2, ... per query in row order; -1 for padding)."""

    rows: torch.Tensor
    valid: torch.Tensor
    region: torch.Tensor


def candidate_rows(
    hits: torch.Tensor, doc_first: torch.Tensor, doc_last: torch.Tensor, neighbourhood: int, n_total: int,
    block_first: torch.Tensor | None = None, block_last: torch.Tensor | None = None, block_rows: int = 0,
) -> CandidateRows:
    """hits (Q, K) int64 global rows (-1 = none); doc_first/doc_last (N_total,) int32 or int64: first/last row of
    each row's document (N_total >= 1); optional block_first/block_last (N_total,) int32 or int64: the rows of a block
    (a section) each row brings whole, within its document and at most `block_rows` rows long (a row that
    brings no block: itself) -> the sorted, de-duplicated candidate rows of each query and their region ids.

    Each hit brings the rows within `neighbourhood` of it inside its own document, and the rows of its block;
    rows that are adjacent and in the same document share a region. L is the widest query's candidate count.
    A block longer than `block_rows` is an error of the caller (its far rows would be cut off).
    """
    q = hits.shape[0]
    reach = max(neighbourhood, block_rows - 1) if block_first is not None else neighbourhood
    offsets = torch.arange(-reach, reach + 1, device=hits.device)
    safe = hits.clamp(min=0)
    cand = safe[:, :, None] + offsets  # (Q, K, 2 reach + 1)
    lo, hi = safe - neighbourhood, safe + neighbourhood  # (Q, K) inclusive
    if block_first is not None and block_last is not None:
        lo, hi = torch.minimum(lo, block_first[safe].long()), torch.maximum(hi, block_last[safe].long())
    lo, hi = torch.maximum(lo, doc_first[safe].long()), torch.minimum(hi, doc_last[safe].long())
    ok = (hits[:, :, None] >= 0) & (cand >= lo[:, :, None]) & (cand <= hi[:, :, None])
    flat = torch.where(ok, cand, torch.full_like(cand, n_total)).reshape(q, cand.shape[1] * cand.shape[2])
    flat = flat.sort(dim=1).values
    dup = torch.zeros_like(flat, dtype=torch.bool)
    dup[:, 1:] = flat[:, 1:] == flat[:, :-1]
    flat = torch.where(dup, torch.full_like(flat, n_total), flat).sort(dim=1).values
    valid = flat < n_total
    width = int(valid.sum(dim=1).max()) if valid.numel() else 0
    flat, valid = flat[:, :width], valid[:, :width]
    safe_rows = torch.where(valid, flat, torch.zeros_like(flat))
    new_region = torch.ones_like(valid)
    if width > 1:
        contiguous = flat[:, 1:] == flat[:, :-1] + 1
        same_doc = doc_first[safe_rows[:, 1:]] == doc_first[safe_rows[:, :-1]]
        new_region[:, 1:] = ~(contiguous & same_doc)
    region = new_region.long().cumsum(dim=1)
    return CandidateRows(flat, valid, torch.where(valid, region, torch.full_like(region, -1)))
