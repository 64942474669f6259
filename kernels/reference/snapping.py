"""Loop twins of kernels.snapping."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _block_ids, _label_runs, _rows, _to_tensor


def snap_to_blocks(
    labels: torch.Tensor,
    n_segments: int,
    segment_ids: torch.Tensor,
    block_ids: torch.Tensor,
    valid: torch.Tensor,
    n_tokens: torch.Tensor,
    max_tokens: int,
) -> torch.Tensor:
    """covered (Q, L) bool: union of the label spans [s, e], each grown to [start of s's block, end of e's block]
    when the grown span holds at most `max_tokens` tokens of valid sentences."""
    q, length = labels.shape
    out: list[list[bool]] = []
    for lab, keys, blk, ok, tok in zip(
        _rows(labels), _rows(segment_ids), _rows(block_ids), _rows(valid), _rows(n_tokens), strict=True
    ):
        block = _block_ids(keys, blk, ok)
        covered = [False] * length
        for s_label in range(n_segments):
            where = [i for i in range(length) if lab[i] == s_label]
            if not where:
                continue
            s, e = min(where), max(where)
            new_s, new_e = s, e
            if block[s] is not None:
                while new_s > 0 and block[new_s - 1] == block[s]:
                    new_s -= 1
            if block[e] is not None:
                while new_e < length - 1 and block[new_e + 1] == block[e]:
                    new_e += 1
            grown = sum(tok[i] for i in range(new_s, new_e + 1) if ok[i])
            if grown <= max_tokens:
                s, e = new_s, new_e
            for i in range(s, e + 1):
                covered[i] = True
        out.append(covered)
    return _to_tensor(out, (q, length), torch.bool, labels.device)


def cap_breaks(labels: torch.Tensor, n_tokens: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """breaks (Q, L) bool: where a new piece starts inside a labelled run when each run is packed greedily,
    left to right, into pieces of at most `max_tokens` tokens (an oversized sentence is a piece of its own)."""
    q, length = labels.shape
    out: list[list[bool]] = []
    for lab, tok in zip(_rows(labels), _rows(n_tokens), strict=True):
        breaks = [False] * length
        for start, end in _label_runs(lab):
            total = tok[start]
            for i in range(start + 1, end + 1):
                if total + tok[i] > max_tokens:
                    breaks[i] = True
                    total = tok[i]
                else:
                    total += tok[i]
        out.append(breaks)
    return _to_tensor(out, (q, length), torch.bool, labels.device)
