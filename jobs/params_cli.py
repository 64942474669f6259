"""CLI flags for every QASC and retrieval parameter, mapped one to one onto the frozen dataclasses, and --preset
(engine.presets): the few flags most queries need in the main group, the other knobs in an advanced one."""

from __future__ import annotations

import argparse
from dataclasses import fields

from qasc.engine.config import RetrievalConfig
from qasc.engine.errors import QascError
from qasc.engine.presets import PRESETS, choose, knob_values
from qasc.kernels.params import BLOCK_RULES, EXTENT_RULES, SCORE_RULES, SNAP_RULES, QascParams

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
    "budget_tokens": "at most this many tokens returned per query ('none': no budget); without --preset, a budget on "
                     "the shipped knobs answers with the context preset",
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
MAIN_FIELDS = ("budget_tokens", "top_k", "max_tokens")  # QascParams flags of the main group; the rest are advanced
ADVANCED_TITLE = "advanced"
ADVANCED_DESCRIPTION = ("the knobs a preset sets and every other QASC, pre-retrieval and index setting; unset: the "
                        "preset's value, else the store's frozen setting")
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


def _show(value: object) -> str:
    """A value as the flags write it: none, on / off, 90.0."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


def _default_text(name: str, default: object) -> str:
    """`(default 90; preset context: 95)`: the shipped default and each preset's other value of a field."""
    others = ""
    for preset in PRESETS.values():
        value = preset.budget_tokens if name == "budget_tokens" else {**preset.qasc, **preset.retrieval}.get(
            name, default)
        if value != default:
            others += f"; preset {preset.name}: {_show(value)}"
    return f"(default {_show(default)}{others})"


def preset_help() -> str:
    """The --preset help: each preset's line, the rule without it, the deprecated alias."""
    names = "; ".join(f"{p.name}: {p.purpose}, {p.description}" for p in PRESETS.values())
    return (f"named setting of the chunking and pre-retrieval knobs ({names}). Default: answers, or context when "
            "--budget-tokens is given and no knob of the advanced group a preset sets; a store frozen with other "
            "knobs answers with them. Flags given override the preset's values. --no-budget-profile is a "
            "deprecated alias of --preset answers")


def add_qasc_arguments(parser: argparse.ArgumentParser,
                       advanced: argparse._ArgumentGroup | None = None) -> argparse._ArgumentGroup:
    """Adds --preset, --budget-tokens, --top-k and --max-tokens to `parser`, and every other QascParams field
    (--percentile, --radius alias -m, ...) and --depth / --neighbourhood to `advanced` (a new group "advanced" when
    None, returned); unset flags keep the preset's or the store's value."""
    if advanced is None:
        advanced = parser.add_argument_group(ADVANCED_TITLE, ADVANCED_DESCRIPTION)
    parser.add_argument("--preset", choices=tuple(PRESETS), default=None, help=preset_help())
    # deprecated: --no-budget-profile = --preset answers; --budget-profile = the default (no preset named)
    parser.add_argument("--budget-profile", dest="budget_profile", default=None, action=argparse.BooleanOptionalAction,
                        help=argparse.SUPPRESS)
    main_fields = [f for name in MAIN_FIELDS for f in fields(QascParams) if f.name == name]
    for f in main_fields + [f for f in fields(QascParams) if f.name not in MAIN_FIELDS]:
        group = parser if f.name in MAIN_FIELDS else advanced
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            group.add_argument(flag, dest=f.name, default=UNSET, action=argparse.BooleanOptionalAction,
                               help=f"{QASC_HELP[f.name]} {_default_text(f.name, f.default)}")
        else:
            choices = {"snap": SNAP_RULES, "score": SCORE_RULES, "extent": EXTENT_RULES,
                       "block_extents": BLOCK_RULES}.get(f.name)
            extra = {"choices": choices} if choices else {}
            names = [flag, "-m"] if f.name == "radius" else [flag]
            group.add_argument(*names, dest=f.name, default=UNSET, type=_flag_type(f.name, f.default),
                               help=f"{QASC_HELP[f.name]} {_default_text(f.name, f.default)}", **extra)
    for f in fields(RetrievalConfig):
        advanced.add_argument("--" + f.name, dest=f.name, type=int, default=UNSET,
                              help=f"{RETRIEVAL_HELP[f.name]} {_default_text(f.name, f.default)}")
    return advanced


def _given(args: argparse.Namespace, kind: type) -> dict:
    """The fields of `kind` set on the command line -> their values."""
    return {f.name: getattr(args, f.name) for f in fields(kind) if getattr(args, f.name, UNSET) is not UNSET}


def params_from_args(args: argparse.Namespace, base: QascParams, base_retrieval: RetrievalConfig,
                     preset: str | None = None) -> tuple[QascParams, RetrievalConfig]:
    """args -> (QascParams, RetrievalConfig): the preset's knobs and budget (engine.presets), then the flags given
    on the command line, override the base."""
    changes, r_changes = {}, {}
    if preset is not None:
        changes, r_changes = knob_values(preset, base_retrieval)
        changes["budget_tokens"] = PRESETS[preset].budget_tokens
    try:
        params = base.replace(**{**changes, **_given(args, QascParams)})
        retrieval = RetrievalConfig(**{**base_retrieval.__dict__, **r_changes, **_given(args, RetrievalConfig)})
    except (ValueError, TypeError) as exc:
        raise QascError(str(exc)) from exc
    return params, retrieval


def preset_from_args(args: argparse.Namespace) -> str | None:
    """The preset named on the command line (--preset, or the deprecated --no-budget-profile: answers), or None."""
    preset = getattr(args, "preset", None)
    if getattr(args, "budget_profile", None) is False:
        if preset not in (None, "answers"):
            raise QascError(f"--no-budget-profile (deprecated: --preset answers) contradicts --preset {preset}")
        return "answers"
    return preset


def setting_from_args(args: argparse.Namespace, base: QascParams,
                      base_retrieval: RetrievalConfig) -> tuple[QascParams, RetrievalConfig, str | None]:
    """args -> (QascParams, RetrievalConfig, the preset that answers or None: the store's own setting). A preset
    named: its values over the base, the flags given over them. None named: the flags over the base, then
    engine.presets.choose (`context` when a budget is set on the shipped knobs and none of them was given)."""
    preset = preset_from_args(args)
    params, retrieval = params_from_args(args, base, base_retrieval, preset)
    if preset is not None:
        return params, retrieval, preset
    given = frozenset(_given(args, QascParams)) | frozenset(_given(args, RetrievalConfig))
    try:
        return choose(params, retrieval, given)
    except ValueError as exc:  # the store's other fields refuse the context knobs (e.g. max_seeds < 16)
        raise QascError(f"the context preset on this store's setting: {exc}") from exc
