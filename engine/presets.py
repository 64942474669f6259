"""Named presets: the settings of the chunking and pre-retrieval knobs a query answers with, by name.

The development suite chooses QASC's setting twice (bench/RESULTS.md): on F1, the chunks alone (`answers`: the
shipped QascParams() / RetrievalConfig() defaults), and on recall within a 400-token budget, the chunks that
`budget_tokens` keeps and then the budget fill (`context`: every leave-one-dataset-out fold and the four sets
together chose it, "The budget profile"; every candidate sentence holding one of the 16 most similar rows or a p95
seed, on its own, over a wider candidate region, the fill spending the rest of the budget; the F1 setting's few,
long chunks leave the fill less room and rank fewer distinct regions). A preset sets its knobs (PRESET_FIELDS, the
fields some preset changes) and the token budget; every other field (the selection, the similarities, the fill)
keeps the value it is given.

`qasc query --preset NAME`; without it, `choose` keeps the rule the budget profile had: a store frozen with the
shipped knobs answers with `answers`, or with `context` when a budget is set and none of the knobs is given; a
store frozen with other knobs answers with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TypeVar

from qasc.kernels.params import QascParams

# an engine.config.RetrievalConfig (engine.config imports this module, so this one names it only as a type variable;
# its shipped defaults are type(retrieval)())
Retrieval = TypeVar("Retrieval")


@dataclass(frozen=True)
class Preset:
    """One named setting: its changes from the shipped defaults and the token budget it answers with."""

    name: str
    purpose: str  # a few words: what it is for
    description: str  # one line: what it sets
    qasc: Mapping[str, object]  # QascParams fields -> values, changed from QascParams()
    retrieval: Mapping[str, object]  # RetrievalConfig fields -> values, changed from RetrievalConfig()
    budget_tokens: int | None  # the budget when none is given (None: no budget)


def _preset(name: str, purpose: str, description: str, budget_tokens: int | None, qasc: dict | None = None,
            retrieval: dict | None = None) -> Preset:
    return Preset(name, purpose, description, MappingProxyType(qasc or {}), MappingProxyType(retrieval or {}),
                  budget_tokens)


PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (
    _preset("answers", "precise spans", "the shipped setting: few, precise chunks, no token budget", None),
    _preset("context", "recall within a token budget", "400 tokens a query (unless a budget is given): short "
            "chunks around many seeds (the 16 most similar sentences, p95) over a wider region, then the budget fill",
            400,
            qasc={"percentile": 95.0, "min_seeds": 16, "radius": 0, "adaptive": False, "margin": None,
                  "clip_to_paragraph": False, "extent": "window", "max_extent": 3, "score": "seed_sim",
                  "focus_gap": None, "far_margin": None, "block_extents": "none", "length_bonus": 0.0},
            retrieval={"depth": 16, "neighbourhood": 8}),
)})
DEFAULT_PRESET = "answers"
PRESET_QASC_FIELDS = tuple(dict.fromkeys(k for p in PRESETS.values() for k in p.qasc))
PRESET_RETRIEVAL_FIELDS = tuple(dict.fromkeys(k for p in PRESETS.values() for k in p.retrieval))
PRESET_FIELDS = frozenset(PRESET_QASC_FIELDS + PRESET_RETRIEVAL_FIELDS)  # the knobs a preset sets


def get(name: str) -> Preset:
    """The preset called `name`; ValueError naming the presets for any other."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; the presets are {', '.join(PRESETS)}")
    return PRESETS[name]


def knob_values(name: str, retrieval: Retrieval) -> tuple[dict[str, object], dict[str, object]]:
    """The preset's value of every knob -> ({QascParams field: value}, {RetrievalConfig field: value}): its
    change, else the shipped default (QascParams(), type(retrieval)())."""
    preset, shipped, shipped_retrieval = get(name), QascParams(), type(retrieval)()
    return ({k: preset.qasc.get(k, getattr(shipped, k)) for k in PRESET_QASC_FIELDS},
            {k: preset.retrieval.get(k, getattr(shipped_retrieval, k)) for k in PRESET_RETRIEVAL_FIELDS})


def apply(name: str, params: QascParams, retrieval: Retrieval) -> tuple[QascParams, Retrieval]:
    """The preset's knobs and budget set on params and retrieval; every other field keeps its value.

    e.g. `apply("context", engine.config.qasc, engine.config.retrieval)` -> the setting of `qasc query --preset
    context` (budget 400 tokens; `params.replace(budget_tokens=N)` after it for another budget)."""
    qasc, retrieval_values = knob_values(name, retrieval)
    return params.replace(**qasc, budget_tokens=get(name).budget_tokens), replace(retrieval, **retrieval_values)


def matching(params: QascParams, retrieval: Retrieval, ignore: frozenset[str] = frozenset()) -> str | None:
    """The first preset whose knobs (those not in `ignore`) all hold params' / retrieval's values, else None. The
    budget does not count: `answers` with a budget is still `answers`."""
    for name in PRESETS:
        qasc, retrieval_values = knob_values(name, retrieval)
        if all(getattr(params, k) == v for k, v in qasc.items() if k not in ignore) and all(
                getattr(retrieval, k) == v for k, v in retrieval_values.items() if k not in ignore):
            return name
    return None


def choose(params: QascParams, retrieval: Retrieval, given: frozenset[str] | set[str] = frozenset()
           ) -> tuple[QascParams, Retrieval, str | None]:
    """The setting a query without a named preset answers with -> (params, retrieval, the preset's name or None).

    params / retrieval: the store's setting with the fields in `given` (set explicitly, e.g. on the command line)
    changed. With the knobs not given at the shipped values: `context`'s knobs when a budget is set and no knob is
    given (the budget kept), else `answers`. Otherwise the setting as it is, named by the preset it matches (None:
    a store frozen with other knobs)."""
    name = matching(params, retrieval, frozenset(given))
    if name == DEFAULT_PRESET and params.budget_tokens is not None and not PRESET_FIELDS & set(given):
        budget = params.budget_tokens
        params, retrieval = apply("context", params, retrieval)
        return params.replace(budget_tokens=budget), retrieval, "context"
    return params, retrieval, name


def _flag(name: str, value: object) -> str:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {'none' if value is None else value}"


def describe(name: str | None, params: QascParams, retrieval: Retrieval) -> str:
    """One line: which preset answers, the knobs that differ from it (as flags), the budget and the other presets,
    e.g. `preset context (budget 400 tokens; --preset answers for precise spans)`."""
    reference = name or DEFAULT_PRESET
    qasc, retrieval_values = knob_values(reference, retrieval)
    changed = [_flag(k, getattr(params, k)) for k, v in qasc.items() if getattr(params, k) != v] + [
        _flag(k, getattr(retrieval, k)) for k, v in retrieval_values.items() if getattr(retrieval, k) != v]
    budget = "no token budget" if params.budget_tokens is None else f"budget {params.budget_tokens} tokens"
    others = "; ".join(f"--preset {p.name} for {p.purpose}"
                       for p in PRESETS.values() if p.name != name)
    if name is None:
        return f"the store's own setting (differs from preset {reference} in {' '.join(changed)}; {budget}; {others})"
    with_flags = f" with {' '.join(changed)}" if changed else ""
    return f"preset {name}{with_flags} ({budget}; {others})"
