"""ivf_sq8_topk against its loop twin on random ragged inverted lists, and against FAISS's own IVF SQ8 search."""

from __future__ import annotations

import sys
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qasc.kernels.ivf_scan as scan
import qasc.kernels.reference as ref

TOL = 1e-4


@st.composite
def inverted_lists(draw: st.DrawFn) -> dict:
    """C in 1..5 lists of 0..8 rows each (rows numbered at random, unique), D in 1..16, Q in 0..5 queries, k, nprobe
    (up to C + 1: clamped), codes from all 256 values or from {0, 255} (many equal codes), a budget of codes per
    query (max_codes; 0: none) that cuts lists short or leaves them out."""
    n_lists, dim, n_q = draw(st.integers(1, 5)), draw(st.sampled_from([1, 2, 3, 5, 6, 8, 16])), draw(st.integers(0, 5))
    sizes = draw(st.lists(st.integers(0, 8), min_size=n_lists, max_size=n_lists))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    rows = torch.randperm(sum(sizes) + 5, generator=g)[: sum(sizes)]
    few_codes = draw(st.booleans())
    codes = [torch.randint(0, 2, (n, dim), generator=g).to(torch.uint8) * 255 if few_codes
             else torch.randint(0, 256, (n, dim), generator=g).to(torch.uint8) for n in sizes]
    bounds = np.cumsum([0, *sizes])
    return {"query": torch.randn(n_q, dim, generator=g), "centroids": torch.randn(n_lists, dim, generator=g),
            "list_codes": codes, "list_rows": [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)],
            "vmin": torch.randn(dim, generator=g) * 0.5, "vdiff": torch.rand(dim, generator=g) + 0.1,
            "nprobe": draw(st.integers(1, n_lists + 1)), "k": draw(st.integers(1, 12)),
            "by_residual": draw(st.booleans()), "max_codes": draw(st.sampled_from([0, 0, 1, 3, 7, 20]))}


def assert_same_topk(fast: tuple[torch.Tensor, torch.Tensor], slow: tuple[torch.Tensor, torch.Tensor],
                     exact: dict[int, float] | list[dict[int, float]], tol: float = TOL) -> None:
    """Same shapes, the same scores rank by rank (TOL), missing entries in the same places, and every returned row
    scored as the reference scores it: rows may differ only among near-equal scores (float32 sums vs float64)."""
    (fs, fr), (ss, sr) = fast, slow
    assert fs.shape == ss.shape == fr.shape == sr.shape and fs.dtype == torch.float32 and fr.dtype == torch.long
    assert torch.equal(fr < 0, sr < 0) and torch.equal(torch.isinf(fs), fr < 0)
    ok = fr >= 0
    assert torch.allclose(fs[ok], ss[ok], atol=tol)
    for qi in range(fr.shape[0]):
        got = [r for r in fr[qi].tolist() if r >= 0]
        assert len(set(got)) == len(got)
        for r, s in zip(got, fs[qi].tolist(), strict=False):
            assert abs(exact[qi][r] - s) < tol
        assert fs[qi][ok[qi]].tolist() == sorted(fs[qi][ok[qi]].tolist(), reverse=True)


@settings(max_examples=250, deadline=None, database=None)
@given(inverted_lists(), st.sampled_from([(1, 1, 1), (2, 3, 5), (256, 1 << 23, 1 << 22)]), st.booleans())
def test_ivf_sq8_topk_matches_reference(case: dict, limits: tuple[int, int, int], int8: bool) -> None:
    """Early merges (every list, or every few entries) and small tiles (one query per product) change nothing but
    the memory held; the int8 scan equals its twin's int8 scores (thresholds compared in integer units never drop
    an entry)."""
    case = {**case, "int8": int8}
    with mock.patch.object(scan, "REFRESH_LISTS", limits[0]), mock.patch.object(scan, "MAX_CANDIDATES", limits[1]), \
            mock.patch.object(scan, "SCAN_TILE_ELEMENTS", limits[2]):
        fast = scan.ivf_sq8_topk(**case)
    slow = ref.ivf_sq8_topk(**case)
    n_rows = sum(len(r) for r in case["list_rows"]) or 1
    every_s, every_r = ref.ivf_sq8_topk(**{**case, "k": n_rows})  # every scanned row's reference score
    exact = [{r: s for r, s in zip(rr.tolist(), ss.tolist(), strict=True) if r >= 0}
             for rr, ss in zip(every_r, every_s, strict=True)]
    assert_same_topk(fast, slow, exact)


