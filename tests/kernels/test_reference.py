"""Property tests: every vectorized kernel against its loop twin in `kernels.reference`, plus pipeline invariants.

Batches are small and ragged: Q in 0..5 queries (rows may be entirely padding), L in 0..24 sentences, validity
as a per-row prefix, region/paragraph/section ids as runs, and similarities on a 1/8 grid so that ties and
constant rows are common.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qasc.kernels.reference as ref
from qasc.kernels import extents, merging, seeding, selection, snapping
from qasc.kernels.params import BLOCK_RULES, QascParams
from qasc.kernels.pipeline import run_qasc

F64 = torch.float64
# KERNELS_HYPOTHESIS_SCALE=20 multiplies every example budget (a slower, deeper search)
SCALE = float(os.environ.get("KERNELS_HYPOTHESIS_SCALE", "1"))


def budget(n: int) -> settings:
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


SETTINGS = budget(150)
GRID = [k / 8 for k in range(-8, 9)]
BOOSTS = [k / 8 for k in range(-3, 4)]  # per-row boosts: eighths too, so their sums are exact
DIM = 3  # sentence vectors in the random batches: eighths, so that every sum of a few is exact
DOTS_WIDTH = 6  # neighbour dots of the random batches: enough for runs of up to 6 sentences


# --------------------------------------------------------------------------------------------------- strategies


@st.composite
def run_row(draw: st.DrawFn, length: int, ordered: bool, alphabet: int = 4) -> list[int]:
    """Ids as runs: increasing ids (ordered), or ids from a small alphabet that may recur after a break."""
    changes = draw(st.lists(st.booleans(), min_size=length, max_size=length))
    ids: list[int] = []
    current = draw(st.integers(-2, 2))
    for i, change in enumerate(changes):
        if i > 0 and change:
            current = current + draw(st.integers(1, 3)) if ordered else draw(st.integers(-1, alphabet - 2))
        ids.append(current)
    return ids


@st.composite
def batches(draw: st.DrawFn, max_q: int = 5, max_l: int = 24) -> dict[str, torch.Tensor]:
    """A random padded batch: sims, valid, region/paragraph/section ids, n_tokens, all (Q, L)."""
    q = draw(st.integers(0, max_q))
    length = draw(st.one_of(st.just(1), st.integers(0, max_l), st.integers(max_l // 2, max_l)))
    if draw(st.booleans()):
        values = GRID
    else:  # few distinct values: many ties, constant rows
        values = draw(st.lists(st.sampled_from(GRID), min_size=1, max_size=3, unique=True))
    all_empty = draw(st.integers(0, 9)) == 0
    ordered_regions = draw(st.booleans())
    with_boost = draw(st.booleans())  # an additive per-row score (the heading context's), or none
    rows: dict[str, list] = {k: [] for k in ("sims", "valid", "region", "paragraph", "section", "tokens", "emb",
                                             "boost")}
    for _ in range(q):
        n_valid = 0 if all_empty else draw(st.one_of(st.just(length), st.just(0), st.integers(0, length)))
        rows["sims"].append(draw(st.lists(st.sampled_from(values), min_size=length, max_size=length)))
        rows["valid"].append([i < n_valid for i in range(length)])
        rows["region"].append(draw(run_row(length, ordered_regions)))
        rows["paragraph"].append(draw(run_row(length, False)))
        rows["section"].append(draw(run_row(length, True)))
        rows["tokens"].append(draw(st.lists(st.integers(1, 60), min_size=length, max_size=length)))
        rows["emb"].append(draw(st.lists(st.sampled_from(GRID), min_size=length * DIM, max_size=length * DIM)))
        rows["boost"].append(draw(st.lists(st.sampled_from(BOOSTS), min_size=length, max_size=length)))

    def as_tensor(name: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(rows[name], dtype=dtype).reshape(q, length)

    return {
        "sims": as_tensor("sims", F64),
        "valid": as_tensor("valid", torch.bool),
        "region": as_tensor("region", torch.long),
        "paragraph": as_tensor("paragraph", torch.long),
        "section": as_tensor("section", torch.long),
        "tokens": as_tensor("tokens", torch.long),
        "emb": torch.tensor(rows["emb"], dtype=F64).reshape(q, length, DIM),
    } | {"dots": row_dots(torch.tensor(rows["emb"], dtype=F64).reshape(q, length, DIM))} | {
        "blocks": row_blocks(torch.tensor(rows["emb"], dtype=F64).reshape(q, length, DIM),
                             {k: as_tensor(k, torch.long) for k in ("paragraph", "section")})} | (
        {"boost": as_tensor("boost", F64)} if with_boost else {})


def row_of(b: dict, q: int) -> dict:
    """The batch's row q as a batch of one (blocks included)."""
    out = {k: v[q : q + 1] for k, v in b.items() if k != "blocks"}
    if "blocks" in b:
        out["blocks"] = {kind: tuple(t[q : q + 1] for t in pair) for kind, pair in b["blocks"].items()}
    return out


