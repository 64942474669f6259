"""The scoring model: the one place where the evidence about a candidate row becomes its score.

A row r (a sentence, or a passage) of query q brings four signals:

    cos   q . s_r                      dense cosine of the query and the row's vector
    c     q . h_r                      heading match: the query against the row's heading path (0 without one)
    hs    h_r . s_r                    how much of the row its heading already says (query independent)
    lex   BM25(q, r) / best(q)         lexical match, in [0, 1] (best(q): the most any row could score for q)

and the query brings its heading gate over the distinct paths of its best rows by cosine
(`kernels.context.heading_gate`): spread = best c - median c, cref = that median. The model is

    plain(r) = cos - beta * c * hs + alpha * lex     what the row says beyond its heading, plus its words
    boost(r) = w * spread * (c - cref)               where it sits: its heading against the typical one
    score(r) = plain(r) + boost(r)

with one weight per signal (`ScoringModel`) and no switch per query: where the headings are alike or absent the
spread is ~0 and the boost vanishes by itself; the lexical term is always on. Extents (kernels.pipeline) pool the
plain scores and add their rows' mean boost once, so that a heading match lifts a run or a section by the same
amount as its best sentence. Every consumer (pre-retrieval ranking, seeding and extents, the budget fill's
passages and rows, the evaluation's `+ same context` baselines) calls `row_scores`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class ScoringModel:
    """The scoring model's weights: heading w >= 0 (0: no heading context), residual beta in [0, 2], lexical
    alpha in [0, 10] (0: no lexical term)."""

    heading: float = 12.0
    residual: float = 0.75
    lexical: float = 0.8

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 <= self.heading < float("inf"):
            problems.append(f"heading weight must be >= 0 and finite, got {self.heading}")
        if not 0.0 <= self.residual <= 2.0:
            problems.append(f"heading residual must be in [0, 2], got {self.residual}")
        if not 0.0 <= self.lexical <= 10.0:
            problems.append(f"lexical weight must be in [0, 10], got {self.lexical}")
        if problems:
            raise ValueError("; ".join(problems))


class RowScores(NamedTuple):
    """plain (Q, L) float32: cos - residual + lexical; boost (Q, L) float32: the heading context (zeros without)."""

    plain: torch.Tensor
    boost: torch.Tensor

    @property
    def total(self) -> torch.Tensor:
        return self.plain + self.boost


def row_scores(
    model: ScoringModel,
    cos: torch.Tensor,
    valid: torch.Tensor,
    c: torch.Tensor | None = None,
    path: torch.Tensor | None = None,
    hs: torch.Tensor | None = None,
    spread: torch.Tensor | None = None,
    cref: torch.Tensor | None = None,
    lex: torch.Tensor | None = None,
) -> RowScores:
    """cos (Q, L) float32, valid (Q, L) bool; heading signals (all or none): c (Q, L) float32, path (Q, L) int64
    (-1: no heading), hs (Q, L) float, spread/cref (Q,) float32; lex (Q, L) float32 BM25 / best in [0, 1] (None:
    no lexical signal) -> RowScores(plain, boost), both 0 where invalid.

    plain = cos - model.residual * c * hs (rows with a heading) + model.lexical * lex; boost = model.heading *
    spread * (c - cref) on rows with a heading, 0 elsewhere."""
    zero = torch.zeros_like(cos)
    plain = cos
    boost = zero
    if c is not None and model.heading > 0:
        headed = valid & (path >= 0)
        boost = torch.where(headed, model.heading * spread[:, None] * (c - cref[:, None]), zero)
        if model.residual > 0:
            plain = plain - torch.where(headed, model.residual * c * hs.to(c.dtype), zero)
    if lex is not None and model.lexical > 0:
        plain = plain + model.lexical * lex
    return RowScores(torch.where(valid, plain, zero), boost)


def normalised_lexical(bm25: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """bm25 (Q, L) float32 BM25 of the rows (`kernels.lexical.lexical_scores`), best (Q,) float32 the most a row could
    score per query -> (Q, L) float32 bm25 / best in [0, 1] (0 for a query with no known term)."""
    scale = torch.where(best > 0, 1.0 / best.clamp(min=1e-12), torch.zeros_like(best))
    return bm25 * scale[:, None]


RERANK_STD_FLOOR = 1e-6  # a query's scores spread less than this: that signal says nothing there (its z is 0)


def rerank_scores(first: torch.Tensor, cross: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """first (Q, N) float the first stage's scores of each query's N best candidates, cross (Q, N) float a
    cross-encoder's scores of the same candidates, valid (Q, N) bool -> (Q, N) float32 fused scores, -inf where
    invalid (the rerank stage, engine.rerank).

    fused = z(first) + z(cross), z over each query's valid entries: (x - mean) / std (population std, float64),
    0 where std <= RERANK_STD_FLOOR (one candidate, or all scores equal). Equal weights and no constant: the two
    signals' scales (cosines, logits) drop out, and neither overrides the other."""
    def z(x: torch.Tensor) -> torch.Tensor:
        x = torch.where(valid, x.double(), torch.zeros_like(x, dtype=torch.float64))
        count = valid.sum(dim=1, keepdim=True).clamp(min=1)
        mean = x.sum(dim=1, keepdim=True) / count
        centred = torch.where(valid, x - mean, torch.zeros_like(x))
        std = (centred.square().sum(dim=1, keepdim=True) / count).sqrt()
        return torch.where(std > RERANK_STD_FLOOR, centred / std.clamp(min=RERANK_STD_FLOOR), torch.zeros_like(x))

    fused = (z(first) + z(cross)).float()
    return torch.where(valid, fused, torch.full_like(fused, float("-inf")))
