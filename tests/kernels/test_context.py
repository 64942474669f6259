"""Query-gated heading context (kernels.context): vectorized kernels against their loop twins on random ragged
batches, and the gate's behaviour: neutral without headings or with headings that all match alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels.reference as ref
from kernels.context import context_boost, heading_gate

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