def row_blocks(emb: torch.Tensor, ids: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each row taken as one document: per kind, its blocks' sizes and norms (Q, L), as the engine gathers them."""
    q, length, _ = emb.shape
    out = {}
    for kind, key in ids.items():
        pairs = [extents.block_stats(emb[i], key[i]) for i in range(q)]
        out[kind] = (torch.stack([p[0] for p in pairs]) if q else torch.zeros((0, length), dtype=torch.long),
                     torch.stack([p[1] for p in pairs]) if q else torch.zeros((0, length), dtype=F64))
    return out


def row_dots(emb: torch.Tensor, width: int = DOTS_WIDTH) -> torch.Tensor:
    """emb (Q, L, D) -> (Q, L, width): each row's neighbour dots, as the engine computes them per store."""
    q, length, _ = emb.shape
    if q == 0:
        return torch.zeros((0, length, width), dtype=emb.dtype)
    return torch.stack([extents.neighbour_dots(e, width) for e in emb])


@st.composite
def masks(draw: st.DrawFn, shape: tuple[int, int], within: torch.Tensor | None = None) -> torch.Tensor:
    """A random bool (Q, L) mask, optionally a subset of `within`."""
    q, length = shape
    bits = draw(st.lists(st.booleans(), min_size=q * length, max_size=q * length))
    mask = torch.tensor(bits, dtype=torch.bool).reshape(q, length)
    return mask & within if within is not None else mask


def percentiles(q: int) -> st.SearchStrategy:
    fixed = st.sampled_from([0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 100.0])
    free = st.floats(0.0, 100.0, allow_nan=False)
    per_row = st.lists(st.one_of(fixed, free), min_size=q, max_size=q).map(lambda v: torch.tensor(v, dtype=F64))
    return st.one_of(fixed, free, per_row)


@st.composite
def qasc_params(draw: st.DrawFn) -> QascParams:
    return QascParams(
        percentile=draw(st.one_of(st.sampled_from([0.0, 50.0, 75.0, 90.0, 95.0, 100.0]), st.floats(0, 100))),
        min_seeds=draw(st.integers(0, 3)),
        clip_to_paragraph=draw(st.booleans()),
        max_tokens=draw(st.integers(1, 200)),
        top_k=draw(st.one_of(st.none(), st.integers(1, 5))),
        budget_tokens=draw(st.one_of(st.none(), st.integers(1, 400))),
        score_margin=draw(st.one_of(st.none(), st.sampled_from([0.0, 0.125, 0.25, 0.5]))),
        max_extent=draw(st.integers(1, 5)),
        merge_picks=draw(st.booleans()),
        focus_gap=draw(st.one_of(st.none(), st.integers(0, 4))),
        far_margin=draw(st.one_of(st.none(), st.sampled_from([0.0, 0.125, 0.5]))),
        block_extents=draw(st.sampled_from(BLOCK_RULES)),
        length_bonus=draw(st.sampled_from([0.0, 0.125, -0.125])),
    )


# --------------------------------------------------------------------------------------------------- helpers


def assert_same(fast: torch.Tensor, slow: torch.Tensor) -> None:
    """Exact for integer/bool tensors, allclose (infinities must match) for floats; shapes and dtypes too."""
    assert fast.shape == slow.shape, (fast.shape, slow.shape)
    assert fast.dtype == slow.dtype, (fast.dtype, slow.dtype)
    if fast.is_floating_point():
        assert torch.allclose(fast, slow, rtol=1e-9, atol=1e-12, equal_nan=True), (fast, slow)
    else:
        assert torch.equal(fast, slow), (fast, slow)


def run_both(b: dict[str, torch.Tensor], params: QascParams, ops=None):
    return run_qasc(b["sims"], b["valid"], b["region"], b["paragraph"], b["section"], b["tokens"], params, ops=ops,
                    dots=b.get("dots"), blocks=b.get("blocks"), boost=b.get("boost"))


def chosen_chunks(batch, q: int) -> list[tuple[int, int, int, float]]:
    """The returned chunks of query q, in rank order: (start, end, tokens, score)."""
    keep = batch.chosen[q]
    return list(
        zip(
            batch.start[q][keep].tolist(),
            batch.end[q][keep].tolist(),
            batch.tokens[q][keep].tolist(),
            batch.score[q][keep].tolist(),
            strict=True,
        )
    )


def numpy_percentile(sims: torch.Tensor, valid: torch.Tensor, pct) -> list[float]:
    q = sims.shape[0]
    pcts = torch.as_tensor(pct, dtype=F64).expand(q).tolist()
    out = []
    for row, ok, p in zip(sims.tolist(), valid.tolist(), pcts, strict=True):
        vals = [v for v, good in zip(row, ok, strict=True) if good]
        out.append(float(np.percentile(np.array(vals), p)) if vals else float("inf"))
    return out


# --------------------------------------------------------------------------------------------------- seeding


@SETTINGS
@given(data=st.data())
def test_percentile_threshold(data: st.DataObject) -> None:
    b = data.draw(batches())
    pct = data.draw(percentiles(b["sims"].shape[0]))
    fast = seeding.percentile_threshold(b["sims"], b["valid"], pct)
    slow = ref.percentile_threshold(b["sims"], b["valid"], pct)
    assert_same(fast, slow)
    assert torch.equal(fast, slow)  # same formula, same dtype: bit for bit
    expected = torch.tensor(numpy_percentile(b["sims"], b["valid"], pct), dtype=F64)
    assert torch.allclose(fast, expected, rtol=1e-12, atol=1e-12)


@SETTINGS
@given(data=st.data())
def test_percentile_seeds(data: st.DataObject) -> None:
    b = data.draw(batches())
    pct = data.draw(percentiles(b["sims"].shape[0]))
    min_seeds = data.draw(st.integers(0, 4))
    fast = seeding.percentile_seeds(b["sims"], b["valid"], pct, min_seeds)
    slow = ref.percentile_seeds(b["sims"], b["valid"], pct, min_seeds)
    for f, s in zip(fast, slow, strict=True):
        assert_same(f, s)
    assert not bool((fast[1] & ~b["valid"]).any())


@SETTINGS
@given(data=st.data())
def test_top_ranked_equals_sorted_ranks(data: st.DataObject) -> None:
    """top_ranked (a top-k and tie counting) against the stable sort it replaces, -inf and NaN similarities too."""
    from qasc.kernels.seeding import similarity_ranks, top_ranked

    b = data.draw(batches())
    sims = b["sims"].clone()
    q, length = sims.shape
    odd = data.draw(st.lists(st.sampled_from([None, float("-inf"), float("nan")]), min_size=q * length,
                             max_size=q * length))
    for i, v in enumerate(odd):
        if v is not None and data.draw(st.integers(0, 3)) == 0:
            sims.view(-1)[i] = v
    k = data.draw(st.integers(0, length + 1))
    assert torch.equal(top_ranked(sims, b["valid"], k), similarity_ranks(sims, b["valid"]) < k)


# --------------------------------------------------------------------------------------------------- merging


@SETTINGS
@given(data=st.data())
def test_label_segments(data: st.DataObject) -> None:
    b = data.draw(batches())
    shape = tuple(b["sims"].shape)
    covered = data.draw(masks(shape))  # may touch padding: label_segments must ignore it
    breaks = data.draw(st.one_of(st.none(), masks(shape)))
    segments = b[data.draw(st.sampled_from(["region", "paragraph"]))]
    fast = merging.label_segments(covered, segments, b["valid"], breaks)
    slow = ref.label_segments(covered, segments, b["valid"], breaks)
    for f, s in zip(fast, slow, strict=True):
        assert_same(f, s)


@st.composite
def labelled(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], torch.Tensor, int]:
    """A batch with chunk labels (from the reference labeller, with random breaks) and a segment count S."""
    b = draw(batches())
    shape = tuple(b["sims"].shape)
    covered = draw(masks(shape, within=b["valid"]))
    breaks = draw(st.one_of(st.none(), masks(shape)))
    labels, count = ref.label_segments(covered, b["region"], b["valid"], breaks)
    n_seg = (int(count.max()) if count.numel() else 0) + draw(st.integers(0, 2))
    return b, labels, n_seg


