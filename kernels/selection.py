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


def focus_on_best(
    scores: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    regions: torch.Tensor,
    gap: int | None,
    far_margin: float | None = None,
) -> torch.Tensor:
    """scores (Q, S) float (-inf = absent), starts/ends (Q, S) int64 row positions (inclusive), regions (Q, S)
    int64 -> scores (Q, S) with -inf for every chunk that is neither the best chunk of its row (highest score,
    ties: lower index) nor in the best chunk's region with at most `gap` sentences between the two.

    Evidence that spans several sentences tends to cluster around the best hit; this keeps the companions of
    the best chunk and drops hits elsewhere. With `far_margin`, a chunk elsewhere (another region or document)
    is kept too when it scores >= the best score - far_margin: evidence spread over several documents survives
    when it is nearly as strong as the best hit. gap None returns the scores unchanged.
    """
    if gap is None or scores.shape[1] == 0:
        return scores.clone()
    if gap < 0:
        raise ValueError(f"gap must be >= 0, got {gap}")
    best = scores.argmax(dim=1, keepdim=True)  # first maximum
    b_start, b_end, b_region = starts.gather(1, best), ends.gather(1, best), regions.gather(1, best)
    between = torch.maximum(starts - b_end, b_start - ends) - 1  # sentences strictly between the two chunks
    near = (regions == b_region) & (between <= gap)
    is_best = torch.zeros_like(near).scatter(1, best, True)
    keep = near | is_best
    if far_margin is not None:
        keep |= scores >= scores.gather(1, best) - far_margin
    return torch.where(keep, scores, torch.full_like(scores, float("-inf")))
