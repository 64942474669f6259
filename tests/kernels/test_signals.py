"""The scoring model (kernels.signals) against its loop twin on random ragged batches: rows with and without
heading paths, invalid entries, empty batches, single rows, every weight zero or not; and its hand-checked form."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qasc.kernels.reference as ref
from qasc.kernels.signals import ScoringModel, normalised_lexical, row_scores

VALUES = st.sampled_from([-0.5, -0.1, 0.0, 0.2, 0.5, 0.9])


@st.composite
def batches(draw: st.DrawFn) -> dict:
    q = draw(st.integers(0, 4))
    n = draw(st.one_of(st.just(1), st.integers(0, 6)))
    grid = lambda strategy: [[draw(strategy) for _ in range(n)] for _ in range(q)]  # noqa: E731
    f32 = lambda rows: torch.tensor(rows, dtype=torch.float32).reshape(q, n)  # noqa: E731
    case = {"cos": f32(grid(VALUES)), "valid": torch.tensor(grid(st.booleans()), dtype=torch.bool).reshape(q, n)}
    if draw(st.booleans()):  # heading signals
        case.update(c=f32(grid(VALUES)), hs=f32(grid(VALUES)),
                    path=torch.tensor(grid(st.integers(-1, 3)), dtype=torch.long).reshape(q, n),
                    spread=torch.tensor([draw(st.sampled_from([0.0, 0.1, 0.4])) for _ in range(q)]),
                    cref=torch.tensor([draw(VALUES) for _ in range(q)]))
    if draw(st.booleans()):  # lexical signal
        case["lex"] = f32(grid(st.sampled_from([0.0, 0.25, 1.0])))
    return case


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches(), heading=st.sampled_from([0.0, 2.0, 12.0]), residual=st.sampled_from([0.0, 0.75]),
       lexical=st.sampled_from([0.0, 0.8]))
def test_row_scores_match_reference(case, heading, residual, lexical) -> None:
    model = ScoringModel(heading, residual, lexical)
    got = row_scores(model, **case)
    plain, boost = ref.row_scores(model, **case)
    assert got.plain.shape == case["cos"].shape and got.boost.dtype == torch.float32
    torch.testing.assert_close(got.plain, plain)
    torch.testing.assert_close(got.boost, boost)
    torch.testing.assert_close(got.total, plain + boost)


@settings(max_examples=100, deadline=None, database=None)
@given(data=st.data(), q=st.integers(0, 3), n=st.integers(0, 4))
def test_normalised_lexical_matches_reference(data, q, n) -> None:
    bm25 = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.5, 3.0]), min_size=q * n, max_size=q * n)))
    best = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0, 6.0]), min_size=q, max_size=q)))
    bm25 = bm25.reshape(q, n).float()
    torch.testing.assert_close(normalised_lexical(bm25, best.float()), ref.normalised_lexical(bm25, best.float()))


def test_the_model_by_hand() -> None:
    """One query, three rows: a headed row, an unheaded row, an invalid row."""
    model = ScoringModel(heading=10.0, residual=0.5, lexical=0.8)
    cos = torch.tensor([[0.6, 0.5, 0.9]])
    valid = torch.tensor([[True, True, False]])
    out = row_scores(model, cos, valid, c=torch.tensor([[0.7, 0.0, 0.7]]), path=torch.tensor([[2, -1, 2]]),
                     hs=torch.tensor([[0.4, 0.0, 0.4]]), spread=torch.tensor([0.2]), cref=torch.tensor([0.5]),
                     lex=torch.tensor([[0.5, 1.0, 1.0]]))
    assert out.plain.tolist()[0] == pytest.approx([0.6 - 0.5 * 0.7 * 0.4 + 0.4, 0.5 + 0.8, 0.0])
    assert out.boost.tolist()[0] == pytest.approx([10 * 0.2 * (0.7 - 0.5), 0.0, 0.0])
    # no gate: the lexical term is the same whatever the heading spread
    wide = row_scores(model, cos, valid, c=torch.tensor([[0.7, 0.0, 0.7]]), path=torch.tensor([[2, -1, 2]]),
                      hs=torch.tensor([[0.4, 0.0, 0.4]]), spread=torch.tensor([0.9]), cref=torch.tensor([0.5]),
                      lex=torch.tensor([[0.5, 1.0, 1.0]]))
    torch.testing.assert_close(wide.plain, out.plain)


def test_weights_are_validated() -> None:
    for bad in ({"heading": -1.0}, {"residual": 3.0}, {"lexical": 11.0}, {"heading": float("inf")}):
        with pytest.raises(ValueError):
            ScoringModel(**bad)