@SETTINGS
@given(data=st.data())
def test_segment_spans_sums_scores(data: st.DataObject) -> None:
    b, labels, n_seg = data.draw(labelled())
    for f, s in zip(merging.segment_spans(labels, n_seg), ref.segment_spans(labels, n_seg), strict=True):
        assert_same(f, s)
    values = torch.where(b["valid"], b["tokens"], 0)
    assert_same(merging.segment_sums(labels, values, n_seg), ref.segment_sums(labels, values, n_seg))
    assert_same(merging.segment_sums(labels, b["sims"], n_seg), ref.segment_sums(labels, b["sims"], n_seg))
    include = data.draw(masks(tuple(labels.shape)))
    for how in ("max", "mean"):
        fast = merging.segment_scores(labels, b["sims"], include, n_seg, how)
        slow = ref.segment_scores(labels, b["sims"], include, n_seg, how)
        assert_same(fast, slow)


# --------------------------------------------------------------------------------------------------- snapping


@SETTINGS
@given(data=st.data())
def test_cap_breaks(data: st.DataObject) -> None:
    b, labels, _ = data.draw(labelled())
    max_tokens = data.draw(st.integers(1, 200))
    fast = snapping.cap_breaks(labels, b["tokens"], max_tokens)
    slow = ref.cap_breaks(labels, b["tokens"], max_tokens)
    assert_same(fast, slow)


