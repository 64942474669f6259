"""Loop twins of kernels.snapping."""

from __future__ import annotations

import torch

from qasc.kernels.reference._common import _label_runs, _rows, _to_tensor


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
