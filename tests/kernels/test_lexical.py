"""Lexical signal (kernels.lexical): the vectorized BM25 gather against its loop twin on random ragged batches
(empty batches, rows without terms, queries without known terms, single rows)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qasc.kernels.lexical as lexical_module
import qasc.kernels.reference as ref
from qasc.kernels.lexical import lexical_scores

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


MODES = ((lexical_module.DENSE_LOOKUP_ELEMENTS, lexical_module.INT32_INDEX_LIMIT),  # (Q, V) table, int32
         (0, lexical_module.INT32_INDEX_LIMIT),  # (Q, U) table of the batch's terms
         (0, 0), (lexical_module.DENSE_LOOKUP_ELEMENTS, 0))  # both with int64 indices


def in_every_mode(**case) -> list[torch.Tensor]:
    """lexical_scores(**case) with each table and index width of MODES."""
    outs = []
    for dense_limit, index_limit in MODES:
        saved = lexical_module.DENSE_LOOKUP_ELEMENTS, lexical_module.INT32_INDEX_LIMIT
        lexical_module.DENSE_LOOKUP_ELEMENTS, lexical_module.INT32_INDEX_LIMIT = dense_limit, index_limit
        try:
            outs.append(lexical_scores(**case))
        finally:
            lexical_module.DENSE_LOOKUP_ELEMENTS, lexical_module.INT32_INDEX_LIMIT = saved
    return outs


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_lexical_scores_match_reference(case) -> None:
    want = ref.lexical_scores(**case)
    for out in in_every_mode(**{**case, "row_terms": case["row_terms"].int()}):
        assert out.shape == case["rows"].shape and out.dtype == torch.float32
        torch.testing.assert_close(out, want)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), data=st.data())
def test_heading_terms_leave_the_scores_as_in_the_reference(case, data) -> None:
    """With the rows' heading paths (some -1) and each path's terms, a term its row's path holds does not count."""
    n_paths = data.draw(st.integers(1, 3))
    path_ptr, path_terms = [0], []
    for _ in range(n_paths):
        path_terms += sorted(data.draw(st.sets(st.integers(0, VOCAB - 1), max_size=3)))
        path_ptr.append(len(path_terms))
    q, l_ = case["rows"].shape
    paths = torch.tensor([[data.draw(st.integers(-1, n_paths - 1)) for _ in range(l_)] for _ in range(q)],
                         dtype=torch.long).reshape(q, l_)
    heads = {"paths": paths, "path_ptr": torch.tensor(path_ptr), "path_terms": torch.tensor(path_terms)}
    want = ref.lexical_scores(**case, **heads)
    for out in in_every_mode(**case, **heads):
        torch.testing.assert_close(out, want)
    assert bool((want <= ref.lexical_scores(**case) + 1e-6).all())  # leaving terms out never adds
    no_paths = {**heads, "paths": torch.full_like(paths, -1)}
    torch.testing.assert_close(lexical_scores(**case, **no_paths), ref.lexical_scores(**case))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), data=st.data())
def test_each_sum_is_a_float32_fold_in_csr_order(case, data) -> None:
    """Bit for bit: each entry's score is 0 plus its row's matching weights one float32 addition at a time in CSR
    order (ascending term id), whatever the table or index width (answers do not move with the implementation)."""
    weights = torch.tensor(data.draw(st.lists(st.floats(0.125, 1024.0, width=32), min_size=case["row_terms"].numel(),
                                              max_size=case["row_terms"].numel())), dtype=torch.float32)
    case = {**case, "row_weights": weights}
    ptr, terms, w = case["row_ptr"].tolist(), case["row_terms"].tolist(), weights.numpy()
    qptr, qterms = case["query_ptr"].tolist(), case["query_terms"].tolist()
    want = torch.zeros(case["rows"].shape, dtype=torch.float32)
    for q in range(want.shape[0]):
        have = set(qterms[qptr[q] : qptr[q + 1]])
        for j in range(want.shape[1]):
            r = int(case["rows"][q, j])
            if case["valid"][q, j]:
                total = np.float32(0.0)
                for i in range(ptr[r], ptr[r + 1]):
                    if terms[i] in have:
                        total = np.float32(total + w[i])
                want[q, j] = float(total)
    for out in in_every_mode(**case):
        assert torch.equal(out, want)