def vector_case(case: dict, dtype: torch.dtype, table_dtype: torch.dtype) -> dict:
    """An inverted_lists case as an IVF over a table of vectors: the rows its lists name (and a few unlisted) get
    random vectors of the store's dtype (`table_dtype`); the scan's products in `dtype`."""
    n_rows = max([int(r.max()) + 1 for r in case["list_rows"] if len(r)] + [0]) + 2
    g = torch.Generator().manual_seed(n_rows * 7 + case["query"].shape[0])
    vectors = torch.randn(n_rows, case["query"].shape[1], generator=g).to(table_dtype)
    keep = ("query", "centroids", "list_rows", "nprobe", "k", "max_codes")
    if dtype == torch.int8:  # 8-bit products: each dimension's largest |x| as its scale (a zero column: scale 0)
        vectors[:, 0] = 0
        return {**{key: case[key] for key in keep}, "vectors": vectors,
                "int8_scale": vectors.float().abs().amax(0) if len(vectors) else torch.zeros(vectors.shape[1])}
    return {**{key: case[key] for key in keep}, "vectors": vectors, "dtype": dtype}


@settings(max_examples=200, deadline=None, database=None)
@given(inverted_lists(), st.sampled_from([(1, 1, 1), (2, 3, 5), (256, 1 << 23, 1 << 22)]),
       st.sampled_from([torch.float32, torch.bfloat16, torch.int8]), st.sampled_from([torch.float32, torch.float16]))
def test_ivf_vectors_topk_matches_reference(case: dict, limits: tuple[int, int, int], dtype: torch.dtype,
                                            table_dtype: torch.dtype) -> None:
    """The scan over a table's own rows (an IVF whose lists index the stored vectors) gives its twin's top k,
    products in float32, int8 (rows and query weights rounded to 8 bits, as the twin rounds them) or bfloat16
    (inputs and outputs rounded alike; the float64 sum the twin rounds may land
    one bf16 step from the float32 sum the product rounds: tolerance one step at |score| < 16), vectors stored
    float32 or float16, whatever the merges and tiles, with and without a budget of codes."""
    case = vector_case(case, dtype, table_dtype)
    with mock.patch.object(scan, "REFRESH_LISTS", limits[0]), mock.patch.object(scan, "MAX_CANDIDATES", limits[1]), \
            mock.patch.object(scan, "SCAN_TILE_ELEMENTS", limits[2]):
        fast = scan.ivf_vectors_topk(**case)
    slow = ref.ivf_vectors_topk(**case)
    every_s, every_r = ref.ivf_vectors_topk(**{**case, "k": len(case["vectors"])})
    exact = [{r: s for r, s in zip(rr.tolist(), ss.tolist(), strict=True) if r >= 0}
             for rr, ss in zip(every_r, every_s, strict=True)]
    assert_same_topk(fast, slow, exact, 2.0**-3 if dtype == torch.bfloat16 else TOL)


