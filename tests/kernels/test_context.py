"""Query-gated heading context (kernels.context): vectorized kernels against their loop twins on random ragged
batches, the gate's behaviour (neutral without headings or with headings that all match alike), and the heading
residual's (q . s - beta (q . h)(h . s): what a row says beyond its heading)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qasc.kernels.reference as ref
from qasc.kernels import context
from qasc.kernels.context import context_boost, heading_gate, heading_residual, int8_heading_table

GRID = [k / 8 for k in range(-8, 9)]


@st.composite
def pools(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(c, path, valid) of shape (Q, M): Q in 0..5, M in 0..12, validity a per-row prefix (empty rows too),
    paths from a small alphabet with -1 (no heading); c is a function of (query, path), as in the engine."""
    q = draw(st.integers(0, 5))
    m = draw(st.one_of(st.just(1), st.integers(0, 12)))
    cs, paths, valids = [], [], []
    for _ in range(q):
        table = draw(st.lists(st.sampled_from(GRID), min_size=5, max_size=5))
        row = draw(st.lists(st.integers(-1, 4), min_size=m, max_size=m))
        n_valid = draw(st.integers(0, m))
        paths.append(row)
        cs.append([table[p] if p >= 0 else draw(st.sampled_from(GRID)) for p in row])
        valids.append([i < n_valid for i in range(m)])
    shape = (q, m)
    return (torch.tensor(cs, dtype=torch.float64).reshape(shape), torch.tensor(paths, dtype=torch.int64).reshape(shape),
            torch.tensor(valids, dtype=torch.bool).reshape(shape))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=pools(), weight=st.sampled_from([0.0, 0.5, 4.0]))
def test_gate_and_boost_match_reference(pool, weight: float) -> None:
    c, path, valid = pool
    spread, cref = heading_gate(c, path, valid)
    r_spread, r_cref = ref.heading_gate(c, path, valid)
    torch.testing.assert_close(spread, r_spread)
    torch.testing.assert_close(cref, r_cref)
    assert spread.shape == (c.shape[0],) and bool((spread >= 0).all())
    boost = context_boost(c, path, valid, spread, cref, weight)
    torch.testing.assert_close(boost, ref.context_boost(c, path, valid, spread, cref, weight))
    assert bool((boost[~valid | (path < 0)] == 0).all())


def test_no_headings_is_exactly_neutral() -> None:
    c = torch.tensor([[0.9, 0.1, 0.5]])
    path = torch.full((1, 3), -1)
    valid = torch.ones((1, 3), dtype=torch.bool)
    spread, cref = heading_gate(c, path, valid)
    assert spread.tolist() == [0.0] and cref.tolist() == [0.0]
    assert context_boost(c, path, valid, spread, cref, 4.0).abs().sum().item() == 0.0


def test_headings_that_match_alike_are_neutral() -> None:
    c = torch.tensor([[0.3, 0.3, 0.3, 0.3]])  # four rows under two paths that match the query equally
    path = torch.tensor([[0, 0, 1, 1]])
    valid = torch.ones((1, 4), dtype=torch.bool)
    spread, cref = heading_gate(c, path, valid)
    assert spread.item() == 0.0 and cref.item() == pytest.approx(0.3)
    assert context_boost(c, path, valid, spread, cref, 4.0).abs().sum().item() == 0.0


