"""The whole QASC pass for a padded batch of queries, composed from the kernels (or their slow twins)."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from qasc.kernels import extents, merging, seeding, selection, snapping, windows
from qasc.kernels.params import QascParams
from qasc.kernels.runs import combine_keys, region_keys


@dataclass(frozen=True)
class FastOps:
    """The vectorized kernels, bundled so that `run_qasc` can swap in `kernels.reference`."""

    percentile_seeds = staticmethod(seeding.percentile_seeds)
    expand_windows = staticmethod(windows.expand_windows)
    decay_window_scores = staticmethod(windows.decay_window_scores)
    keep_windows = staticmethod(windows.keep_windows)
    coverage = staticmethod(merging.coverage)
    fill_gaps = staticmethod(merging.fill_gaps)
    label_segments = staticmethod(merging.label_segments)
    segment_spans = staticmethod(merging.segment_spans)
    segment_sums = staticmethod(merging.segment_sums)
    segment_scores = staticmethod(merging.segment_scores)
    snap_to_blocks = staticmethod(snapping.snap_to_blocks)
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
    W-1 positions (`kernels.extents.neighbour_dots` of the rows behind `sims`), are needed by
    params.extent == "pooled" only. `blocks` maps "paragraph" / "section" to (sizes (Q, L) int64, norms (Q, L)
    float): each position's whole block in its document, its sentences and the norm of its summed vectors
    (`kernels.extents.block_stats`); needed by params.block_extents only. `boost` (Q, L) float: an additive
    per-row score (the scoring model's heading boost, kernels.signals) that seeding, windows and whole blocks see
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
    tau, seeds = ops.percentile_seeds(sims, valid, p.percentile, p.min_seeds, p.max_seeds)
    window_keys = combine_keys(region, paragraph_ids) if p.clip_to_paragraph else region
    if p.extent == "pooled":
        if dots is None:
            raise ValueError("extent='pooled' needs the neighbour dots (Q, L, W) of the sentence vectors")
        runs = ops.pooled_extent_scores(plain, dots, valid, window_keys, seeds, p.max_extent, p.extent_penalty, boost)
        if p.length_bonus:  # a run of n sentences gains length_bonus * ln(n): one constant per slot
            n = torch.arange(1, p.max_extent + 1, dtype=runs.dtype, device=runs.device)
            runs = runs + p.length_bonus * torch.log(n)
        lengths = None  # slot m: the run of m + 1 sentences
        if p.block_kinds:
            runs, lengths = _with_blocks(runs, sims, valid, region_ids, paragraph_ids, section_ids, seeds, n_tokens,
                                         p, blocks, ops)
        pick_id, seed_values = ops.pick_extents(runs, p.max_picks, p.score_margin, lengths)
        kept = pick_id >= 0  # every picked sentence; its value is its run's score
        how = "max"
        # picks are disjoint runs, each its own chunk: merging touching picks would grow the best pick by its
        # weaker neighbours, so every pick starts a new chunk (and gap filling does not apply)
        apart = kept.clone()
        if kept.shape[1] > 1:
            apart[:, 1:] &= pick_id[:, 1:] != pick_id[:, :-1]
        covered = kept
    else:
        threshold = None
        if p.adaptive:
            threshold = torch.full_like(sims, float("-inf"))
            if p.threshold is not None:
                threshold = torch.full_like(sims, p.threshold)
            if p.margin is not None:
                threshold = torch.maximum(threshold, sims - p.margin)
        starts, ends = ops.expand_windows(sims, valid, seeds, window_keys, p.radius, threshold)
        win_scores = ops.decay_window_scores(sims, valid, seeds, starts, ends, p.decay)
        kept = ops.keep_windows(win_scores, seeds, tau, p.factor)
        # the most similar seed always survives the score filter: a query with candidates gets an answer
        if sims.shape[1] > 0:  # amax over an empty row dimension raises
            best = seeds & (sims == torch.where(seeds, sims, float("-inf")).amax(dim=1, keepdim=True))
            first_best = best & (best.long().cumsum(dim=1) == 1)
            kept = kept | first_best
        seed_values = sims if p.score == "seed_sim" else win_scores
        how = "mean" if p.score == "window_mean" else "max"
        apart = None
        if p.merge:
            covered = ops.fill_gaps(ops.coverage(kept, starts, ends), region, valid, p.gap)

    if p.merge or apart is not None:
        labels, count = ops.label_segments(covered, region, valid, breaks=apart)
        if p.snap != "none":
            blocks = paragraph_ids if p.snap == "paragraph" else section_ids
            n_seg = int(count.max()) if count.numel() else 0
            covered = ops.snap_to_blocks(labels, n_seg, region, blocks, valid, n_tokens, p.max_tokens)
            labels, count = ops.label_segments(covered, region, valid)
        breaks = ops.cap_breaks(labels, n_tokens, p.max_tokens)
        if apart is not None and p.snap == "none":
            breaks = breaks | apart
        labels, count = ops.label_segments(labels >= 0, region, valid, breaks)
    else:  # ablation: every kept window is its own chunk; windows over the cap shrink to the seed
        labels, count = ops.label_segments(kept, region, valid, breaks=kept)
        count = kept.sum(dim=1)
    n_seg = int(count.max()) if count.numel() else 0
    scores = ops.segment_scores(labels, seed_values, kept, n_seg, how)
    if p.merge or apart is not None:
        seg_start, seg_end = ops.segment_spans(labels, n_seg)
        seg_tokens = ops.segment_sums(labels, torch.where(valid, n_tokens, 0), n_seg)
    else:
        seg_start, seg_end, seg_tokens = _window_spans(kept, starts, ends, n_tokens, valid, labels, n_seg, p)
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


def _window_spans(kept, starts, ends, n_tokens, valid, labels, n_seg, p):
    """No-merge ablation: spans (Q, S) of each kept window, in seed order; a window over the cap is cut to its seed."""
    q, length = kept.shape
    cum = torch.where(valid, n_tokens, 0).cumsum(dim=1)
    before = torch.cat([torch.zeros_like(cum[:, :1]), cum], dim=1)
    s = starts.clamp(min=0)
    e = ends.clamp(min=0)
    tokens = before.gather(1, e + 1) - before.gather(1, s)
    idx = torch.arange(length, device=kept.device).expand(q, length)
    over = tokens > p.max_tokens
    s = torch.where(over, idx, s)
    e = torch.where(over, idx, e)
    tokens = before.gather(1, e + 1) - before.gather(1, s)
    slot = torch.where(kept, labels, torch.full_like(labels, n_seg))
    out = torch.full((q, n_seg + 1), -1, dtype=torch.long, device=kept.device)
    span_s = out.scatter(1, slot, torch.where(kept, s, -1))[:, :n_seg]
    span_e = out.scatter(1, slot, torch.where(kept, e, -1))[:, :n_seg]
    span_t = torch.zeros_like(out).scatter(1, slot, torch.where(kept, tokens, 0))[:, :n_seg]
    return span_s, span_e, span_t
