"""QASC inside the harness: the declared grid of settings, selectors, ablations, and the engine adapter.

A setting is (QascParams, RetrievalConfig) with the selection knobs neutral (top_k, budget_tokens and
score_margin unset): the engine returns every chunk it assembles, ranked, and the harness applies the
selectors (top-k, score margin) and the token budgets itself, with the same rule as for the baselines.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from qasc.engine.config import RetrievalConfig
from qasc.engine.passages import fill_budget
from qasc.jobs.eval.retrieval import Hit, TokenCutter, within_budget
from qasc.kernels.params import QascParams

NEUTRAL = {"top_k": None, "budget_tokens": None, "score_margin": None}
# The grid's own starting point, spelled out so that it does not move when the engine's defaults (the
# setting this grid chose) change: plain sentences, no adaptive growth, seed-similarity ranking.
GRID_BASE = {"percentile": 95.0, "radius": 0, "adaptive": False, "margin": None, "clip_to_paragraph": False,
             "score": "seed_sim", "extent": "window", "max_extent": 3, "extent_penalty": 0.0, "max_picks": 10,
             "focus_gap": None, "far_margin": None, "block_extents": "none", "length_bonus": 0.0,
             "lexical_weight": 0.0}
DEFAULTS = QascParams(**{**GRID_BASE, **NEUTRAL})
DEFAULT_RETRIEVAL = RetrievalConfig()
SHORT = {"percentile": "p", "radius": "m", "decay": "lam", "factor": "f", "gap": "gap", "snap": "snap",
         "score": "score", "margin": "margin", "threshold": "thr", "max_tokens": "cap", "min_seeds": "min",
         "max_seeds": "max", "clip_to_paragraph": "clip", "adaptive": "adaptive", "merge": "merge",
         "extent": "extent", "max_extent": "runs", "extent_penalty": "pen", "max_picks": "picks",
         "focus_gap": "focus", "far_margin": "far", "block_extents": "blocks", "length_bonus": "lam",
         "context_weight": "ctx", "heading_residual": "hres", "lexical_weight": "lex", "budget_fill": "fill",
         "fill_diversity": "filldiv"}


@dataclass(frozen=True)
class Setting:
    """One QASC configuration without its selection rule."""

    params: QascParams
    retrieval: RetrievalConfig

    def key(self) -> str:
        """Compact, stable name: the fields that differ from the defaults, e.g. `p90 m2 clip=T depth16 nb2`."""
        parts = []
        for name, short in SHORT.items():
            value = getattr(self.params, name)
            if name in ("percentile", "radius") or value != getattr(DEFAULTS, name):
                if isinstance(value, bool):
                    parts.append(f"{short}={'T' if value else 'F'}")
                elif name in ("percentile", "radius"):
                    parts.append(f"{short}{value:g}")
                else:
                    parts.append(f"{short}={value}")
        return " ".join(parts) + f" depth{self.retrieval.depth} nb{self.retrieval.neighbourhood}"

    def describe(self) -> dict:
        return {"params": self.params.to_dict(), "retrieval": {"depth": self.retrieval.depth,
                                                               "neighbourhood": self.retrieval.neighbourhood}}

    def replace(self, retrieval: dict | None = None, **params: object) -> Setting:
        r = self.retrieval
        if retrieval:
            r = RetrievalConfig(**{"depth": r.depth, "neighbourhood": r.neighbourhood, **retrieval})
        return Setting(self.params.replace(**params), r)


def setting(retrieval: dict | None = None, **params: object) -> Setting:
    return Setting(QascParams(**{**GRID_BASE, **NEUTRAL, **params}), RetrievalConfig(**(retrieval or {})))


# The declared grid: every combination of these axes (windows as whole bundles, so that e.g. a margin is
# never tried without adaptive growth). Chosen per fold by leave-one-corpus-out cross-validation.
WINDOWS = (
    {"radius": 0},
    {"radius": 3, "adaptive": True, "margin": 0.10, "clip_to_paragraph": True},
    # query-adaptive extents: the best runs of up to 2 / 3 sentences by pooled-embedding cosine, and whole
    # sections (complete in the candidate region, within the token cap) as candidates too, with a length bonus
    # 0.02 ln(sentences). Section blocks are a fixed part of the method, not a grid choice: a section competes
    # only where the headings are fine-grained enough for it to fit the cap (medquad: the evidence is a whole
    # section), and never where one heading spans a whole document (policyqa) or there are none (chroma). As a
    # choice, the medquad fold (trained on three sets that show no difference) dropped them: held-out medquad
    # F1 35.5 -> 65.0 with them fixed, the other three folds unchanged. Paragraph blocks ("both") are left out:
    # the heading boost inflates long extents, and held out they cost tatqa -1.0 and policyqa -0.9 F1.
    {"extent": "pooled", "max_extent": 2, "clip_to_paragraph": True, "block_extents": "section",
     "length_bonus": 0.02},
    {"extent": "pooled", "max_extent": 3, "clip_to_paragraph": True, "block_extents": "section",
     "length_bonus": 0.02},
    {"extent": "pooled", "max_extent": 3, "clip_to_paragraph": False, "block_extents": "section",
     "length_bonus": 0.02},
)
# Seeding bundles: the percentile rule alone (few seeds: precise top-k), or at least 16 seeds (the most
# similar candidates), which lets a query return enough chunks to fill the larger token budgets.
SEEDING = (
    {"percentile": 75.0, "min_seeds": 1},  # pooled extents only: every run holding a top-quarter sentence
    {"percentile": 90.0, "min_seeds": 1},
    {"percentile": 95.0, "min_seeds": 16},
)
# The focus rule (pooled extents only): keep the best chunk's neighbours within focus_gap sentences, and
# (far_margin) chunks elsewhere, in other regions or documents, scoring within far_margin of the best.
FOCUS = ((None, None), (4, None), (6, None), (6, 0.02), (6, 0.05))
# The lexical term (kernels.signals): off, or alpha x BM25 / the query's best possible (without the query terms the
# row's heading path holds), for every query. The gate it had (on only where the heading spread < t) is gone: the
# six-set leave-one-dataset-out measured the heading-term rule in its place (bench/RESULTS.md, "One scoring model").
LEXICAL = ({"lexical_weight": 0.0}, {"lexical_weight": 0.4}, {"lexical_weight": 0.8})
GRID_AXES: dict[str, Sequence] = {
    "seeding": SEEDING,
    "window": WINDOWS,
    "gap": (0,),
    "focus": FOCUS,
    "score": ("seed_sim",),
    "retrieval": ({"depth": 8, "neighbourhood": 2}, {"depth": 16, "neighbourhood": 4},
                  {"depth": 16, "neighbourhood": 8}),
    "lexical": LEXICAL,
}
QUICK_AXES: dict[str, Sequence] = {
    "seeding": (SEEDING[0], SEEDING[1]),
    "window": (WINDOWS[0], WINDOWS[1], WINDOWS[2], WINDOWS[3]),
    "gap": (0,),
    "focus": (FOCUS[0], FOCUS[1], FOCUS[3]),
    "score": ("seed_sim",),
    "retrieval": ({"depth": 8, "neighbourhood": 2},),
    "lexical": (LEXICAL[0], LEXICAL[2]),
}


def qasc_grid(quick: bool = False) -> list[Setting]:
    """The declared grid as a list of Settings (duplicates removed, declared order kept)."""
    axes = QUICK_AXES if quick else GRID_AXES
    out: dict[str, Setting] = {}
    for seeding, window, gap, (focus, far), score, retrieval, lexical in itertools.product(*axes.values()):
        params = {**seeding, "gap": gap, "focus_gap": focus, "far_margin": far, "score": score, **window, **lexical}
        pooled = params.get("extent") == "pooled"
        if focus is not None and not pooled:
            continue  # the focus rule is declared for pooled extents (it is a selection rule for both)
        if score != "seed_sim" and (params.get("radius", 0) == 0 or pooled):
            continue  # with m = 0 (or pooled runs, scored by their own cosine) `score` changes nothing
        if pooled and gap:
            continue  # pooled picks are chunks of their own: gap filling does not apply
        if params["percentile"] < 90 and not pooled:
            continue  # low percentiles only make sense as a candidate filter for pooled runs
        s = setting(retrieval, **params)
        out.setdefault(s.key(), s)
    return list(out.values())


# Selection rules applied to the ranked chunks of a setting: top-k, or a score margin below the best
# (capped at 10 chunks). Each is a candidate for cross-validation alongside the setting.
MARGINS = (0.02, 0.05, 0.10, 0.15)


def selectors(ks: Sequence[int]) -> list[str]:
    return [f"k={k}" for k in ks] + [f"margin={m:g}" for m in MARGINS]


def select(hits: Sequence[Hit], selector: str, cap: int = 10) -> list[Hit]:
    kind, value = selector.split("=")
    if kind == "k":
        return list(hits[: int(value)])
    if kind == "margin":
        return within_margin(hits, float(value), cap)
    raise ValueError(f"unknown selector {selector!r}")


# Ablations: each maps the setting chosen on a fold to a variant (or None: not applicable).
Ablation = tuple[str, Callable[[Setting], Setting | None]]


def _widest(s: Setting) -> int:
    return max(s.params.radius, 2)


def _pooled(s: Setting) -> bool:
    return s.params.extent == "pooled"


ABLATIONS: list[Ablation] = [
    ("sentences only (m=0, no pooled runs)", lambda s: s.replace(extent="window", radius=0, adaptive=False,
                                                                 margin=None)),
    ("fixed window (m=max(m,2), no adaptive growth)", lambda s: s.replace(extent="window", radius=_widest(s),
                                                                         adaptive=False, margin=None)),
    ("adaptive window (margin 0.05, up to m=max(m,2))", lambda s: s.replace(extent="window", radius=_widest(s),
                                                                            adaptive=True, margin=0.05)),
    ("pooled runs of up to 3 sentences", lambda s: s.replace(extent="pooled", max_extent=3)),
    ("pooled runs of 1 sentence (max_extent=1)", lambda s: s.replace(max_extent=1) if _pooled(s) else None),
    ("pooled runs without the seed filter (p=0)", lambda s: s.replace(percentile=0.0) if _pooled(s) else None),
    ("no focus on the best chunk (focus_gap=None)", lambda s: s.replace(focus_gap=None, far_margin=None)),
    ("focus without far chunks (far_margin=None)", lambda s: s.replace(far_margin=None) if _pooled(s) else None),
    ("far chunks within 0.02 of the best (far_margin=0.02)",
     lambda s: s.replace(focus_gap=s.params.focus_gap or 6, far_margin=0.02) if _pooled(s) else None),
    ("no whole-block extents (block_extents=none, no length bonus)",
     lambda s: s.replace(block_extents="none", length_bonus=0.0) if _pooled(s) else None),
    ("whole paragraphs and sections (block_extents=both, bonus 0.02)",
     lambda s: s.replace(block_extents="both", length_bonus=0.02) if _pooled(s) else None),
    ("focus on the best chunk (focus_gap=4)", lambda s: s.replace(focus_gap=4)),
    ("no heading context (context_weight=0)", lambda s: s.replace(context_weight=0.0)),
    ("no heading residual (heading_residual=0)", lambda s: s.replace(heading_residual=0.0)),
    ("no lexical term (lexical_weight=0)", lambda s: s.replace(lexical_weight=0.0)),
    ("lexical term alpha 0.4", lambda s: s.replace(lexical_weight=0.4)),
    # window-mode steps: not applicable (None) when pooled extents were chosen
    ("no decay (lambda=0)", lambda s: None if _pooled(s) else s.replace(decay=0.0)),
    ("no score filter (factor=None)", lambda s: None if _pooled(s) else s.replace(factor=None)),
    ("no merging (merge=False)", lambda s: None if _pooled(s) else s.replace(merge=False)),
    ("no snapping (snap=none)", lambda s: s.replace(snap="none")),
    ("snap to paragraph", lambda s: s.replace(snap="paragraph")),
    ("no paragraph clipping", lambda s: s.replace(clip_to_paragraph=False)),
    ("clip windows to paragraph", lambda s: s.replace(clip_to_paragraph=True)),
    ("paper setting (p=75, m=3, wide regions)", lambda s: s.replace(
        retrieval={"depth": 8, "neighbourhood": 25}, percentile=75.0, radius=3, adaptive=False, margin=None,
        clip_to_paragraph=False, decay=0.3, factor=0.6, gap=0, snap="none", score="window_max", extent="window",
        focus_gap=None)),
]


def chunks_to_hits(results) -> list[list[Hit]]:
    """Engine output (per query, ranked engine.types.Chunk) -> per query, ranked Hits."""
    return [[(c.doc_id, int(c.char_start), int(c.char_end), int(c.n_tokens), float(c.score),
              int(c.sentence_end) - int(c.sentence_start) + 1) for c in row] for row in results]


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the small (Q, L) kernels single-threaded: on a busy 2-core machine intra-op threads made one
    setting 2-4x slower (measured 1.1 s vs 2.3-5.0 s for 472 queries)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def run_setting(engine, query_emb, s: Setting, texts: Sequence[str] | None = None,
                fill_units: list | None = None) -> list[list[Hit]]:
    """One engine pass over every query (top_k/budget/margin unset): ranked chunks per query. texts: the
    questions, for the lexical term (params.lexical_weight > 0; left out without them). fill_units: a list that
    gets each query's budget-fill units (engines with passages)."""
    extra = {"fill_units": fill_units} if fill_units is not None and hasattr(engine, "passage_tier") else {}
    with torch_threads(1):
        return chunks_to_hits(engine.query_embedded(query_emb, s.params, s.retrieval, questions=texts, **extra))


