"""The scoring model and its ablations for bench.scoring_lodo: name -> () -> (QascParams, RetrievalConfig).

`model` is `qasc query`'s default; each other entry changes one knob of it (the forms that are no knob any more,
the lexical term's heading residual, the boost once per run, a title's text as no section, were measured with
the code before they became the model's form: bench/RESULTS.md, "One scoring model")."""

from __future__ import annotations

from qasc.engine.config import RetrievalConfig
from qasc.kernels.params import QascParams


def _v(retrieval: dict | None = None, **params):
    return lambda: (QascParams().replace(**params), RetrievalConfig(**(retrieval or {})))


VARIANTS = {
    "model": _v(),
    "no-lexical": _v(lexical_weight=0.0),
    "lexical-0.4": _v(lexical_weight=0.4),
    "no-heading-context": _v(context_weight=0.0),
    "heading-6": _v(context_weight=6.0),
    "no-heading-residual": _v(heading_residual=0.0),
    "no-section-blocks": _v(block_extents="none", length_bonus=0.0),
    "no-focus": _v(focus_gap=None, far_margin=None),
    "depth16-nb4": _v({"depth": 16, "neighbourhood": 4}),
}
