"""The whole QASC pass for a padded batch of queries, composed from the kernels (or their slow twins)."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from qasc.kernels import extents, merging, seeding, selection, snapping
from qasc.kernels.params import MAX_PICKS, QascParams
from qasc.kernels.runs import combine_keys, region_keys


@dataclass(frozen=True)
class FastOps:
    """The vectorized kernels, bundled so that `run_qasc` can swap in `kernels.reference`."""

    percentile_seeds = staticmethod(seeding.percentile_seeds)
    label_segments = staticmethod(merging.label_segments)
    segment_spans = staticmethod(merging.segment_spans)
    segment_sums = staticmethod(merging.segment_sums)
    segment_scores = staticmethod(merging.segment_scores)
    cap_breaks = staticmethod(snapping.cap_breaks)
    select_chunks = staticmethod(selection.select_chunks)
    focus_on_best = staticmethod(selection.focus_on_best)
    pooled_extent_scores = staticmethod(extents.pooled_extent_scores)
    pick_extents = staticmethod(extents.pick_extents)
    block_extent_scores = staticmethod(extents.block_extent_scores)


@dataclass(frozen=True)
class QascBatch:
    """Ranked chunks for Q queries, K = most chunks any query has.

    start/end (Q, K) int64: first/last row position (inclusive); score (Q, K) float; tokens (Q, K) int64;
    chosen (Q, K) bool: the chunk is returned; piece (Q, K) int64: its label in `labels`;
    labels (Q, L) int64: chunk label of each row position (-1: none); kept (Q, L) bool: kept seeds;
    tau (Q,) float: the seeding threshold.
    """

    start: torch.Tensor
    end: torch.Tensor
    score: torch.Tensor
    tokens: torch.Tensor
    chosen: torch.Tensor
    piece: torch.Tensor
    labels: torch.Tensor
    kept: torch.Tensor
    tau: torch.Tensor


def run_qasc(
    sims: torch.Tensor,
    valid: torch.Tensor,
    region_ids: torch.Tensor,
    paragraph_ids: torch.Tensor,
    section_ids: torch.Tensor,
    n_tokens: torch.Tensor,
    params: QascParams,
    ops: ModuleType | FastOps | None = None,
    dots: torch.Tensor | None = None,
    blocks: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    boost: torch.Tensor | None = None,
) -> QascBatch:
    """sims (Q, L) float, valid (Q, L) bool, region/paragraph/section ids and n_tokens (Q, L) int64 -> QascBatch.

    A row is one query's candidate text: one or more regions (runs of equal region id: a document or a
    neighbourhood inside one) laid end to end; nothing ever crosses a region boundary. `dots`
    (Q, L, W >= params.max_extent) float, each position's dot products with the sentence vectors of its next
    W-1 positions (`kernels.extents.neighbour_dots` of the rows behind `sims`), are required. `blocks` maps
    "paragraph" / "section" to (sizes (Q, L) int64, norms (Q, L) float): each position's whole block in its
    document, its sentences and the norm of its summed vectors (`kernels.extents.block_stats`); needed by
    params.block_extents only. `boost` (Q, L) float: an additive
    per-row score (the scoring model's heading boost, kernels.signals) that seeding and whole blocks see
    added to `sims`; pooled runs add their mean boost once to the pooled cosine of `sims` (a run outranks its own
    best sentence only by what it says, not by repeating its heading), whole blocks pool sims + boost (a section
    whose heading the question matches is lifted as a whole).
    """
    ops = ops or FastOps()
    p = params
    if p.budget_tokens is not None and p.budget_tokens < p.max_tokens:
        p = p.replace(max_tokens=p.budget_tokens)  # a chunk never alone overflows the budget
    region = region_keys(region_ids, valid)
    plain = sims  # without the boost: what pooled runs take their cosine of (the boost counts once per run)
    if boost is not None:
        sims = sims + boost
    tau, seeds = ops.percentile_seeds(sims, valid, p.percentile, p.min_seeds)
    window_keys = combine_keys(region, paragraph_ids) if p.clip_to_paragraph else region
    if dots is None:
        raise ValueError("run_qasc needs the neighbour dots (Q, L, W) of the sentence vectors")
    runs = ops.pooled_extent_scores(plain, dots, valid, window_keys, seeds, p.max_extent, boost=boost)
    if p.length_bonus:  # a run of n sentences gains length_bonus * ln(n): one constant per slot
        n = torch.arange(1, p.max_extent + 1, dtype=runs.dtype, device=runs.device)
        runs = runs + p.length_bonus * torch.log(n)
    lengths = None  # slot m: the run of m + 1 sentences
    if p.block_kinds:
        runs, lengths = _with_blocks(runs, sims, valid, region_ids, paragraph_ids, section_ids, seeds, n_tokens,
                                     p, blocks, ops)
    # merge_picks: picks below the score margin too, for the chunks they touch (the margin applies to chunks)
    pick_id, seed_values = ops.pick_extents(runs, MAX_PICKS, None if p.merge_picks else p.score_margin, lengths)
    kept = pick_id >= 0  # every picked sentence; its value is its extent's score
    # picks are disjoint, each its own chunk; with merge_picks, picks that touch in one paragraph (in one region when
    # not clipped) are one chunk scored by its best pick (the `context` preset's single sentences around many seeds)
    apart = kept.clone()
    if kept.shape[1] > 1:
        another = pick_id[:, 1:] != pick_id[:, :-1]
        apart[:, 1:] &= (another & (window_keys[:, 1:] != window_keys[:, :-1])) if p.merge_picks else another
    labels, count = ops.label_segments(kept, region, valid, breaks=apart)
    breaks = ops.cap_breaks(labels, n_tokens, p.max_tokens) | apart
    labels, count = ops.label_segments(labels >= 0, region, valid, breaks)
    n_seg = int(count.max()) if count.numel() else 0
    scores = ops.segment_scores(labels, seed_values, kept, n_seg, "max")
    seg_start, seg_end = ops.segment_spans(labels, n_seg)
    seg_tokens = ops.segment_sums(labels, torch.where(valid, n_tokens, 0), n_seg)
    if p.focus_gap is not None and n_seg > 0:
        seg_region = region.gather(1, seg_start.clamp(min=0))
        scores = ops.focus_on_best(scores, seg_start, seg_end, seg_region, p.focus_gap, p.far_margin)
    order, chosen = ops.select_chunks(scores, seg_tokens, p.top_k, p.budget_tokens, p.score_margin)
    k = int(chosen.sum(dim=1).max()) if chosen.numel() else 0
    order, chosen = order[:, :k], chosen[:, :k]
    return QascBatch(
        start=seg_start.gather(1, order),
        end=seg_end.gather(1, order),
        score=scores.gather(1, order),
        tokens=seg_tokens.gather(1, order),
        chosen=chosen,
        piece=order,
        labels=labels,
        kept=kept,
        tau=tau,
    )


def _with_blocks(runs, sims, valid, region_ids, paragraph_ids, section_ids, seeds, n_tokens, p, blocks, ops):
    """runs (Q, L, M) -> scores (Q, L, M + B) float, lengths (Q, L, M + B) int64: the whole paragraphs and/or
    sections longer than the longest run as extra candidate slots (B = 1 or 2), scored by the pooled cosine of
    `sims` (boost included), with their length bonus. A block of size 0 in `blocks` is no candidate."""
    ids = {"paragraph": paragraph_ids, "section": section_ids}
    q, length, m = runs.shape
    out = runs.new_empty((q, length, m + len(p.block_kinds)))
    out[..., :m] = runs
    out[..., m:] = float("-inf")
    lengths = torch.zeros(out.shape, dtype=torch.long, device=runs.device)
    lengths[..., :m] = torch.arange(1, m + 1, device=runs.device)
    for k, kind in enumerate(p.block_kinds, start=m):
        if blocks is None or kind not in blocks:
            raise ValueError(f"block_extents={p.block_extents!r} needs the {kind} sizes and norms (blocks=...)")
        sizes, norms = blocks[kind]
        score, size = ops.block_extent_scores(sims, valid, region_ids, ids[kind], sizes, norms, seeds, n_tokens,
                                              p.max_tokens)
        longer = size > p.max_extent  # the blocks (few) longer than the longest run
        row, at = longer.nonzero().unbind(1)
        n = size[row, at]
        value = score[row, at]
        if p.length_bonus:
            value = value + p.length_bonus * torch.log(n.to(value.dtype))
        out[row, at, k] = value
        lengths[row, at, k] = n
    return out, lengths
