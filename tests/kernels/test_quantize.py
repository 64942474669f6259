"""kernels.quantize: the top k keeps the lower rows at a tie, the 8-bit quantisers round within half a step (their
loop twins: tests/kernels/test_reference_helpers.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qasc.kernels.quantize as scan


def test_row_top_k_keeps_lower_rows_at_a_tie() -> None:
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4]])
    rows = torch.tensor([40, 10, 30, 20])
    best, got = scan.row_top_k(scores, 2, rows)
    assert got.tolist() == [[10, 20], [20, 30]] and torch.allclose(best, torch.tensor([[0.9, 0.5], [0.4, 0.3]]))
    best, got = scan.row_top_k(scores, 9, rows)  # k beyond the list: all of it
    assert got.shape == (2, 4) and sorted(got[0].tolist()) == [10, 20, 30, 40]


@settings(max_examples=100, deadline=None, database=None)
@given(st.integers(0, 6), st.integers(0, 40), st.integers(0, 2**31 - 1), st.booleans())
def test_quantize_rows_within_half_a_step(n: int, dim: int, seed: int, zero_row: bool) -> None:
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)) * 10 ** torch.randint(-6, 3, (n, 1)).float()
    if zero_row and n:
        x[0] = 0
    codes, step = scan.quantize_rows(x)
    assert codes.dtype == torch.int8 and codes.shape == x.shape and step.shape == (n,) and (step > 0).all()
    assert (codes.abs() <= 127).all()
    assert ((x - step[:, None] * codes.float()).abs() <= step[:, None] / 2 * (1 + 1e-5)).all()
    if dim and n:  # the largest |x| of a nonzero row lands on +-127
        nonzero = x.abs().amax(1) > 0
        assert (codes[nonzero].abs().amax(1) == 127).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_columns_rounds_per_dimension_and_leaves_its_input_alone(dtype: torch.dtype) -> None:
    x = (torch.randn(50, 24, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.01, 3, 24)).to(dtype)
    before = x.clone()
    scale = x.float().abs().amax(0)
    scale[5] = 0  # a dimension that is 0 everywhere
    x[:, 5] = 0
    before[:, 5] = 0
    codes = scan.quantize_columns(x, scan.column_inverse(scale))
    assert torch.equal(x, before)  # rounded in a temporary, never in the caller's rows (float32 included)
    assert codes.dtype == torch.int8 and codes.shape == x.shape and (codes.abs() <= 127).all()
    assert (codes[:, 5] == 0).all()
    want = torch.round(x.float() * (127 / scale.clamp(min=1e-30))).clamp(-127, 127)
    want[:, 5] = 0
    assert torch.equal(codes.float(), want)