# --------------------------------------------------------------------------------------------------- selection


@SETTINGS
@given(data=st.data())
def test_select_chunks(data: st.DataObject) -> None:
    q = data.draw(st.integers(0, 5))
    s = data.draw(st.integers(0, 12))
    scores = data.draw(st.lists(st.sampled_from([*GRID, float("-inf")]), min_size=q * s, max_size=q * s))
    tokens = data.draw(st.lists(st.integers(1, 200), min_size=q * s, max_size=q * s))
    scores_t = torch.tensor(scores, dtype=F64).reshape(q, s)
    tokens_t = torch.tensor(tokens, dtype=torch.long).reshape(q, s)
    top_k = data.draw(st.one_of(st.none(), st.integers(1, 6)))
    budget = data.draw(st.one_of(st.none(), st.integers(1, 600)))
    margin = data.draw(st.one_of(st.none(), st.sampled_from([0.0, 0.125, 0.25, 0.5, 2.0])))
    fast = selection.select_chunks(scores_t, tokens_t, top_k, budget, margin)
    slow = ref.select_chunks(scores_t, tokens_t, top_k, budget, margin)
    for f, sl in zip(fast, slow, strict=True):
        assert_same(f, sl)


# --------------------------------------------------------------------------------------------------- pipeline


# --------------------------------------------------------------------------------------------------- extents


@SETTINGS
@given(data=st.data())
def test_pooled_extent_scores(data: st.DataObject) -> None:
    b = data.draw(batches())
    seeds = data.draw(masks(tuple(b["sims"].shape), within=b["valid"]))
    segments = b[data.draw(st.sampled_from(["region", "paragraph"]))]
    max_len = data.draw(st.integers(1, 6))
    boost = b.get("boost")  # the run's mean boost added once, when the batch has one
    fast = extents.pooled_extent_scores(b["sims"], b["dots"], b["valid"], segments, seeds, max_len, boost)
    slow = ref.pooled_extent_scores(b["sims"], b["dots"], b["valid"], segments, seeds, max_len, boost)
    assert_same(fast, slow)
    assert torch.equal(fast, slow)  # exact sums, correctly rounded norm and division: bit for bit


def test_a_constant_boost_shifts_every_run_by_itself_once() -> None:
    """With the boost counted once, a boost b on every row adds exactly b to every run's score, so the runs keep
    their order; pooled into the similarities instead, it adds b * n / ||sum e|| and a run of two overtakes
    its own better sentence."""
    y = -1 / 30  # row 1: cosine 0.4 with the query, 0.3 with row 0 (cosine 0.8): the pair [0, 1] scores 0.744
    emb = torch.tensor([[[0.8, 0.6, 0.0], [0.4, y, (1 - 0.16 - y * y) ** 0.5], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0],
                         [0.6, 0.0, 0.8], [0.0, 0.6, 0.8]]], dtype=F64)
    sims = emb[0] @ torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    sims = sims[None]
    valid = torch.ones_like(sims, dtype=torch.bool)
    ids = torch.zeros_like(sims, dtype=torch.long)
    dots = row_dots(emb, 3)
    plain = extents.pooled_extent_scores(sims, dots, valid, ids, valid, 3)
    b = 0.25
    once = extents.pooled_extent_scores(sims, dots, valid, ids, valid, 3, boost=torch.full_like(sims, b))
    finite = torch.isfinite(plain)
    assert torch.allclose(once[finite], plain[finite] + b, rtol=0, atol=1e-12)
    assert plain[0, 0, 0] > plain[0, 0, 1]  # the exact sentence beats the pair it starts
    pooled = extents.pooled_extent_scores(sims + b, dots, valid, ids, valid, 3)
    assert pooled[0, 0, 1] > pooled[0, 0, 0]  # with the boost pooled, the pair overtakes it


