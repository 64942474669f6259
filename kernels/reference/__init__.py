"""Slow, loop-based twins of the QASC kernels, written from their docstring contracts for the tests.

Every function has the signature and the output shapes/dtypes of its vectorized counterpart, but works one
query row and one sentence at a time on plain Python lists. Nothing here calls the vectorized kernels, so a
disagreement between the two points at a bug in one of them. The package can be passed as
`kernels.pipeline.run_qasc(..., ops=kernels.reference)`.

Conventions shared by all functions:

* a "segment" of a row is a maximal run of equal consecutive keys among valid positions; an invalid position
  belongs to no segment and always separates segments;
* chunk labels are >= 0; -1 means "no chunk".

One module per module of `kernels/` (kernels/reference/seeding.py twins kernels/seeding.py, ...), loop helpers
in `_common`; this package re-exports every twin by name. Each twin's docstring states the contract it computes.
tests/kernels/test_reference_complete.py fails when a public function of a kernels/ module has no twin of the
same name and parameters in the matching module here, or when a twin imports the kernels' own code.
"""

from __future__ import annotations

from qasc.kernels.reference.candidates import candidate_rows
from qasc.kernels.reference.context import (
    best_paths,
    context_boost,
    heading_gate,
    heading_residual,
    int8_heading_table,
    packed_path_rows,
    shortlist_top,
)
from qasc.kernels.reference.extents import (
    block_extent_scores,
    block_stats,
    neighbour_dots,
    pick_extents,
    pooled_extent_scores,
    run_norms,
)
from qasc.kernels.reference.gather import entry_dots, gathered_dots, segment_first
from qasc.kernels.reference.lexical import lexical_scores
from qasc.kernels.reference.merging import label_segments, segment_scores, segment_spans, segment_sums
from qasc.kernels.reference.quantize import column_inverse, int8_products, quantize_columns, quantize_rows, row_top_k
from qasc.kernels.reference.runs import combine_keys, positions_like, region_keys, run_bounds
from qasc.kernels.reference.seeding import percentile_seeds, percentile_threshold, similarity_ranks, top_ranked
from qasc.kernels.reference.selection import focus_on_best, select_chunks
from qasc.kernels.reference.signals import normalised_lexical, rerank_scores, row_scores
from qasc.kernels.reference.snapping import cap_breaks

__all__ = [
    "best_paths",
    "block_extent_scores",
    "block_stats",
    "candidate_rows",
    "cap_breaks",
    "column_inverse",
    "combine_keys",
    "context_boost",
    "entry_dots",
    "focus_on_best",
    "gathered_dots",
    "heading_gate",
    "heading_residual",
    "int8_heading_table",
    "int8_products",
    "label_segments",
    "lexical_scores",
    "neighbour_dots",
    "normalised_lexical",
    "packed_path_rows",
    "percentile_seeds",
    "percentile_threshold",
    "pick_extents",
    "pooled_extent_scores",
    "positions_like",
    "quantize_columns",
    "quantize_rows",
    "region_keys",
    "rerank_scores",
    "row_scores",
    "row_top_k",
    "run_bounds",
    "run_norms",
    "segment_first",
    "segment_scores",
    "segment_spans",
    "segment_sums",
    "select_chunks",
    "shortlist_top",
    "similarity_ranks",
    "top_ranked",
]