def test_informative_heading_lifts_its_rows_and_counts_paths_once() -> None:
    # path 2 matches the query (0.8); paths 0, 1, 3 do not (0.1, 0.2, 0.3). Path 0 fills most of the pool, but
    # the median is over distinct paths: (0.2 + 0.3) / 2 = 0.25, not path 0's 0.1.
    c = torch.tensor([[0.1, 0.1, 0.1, 0.1, 0.2, 0.8, 0.3]], dtype=torch.float64)
    path = torch.tensor([[0, 0, 0, 0, 1, 2, 3]])
    valid = torch.ones((1, 7), dtype=torch.bool)
    spread, cref = heading_gate(c, path, valid)
    np.testing.assert_allclose(cref.numpy(), [0.25])
    np.testing.assert_allclose(spread.numpy(), [0.55])
    boost = context_boost(c, path, valid, spread, cref, 2.0)
    np.testing.assert_allclose(boost[0, 5].item(), 2.0 * 0.55 * 0.55)
    assert boost[0, 5] > 0 and bool((boost[0, :5] < 0).all())


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=pools(), beta=st.sampled_from([0.0, 0.5, 0.75, 2.0]), data=st.data())
def test_heading_residual_matches_reference(pool, beta: float, data) -> None:
    c, path, valid = pool
    hs = torch.tensor(data.draw(st.lists(st.sampled_from(GRID), min_size=c.numel(), max_size=c.numel())),
                      dtype=torch.float64).reshape(c.shape)
    out = heading_residual(c, hs, path, valid, beta)
    torch.testing.assert_close(out, ref.heading_residual(c, hs, path, valid, beta))
    assert out.shape == c.shape and out.dtype == c.dtype
    assert bool((out[~valid | (path < 0)] == 0).all())


def test_heading_residual_is_the_query_against_the_row_minus_its_heading() -> None:
    """sim + residual = q . (I - beta h h^T) s: the row with the same heading match but more of its own content
    keeps more of its similarity; beta = 0 leaves every similarity as it was."""
    g = torch.Generator().manual_seed(0)
    q, h = (torch.nn.functional.normalize(torch.randn(16, generator=g), dim=0) for _ in range(2))
    s = torch.nn.functional.normalize(torch.randn(3, 16, generator=g), dim=1)
    s[0] = torch.nn.functional.normalize(h + 0.1 * s[0], dim=0)  # a row that restates its heading
    sims, c, hs = (s @ q)[None], (q @ h).expand(1, 3), (s @ h)[None]
    path, valid = torch.tensor([[0, 0, -1]]), torch.ones((1, 3), dtype=torch.bool)
    beta = 0.75
    got = sims + heading_residual(c, hs, path, valid, beta)
    projected = s - beta * (s @ h)[:, None] * h[None]  # the rows without beta of their heading direction
    torch.testing.assert_close(got[0, :2], (projected @ q)[:2])
    assert got[0, 2] == sims[0, 2]  # no heading: unchanged
    assert bool((heading_residual(c, hs, path, valid, 0.0) == 0).all())


@st.composite
def path_cases(draw: st.DrawFn) -> dict:
    """Q in 0..4 queries, H in 1..12 heading paths, small integer entries: every dot product is exact in float32
    and bfloat16, so ties are common and exact and the order must follow the contract (lower path first); the
    shortlist is float32, bfloat16 or int8 (`int8_heading_table`)."""
    q, h, dim = draw(st.integers(0, 4)), draw(st.integers(1, 12)), draw(st.integers(1, 5))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    emb = torch.randint(-2, 3, (h, dim), generator=g).float()
    low = draw(st.sampled_from([None, "bf16", "int8"]))
    table, scale = int8_heading_table(emb) if low == "int8" else (emb.bfloat16() if low else None, None)
    return {"query": torch.randint(-2, 3, (q, dim), generator=g).float(), "heading_emb": emb,
            "j": draw(st.integers(1, 14)), "heading_low": table, "low_scale": scale,
            "block_elements": draw(st.integers(1, 40))}


@settings(max_examples=300, deadline=None, database=None)
@given(path_cases())
def test_best_paths_matches_reference(case: dict) -> None:
    scores, paths = context.best_paths(**case)
    ref_scores, ref_paths = ref.best_paths(**case)
    assert scores.shape == ref_scores.shape == paths.shape and paths.dtype == torch.long
    # the shortlist is re-scored in float32, exact on these small integers; int8 rounds each product by less
    # than 0.5 here (5 dimensions of entries <= 2 in steps of 1/127 of the largest), so unequal scores keep their
    # order in it too
    assert torch.equal(scores, ref_scores)
    if case["heading_low"] is None:  # exact: equal scores keep the lower paths
        assert torch.equal(paths, ref_paths)
    else:  # the shortlist's cut among equal low-precision scores is arbitrary: only equal scores may swap
        own = (case["query"][:, None, :] * case["heading_emb"][paths]).sum(-1)
        assert torch.equal(own, scores) and all(len(set(r)) == len(r) for r in paths.tolist())


