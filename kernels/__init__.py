"""Pure torch kernels of query-adaptive semantic chunking over padded (Q queries x L sentences) batches.

No I/O, no model, no Ray: every function maps tensors to tensors on the device of its inputs.
`kernels.reference` holds a slow, loop-based twin of each function for the tests.
"""

from kernels.candidates import CandidateRows, candidate_rows
from kernels.context import best_paths
from kernels.extents import (
    block_extent_scores,
    block_stats,
    neighbour_dots,
    pick_extents,
    pooled_extent_scores,
    run_norms,
)
from kernels.gather import gathered_dots, segment_first
from kernels.merging import coverage, fill_gaps, label_segments, segment_scores, segment_spans, segment_sums
from kernels.params import QascParams
from kernels.pipeline import QascBatch, run_qasc
from kernels.seeding import percentile_seeds, percentile_threshold
from kernels.selection import focus_on_best, select_chunks
from kernels.snapping import cap_breaks, snap_to_blocks
from kernels.windows import decay_window_scores, expand_windows, keep_windows

__all__ = [
    "best_paths",
    "CandidateRows",
    "QascBatch",
    "QascParams",
    "block_extent_scores",
    "block_stats",
    "candidate_rows",
    "cap_breaks",
    "coverage",
    "decay_window_scores",
    "expand_windows",
    "fill_gaps",
    "keep_windows",
    "focus_on_best",
    "gathered_dots",
    "label_segments",
    "percentile_seeds",
    "neighbour_dots",
    "pick_extents",
    "pooled_extent_scores",
    "run_norms",
    "percentile_threshold",
    "run_qasc",
    "segment_first",
    "segment_scores",
    "segment_spans",
    "segment_sums",
    "select_chunks",
    "snap_to_blocks",
]


def __getattr__(name: str):
    """A name this package does not define. Hugging Face's PyPI package `kernels` (a dependency of transformers >=
    5.25) has this package's import name: where it is installed, transformers imports this package in its place and
    asks it for names such as `CUDAProperties`. Say so, instead of a bare "cannot import name"."""
    if not name.startswith("_"):
        from importlib.metadata import PackageNotFoundError, version

        try:
            hub = version("kernels")
        except PackageNotFoundError:
            hub = None
        if hub is not None:
            raise ImportError(
                f"cannot import name {name!r} from qasc's `kernels` package: Hugging Face's PyPI package `kernels` "
                f"{hub} is installed under the same import name (transformers >= 5.25 depends on it), and qasc's "
                f"takes its place. qasc needs transformers < 5.25 (its pin in pyproject.toml: `pip install "
                f"'transformers<5.25'`), which runs without Hugging Face's `kernels` (`pip uninstall kernels`).",
                name=__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
