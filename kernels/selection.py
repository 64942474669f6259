"""Final choice of chunks per query: top-k by score and/or a retrieved-token budget."""

from __future__ import annotations

import torch


def select_chunks(
    scores: torch.Tensor,
    n_tokens: torch.Tensor,
    top_k: int | None = None,
    budget_tokens: int | None = None,
    score_margin: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (Q, S) float (-inf = absent), n_tokens (Q, S) int64 -> order (Q, S) int64, chosen (Q, S) bool.

    order lists chunk indices by descending score (ties: lower index first); chosen[q, j] says whether
    the j-th chunk of that order is returned: present, among the first `top_k`, and within
    `budget_tokens` counted cumulatively in rank order (a chunk that would overflow the budget stops the
    selection there); with `score_margin`, only chunks scoring >= best score - score_margin (a gap
    rule that lets the number of returned chunks follow the score profile).
    """
    q, s = scores.shape
    order = scores.sort(dim=1, descending=True, stable=True).indices
    sorted_scores = scores.gather(1, order)
    chosen = sorted_scores > float("-inf")
    if top_k is not None:
        chosen &= torch.arange(s, device=scores.device)[None, :] < top_k
    if score_margin is not None:
        chosen &= sorted_scores >= sorted_scores[:, :1] - score_margin
    if budget_tokens is not None:
        toks = torch.where(chosen, n_tokens.gather(1, order), torch.zeros_like(n_tokens))
        chosen &= toks.cumsum(dim=1) <= budget_tokens
        chosen = chosen.long().cumprod(dim=1).bool()  # stop at the first overflow
    return order, chosen
