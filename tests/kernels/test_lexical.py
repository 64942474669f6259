"""Gated lexical term (kernels.lexical): the vectorized BM25 gather and the gated boost against their loop twins on
random ragged batches (empty batches, rows without terms, queries without known terms, single rows)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels.lexical
import kernels.reference as ref
from kernels.lexical import lexical_boost, lexical_scores

VOCAB = 7


@st.composite
def cases(draw: st.DrawFn) -> dict:
    """A store of N rows as CSR over VOCAB terms (distinct sorted terms per row, some rows empty), Q queries' term
    sets (some empty), and (Q, L) candidate rows with a random validity mask."""
    n = draw(st.integers(1, 6))
    ptr, terms, weights = [0], [], []
    for _ in range(n):
        row = sorted(draw(st.sets(st.integers(0, VOCAB - 1), max_size=4)))
        terms += row
        weights += [draw(st.sampled_from([0.25, 0.5, 1.0, 2.5])) for _ in row]
        ptr.append(len(terms))
    q = draw(st.integers(0, 4))
    l_ = draw(st.one_of(st.just(1), st.integers(0, 5)))
    qptr, qterms = [0], []
    for _ in range(q):
        qterms += sorted(draw(st.sets(st.integers(0, VOCAB - 1), max_size=3)))
        qptr.append(len(qterms))
    rows = [[draw(st.integers(0, n - 1)) for _ in range(l_)] for _ in range(q)]
    valid = [[draw(st.booleans()) for _ in range(l_)] for _ in range(q)]
    long = torch.long
    return {"row_ptr": torch.tensor(ptr, dtype=long), "row_terms": torch.tensor(terms, dtype=long),
            "row_weights": torch.tensor(weights, dtype=torch.float32), "query_ptr": torch.tensor(qptr, dtype=long),
            "query_terms": torch.tensor(qterms, dtype=long), "vocab_size": VOCAB,
            "rows": torch.tensor(rows, dtype=long).reshape(q, l_),
            "valid": torch.tensor(valid, dtype=torch.bool).reshape(q, l_)}


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_lexical_scores_match_reference(case) -> None:
    want = ref.lexical_scores(**case)
    for dense_limit in (kernels.lexical.DENSE_LOOKUP_ELEMENTS, 0):  # the (Q, V) table, then the sorted keys
        old, kernels.lexical.DENSE_LOOKUP_ELEMENTS = kernels.lexical.DENSE_LOOKUP_ELEMENTS, dense_limit
        try:
            out = lexical_scores(**{**case, "row_terms": case["row_terms"].int()})
        finally:
            kernels.lexical.DENSE_LOOKUP_ELEMENTS = old
        assert out.shape == case["rows"].shape and out.dtype == torch.float32
        torch.testing.assert_close(out, want)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), weight=st.sampled_from([0.0, 0.4, 2.0]), max_spread=st.sampled_from([None, 0.0, 0.1]),
       data=st.data())
def test_lexical_boost_matches_reference(case, weight, max_spread, data) -> None:
    scores = lexical_scores(**case)
    q = scores.shape[0]
    best = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0, 4.0]), min_size=q, max_size=q)))
    spread = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.05, 0.3]), min_size=q, max_size=q)))
    out = lexical_boost(scores, case["valid"], best.float(), spread.float(), weight, max_spread)
    torch.testing.assert_close(out, ref.lexical_boost(scores, case["valid"], best.float(), spread.float(), weight,
                                                      max_spread))


def test_boost_is_zero_where_the_gate_is_closed_and_scaled_where_open() -> None:
    scores = torch.tensor([[2.0, 1.0], [2.0, 1.0]])
    valid = torch.tensor([[True, True], [True, False]])
    out = lexical_boost(scores, valid, torch.tensor([4.0, 4.0]), torch.tensor([0.3, 0.0]), 0.8, 0.1)
    assert out[0].tolist() == [0.0, 0.0]  # spread 0.3 >= 0.1: the headings name the subject
    assert out[1].tolist() == pytest.approx([0.4, 0.0])  # 0.8 * 2 / 4; the invalid entry stays 0
    every = lexical_boost(scores, valid, torch.tensor([4.0, 4.0]), torch.tensor([0.3, 0.0]), 0.8, None)
    assert every[0].tolist() == pytest.approx([0.4, 0.2])


def test_an_entry_sums_only_the_terms_its_query_has() -> None:
    # row 0: terms {1: 1.5, 3: 0.5}; row 1: no terms; query 0 has {3, 5}, query 1 has {}
    out = lexical_scores(torch.tensor([0, 2, 2]), torch.tensor([1, 3]), torch.tensor([1.5, 0.5]),
                         torch.tensor([0, 2, 2]), torch.tensor([3, 5]), 6,
                         torch.tensor([[0, 1], [0, 1]]), torch.ones((2, 2), dtype=torch.bool))
    assert out.tolist() == [[0.5, 0.0], [0.0, 0.0]]
