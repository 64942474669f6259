"""gathered_dots, entry_dots and segment_first against their loop twins in kernels.reference, random ragged batches."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qasc.kernels.reference as ref
from qasc.kernels import gather


@st.composite
def gather_cases(draw: st.DrawFn) -> dict:
    """A table of 1..9 rows (float32 or float16), Q in 0..4 queries of L in 0..7 entries, any mix of valid and
    padding (padding indices out of range), a block size from 1 element up."""
    n, dim = draw(st.integers(1, 9)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    q, length = draw(st.integers(0, 4)), draw(st.integers(0, 7))
    valid = torch.rand((q, length), generator=g) < draw(st.floats(0.0, 1.0))
    index = torch.where(valid, torch.randint(0, n, (q, length), generator=g), torch.full((q, length), n + 5))
    return {"table": torch.randn((n, dim), generator=g).to(dtype), "query": torch.randn((q, dim), generator=g),
            "index": index, "valid": valid, "block_elements": draw(st.integers(1, 64))}


@settings(max_examples=300, deadline=None, database=None)
@given(gather_cases())
def test_gathered_dots_matches_reference(case: dict) -> None:
    fast = gather.gathered_dots(**case)
    slow = ref.gathered_dots(**case)
    assert fast.shape == slow.shape and fast.dtype == slow.dtype == torch.float32
    assert torch.allclose(fast, slow, atol=1e-4, rtol=1e-4)
    assert torch.all(fast[~case["valid"]] == 0)


def test_gathered_dots_equals_the_padded_product() -> None:
    """The block size does not change the result: one entry per block == everything at once == the dense form."""
    g = torch.Generator().manual_seed(3)
    table, query = torch.randn(50, 16, generator=g).half(), torch.randn(6, 16, generator=g)
    index = torch.randint(0, 50, (6, 11), generator=g)
    valid = torch.rand(6, 11, generator=g) < 0.7
    dense = torch.einsum("qld,qd->ql", table[index].float(), query) * valid
    for block in (1, 16, 17, 1 << 22):
        assert torch.allclose(gather.gathered_dots(table, query, index, valid, block), dense, atol=1e-5)


@settings(max_examples=200, deadline=None, database=None)
@given(gather_cases(), st.integers(0, 2**16))
def test_entry_dots_matches_reference_and_any_subset_has_the_same_bits(case: dict, seed: int) -> None:
    """entry_dots against its twin; any subset of the entries, in any block size (what a partition holding some
    of the rows computes), gives each entry the same bits as all of them at once (engine.partition)."""
    who, col = case["valid"].nonzero(as_tuple=True)
    index = case["index"][who, col]
    fast = gather.entry_dots(case["table"], case["query"], who, index, case["block_elements"])
    slow = ref.entry_dots(case["table"], case["query"], who, index)
    assert fast.shape == slow.shape == who.shape and fast.dtype == torch.float32
    assert torch.allclose(fast, slow, atol=1e-4, rtol=1e-4)
    pick = torch.rand(who.shape[0], generator=torch.Generator().manual_seed(seed)) < 0.5
    part = gather.entry_dots(case["table"], case["query"], who[pick], index[pick], 1 + seed % 97)
    assert torch.equal(part, fast[pick])
    assert torch.equal(fast, gather.gathered_dots(case["table"], case["query"], case["index"], case["valid"])[who, col])


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(0, 4), st.integers(0, 9), st.integers(1, 4), st.integers(0, 2**16))
def test_segment_first_matches_reference(q: int, length: int, n_keys: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(-1, n_keys, (q, length), generator=g).sort(dim=1).values if seed % 2 else \
        torch.randint(-1, n_keys, (q, length), generator=g)
    seg, first = gather.segment_first(keys)
    ref_seg, ref_first = ref.segment_first(keys)
    assert torch.equal(seg, ref_seg) and torch.equal(first, ref_first)
    assert torch.equal(first.gather(1, seg), keys)