def test_ivf_vectors_topk_empty_inputs() -> None:
    empty = {"centroids": torch.zeros(2, 3), "vectors": torch.zeros(0, 3),
             "list_rows": [torch.zeros(0, dtype=torch.long)] * 2, "nprobe": 2, "k": 4}
    s, r = scan.ivf_vectors_topk(torch.zeros(0, 3), **empty)
    assert s.shape == r.shape == (0, 4)
    s, r = scan.ivf_vectors_topk(torch.ones(2, 3), **empty)  # lists without rows: nothing found
    assert (r == -1).all() and torch.isinf(s).all() and s.shape == (2, 4)
    one = {"centroids": torch.ones(1, 3), "vectors": torch.tensor([[1.0, 0.0, 0.0]]),
           "list_rows": [torch.tensor([0])], "nprobe": 1, "k": 2}
    s, r = scan.ivf_vectors_topk(torch.tensor([[2.0, 1.0, 0.0]]), **one)  # one row: found once, then nothing
    assert r.tolist() == [[0, -1]] and s[0, 0].item() == 2.0 and torch.isinf(s[0, 1])


def test_ivf_vectors_topk_equals_faiss_ivf_flat() -> None:
    """The lists of a FAISS IVF index (engine.store.index.ivf_rows: its centroids and rows, any codes) scored over
    the vectors give FAISS's IndexIVFFlat search, with and without a budget of codes; the rows read from a mapped
    index file (pread beside the mapping) are the ones its lists hold."""
    faiss = pytest.importorskip("faiss")
    from qasc.engine.store import index as faiss_index

    rng = np.random.default_rng(1)
    data = rng.standard_normal((3000, 24)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    flat = faiss.index_factory(24, "IVF16,Flat", faiss.METRIC_INNER_PRODUCT)
    flat.train(data[:2000])
    flat.add(data)
    flat.nprobe = 5
    lists = faiss_index.ivf_rows(flat)
    assert sorted(torch.cat(lists.rows).tolist()) == list(range(3000))
    query = rng.standard_normal((50, 24)).astype(np.float32)
    for max_codes in (0, 1, 150, 700):
        flat.max_codes = max_codes
        want_s, want_r = flat.search(query, 20)
        got_s, got_r = scan.ivf_vectors_topk(torch.from_numpy(query), lists.centroids, torch.from_numpy(data),
                                             lists.rows, flat.nprobe, 20, max_codes=max_codes)
        assert np.array_equal(got_r.numpy() < 0, want_r < 0)
        ok = want_r >= 0
        assert np.allclose(got_s.numpy()[ok], want_s[ok], atol=TOL)
        assert (got_r.numpy() == want_r).mean() > 0.99  # rows may differ only among near-equal scores
    assert faiss_index.ivf_rows(faiss.IndexFlatIP(24)) is None  # not an IVF: FAISS searches it


def test_ivf_rows_of_a_mapped_index_file(tmp_path) -> None:
    """An ivf index read mapped (IO_FLAG_MMAP_IFC) gives the same centroids and rows as one read whole; its ids are
    read from the file (the mapping located in /proc/self/maps), and a file whose lists lie is refused."""
    faiss = pytest.importorskip("faiss")
    from qasc.engine.errors import QascError
    from qasc.engine.store import index as faiss_index
    from qasc.engine.store.files import file_digest

    rng = np.random.default_rng(2)
    data = rng.standard_normal((2000, 16)).astype(np.float32)
    index = faiss.index_factory(16, "IVF8,SQ8", faiss.METRIC_INNER_PRODUCT)
    index.train(data)
    index.add(data)
    path = tmp_path / "index.faiss"
    faiss.write_index(index, str(path))
    sha = file_digest(path)["sha256"]
    whole = faiss_index.ivf_rows(faiss_index.read_index_file(path, sha))
    calls = []
    real = faiss_index._mapped_file
    with mock.patch.object(faiss_index, "_mapped_file", lambda a: calls.append(real(a)) or calls[-1]):
        mapped = faiss_index.ivf_rows(faiss_index.read_index_file(path, sha, mmap=True))
    if sys.platform.startswith("linux"):
        assert calls and calls[0] is not None and calls[0][0] == str(path)
    assert torch.equal(whole.centroids, mapped.centroids)
    assert all(torch.equal(a, b) for a, b in zip(whole.rows, mapped.rows, strict=True))
    dup = faiss.index_factory(16, "IVF8,Flat", faiss.METRIC_INNER_PRODUCT)
    dup.train(data)
    dup.add_with_ids(data[:10], np.full(10, 3, dtype=np.int64))  # every vector under one id: not this store's rows
    with pytest.raises(QascError, match="do not hold each"):
        faiss_index.ivf_rows(dup)


def test_ivf_sq8_topk_empty_inputs() -> None:
    empty = {"centroids": torch.zeros(2, 3), "list_codes": [torch.zeros((0, 3), dtype=torch.uint8)] * 2,
             "list_rows": [torch.zeros(0, dtype=torch.long)] * 2, "vmin": torch.zeros(3), "vdiff": torch.ones(3),
             "nprobe": 2, "k": 4}
    s, r = scan.ivf_sq8_topk(torch.zeros(0, 3), **empty)
    assert s.shape == r.shape == (0, 4)
    s, r = scan.ivf_sq8_topk(torch.ones(2, 3), **empty)  # lists without rows: nothing found
    assert (r == -1).all() and torch.isinf(s).all() and s.shape == (2, 4)


def test_top_k_per_query_orders_ties_by_row() -> None:
    q = torch.tensor([0, 0, 0, 1, 0])
    s = torch.tensor([0.5, 0.9, 0.5, 0.1, 0.5])
    r = torch.tensor([7, 3, 2, 9, 5])
    best_s, best_r = scan.top_k_per_query(q, s, r, 3, 3)
    assert best_r.tolist() == [[3, 2, 5], [9, -1, -1], [-1, -1, -1]]
    assert best_s[0].tolist() == [pytest.approx(0.9), 0.5, 0.5] and torch.isinf(best_s[2]).all()


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.tuples(st.sampled_from([0.5, -0.5, 0.0, -0.0, 1e-30, -1e-30, 3.0e38, float("-inf"),
                                           float("inf"), 0.25]), st.integers(-1, 2**32 - 2)), max_size=40))