@SETTINGS
@given(data=st.data())
def test_neighbour_dots_and_run_norms(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 12))
    width = data.draw(st.integers(1, 5))
    cells = data.draw(st.lists(st.sampled_from(GRID), min_size=n * DIM, max_size=n * DIM))
    vectors = torch.tensor(cells, dtype=F64).reshape(n, DIM)
    block = data.draw(st.integers(1, 8))
    dots = extents.neighbour_dots(vectors, width, block_rows=block)
    assert_same(dots, ref.neighbour_dots(vectors, width))
    max_len = data.draw(st.integers(1, width))
    norms = extents.run_norms(dots[None], max_len)
    assert_same(norms, ref.run_norms(dots[None], max_len))
    for a in range(n):  # the norm of the summed vectors themselves, for every run inside the row
        for length in range(1, max_len + 1):
            direct = torch.linalg.vector_norm(vectors[a : a + length].sum(0))
            assert float(norms[0, a, length - 1]) == pytest.approx(float(direct), abs=1e-12)


def test_pooled_scores_do_not_depend_on_the_width() -> None:
    """The same unit vectors in 16 and in 384 dimensions (zero-padded) give the same pooled scores."""
    g = torch.Generator().manual_seed(0)
    small = torch.nn.functional.normalize(torch.randn(40, 16, generator=g, dtype=F64), dim=-1)
    wide = torch.nn.functional.pad(small, (0, 384 - 16))
    query = torch.nn.functional.normalize(torch.randn(16, generator=g, dtype=F64), dim=0)
    sims = (small @ query)[None]
    valid = torch.ones_like(sims, dtype=torch.bool)
    ids = torch.zeros_like(sims, dtype=torch.long)
    a = extents.pooled_extent_scores(sims, extents.neighbour_dots(small, 3)[None], valid, ids, valid, 3)
    b = extents.pooled_extent_scores(sims, extents.neighbour_dots(wide, 3)[None], valid, ids, valid, 3)
    assert torch.allclose(a, b, rtol=0, atol=1e-12)


@SETTINGS
@given(data=st.data())
def test_pick_extents(data: st.DataObject) -> None:
    b = data.draw(batches())
    q, length = b["sims"].shape
    m = data.draw(st.integers(1, 4))
    cells = data.draw(st.lists(st.sampled_from([*GRID, float("-inf")]), min_size=q * length * m,
                               max_size=q * length * m))
    scores = torch.tensor(cells, dtype=F64).reshape(q, length, m)
    sizes = None  # runs of m + 1 sentences, or explicit per-slot lengths (whole blocks), 0 included
    if data.draw(st.booleans()):
        cells = data.draw(st.lists(st.integers(0, 7), min_size=q * length * m, max_size=q * length * m))
        sizes = torch.tensor(cells, dtype=torch.long).reshape(q, length, m)
    max_picks = data.draw(st.integers(1, 8))
    margin = data.draw(st.one_of(st.none(), st.sampled_from([0.0, 0.125, 0.5])))
    fast = extents.pick_extents(scores, max_picks, margin, sizes)
    slow = ref.pick_extents(scores, max_picks, margin, sizes)
    for f, s in zip(fast, slow, strict=True):
        assert_same(f, s)
    ids = fast[0]
    assert bool((ids < max_picks).all())
    for row in ids.tolist():  # every pick is one contiguous run
        for t in set(row) - {-1}:
            where = [i for i, v in enumerate(row) if v == t]
            assert where == list(range(where[0], where[-1] + 1))


@SETTINGS
@given(data=st.data(), scan_max=st.sampled_from([0, 1, 2, 5]))
def test_pick_extents_scan_and_steps_agree(data: st.DataObject, scan_max: int) -> None:
    """pick_extents decides a row by one scan when few candidates lie within the margin, else one pick per step:
    with the scan bound lowered, every mix of the two paths still equals the reference (ties are common)."""
    q = data.draw(st.integers(1, 5))
    length = data.draw(st.integers(1, 16))
    m = data.draw(st.integers(1, 4))
    cells = data.draw(st.lists(st.sampled_from([0.0, 0.125, 0.25, 1.0, float("-inf")]), min_size=q * length * m,
                               max_size=q * length * m))
    scores = torch.tensor(cells, dtype=F64).reshape(q, length, m)
    sizes = None
    if data.draw(st.booleans()):
        cells = data.draw(st.lists(st.integers(0, 9), min_size=q * length * m, max_size=q * length * m))
        sizes = torch.tensor(cells, dtype=torch.long).reshape(q, length, m)
    max_picks = data.draw(st.integers(1, 8))
    margin = data.draw(st.sampled_from([0.0, 0.125, 0.25, 2.0, float("inf")]))
    slow = ref.pick_extents(scores, max_picks, margin, sizes)
    saved = extents.SCAN_MAX
    try:
        extents.SCAN_MAX = scan_max
        fast = extents.pick_extents(scores, max_picks, margin, sizes)
    finally:
        extents.SCAN_MAX = saved
    for f, s in zip(fast, slow, strict=True):
        assert_same(f, s)