# The chunks a budget view keeps before the fill: those `qasc query --budget-tokens N` keeps, at most the shipped
# default's top_k within its score gap of the best (QascParams.top_k, score_margin), not the setting's whole ranking.
BUDGET_MARGIN = QascParams().score_margin
BUDGET_TOP_K = QascParams().top_k


def within_margin(hits: Sequence[Hit], margin: float | None, top_k: int | None = None) -> list[Hit]:
    """Ranked hits (best first) -> the prefix of at most top_k (None: any number) scoring >= the best - margin
    (None: every score), as the engine's selection (kernels.selection.select_chunks) keeps them."""
    out: list[Hit] = []
    for h in hits:
        if (top_k is not None and len(out) >= top_k) or (margin is not None and h[4] < hits[0][4] - margin):
            break
        out.append(h)
    return out


class BudgetFill:
    """The engine's budget rule (`--budget-tokens`) at the harness's token budgets, from one unbudgeted engine
    pass: of a setting's ranked chunks the first `top_k` within `margin` of the best (BUDGET_TOP_K and
    BUDGET_MARGIN: the shipped default's; None: no limit), cut to the budget as every method's are
    (`within_budget`: the first that would overflow is cut at the budget when a cutter is given, dropped without
    one, as the engine's kernels.select_chunks does), then the engine's own fill units for that setting and query
    (`Engine.query_embedded(fill_units=...)`) through `engine.passages.fill_budget` with the setting's
    fill_diversity. Without units (no passages, or params.budget_fill off): the cut chunks alone. Without a
    cutter this is the engine's `--budget-tokens` answer at the same top_k and score margin (tested)."""

    def __init__(self, engine, margin: float | None = BUDGET_MARGIN, top_k: int | None = BUDGET_TOP_K) -> None:
        self.engine = engine
        self.margin = margin
        self.top_k = top_k
        store = getattr(engine, "store", None)
        self.offsets = np.asarray(getattr(store, "doc_offsets", [0]), np.int64)
        self.doc_index = {d: i for i, d in enumerate(getattr(store, "doc_ids", []))}

    def rows(self, hit: Hit) -> tuple[int, int]:
        """A sentence-aligned hit -> its global rows (first, last inclusive)."""
        d = self.doc_index[hit[0]]
        lo, hi = int(self.offsets[d]), int(self.offsets[d + 1])
        starts = self.engine.row_table.char_start[lo:hi]
        r0 = lo + int(np.searchsorted(starts, hit[1], side="right")) - 1
        r1 = lo + int(np.searchsorted(starts, hit[2] - 1, side="right")) - 1
        return max(r0, lo), max(r1, lo)

    def hits(self, ranked: Sequence[Sequence[Hit]], units: Sequence, budget: int, cutter: TokenCutter | None,
             diversity: float) -> list[list[Hit]]:
        base = [within_budget(within_margin(h, self.margin, self.top_k), budget, cutter) for h in ranked]
        if not units:
            return base
        table = self.engine.row_table
        out = []
        for q, hits in enumerate(base):
            u = units[q]
            pieces = fill_budget([self.rows(h) for h in hits], sum(h[3] for h in hits), budget, range(len(u.first)),
                                 u.score.tolist(), u.first, u.count, self.engine.row_tokens,
                                 self.engine.row_sections, diversity)
            out.append(list(hits) + [(table.doc_ids[int(table.doc[a])], int(table.char_start[a]),
                                      int(table.char_end[b]), tok, sc, b - a + 1) for a, b, tok, sc in pieces])
        return out


def sentence_histogram(hits_per_q: Sequence[Sequence[Hit]]) -> dict[str, int]:
    """Returned chunk lengths in sentences -> counts (keys '1'..'9', '10+')."""
    lengths = np.asarray([h[5] for row in hits_per_q for h in row if h[5] > 0], dtype=np.int64)
    out = {}
    for n in range(1, 10):
        out[str(n)] = int((lengths == n).sum())
    out["10+"] = int((lengths >= 10).sum())
    return out
