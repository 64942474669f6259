"""QASC parameters: one frozen, validated dataclass shared by the kernels pipeline and the engine."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from qasc.kernels.signals import ScoringModel

SCORE_RULES = ("seed_sim", "window_max", "window_mean")
SNAP_RULES = ("none", "paragraph", "section")
EXTENT_RULES = ("window", "pooled")
BLOCK_RULES = ("none", "paragraph", "section", "both")
MAX_EXTENT_LIMIT = 64  # pooled runs are scored for every length up to max_extent: (Q, L, max_extent) per batch
FLOAT_FIELDS = ("percentile", "threshold", "margin", "extent_penalty", "decay", "factor", "score_margin",
                "far_margin", "length_bonus", "context_weight", "heading_residual", "lexical_weight", "fill_diversity")


@dataclass(frozen=True)
class QascParams:
    """Every knob of query-time chunking.

    Defaults: pooled extents (runs of up to 2 sentences holding a p90 seed, clipped to the paragraph, and whole
    sections complete in the candidate region, a title's text excepted, with a length bonus 0.02 ln(sentences)),
    the best chunk, its neighbours within 6 sentences and chunks elsewhere within 0.05 of it, every chunk within
    0.1 of the best, at most 10 (with RetrievalConfig depth 8, neighbourhood 2), rows scored by the one scoring
    model (kernels.signals: cosine, heading boost w 12, heading residual 0.75, lexical term 0.8 without the
    heading's own words; no switch per query). Leave-one-dataset-out over the six development sets, every
    signal's ablation and the form's measured alternatives: bench/RESULTS.md, "One scoring model". The
    window-mode fields keep the setting cross-validation chose among windows (adaptive up to m=3 within 0.1 of the
    seed, window-max ranking). With a token budget and these chunking defaults, `qasc query` answers with the
    suite's budget setting instead (engine.config.BUDGET_PROFILE, `--no-budget-profile` to keep these).
    """

    percentile: float = 90.0  # seeds: sims >= the p-th percentile tau of the row (0..100)
    min_seeds: int = 1  # the most similar sentences that are always seeds
    max_seeds: int | None = None  # at most this many seeds per query (None: no cap)
    radius: int = 3  # window: m sentences each side (fixed), or the most it may grow (adaptive)
    adaptive: bool = True  # grow while the neighbour's similarity stays >= the seed's threshold
    threshold: float | None = None  # adaptive: absolute floor on a neighbour's similarity
    margin: float | None = 0.1  # adaptive: neighbour must be >= seed similarity - margin
    clip_to_paragraph: bool = True  # windows never leave the seed's paragraph
    extent: str = "pooled"  # window: seed + (adaptive) window; pooled: best runs by pooled-embedding cosine
    max_extent: int = 2  # pooled: longest run of sentences scored as one candidate extent
    extent_penalty: float = 0.0  # pooled: subtracted from a run's score per sentence beyond the first
    max_picks: int = 10  # pooled: at most this many non-overlapping runs picked per query
    decay: float = 0.3  # lambda of the decay weights exp(-lambda |i - r|)
    factor: float | None = 0.6  # keep windows scoring >= factor * tau; None: no score filter
    merge: bool = True  # merge overlapping / nearby windows into one chunk (window extents only)
    gap: int = 0  # windows at most `gap` sentences apart merge (0 = touching; window extents only)
    snap: str = "none"  # grow chunks to whole paragraphs / sections when they fit the cap
    max_tokens: int = 512  # hard cap on a chunk's length in model tokens
    score: str = "window_max"  # chunk score: best kept seed similarity, or max/mean window score
    top_k: int | None = 10  # chunks returned per query (None: no limit)
    budget_tokens: int | None = None  # at most this many tokens returned per query
    score_margin: float | None = 0.1  # return only chunks scoring >= best - margin
    focus_gap: int | None = 6  # return only the best chunk and chunks <= this many sentences from it
    far_margin: float | None = 0.05  # focus: also keep chunks elsewhere scoring >= best - far_margin
    block_extents: str = "section"  # pooled: whole paragraphs / sections (complete in the row) are candidates too
    length_bonus: float = 0.02  # pooled: added to a candidate's score times ln(its sentences)
    # heading context (engine, stores with heading paths): w in boost = w * spread * (c - cref) (kernels.signals),
    # added to the rows' scores before pre-retrieval ranking and scoring; 0 = off. 12: the development suite's
    # fit on its first four sets, kept by the six-set leave-one-dataset-out (w 6: -2.4 pooled F1; RESULTS.md)
    context_weight: float = 12.0
    # heading residual (with the heading context on): a row's similarity minus beta * (q . h)(h . s), the part of
    # it that its heading path h already explains (kernels.context.heading_residual); 0 = off. 0.75: chosen by
    # leave-one-dataset-out on the development suite and its two-question composites (bench/RESULTS.md)
    heading_residual: float = 0.75
    # lexical term (engine, queries with their texts): alpha * BM25(row) / the most a row could score for the query,
    # without the query terms the row's heading path holds when the heading context is on (kernels.signals,
    # kernels.lexical); 0 = off. 0.8: the development suite's choice (bench/RESULTS.md, "One scoring model")
    lexical_weight: float = 0.8
    # budget fill (engine.fill, stores with passages): with budget_tokens set, the budget left after the chunks is
    # filled with the best passages (the store's sentence runs up to its passage_tokens, embedded whole), cut where
    # they overlap what is already returned. The development suite's choice at 400 tokens (bench/RESULTS.md,
    # "The budget fill")
    budget_fill: bool = True
    # budget fill: a unit whose section already holds a returned chunk or an earlier unit counts this much less
    # when the next unit is chosen (engine.passages.fill_budget; 0: by score alone): the budget reaches other
    # sections before it repeats one. The development suite's leave-one-dataset-out choice (bench/RESULTS.md,
    # "Diversity in the budget fill")
    fill_diversity: float = 0.02

    def __post_init__(self) -> None:
        problems = [f"{name} must be a finite number, got {getattr(self, name)}" for name in FLOAT_FIELDS
                    if getattr(self, name) is not None and not math.isfinite(getattr(self, name))]
        if problems:  # nan passes every comparison below: refuse it before they run
            raise ValueError("; ".join(problems))
        if not 0.0 <= self.percentile <= 100.0:
            problems.append(f"percentile must be in [0, 100], got {self.percentile}")
        if self.min_seeds < 0:
            problems.append(f"min_seeds must be >= 0, got {self.min_seeds}")
        if self.max_seeds is not None and self.max_seeds < 1:
            problems.append(f"max_seeds must be >= 1, got {self.max_seeds}")
        elif self.max_seeds is not None and self.min_seeds > self.max_seeds:
            problems.append(f"min_seeds ({self.min_seeds}) must be <= max_seeds ({self.max_seeds})")
        if self.radius < 0:
            problems.append(f"radius (m) must be >= 0, got {self.radius}")
        if self.decay < 0:
            problems.append(f"decay (lambda) must be >= 0, got {self.decay}")
        if self.margin is not None and self.margin < 0:
            problems.append(f"margin must be >= 0, got {self.margin}")
        if self.gap < 0:
            problems.append(f"gap must be >= 0, got {self.gap}")
        if self.snap not in SNAP_RULES:
            problems.append(f"snap must be one of {SNAP_RULES}, got {self.snap!r}")
        if self.extent not in EXTENT_RULES:
            problems.append(f"extent must be one of {EXTENT_RULES}, got {self.extent!r}")
        if not 1 <= self.max_extent <= MAX_EXTENT_LIMIT:
            problems.append(f"max_extent must be in [1, {MAX_EXTENT_LIMIT}], got {self.max_extent}")
        if self.extent_penalty < 0:
            problems.append(f"extent_penalty must be >= 0, got {self.extent_penalty}")
        if self.max_picks < 1:
            problems.append(f"max_picks must be >= 1, got {self.max_picks}")
        if self.score not in SCORE_RULES:
            problems.append(f"score must be one of {SCORE_RULES}, got {self.score!r}")
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.top_k is not None and self.top_k < 1:
            problems.append(f"top_k must be >= 1, got {self.top_k}")
        if self.budget_tokens is not None and self.budget_tokens < 1:
            problems.append(f"budget_tokens must be >= 1, got {self.budget_tokens}")
        if self.focus_gap is not None and self.focus_gap < 0:
            problems.append(f"focus_gap must be >= 0, got {self.focus_gap}")
        if self.far_margin is not None and self.far_margin < 0:
            problems.append(f"far_margin must be >= 0, got {self.far_margin}")
        if self.block_extents not in BLOCK_RULES:
            problems.append(f"block_extents must be one of {BLOCK_RULES}, got {self.block_extents!r}")
        if not -1.0 <= self.length_bonus <= 1.0:
            problems.append(f"length_bonus must be in [-1, 1], got {self.length_bonus}")
        if not 0.0 <= self.context_weight < float("inf"):
            problems.append(f"context_weight must be >= 0 and finite, got {self.context_weight}")
        if not 0.0 <= self.heading_residual <= 2.0:
            problems.append(f"heading_residual must be in [0, 2], got {self.heading_residual}")
        if not 0.0 <= self.lexical_weight <= 10.0:
            problems.append(f"lexical_weight must be in [0, 10], got {self.lexical_weight}")
        if not 0 <= self.fill_diversity <= 10:
            problems.append(f"fill_diversity must be in [0, 10], got {self.fill_diversity}")
        if self.score_margin is not None and self.score_margin < 0:
            problems.append(f"score_margin must be >= 0, got {self.score_margin}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def block_kinds(self) -> tuple[str, ...]:
        """The block kinds whose whole blocks are candidate extents: () unless pooled with block_extents set."""
        if self.extent != "pooled" or self.block_extents == "none":
            return ()
        return ("paragraph", "section") if self.block_extents == "both" else (self.block_extents,)

    @property
    def scoring(self) -> ScoringModel:
        """The scoring model's weights (kernels.signals): heading w, residual beta, lexical alpha."""
        return ScoringModel(self.context_weight, self.heading_residual, self.lexical_weight)

    def replace(self, **changes: object) -> QascParams:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown QASC parameter(s): {sorted(unknown)}")
        return QascParams(**{**asdict(self), **changes})

    def to_dict(self) -> dict:
        return asdict(self)
