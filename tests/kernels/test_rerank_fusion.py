"""The rerank stage's fusion (kernels.signals.rerank_scores) against its loop twin on random ragged batches, and
its rule by hand: z-scores of both signals added, a flat signal counting 0, -inf where invalid."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qasc.kernels.reference as ref
from qasc.kernels.signals import rerank_scores

VALUES = st.sampled_from([-3.0, -0.5, 0.0, 0.1, 0.2, 0.7, 2.5, 8.0])


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data(), q=st.integers(0, 4), n=st.one_of(st.just(1), st.integers(0, 7)))
def test_rerank_scores_match_reference(data, q, n) -> None:
    grid = lambda strategy: data.draw(st.lists(strategy, min_size=q * n, max_size=q * n))  # noqa: E731
    first = torch.tensor(grid(VALUES), dtype=torch.float32).reshape(q, n)
    cross = torch.tensor(grid(VALUES), dtype=torch.float32).reshape(q, n)
    valid = torch.tensor(grid(st.booleans()), dtype=torch.bool).reshape(q, n)
    got = rerank_scores(first, cross, valid)
    want = ref.rerank_scores(first, cross, valid)
    assert got.shape == (q, n) and got.dtype == torch.float32
    assert torch.equal(torch.isinf(got), ~valid)
    torch.testing.assert_close(got, want)


def test_the_fusion_by_hand() -> None:
    """Scores [1, 2, 3] z to [-1.22, 0, 1.22]; a cross-encoder that reverses them cancels the first stage out, an
    invalid entry is -inf and counts in neither mean; one valid candidate, or equal scores, z to 0."""
    first = torch.tensor([[1.0, 2.0, 3.0, 9.0], [5.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    cross = torch.tensor([[30.0, 20.0, 10.0, -7.0], [-4.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    valid = torch.tensor([[True, True, True, False], [True, False, False, False], [True] * 4])
    out = rerank_scores(first, cross, valid)
    torch.testing.assert_close(out[0, :3], torch.zeros(3))
    assert out[0, 3] == -math.inf
    assert out[1, 0] == 0.0 and bool(torch.isinf(out[1, 1:]).all())
    z = (torch.arange(4.0) - 1.5) / math.sqrt(1.25)
    torch.testing.assert_close(out[2], z)