@SETTINGS
@given(data=st.data())
def test_block_stats(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 12))
    cells = data.draw(st.lists(st.sampled_from(GRID), min_size=n * DIM, max_size=n * DIM))
    vectors = torch.tensor(cells, dtype=F64).reshape(n, DIM)
    keys = torch.tensor(data.draw(run_row(n, False)), dtype=torch.long)
    fast, slow = extents.block_stats(vectors, keys), ref.block_stats(vectors, keys)
    for f, s in zip(fast, slow, strict=True):
        assert_same(f, s)


@SETTINGS
@given(data=st.data())
def test_block_extent_scores(data: st.DataObject) -> None:
    b = data.draw(batches())
    seeds = data.draw(masks(tuple(b["sims"].shape), within=b["valid"]))
    kind = data.draw(st.sampled_from(["paragraph", "section"]))
    sizes, norms = b["blocks"][kind]
    cap = data.draw(st.integers(1, 300))
    args = (b["sims"], b["valid"], b["region"], b[kind], sizes, norms, seeds, b["tokens"], cap)
    fast, slow = extents.block_extent_scores(*args), ref.block_extent_scores(*args)
    for f, s in zip(fast, slow, strict=True):
        assert_same(f, s)
    score, size = fast
    assert bool(((size > 0) == (score > float("-inf"))).all())


@SETTINGS
@given(data=st.data())
def test_focus_on_best(data: st.DataObject) -> None:
    q = data.draw(st.integers(0, 4))
    s = data.draw(st.integers(0, 6))
    cells = data.draw(st.lists(st.sampled_from([*GRID, float("-inf")]), min_size=q * s, max_size=q * s))
    scores = torch.tensor(cells, dtype=F64).reshape(q, s)
    starts = torch.tensor(data.draw(st.lists(st.integers(0, 30), min_size=q * s, max_size=q * s))).reshape(q, s)
    ends = starts + torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=q * s, max_size=q * s))).reshape(q, s)
    regions = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=q * s, max_size=q * s))).reshape(q, s)
    gap = data.draw(st.one_of(st.none(), st.integers(0, 6)))
    far = data.draw(st.one_of(st.none(), st.sampled_from([0.0, 0.125, 0.5])))
    fast = selection.focus_on_best(scores, starts, ends, regions, gap, far)
    assert_same(fast, ref.focus_on_best(scores, starts, ends, regions, gap, far))
    if s:  # the best chunk always survives
        assert torch.equal(fast.max(dim=1).values, scores.max(dim=1).values)


def test_pooled_extent_prefers_a_run_that_answers_together() -> None:
    """Two sentences that each hold half of the query's direction pool into a run closer than either alone;
    a sentence that matches alone stays a sentence."""
    query = torch.tensor([1.0, 1.0, 0.0], dtype=F64) / 2**0.5
    emb = torch.tensor([[[0.0, 0.0, 1.0], [0.8, 0.0, 0.6], [0.0, 0.8, 0.6], [0.0, 0.0, 1.0],
                         [0.7071067811865476, 0.7071067811865476, 0.0], [0.0, 0.0, 1.0]]], dtype=F64)
    sims = (emb * query).sum(-1)
    valid = torch.ones((1, 6), dtype=torch.bool)
    region = torch.tensor([[0, 0, 0, 0, 1, 1]])
    scores = extents.pooled_extent_scores(sims, row_dots(emb, 3), valid, region, valid, 3)
    assert scores[0, 1, 1] > scores[0, 1, 0] and scores[0, 1, 1] > scores[0, 2, 0]  # [1, 2] beats 1 or 2
    assert torch.isinf(scores[0, 3, 1])  # [3, 4] crosses the region boundary
    ids, value = extents.pick_extents(scores, 2)
    assert ids[0].tolist() == [-1, 1, 1, -1, 0, -1]  # the exact sentence 4 first, then the pair [1, 2]
    assert value[0, 4] == pytest.approx(1.0)


def test_reference_has_every_op() -> None:
    from qasc.kernels.pipeline import FastOps

    for name in vars(FastOps):
        if not name.startswith("_"):
            assert callable(getattr(ref, name)), name


