"""CLI flags for every QASC and retrieval parameter, mapped one to one onto the frozen dataclasses, and --preset
(engine.presets): the few flags most queries need in the main group, the other knobs in an advanced one."""

from __future__ import annotations

import argparse
from dataclasses import fields

from qasc.engine.config import RetrievalConfig
from qasc.engine.errors import QascError
from qasc.engine.presets import PRESETS, choose, knob_values
from qasc.kernels.params import BLOCK_RULES, FIELD_NAMES, REMOVED_FIELDS, QascParams

QASC_HELP = {
    "percentile": "seed threshold tau = this percentile (0..100) of the query's candidate similarities",
    "min_seeds": "the N most similar sentences are always seeds",
    "clip_to_paragraph": "runs of sentences, and the merging of picks that touch, stay in one paragraph",
    "max_extent": "longest run of sentences scored as one candidate (the cosine of their summed embeddings)",
    "max_tokens": "hard cap on a chunk's length in model tokens",
    "merge_picks": "picked extents that touch in one paragraph (one region without --clip-to-paragraph) merge into "
                   "one chunk scored by its best, and --score-margin applies to chunks, not picks (a pick below it "
                   "returns inside a chunk it touches); off: every pick its own chunk",
    "top_k": "chunks returned per query ('none': no limit)",
    "budget_tokens": "at most this many tokens returned per query ('none': no budget); without --preset, a budget on "
                     "the shipped knobs answers with the context preset",
    "score_margin": "return only chunks scoring >= best - margin ('none': off)",
    "focus_gap": "return only the best chunk and the chunks in its region at most N sentences away ('none': off)",
    "far_margin": "with --focus-gap: also keep chunks elsewhere (other regions/documents) scoring >= best - "
                  "margin ('none': only the best chunk's neighbours)",
    "block_extents": f"whole blocks that are candidates too: {', '.join(BLOCK_RULES)} (a block counts when the "
                     "candidate region holds all of it and it fits --max-tokens)",
    "length_bonus": "added to a candidate's score times ln(its sentences) (-1..1; > 0 favours longer extents)",
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


# flags of settings this version removed (kernels.params.REMOVED_FIELDS: the window extents and unused knobs)
REMOVED_FLAGS = frozenset({"--" + n.replace("_", "-") for n in REMOVED_FIELDS} | {"-m", "--no-adaptive", "--no-merge"})


class _Removed(argparse.Action):
    """A removed setting's flag: noted, and refused with one line by setting_from_args (removed_flag)."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.removed_flag = option_string


def removed_flag_error(flag: str) -> QascError:
    return QascError(f"{flag} was removed (the window extents and the knobs no preset used are gone; --preset "
                     "context answers with single sentences around many seeds, touching ones merged)")


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
    if name in ("top_k", "budget_tokens", "focus_gap"):
        return _optional(int)
    if name in ("score_margin", "far_margin"):
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
    (--percentile, ...) and --depth / --neighbourhood to `advanced` (a new group "advanced" when None, returned);
    unset flags keep the preset's or the store's value. The flags of removed settings (REMOVED_FLAGS) stay,
    hidden, and stop with one line saying so."""
    if advanced is None:
        advanced = parser.add_argument_group(ADVANCED_TITLE, ADVANCED_DESCRIPTION)
    parser.add_argument("--preset", choices=tuple(PRESETS), default=None, help=preset_help())
    # deprecated: --no-budget-profile = --preset answers; --budget-profile = the default (no preset named)
    parser.add_argument("--budget-profile", dest="budget_profile", default=None, action=argparse.BooleanOptionalAction,
                        help=argparse.SUPPRESS)
    shipped = QascParams()
    for name in MAIN_FIELDS + tuple(n for n in FIELD_NAMES if n not in MAIN_FIELDS):
        group = parser if name in MAIN_FIELDS else advanced
        flag, default = "--" + name.replace("_", "-"), getattr(shipped, name)
        text = f"{QASC_HELP[name]} {_default_text(name, default)}"
        if isinstance(default, bool):
            group.add_argument(flag, dest=name, default=UNSET, action=argparse.BooleanOptionalAction, help=text)
        else:
            extra = {"choices": BLOCK_RULES} if name == "block_extents" else {}
            group.add_argument(flag, dest=name, default=UNSET, type=_flag_type(name, default), help=text, **extra)
    for name in sorted(REMOVED_FLAGS):  # hidden: a flag of a removed setting says so in one line
        parser.add_argument(name, dest="removed_flag", action=_Removed, nargs="?", default=None,
                            help=argparse.SUPPRESS)
    for f in fields(RetrievalConfig):
        advanced.add_argument("--" + f.name, dest=f.name, type=int, default=UNSET,
                              help=f"{RETRIEVAL_HELP[f.name]} {_default_text(f.name, f.default)}")
    return advanced


def _given(args: argparse.Namespace, kind: type) -> dict:
    """The fields of `kind` set on the command line -> their values."""
    names = FIELD_NAMES if kind is QascParams else [f.name for f in fields(kind)]
    return {n: getattr(args, n) for n in names if getattr(args, n, UNSET) is not UNSET}


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
    if getattr(args, "removed_flag", None):
        raise removed_flag_error(args.removed_flag)
    preset = preset_from_args(args)
    params, retrieval = params_from_args(args, base, base_retrieval, preset)
    if preset is not None:
        return params, retrieval, preset
    given = frozenset(_given(args, QascParams)) | frozenset(_given(args, RetrievalConfig))
    return choose(params, retrieval, given)
