"""CLI flags for every QASC and retrieval parameter, mapped one to one onto the frozen dataclasses."""

from __future__ import annotations

import argparse
from dataclasses import fields

from engine.config import RetrievalConfig, budget_setting, describe_budget_profile
from engine.errors import QascError
from kernels.params import BLOCK_RULES, EXTENT_RULES, SCORE_RULES, SNAP_RULES, QascParams

QASC_HELP = {
    "percentile": "seed threshold tau = this percentile (0..100) of the query's candidate similarities",
    "min_seeds": "the N most similar sentences are always seeds",
    "max_seeds": "at most N seeds per query",
    "radius": "window: m sentences each side of a seed (fixed), or the most an adaptive window grows",
    "adaptive": "grow windows only while the neighbour's similarity stays above the threshold/margin",
    "threshold": "adaptive window: absolute floor on a neighbour's similarity",
    "margin": "adaptive window: neighbour must score >= seed similarity - margin",
    "clip_to_paragraph": "windows never leave the seed's paragraph",
    "extent": f"how a chunk's extent is chosen: {', '.join(EXTENT_RULES)} (pooled: the best runs of up to "
              "--max-extent sentences by the cosine of their summed embeddings; windows/decay/factor unused)",
    "max_extent": "pooled extents: longest run of sentences scored as one candidate",
    "extent_penalty": "pooled extents: score penalty per sentence beyond the first",
    "max_picks": "pooled extents: at most this many non-overlapping runs picked per query",
    "decay": "lambda of the window weights exp(-lambda*|i-r|)",
    "factor": "keep windows scoring >= factor * tau ('none' disables the filter)",
    "merge": "merge overlapping / nearby windows into one chunk",
    "gap": "windows at most this many sentences apart merge (0 = touching)",
    "snap": f"grow chunks to whole blocks when they fit the cap: {', '.join(SNAP_RULES)}",
    "max_tokens": "hard cap on a chunk's length in model tokens",
    "score": f"chunk score: {', '.join(SCORE_RULES)}",
    "top_k": "chunks returned per query ('none': no limit)",
    "budget_tokens": "at most this many tokens returned per query ('none': no budget)",
    "score_margin": "return only chunks scoring >= best - margin ('none': off)",
    "focus_gap": "return only the best chunk and the chunks in its region at most N sentences away ('none': off)",
    "far_margin": "with --focus-gap: also keep chunks elsewhere (other regions/documents) scoring >= best - "
                  "margin ('none': only the best chunk's neighbours)",
    "block_extents": f"pooled extents: whole blocks that are candidates too: {', '.join(BLOCK_RULES)} (a block "
                     "counts when the candidate region holds all of it and it fits --max-tokens)",
    "length_bonus": "pooled extents: added to a candidate's score times ln(its sentences) (-1..1; > 0 favours "
                    "longer extents)",
    "context_weight": "query-gated heading context: w in boost = w * spread * (c - cref), c = cosine of the query "
                      "and a row's heading path; reranks the pre-retrieval hits and adds to the similarities (0: "
                      "off; stores without heading paths: no effect)",
    "heading_residual": "with the heading context: beta in sim = q.s - beta (q.h)(h.s), the part of a row's similarity "
                        "that its heading path h already explains taken out (0..2; 0: off)",
    "lexical_weight": "lexical term: alpha in sim += alpha * BM25(row) / the most a row could score for the query "
                      "(0..10; 0: off; needs the questions' texts)",
    "budget_fill": "with --budget-tokens: the budget left after the chunks is filled with the store's best passages "
                   "(sentence runs embedded whole at ingest, --passage-tokens), cut where they overlap; "
                   "--no-budget-fill: the chunks alone (stores without passages: no effect)",
    "fill_diversity": "budget fill: a passage or sentence from a section that already holds a returned chunk or "
                      "an earlier fill unit counts this much less when the next unit is chosen (0..10; 0: by score "
                      "alone)",
}
UNSET = argparse.SUPPRESS  # flag not given: keep the store's value (None from a flag means 'none')
RETRIEVAL_HELP = {
    "depth": "FAISS pre-retrieval depth: sentence hits per query",
    "neighbourhood": "candidate region = each hit +- this many sentences of its document",
}


def _optional(kind):
    def parse(text: str):
        if text.lower() in ("none", "off", "null"):
            return None
        return kind(text)

    parse.__name__ = kind.__name__
    return parse


def _flag_type(name: str, default):
    if isinstance(default, bool):
        return None
    if name in ("max_seeds", "top_k", "budget_tokens", "focus_gap"):
        return _optional(int)
    if name in ("threshold", "margin", "factor", "score_margin", "far_margin"):
        return _optional(float)
    return type(default)


def add_qasc_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds --percentile, --radius (alias -m), ... and --depth / --neighbourhood; defaults come from the store."""
    group = parser.add_argument_group("QASC parameters (default: the store's frozen setting)")
    for f in fields(QascParams):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if isinstance(default, bool):
            group.add_argument(flag, dest=f.name, default=UNSET, action=argparse.BooleanOptionalAction,
                               help=QASC_HELP[f.name])
        else:
            choices = {"snap": SNAP_RULES, "score": SCORE_RULES, "extent": EXTENT_RULES,
                       "block_extents": BLOCK_RULES}.get(f.name)
            extra = {"choices": choices} if choices else {}
            names = [flag, "-m"] if f.name == "radius" else [flag]
            group.add_argument(*names, dest=f.name, default=UNSET, type=_flag_type(f.name, default),
                               help=f"{QASC_HELP[f.name]} (default {default})", **extra)
    group.add_argument("--budget-profile", dest="budget_profile", default=True, action=argparse.BooleanOptionalAction,
                       help="with --budget-tokens and the chunking knobs at their shipped values (none of them given, "
                            "the store frozen with them): answer with the development suite's setting for recall at "
                            f"a budget ({describe_budget_profile()}); --no-budget-profile: the store's setting as it "
                            "is (default on)")
    group = parser.add_argument_group("pre-retrieval")
    for f in fields(RetrievalConfig):
        group.add_argument("--" + f.name, dest=f.name, type=int, default=UNSET,
                           help=f"{RETRIEVAL_HELP[f.name]} (default {f.default})")


def params_from_args(args: argparse.Namespace, base: QascParams, base_retrieval: RetrievalConfig):
    """args -> (QascParams, RetrievalConfig): flags given on the command line override the base."""
    try:
        changes = {f.name: getattr(args, f.name) for f in fields(QascParams)
                   if getattr(args, f.name, UNSET) is not UNSET}
        params = base.replace(**changes)
        r_changes = {f.name: getattr(args, f.name) for f in fields(RetrievalConfig)
                     if getattr(args, f.name, UNSET) is not UNSET}
        retrieval = RetrievalConfig(**{**base_retrieval.__dict__, **r_changes})
    except (ValueError, TypeError) as exc:
        raise QascError(str(exc)) from exc
    return params, retrieval


def setting_from_args(args: argparse.Namespace, base: QascParams,
                      base_retrieval: RetrievalConfig) -> tuple[QascParams, RetrievalConfig, bool]:
    """args -> (QascParams, RetrievalConfig, whether the budget profile applied): `params_from_args`, then the
    budget profile (engine.config.budget_setting) unless --no-budget-profile or one of its knobs was given."""
    params, retrieval = params_from_args(args, base, base_retrieval)
    if not getattr(args, "budget_profile", True):
        return params, retrieval, False
    given = {f.name for f in (*fields(QascParams), *fields(RetrievalConfig))
             if getattr(args, f.name, UNSET) is not UNSET}
    return budget_setting(params, retrieval, frozenset(given))