PIPE_SETTINGS = budget(300)


@PIPE_SETTINGS
@given(b=batches(), params=qasc_params())
def test_pipeline_reference_matches_fast(b: dict[str, torch.Tensor], params: QascParams) -> None:
    fast = run_both(b, params)
    slow = run_both(b, params, ops=ref)
    for name in ("start", "end", "tokens", "chosen", "piece", "labels", "kept"):
        assert_same(getattr(fast, name), getattr(slow, name))
    for name in ("score", "tau"):
        assert_same(getattr(fast, name), getattr(slow, name))


@budget(100)
@given(b=batches(max_l=40), name=st.sampled_from(["default", "blocks-both", "pooled-focus", "no-margin"]))
def test_pipeline_shipped_settings_match_reference(b: dict[str, torch.Tensor], name: str) -> None:
    """The shipped default (whole sections, length bonus, far chunks) and its neighbours, fast vs reference:
    random params rarely land on them, and their paths (scan picks, block slots) are the ones that run."""
    params = {"default": QascParams(), "blocks-both": QascParams(block_extents="both"),
              "pooled-focus": QascParams(block_extents="none", length_bonus=0.0, far_margin=None),
              "no-margin": QascParams(score_margin=None, top_k=None)}[name]
    fast, slow = run_both(b, params), run_both(b, params, ops=ref)
    for field in ("start", "end", "tokens", "chosen", "piece", "labels", "kept", "score", "tau"):
        assert_same(getattr(fast, field), getattr(slow, field))


@PIPE_SETTINGS
@given(b=batches(), params=qasc_params())
def test_pipeline_batch_equals_single_queries(b: dict[str, torch.Tensor], params: QascParams) -> None:
    together = run_both(b, params)
    for q in range(b["sims"].shape[0]):
        alone = run_both(row_of(b, q), params)
        mine, single = chosen_chunks(together, q), chosen_chunks(alone, 0)
        assert [c[:3] for c in mine] == [c[:3] for c in single]
        assert np.allclose([c[3] for c in mine], [c[3] for c in single], rtol=1e-12, atol=1e-15)
        assert torch.equal(together.labels[q], alone.labels[0])
        assert torch.equal(together.kept[q], alone.kept[0])


@PIPE_SETTINGS
@given(b=batches(), params=qasc_params(), clamp=st.booleans())
def test_pipeline_chunks_respect_cap_and_do_not_overlap(
    b: dict[str, torch.Tensor], params: QascParams, clamp: bool
) -> None:
    if clamp:  # make every sentence fit the cap, so that the cap must hold for every chunk
        b = {**b, "tokens": b["tokens"].clamp(max=params.max_tokens)}
    fits = bool((b["tokens"] <= params.max_tokens).all())
    out = run_both(b, params)
    for q in range(b["sims"].shape[0]):
        chunks = chosen_chunks(out, q)
        for start, end, tokens, _ in chunks:
            assert 0 <= start <= end < b["sims"].shape[1]
            assert bool(b["valid"][q, start : end + 1].all())
            assert tokens == int(b["tokens"][q, start : end + 1].sum())
            if fits:
                assert tokens <= params.max_tokens
        if params.budget_tokens is not None:
            assert sum(c[2] for c in chunks) <= params.budget_tokens
        spans = sorted((s, e) for s, e, _, _ in chunks)
        for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False):
            assert e1 < s2


