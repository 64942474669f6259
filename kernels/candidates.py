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
    hits: torch.Tensor, doc_first: torch.Tensor, doc_last: torch.Tensor, neighbourhood: int, n_total: int
) -> CandidateRows:
    """hits (Q, K) int64 global rows (-1 = none); doc_first/doc_last (N_total,) int64: first/last row of
    each row's document (N_total >= 1) -> the sorted, de-duplicated candidate rows of each query and their
    region ids.

    Each hit brings the rows within `neighbourhood` of it inside its own document; rows that are adjacent
    and in the same document share a region. L is the widest query's candidate count.
    """
    q = hits.shape[0]
    offsets = torch.arange(-neighbourhood, neighbourhood + 1, device=hits.device)
    safe = hits.clamp(min=0)
    cand = safe[:, :, None] + offsets  # (Q, K, 2w+1)
    ok = (hits[:, :, None] >= 0) & (cand >= doc_first[safe][:, :, None]) & (cand <= doc_last[safe][:, :, None])
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
