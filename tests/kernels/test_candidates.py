"""candidate_rows against its loop twin in kernels.reference on random stores and hits."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qasc.kernels.reference as ref
from qasc.kernels import candidates


@st.composite
def stores_and_hits(draw: st.DrawFn) -> dict:
    """A non-empty store of 1..6 documents (0..6 rows each), Q in 0..4 queries of K in 0..6 hits (-1 = none);
    with blocks: each document cut into blocks, those of at most block_rows rows brought whole."""
    lengths = draw(st.lists(st.integers(0, 6), min_size=1, max_size=6).filter(lambda ns: sum(ns) > 0))
    n_total = sum(lengths)
    first, last, b_first, b_last = [], [], [], []
    block_rows = draw(st.integers(1, 5))
    start = 0
    for n in lengths:
        first += [start] * n
        last += [start + n - 1] * n
        cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=3))) if n > 1 else []
        for a, b in zip([0, *cuts], [*cuts, n], strict=True):
            whole = b - a <= block_rows
            for r in range(a, b):
                b_first.append(start + (a if whole else r))
                b_last.append(start + (b - 1 if whole else r))
        start += n
    q, k = draw(st.integers(0, 4)), draw(st.integers(0, 6))
    rows = st.integers(-1, n_total - 1)
    hits = [draw(st.lists(rows, min_size=k, max_size=k)) for _ in range(q)]
    return {"hits": torch.tensor(hits, dtype=torch.long).reshape(q, k),
            "doc_first": torch.tensor(first, dtype=torch.long), "doc_last": torch.tensor(last, dtype=torch.long),
            "neighbourhood": draw(st.integers(0, 3)), "n_total": n_total,
            **({"block_first": torch.tensor(b_first, dtype=torch.long),
                "block_last": torch.tensor(b_last, dtype=torch.long), "block_rows": block_rows}
               if draw(st.booleans()) else {})}


@settings(max_examples=300, deadline=None, database=None)
@given(stores_and_hits())
def test_candidate_rows_matches_reference(case: dict) -> None:
    fast = candidates.candidate_rows(**case)
    slow = ref.candidate_rows(**case)
    for name in ("rows", "valid", "region"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert torch.equal(a, b), name


def test_candidate_rows_regions_split_at_documents() -> None:
    """Two adjacent rows of different documents are two regions; a gap inside one document too."""
    doc_first = torch.tensor([0, 0, 0, 3, 3, 3])
    doc_last = torch.tensor([2, 2, 2, 5, 5, 5])
    got = candidates.candidate_rows(torch.tensor([[2, 3, -1]]), doc_first, doc_last, 1, 6)
    assert got.rows.tolist() == [[1, 2, 3, 4]]
    assert got.region.tolist() == [[1, 1, 2, 2]]
    got = candidates.candidate_rows(torch.tensor([[0, 5]]), doc_first, doc_last, 0, 6)
    assert got.region.tolist() == [[1, 2]] and got.valid.all()


def test_candidate_rows_bring_whole_blocks() -> None:
    """A hit brings its whole block (rows 1..4) beyond its neighbourhood, never past its document's end."""
    doc_first = torch.tensor([0] * 6 + [6] * 2)
    doc_last = torch.tensor([5] * 6 + [7] * 2)
    block_first = torch.tensor([0, 1, 1, 1, 1, 5, 6, 7])
    block_last = torch.tensor([0, 4, 4, 4, 4, 5, 6, 7])
    got = candidates.candidate_rows(torch.tensor([[2, 6]]), doc_first, doc_last, 0, 8, block_first, block_last, 4)
    assert got.rows.tolist() == [[1, 2, 3, 4, 6]]
    assert got.region.tolist() == [[1, 1, 1, 1, 2]]
    got = candidates.candidate_rows(torch.tensor([[2, 6]]), doc_first, doc_last, 0, 8)
    assert got.rows.tolist() == [[2, 6]]