@SETTINGS
@given(b=batches(), params=qasc_params())
def test_pipeline_tau_is_numpy_percentile(b: dict[str, torch.Tensor], params: QascParams) -> None:
    out = run_both(b, params)
    seeded = b["sims"] + b["boost"] if "boost" in b else b["sims"]  # seeding sees the boosted similarities
    expected = torch.tensor(numpy_percentile(seeded, b["valid"], params.percentile), dtype=F64)
    assert out.tau.shape == (b["sims"].shape[0],)
    assert torch.allclose(out.tau, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("q", [0, 3])
def test_pipeline_all_rows_empty(q: int) -> None:
    length = 5
    b = {
        "sims": torch.zeros((q, length), dtype=F64),
        "valid": torch.zeros((q, length), dtype=torch.bool),
        "region": torch.zeros((q, length), dtype=torch.long),
        "paragraph": torch.zeros((q, length), dtype=torch.long),
        "section": torch.zeros((q, length), dtype=torch.long),
        "tokens": torch.ones((q, length), dtype=torch.long),
        "dots": torch.zeros((q, length, DOTS_WIDTH), dtype=F64),
        "blocks": {k: (torch.ones((q, length), dtype=torch.long), torch.zeros((q, length), dtype=F64))
                   for k in ("paragraph", "section")},
    }
    for ops in (None, ref):
        out = run_both(b, QascParams(), ops=ops)
        assert out.chosen.shape == (q, 0)
        assert torch.isinf(out.tau).all()


# --------------------------------------------------------------------------------------------------- regressions


def test_whole_blocks_pool_the_boost_and_size_zero_is_no_block() -> None:
    """One row, two sections of three sentences (the second holds the best sentence). Every section that fits
    competes (the length bonus makes the second win); a block the engine marks with size 0 (a title's text) is no
    candidate; the boost of a section's rows is pooled into its score."""
    sims = torch.tensor([[0.2, 0.2, 0.2, 0.5, 0.45, 0.45]], dtype=F64)
    emb = torch.tensor([[[1.0, 0.0, 0.0]] * 3 + [[0.0, 1.0, 0.0]] * 3], dtype=F64)  # identical within a section
    section = torch.tensor([[0, 0, 0, 1, 1, 1]])
    blocks = row_blocks(emb, {"paragraph": torch.arange(6)[None], "section": section})
    b = {"sims": sims, "valid": torch.ones_like(sims, dtype=torch.bool), "region": torch.zeros_like(section),
         "paragraph": torch.arange(6)[None], "section": section, "tokens": torch.full_like(section, 10),
         "dots": row_dots(emb), "blocks": blocks}
    params = QascParams(percentile=0.0, max_extent=1, length_bonus=0.5, focus_gap=None, far_margin=None,
                        score_margin=None, top_k=None)

    def first_chunk(batch_input: dict, p: QascParams) -> tuple[int, int]:
        got = chosen_chunks(run_both(batch_input, p), 0)[0]
        return got[0], got[1]

    assert first_chunk(b, params) == (3, 5)  # every section that fits competes
    sizes, norms = blocks["section"]
    untitled = {**b, "blocks": {**blocks, "section": (torch.zeros_like(sizes), norms)}}
    assert first_chunk(untitled, params) == (3, 3)  # size 0: no block, the best sentence
    lifted = torch.tensor([[0.3, 0.3, 0.3, 0.0, 0.0, 0.0]], dtype=F64)  # the first section's heading matches
    assert first_chunk({**b, "boost": lifted}, params) == (0, 2)
    for boost in (None, lifted):  # and the loop twins agree
        both = b if boost is None else {**b, "boost": boost}
        fast, slow = run_both(both, params), run_both(both, params, ops=ref)
        for field in ("start", "end", "score", "chosen"):
            assert_same(getattr(fast, field), getattr(slow, field))


def test_touching_picks_merge_in_one_paragraph_scored_by_the_best() -> None:
    """Single sentences (max_extent 1) around many seeds: every pick its own chunk, picked within the margin; with
    merge_picks (the `context` preset), picks that touch in one paragraph are one chunk scored by its best pick, a
    pick below the margin riding inside it, and a pick in the next paragraph starts another chunk unless the picks
    are not clipped to it."""
    sims = torch.tensor([[0.9, 0.85, 0.5, 0.1, 0.88, 0.1]], dtype=F64)
    emb = torch.eye(6, dtype=F64)[None, :, :3].clone()
    emb[0, :, 0] = 1.0
    paragraph = torch.tensor([[0, 0, 0, 0, 1, 1]])
    b = {"sims": sims, "valid": torch.ones_like(sims, dtype=torch.bool), "region": torch.zeros_like(paragraph),
         "paragraph": paragraph, "section": torch.zeros_like(paragraph), "tokens": torch.full_like(paragraph, 10),
         "dots": row_dots(emb / emb.norm(dim=2, keepdim=True))}
    base = QascParams(percentile=40.0, max_extent=1, block_extents="none", length_bonus=0.0, focus_gap=None,
                      far_margin=None, score_margin=0.1, top_k=None)
    for ops in (None, ref):
        spans = [c[:2] for c in chosen_chunks(run_both(b, base, ops=ops), 0)]
        assert spans == [(0, 0), (4, 4), (1, 1)]  # each pick its own chunk; 0.5 is below the margin
        merged = [c[:2] for c in chosen_chunks(run_both(b, base.replace(merge_picks=True), ops=ops), 0)]
        assert merged == [(0, 2), (4, 4)]  # 0.9, 0.85 and the seed 0.5 below the margin: one chunk
        unclipped = base.replace(clip_to_paragraph=False, percentile=0.0, merge_picks=True)
        assert [c[:2] for c in chosen_chunks(run_both(b, unclipped, ops=ops), 0)] == [(0, 5)]