def test_rank_keys_order_score_descending_then_row(entries: list[tuple[float, int]]) -> None:
    """Ascending keys = the sort by (-score, row) that Python does, rows -1 after every row of an equal score
    (-0.0 equal to 0.0); ties among identical entries only."""
    s = torch.tensor([e[0] for e in entries], dtype=torch.float32)
    r = torch.tensor([e[1] for e in entries], dtype=torch.long)
    got = [entries[i] for i in torch.argsort(scan.rank_keys(s, r), stable=True).tolist()]
    key = lambda e: (-e[0], e[1] if e[1] >= 0 else float("inf"))  # noqa: E731
    assert [key(e) for e in got] == sorted(key(e) for e in entries)


def test_top_k_per_query_keeps_the_lower_row_of_equal_scores_in_the_merge() -> None:
    """The dense merge (rank_keys, top k) gives the same tables whatever the order the entries arrived in."""
    cand = scan._Candidates(2, 3, torch.device("cpu"))
    cand.add(torch.tensor([0, 0, 1]), torch.tensor([0.5, 0.5, -0.0]), torch.tensor([9, 4, 6]))
    cand.merge()
    cand.add(torch.tensor([0, 1, 1]), torch.tensor([0.5, 0.0, 0.7]), torch.tensor([1, 2, 8]))
    best_s, best_r = cand.merge()
    assert best_r.tolist() == [[1, 4, 9], [8, 2, 6]]
    assert best_s[0].tolist() == [0.5, 0.5, 0.5] and cand.threshold.tolist() == [0.5, 0.0]


