"""QASC parameters: four small frozen groups (seeding, extents, selection, budget) and the scoring model
(kernels.signals.ScoringModel), combined in one frozen, validated QascParams shared by the kernels and the engine.

18 fields in all (with engine.config.RetrievalConfig's depth and neighbourhood: 20). Each group validates its own
fields; QascParams reads and replaces them by their flat names (`params.percentile`, `params.replace(top_k=3)`), the
names a store's manifest and the CLI flags use (`to_dict` / `from_flat`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from qasc.kernels.signals import ScoringModel

BLOCK_RULES = ("none", "paragraph", "section", "both")
MAX_EXTENT_LIMIT = 64  # pooled runs are scored for every length up to max_extent: (Q, L, max_extent) per batch
# at most this many non-overlapping extents picked per query, best first (a constant: 10 and 32 gave the `answers`
# preset the same F1 on the six sets, and the `context` preset needs more than 10; bench/RESULTS.md, "Fewer,
# grouped knobs")
MAX_PICKS = 32


def _finite(group: object) -> list[str]:
    """nan / inf in a float field: refused before the range checks (nan passes every comparison)."""
    return [f"{f.name} must be a finite number, got {getattr(group, f.name)}" for f in fields(group)
            if isinstance(getattr(group, f.name), float) and not math.isfinite(getattr(group, f.name))]


def _raise(problems: list[str]) -> None:
    if problems:
        raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class Seeding:
    """Which candidate sentences seed extents."""

    percentile: float = 90.0  # seeds: sims >= the p-th percentile tau of the row (0..100)
    min_seeds: int = 1  # the most similar sentences that are always seeds

    def __post_init__(self) -> None:
        problems = _finite(self)
        _raise(problems)
        if not 0.0 <= self.percentile <= 100.0:
            problems.append(f"percentile must be in [0, 100], got {self.percentile}")
        if self.min_seeds < 0:
            problems.append(f"min_seeds must be >= 0, got {self.min_seeds}")
        _raise(problems)


@dataclass(frozen=True)
class Extents:
    """Which spans around the seeds compete: pooled runs, whole blocks, the token cap."""

    max_extent: int = 2  # longest run of sentences scored as one candidate extent
    clip_to_paragraph: bool = True  # runs (and the merging of touching picks) stay in one paragraph
    block_extents: str = "section"  # whole paragraphs / sections (complete in the row) are candidates too
    length_bonus: float = 0.02  # added to a candidate's score times ln(its sentences)
    max_tokens: int = 512  # hard cap on a chunk's length in model tokens

    def __post_init__(self) -> None:
        problems = _finite(self)
        _raise(problems)
        if not 1 <= self.max_extent <= MAX_EXTENT_LIMIT:
            problems.append(f"max_extent must be in [1, {MAX_EXTENT_LIMIT}], got {self.max_extent}")
        if self.block_extents not in BLOCK_RULES:
            problems.append(f"block_extents must be one of {BLOCK_RULES}, got {self.block_extents!r}")
        if not -1.0 <= self.length_bonus <= 1.0:
            problems.append(f"length_bonus must be in [-1, 1], got {self.length_bonus}")
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        _raise(problems)

    @property
    def block_kinds(self) -> tuple[str, ...]:
        """The block kinds whose whole blocks are candidate extents."""
        if self.block_extents == "none":
            return ()
        return ("paragraph", "section") if self.block_extents == "both" else (self.block_extents,)


@dataclass(frozen=True)
class Selection:
    """Which chunks a query returns."""

    # picks that touch in one paragraph (one region unclipped) merge into one chunk scored by its best, and picks
    # are not held to score_margin (a pick below it returns only inside a chunk whose best is within it): the
    # `context` preset's single sentences around many seeds (the paper's windows of radius 0). False: every pick
    # its own chunk, picked only within score_margin of the best
    merge_picks: bool = False
    top_k: int | None = 10  # chunks returned per query (None: no limit)
    score_margin: float | None = 0.1  # pick and return only extents / chunks scoring >= best - margin
    focus_gap: int | None = 6  # return only the best chunk and chunks <= this many sentences from it
    far_margin: float | None = 0.05  # focus: also keep chunks elsewhere scoring >= best - far_margin

    def __post_init__(self) -> None:
        problems = _finite(self)
        _raise(problems)
        if self.top_k is not None and self.top_k < 1:
            problems.append(f"top_k must be >= 1, got {self.top_k}")
        if self.score_margin is not None and self.score_margin < 0:
            problems.append(f"score_margin must be >= 0, got {self.score_margin}")
        if self.focus_gap is not None and self.focus_gap < 0:
            problems.append(f"focus_gap must be >= 0, got {self.focus_gap}")
        if self.far_margin is not None and self.far_margin < 0:
            problems.append(f"far_margin must be >= 0, got {self.far_margin}")
        _raise(problems)


@dataclass(frozen=True)
class Budget:
    """How many tokens a query returns, and what fills what the chunks leave."""

    budget_tokens: int | None = None  # at most this many tokens returned per query
    # budget fill (engine.fill, stores with passages): with budget_tokens set, the budget left after the chunks is
    # filled with the best passages (the store's sentence runs up to its passage_tokens, embedded whole), cut where
    # they overlap what is already returned (bench/RESULTS.md, "The budget fill")
    budget_fill: bool = True
    # a unit whose section already holds a returned chunk or an earlier unit counts this much less when the next
    # unit is chosen (engine.passages.fill_budget; 0: by score alone; bench/RESULTS.md, "Diversity in the budget
    # fill")
    fill_diversity: float = 0.02

    def __post_init__(self) -> None:
        problems = _finite(self)
        _raise(problems)
        if self.budget_tokens is not None and self.budget_tokens < 1:
            problems.append(f"budget_tokens must be >= 1, got {self.budget_tokens}")
        if not 0 <= self.fill_diversity <= 10:
            problems.append(f"fill_diversity must be in [0, 10], got {self.fill_diversity}")
        _raise(problems)


GROUPS = {"seeding": Seeding, "extents": Extents, "selection": Selection, "budget": Budget}
# the scoring model's weights under their flat names: heading context w, heading residual beta, lexical alpha
SIGNAL_NAMES = {"context_weight": "heading", "heading_residual": "residual", "lexical_weight": "lexical"}
# flat name -> (group, its field there), in the order of the flags and the manifest
FLAT: dict[str, tuple[str, str]] = {
    **{f.name: (g, f.name) for g, kind in list(GROUPS.items())[:3] for f in fields(kind)},
    **{name: ("signals", attr) for name, attr in SIGNAL_NAMES.items()},
    **{f.name: ("budget", f.name) for f in fields(Budget)},
}
FIELD_NAMES = tuple(FLAT)
# fields of earlier versions, gone: the window extents (the paper's windows and their merging, the `context`
# preset's form before pooled runs merged where they touch) and the knobs no preset or grid used
REMOVED_FIELDS = frozenset({"radius", "adaptive", "threshold", "margin", "decay", "factor", "merge", "gap", "score",
                            "extent", "max_seeds", "extent_penalty", "snap", "max_picks"})


@dataclass(frozen=True, init=False)
class QascParams:
    """Every knob of query-time chunking, in groups; built from groups or from flat names
    (`QascParams(percentile=95.0)`, `QascParams(seeding=Seeding(95.0))`).

    Defaults (the `answers` preset): runs of up to 2 sentences holding a p90 seed, clipped to the paragraph, and
    whole sections complete in the candidate region (a title's text excepted), with a length bonus
    0.02 ln(sentences), each picked extent its own chunk; the best chunk, its neighbours within 6 sentences and
    chunks elsewhere within 0.05 of it, every chunk within 0.1 of the best, at most 10 (with RetrievalConfig depth
    8, neighbourhood 2); rows scored by the one scoring model
    (kernels.signals: heading boost w 12, heading residual 0.75, lexical term 0.8). Leave-one-dataset-out over the
    six development sets: bench/RESULTS.md, "One scoring model" and "Fewer, grouped knobs".
    """

    seeding: Seeding
    extents: Extents
    selection: Selection
    signals: ScoringModel
    budget: Budget

    def __init__(self, seeding: Seeding | None = None, extents: Extents | None = None,
                 selection: Selection | None = None, signals: ScoringModel | None = None,
                 budget: Budget | None = None, **flat: object) -> None:
        groups = {"seeding": seeding or Seeding(), "extents": extents or Extents(),
                  "selection": selection or Selection(), "signals": signals or ScoringModel(),
                  "budget": budget or Budget()}
        unknown = sorted(set(flat) - set(FLAT))
        if unknown:
            raise TypeError(f"unknown QASC parameter(s): {unknown}")
        changes: dict[str, dict[str, object]] = {}
        for name, value in flat.items():
            group, attr = FLAT[name]
            changes.setdefault(group, {})[attr] = value
        problems = []
        for group, values in changes.items():
            try:
                groups[group] = replace(groups[group], **values)
            except ValueError as exc:
                problems.append(str(exc))
        _raise(problems)
        for group, value in groups.items():
            object.__setattr__(self, group, value)

    def __getattr__(self, name: str) -> object:
        if name in FLAT:  # a flat name: its group's field
            group, attr = FLAT[name]
            return getattr(object.__getattribute__(self, group), attr)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def block_kinds(self) -> tuple[str, ...]:
        """The block kinds whose whole blocks are candidate extents: () with block_extents none."""
        return self.extents.block_kinds

    @property
    def scoring(self) -> ScoringModel:
        """The scoring model's weights (kernels.signals): heading w, residual beta, lexical alpha."""
        return self.signals

    def replace(self, **changes: object) -> QascParams:
        """A copy with these fields (flat names) changed; ValueError for a name that is none."""
        unknown = set(changes) - set(FLAT)
        if unknown:
            raise ValueError(f"unknown QASC parameter(s): {sorted(unknown)}")
        return QascParams(**{g: getattr(self, g) for g in (*GROUPS, "signals")}, **changes)

    def to_dict(self) -> dict:
        """The flat fields -> values (the manifest's `qasc` section, the CLI's names)."""
        return {name: getattr(self, name) for name in FLAT}

    def groups(self) -> dict[str, dict]:
        """Group name -> its fields and values."""
        return {g: asdict(getattr(self, g)) for g in (*GROUPS, "signals")}