def test_best_paths_shortlist_rescored_exactly() -> None:
    """Through a bfloat16 or an int8 shortlist the scores are the float32 ones, and the paths those of the exact product
    (random unit vectors: no near-ties at the cut)."""
    g = torch.Generator().manual_seed(5)
    emb = torch.nn.functional.normalize(torch.randn(300, 32, generator=g), dim=1)
    query = torch.nn.functional.normalize(torch.randn(20, 32, generator=g), dim=1)
    exact_s, exact_p = context.best_paths(query, emb, 8)
    for low, scale in ((emb.bfloat16(), None), int8_heading_table(emb)):
        s, p = context.best_paths(query, emb, 8, low, block_elements=1000, low_scale=scale)
        assert torch.equal(p, exact_p) and torch.allclose(s, exact_s, atol=1e-6)
        assert torch.allclose(s, (query @ emb.T).topk(8, dim=1).values, atol=1e-6)
    with pytest.raises(ValueError, match="low_scale"):
        context.best_paths(query, emb, 8, int8_heading_table(emb)[0])


@settings(max_examples=200, deadline=None, database=None)
@given(counts=st.lists(st.integers(0, 5), min_size=1, max_size=6), n_q=st.integers(0, 4), n_j=st.integers(1, 4),
       seed=st.integers(0, 2**31 - 1), cap=st.sampled_from([None, 1, 3]))
def test_packed_path_rows_equals_reference(counts: list[int], n_q: int, n_j: int, seed: int, cap: int | None):
    """Random CSR paths (empty ones too, entries in any order, capped counts as the engine passes them) and
    random path picks per query (repeats too): the same valid rows in the same order, as wide as the longest."""
    from qasc.kernels.context import packed_path_rows

    g = torch.Generator().manual_seed(seed)
    count = torch.tensor(counts, dtype=torch.long)
    start = torch.cumsum(count, 0) - count
    rows = torch.randperm(int(count.sum()) + 3, generator=g)[: int(count.sum())]
    paths = torch.randint(0, len(counts), (n_q, n_j), generator=g)
    used = count if cap is None else count.clamp(max=cap)
    got_rows, got_valid = packed_path_rows(paths, start, used, rows)
    want_rows, want_valid = ref.packed_path_rows(paths, start, used, rows)
    assert got_rows.shape == got_valid.shape == want_rows.shape and torch.equal(got_valid, want_valid)
    assert torch.equal(got_rows[got_valid], want_rows[want_valid])


@settings(max_examples=200, deadline=None, database=None)
@given(m=st.integers(0, 5), n=st.integers(1, 400), wide=st.integers(1, 12), group=st.sampled_from([1, 2, 4, 8]),
       levels=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([torch.int32, torch.float32]))
def test_shortlist_top_holds_a_top_set(m, n, wide, group, levels, seed, dtype):
    """shortlist_top's columns are distinct, and their scores are those of its loop twin's columns (the row's `wide`
    largest, as a multiset: equal scores at the cut may be any of them), on few distinct values (ties everywhere),
    partial last groups and rows of one group too."""
    from qasc.kernels.context import shortlist_top

    wide = min(wide, n)
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (m, n), generator=g).to(dtype)
    cols = shortlist_top(scores, wide, group)
    assert cols.shape == (m, wide) and cols.dtype == torch.long
    assert all(len(set(r)) == wide for r in cols.tolist())
    got = scores.gather(1, cols).sort(dim=1).values
    assert torch.equal(got, scores.gather(1, ref.shortlist_top(scores, wide, group)).sort(dim=1).values)