def test_ivf_sq8_topk_equals_faiss_search() -> None:
    """The views of a trained FAISS IVF SQ8 index (engine.store.index.sq8_lists) scored by the kernel give FAISS's
    own search results: the decoding formula and the residual to the centroid are FAISS's."""
    faiss = pytest.importorskip("faiss")
    from qasc.engine.store import index as faiss_index

    rng = np.random.default_rng(0)
    data = rng.standard_normal((3000, 24)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    for spec in ("IVF16,SQ8", "IVF16,Flat"):
        index = faiss.index_factory(24, spec, faiss.METRIC_INNER_PRODUCT)
        index.train(data[:2000])
        index.add(data)
        index.nprobe = 5
        lists = faiss_index.sq8_lists(index)
        if spec.endswith("Flat"):  # full vectors: FAISS searches them itself
            assert lists is None
            continue
        assert sum(len(r) for r in lists.rows) == 3000 and lists.by_residual
        query = rng.standard_normal((50, 24)).astype(np.float32)
        for max_codes in (0, 1, 150, 700):  # no budget; a budget inside the first list, across lists, past most
            index.max_codes = max_codes
            want_s, want_r = index.search(query, 20)
            got_s, got_r = scan.ivf_sq8_topk(torch.from_numpy(query), lists.centroids, lists.codes, lists.rows,
                                             lists.vmin, lists.vdiff, index.nprobe, 20, lists.by_residual,
                                             max_codes=max_codes)
            assert np.array_equal(got_r.numpy() < 0, want_r < 0)
            ok = want_r >= 0
            assert np.allclose(got_s.numpy()[ok], want_s[ok], atol=TOL)
            for g, w, ws in zip(got_r.numpy(), want_r, want_s, strict=True):
                clear = ws > ws[w >= 0][-1] + TOL if (w >= 0).any() else ws < ws  # above the cut by more than TOL
                assert set(w[clear]) <= set(g)


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


def test_ivf_sq8_topk_int8_close_to_exact_scores() -> None:
    """int8 scores of 1,000 rows in 8 lists of dimension 64 are within the quantisation bound step / 2 * sum(code)
    of the float scores, and the int8 top 20 holds nearly all of the float top 10."""
    g = torch.Generator().manual_seed(3)
    dim, sizes = 64, [60, 90, 150, 200, 100, 120, 180, 100]
    rows = torch.randperm(sum(sizes), generator=g)
    bounds = np.cumsum([0, *sizes])
    case = {"query": torch.randn(40, dim, generator=g), "centroids": torch.randn(8, dim, generator=g),
            "list_codes": [torch.randint(0, 256, (n, dim), generator=g).to(torch.uint8) for n in sizes],
            "list_rows": [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)],
            "vmin": torch.randn(dim, generator=g) * 0.1, "vdiff": torch.rand(dim, generator=g) * 0.2 + 0.05,
            "nprobe": 3, "by_residual": True}
    every_s, every_r = scan.ivf_sq8_topk(**case, k=sum(sizes))  # exact float scores of every probed row
    approx_s, approx_r = scan.ivf_sq8_topk(**case, k=sum(sizes), int8=True)
    _, step = scan.quantize_rows(case["query"] * (case["vdiff"] / 255))
    code_of = dict(zip(torch.cat(case["list_rows"]).tolist(), torch.cat(case["list_codes"]).sum(1).tolist(),
                       strict=True))
    for qi in range(40):
        exact = {r: s for r, s in zip(every_r[qi].tolist(), every_s[qi].tolist(), strict=True) if r >= 0}
        got = {r: s for r, s in zip(approx_r[qi].tolist(), approx_s[qi].tolist(), strict=True) if r >= 0}
        assert got.keys() == exact.keys()  # the same probed rows
        assert all(abs(got[r] - exact[r]) <= float(step[qi]) / 2 * code_of[r] + TOL for r in got)
    top10 = scan.ivf_sq8_topk(**case, k=10)[1]
    top20 = scan.ivf_sq8_topk(**case, k=20, int8=True)[1]
    found = np.mean([len(set(a.tolist()) & set(b.tolist())) / 10 for a, b in zip(top10, top20, strict=True)])
    assert found >= 0.95


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
