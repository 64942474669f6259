"""The kernels' public helpers against their loop twins in kernels.reference: run bounds and keys (kernels.runs),
similarity ranks (kernels.seeding), the top k with ties and the 8-bit quantisers (kernels.quantize) and the
int8 heading table (kernels.context), on small random inputs with many ties."""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qasc.kernels.context as context
import qasc.kernels.quantize as scan
import qasc.kernels.reference as ref
import qasc.kernels.runs as runs
import qasc.kernels.seeding as seeding

SCALE = float(os.environ.get("KERNELS_HYPOTHESIS_SCALE", "1"))
SETTINGS = settings(max_examples=max(1, int(100 * SCALE)), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
GRID = [k / 4 for k in range(-4, 5)]  # few values: ties everywhere


@st.composite
def int_grid(draw: st.DrawFn, lo: int = -2, hi: int = 3, max_q: int = 4, max_l: int = 12) -> torch.Tensor:
    q, length = draw(st.integers(0, max_q)), draw(st.integers(0, max_l))
    values = draw(st.lists(st.integers(lo, hi), min_size=q * length, max_size=q * length))
    return torch.tensor(values, dtype=torch.long).reshape(q, length)


@st.composite
def float_rows(draw: st.DrawFn, max_q: int = 4, max_l: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """sims (Q, L) float32 on a grid (ties, constant rows, -inf), valid (Q, L) bool."""
    q, length = draw(st.integers(0, max_q)), draw(st.integers(0, max_l))
    sims = draw(st.lists(st.sampled_from([*GRID, float("-inf")]), min_size=q * length, max_size=q * length))
    valid = draw(st.lists(st.booleans(), min_size=q * length, max_size=q * length))
    return (torch.tensor(sims, dtype=torch.float32).reshape(q, length),
            torch.tensor(valid, dtype=torch.bool).reshape(q, length))


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@SETTINGS
@given(int_grid(), st.data())
def test_runs_match_reference(keys: torch.Tensor, data: st.DataObject) -> None:
    valid = torch.tensor(data.draw(st.lists(st.booleans(), min_size=keys.numel(), max_size=keys.numel())),
                         dtype=torch.bool).reshape(keys.shape)
    inner = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=keys.numel(), max_size=keys.numel())),
                         dtype=torch.long).reshape(keys.shape)
    assert torch.equal(runs.positions_like(keys), ref.positions_like(keys))
    for fast, slow in zip(runs.run_bounds(keys), ref.run_bounds(keys), strict=True):
        assert torch.equal(fast, slow)
    assert torch.equal(runs.region_keys(keys, valid), ref.region_keys(keys, valid))
    outer = runs.region_keys(keys, valid)  # -1 where invalid
    assert torch.equal(runs.combine_keys(outer, inner), ref.combine_keys(outer, inner))


@SETTINGS
@given(float_rows(), st.integers(0, 14))
def test_similarity_ranks_match_reference(rows: tuple[torch.Tensor, torch.Tensor], k: int) -> None:
    sims, valid = rows
    assert torch.equal(seeding.similarity_ranks(sims, valid), ref.similarity_ranks(sims, valid))
    assert torch.equal(seeding.top_ranked(sims, valid, k), ref.top_ranked(sims, valid, k))


@SETTINGS
@given(float_rows(), st.integers(1, 14), st.booleans(), st.integers(0, 2**31 - 1))
def test_row_top_k_matches_reference(rows_: tuple[torch.Tensor, torch.Tensor], k: int, with_rows: bool,
                                     seed: int) -> None:
    """The same scores rank by rank and the same (score, row) pairs: equal scores at the cut keep the lower rows
    (their order among equal scores above the cut is torch.topk's)."""
    scores = rows_[0]
    rows = torch.randperm(scores.shape[1], generator=seeded(seed)) * 3 if with_rows else None
    fast_s, fast_r = scan.row_top_k(scores, k, rows)
    slow_s, slow_r = ref.row_top_k(scores, k, rows)
    assert torch.equal(fast_s, slow_s)
    for fs, fr, ss, sr in zip(fast_s.tolist(), fast_r.tolist(), slow_s.tolist(), slow_r.tolist(), strict=True):
        assert sorted(zip(fs, fr, strict=True)) == sorted(zip(ss, sr, strict=True))


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(0, 4), st.sampled_from([0, 1, 3, 8, 16]), st.booleans())
def test_quantisers_match_reference(seed: int, n: int, dim: int, zero_row: bool) -> None:
    """quantize_rows, column_inverse, quantize_columns and int8_products give their twins' integers exactly (the
    step of an all-zero row is left out: any step codes it as zeros)."""
    g = seeded(seed)
    x = torch.randn(n, dim, generator=g) * 3
    if zero_row and n:
        x[0] = 0
    codes, step = scan.quantize_rows(x)
    codes_ref, step_ref = ref.quantize_rows(x)
    assert codes.dtype == codes_ref.dtype == torch.int8 and torch.equal(codes, codes_ref)
    nonzero = x.abs().amax(1) > 0 if dim else torch.zeros(n, dtype=torch.bool)
    assert torch.equal(step[nonzero], step_ref[nonzero])
    scale = x.abs().amax(0) if n else torch.zeros(dim)
    inverse = scan.column_inverse(scale)
    assert torch.equal(inverse, ref.column_inverse(scale))
    y = torch.randn(5, dim, generator=g) * 4  # some beyond the scale: clamped
    assert torch.equal(scan.quantize_columns(y, inverse), ref.quantize_columns(y, inverse))
    other = ref.quantize_columns(y, inverse)
    assert torch.equal(scan.int8_products(codes, other), ref.int8_products(codes, other))


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(0, 6), st.sampled_from([1, 3, 8]))
def test_int8_heading_table_matches_reference(seed: int, n: int, dim: int) -> None:
    emb = torch.randn(n, dim, generator=seeded(seed))
    if n:
        emb[:, 0] = 0  # a dimension without any value: scale 0, codes 0
    for fast, slow in zip(context.int8_heading_table(emb), ref.int8_heading_table(emb), strict=True):
        assert fast.dtype == slow.dtype and torch.equal(fast, slow)
