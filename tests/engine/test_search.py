"""engine.store.search on real MiniLM vectors (chroma_general's sentences, the bundled model): in every ivf mode
that ships (full vectors, stores written before SQ8; 8-bit codes, re-ranked 2 x k) the searcher gives FAISS's own
hits or better, its recall against the exact top k is reported and bounded, and the exact searcher gives the
brute-force top k. The list-major search (many queries at once) gives `index.search`'s hits in both modes, on real
vectors and on random ragged lists (empty lists, lists shorter than k, k beyond the store, nprobe beyond nlist)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from qasc.engine.errors import QascError
from qasc.engine.store import index as faiss_index
from qasc.engine.store.search import (
    LIST_MAJOR_MIN_VISITS,
    ExactSearcher,
    FaissSearcher,
    IvfSettings,
    goes_list_major,
    ivf_params,
    list_major_search,
    store_searcher,
)
from tests.conftest import REPO

CORPORA = REPO.parent / "shared" / "data" / "chroma_general" / "corpora"
N_ROWS, N_QUERIES, K, NLIST = 1500, 150, 8, 32


@pytest.fixture(scope="module")
def real_vectors(embedder) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows (1500, 384), queries (150, 384)) float32 unit vectors: chroma_general's first sentences embedded, the
    queries the sentences after them (not in the rows)."""
    if not CORPORA.is_dir():
        pytest.skip(f"{CORPORA} is not here")
    text = " ".join(p.read_text(encoding="utf-8") for p in sorted(CORPORA.glob("*.md")))
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if len(s.strip()) >= 30]
    assert len(sentences) >= N_ROWS + N_QUERIES
    emb = torch.as_tensor(np.asarray(embedder.encode(sentences[: N_ROWS + N_QUERIES]), dtype=np.float32))
    return emb[:N_ROWS].contiguous(), emb[N_ROWS:].contiguous()


def ivf_index(rows: torch.Tensor, codes: str):
    params = {"nlist": NLIST, "nprobe": 4, "codes": codes}
    index = faiss_index.new_index("ivf", rows.shape[1], params)
    faiss_index.train(index, rows.numpy())
    faiss_index.add(index, rows.numpy())
    return index


def recall(hits: torch.Tensor, exact: torch.Tensor) -> float:
    return faiss_index.recall_at_depth(hits, exact)


@pytest.mark.slow
def test_exact_searcher_is_the_brute_force_top_k(real_vectors) -> None:
    rows, queries = real_vectors
    scores, hits = ExactSearcher(rows).search(queries, K)
    want = (queries @ rows.T).topk(K, dim=1)  # the same scores; rows may differ among duplicate sentences
    assert torch.allclose(scores, want.values, atol=1e-5) and recall(hits, want.indices) >= 0.99
    assert torch.allclose((queries[:, None, :] * rows[hits]).sum(-1), scores, atol=1e-5)
    half_s, half_r = ExactSearcher(rows.half()).search(queries, K)  # a float16 store: the same rows, fp16 scores
    assert recall(half_r, hits) >= 0.99 and torch.allclose(half_s, scores, atol=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("codes, rerank", [("Flat", 1), ("SQ8", 2)])
def test_ivf_searcher_gives_faiss_hits_on_real_vectors(real_vectors, codes: str, rerank: int) -> None:
    """Per nprobe: full vectors give FAISS's own hits and scores exactly; 8-bit codes re-ranked exactly find at
    least what FAISS's own 8-bit top k finds of the exact top k (the recall is printed: pytest -s)."""
    rows, queries = real_vectors
    index = ivf_index(rows, codes)
    exact_s, exact = ExactSearcher(rows).search(queries, K)
    for nprobe in (1, 4, 8, NLIST):
        searcher = store_searcher("ivf", index, rows, {"rerank": rerank}, IvfSettings(nprobe))
        assert isinstance(searcher, FaissSearcher) and searcher.rerank == rerank
        got_s, got_r = searcher.search(queries, K)
        index.nprobe = nprobe  # FAISS's own search, configured the old way
        own_s, own_r = (torch.from_numpy(a) for a in faiss_index.search(index, queries.numpy(), K))
        index.nprobe = 1
        r_got, r_own = recall(got_r, exact), recall(own_r, exact)
        print(f"{codes} nprobe {nprobe}: recall@{K} searcher {r_got:.4f}, FAISS alone {r_own:.4f}")
        if codes == "Flat":  # list by list from nprobe 8 on (150 x 8 probes >= 32 x 32 lists): ties may swap
            assert_same_hits((got_s.numpy(), got_r.numpy()), (own_s.numpy(), own_r.numpy()))
        else:
            assert r_got >= r_own
            found = got_r >= 0  # every hit's score is its exact inner product
            exact_dots = (queries[:, None, :] * rows[got_r.clamp(min=0)]).sum(-1)
            assert torch.allclose(got_s[found], exact_dots[found], atol=1e-5)
        if nprobe == NLIST:  # every list probed: the exact top k's scores (full vectors), nearly (8-bit codes)
            assert r_got >= 0.98
            if codes == "Flat":
                assert torch.allclose(got_s, exact_s, atol=1e-5)
    budget = store_searcher("ivf", index, rows, {"rerank": rerank}, IvfSettings(NLIST, 50)).search(queries, K)[1]
    assert recall(budget, exact) < recall(store_searcher("ivf", index, rows, {"rerank": rerank},
                                                         IvfSettings(NLIST)).search(queries, K)[1], exact)
    assert index.nprobe == 1 and index.max_codes == 0  # settings are passed per search, never set on the index


def test_store_searcher_by_kind_and_settings() -> None:
    rows = torch.nn.functional.normalize(torch.randn(300, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    assert isinstance(store_searcher("flat", None, rows, {}, IvfSettings()), ExactSearcher)
    assert isinstance(store_searcher("ivf", None, rows, {"rerank": 2}, IvfSettings()), ExactSearcher)  # not loaded
    flat = faiss_index.new_index("flat", 16, {})
    faiss_index.add(flat, rows.numpy())
    loaded = store_searcher("flat", flat, rows, {}, IvfSettings())
    assert isinstance(loaded, FaissSearcher) and loaded.rerank == 1
    assert torch.equal(loaded.search(rows[:5], 3)[1][:, 0], torch.arange(5))
    assert ivf_params(flat, IvfSettings()) is None
    with pytest.raises(QascError, match="max_codes applies to an ivf index"):
        ivf_params(flat, IvfSettings(None, 10))
    for bad in ({"nprobe": 0}, {"nprobe": True}, {"max_codes": -1}, {"max_codes": 1.5}):
        with pytest.raises(QascError):
            IvfSettings(**bad)
    with pytest.raises(QascError, match="k must be a positive integer"):
        ExactSearcher(rows).search(rows[:2], 0)


def faiss_hits(index, queries: np.ndarray, k: int, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
    faiss = faiss_index._faiss()
    return faiss_index.search(index, queries, k, faiss.SearchParametersIVF(nprobe=min(nprobe, index.nlist)))


def assert_same_hits(got: tuple[np.ndarray, np.ndarray], own: tuple[np.ndarray, np.ndarray]) -> None:
    """The same rows in the same order, up to swaps among scores equal within float rounding; scores within 1e-5."""
    (got_s, got_r), (own_s, own_r) = got, own
    assert got_r.shape == own_r.shape and np.array_equal(got_r < 0, own_r < 0)
    assert np.allclose(np.where(got_r < 0, 0, got_s), np.where(own_r < 0, 0, own_s), atol=1e-5)
    differ = got_r != own_r
    for q in np.flatnonzero(differ.any(axis=1)):  # a swap of two near-equal scores, nothing else
        assert sorted(got_r[q]) == sorted(own_r[q]) or np.ptp(own_s[q][differ[q]]) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("codes", ["Flat", "SQ8"])
def test_list_major_search_gives_faiss_hits_on_real_vectors(real_vectors, codes: str) -> None:
    rows, queries = real_vectors
    index = ivf_index(rows, codes)
    for nprobe in (1, 4, 8, NLIST):
        got = list_major_search(index, queries.numpy(), 2 * K, nprobe)
        assert_same_hits(got, faiss_hits(index, queries.numpy(), 2 * K, nprobe))


@pytest.mark.parametrize("codes", ["Flat", "SQ8"])
@pytest.mark.parametrize("seed", range(4))
def test_list_major_search_equals_faiss_on_ragged_lists(codes: str, seed: int) -> None:
    """Clustered random rows (some lists empty, some shorter than k), k up to beyond the store, nprobe up to beyond
    nlist, one query and none."""
    gen = np.random.default_rng(seed)
    dim, nlist = 12, 24
    centres = gen.standard_normal((5, dim))
    n = int(gen.integers(30, 200))
    rows = centres[gen.integers(0, 5, n)] + 0.3 * gen.standard_normal((n, dim))
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    index = faiss_index.new_index("ivf", dim, {"nlist": nlist, "nprobe": 1, "codes": codes})
    faiss_index.train(index, np.concatenate([rows, gen.standard_normal((nlist * 40, dim)).astype(np.float32)]))
    faiss_index.add(index, rows)
    sizes = [index.invlists.list_size(lst) for lst in range(nlist)]
    assert 0 in sizes  # the random training points made lists the clustered rows leave empty
    queries = gen.standard_normal((int(gen.integers(1, 60)), dim)).astype(np.float32)
    for k in (1, 8, n + 5):
        for nprobe in (1, 3, nlist, nlist + 7):
            assert_same_hits(list_major_search(index, queries, k, nprobe), faiss_hits(index, queries, k, nprobe))
    one = list_major_search(index, queries[:1], 4, 3)
    assert one[0].shape == (1, 4)
    none = list_major_search(index, queries[:0], 4, 3)
    assert none[0].shape == (0, 4) and none[1].dtype == np.int64


def test_searcher_goes_list_major_only_for_many_queries_and_no_codes_budget() -> None:
    faiss = faiss_index._faiss()
    rows = torch.nn.functional.normalize(torch.randn(2000, 16, generator=torch.Generator().manual_seed(1)), dim=1)
    index = faiss_index.new_index("ivf", 16, {"nlist": 16, "nprobe": 2, "codes": "SQ8"})
    faiss_index.train(index, rows.numpy())
    faiss_index.add(index, rows.numpy())
    enough = LIST_MAJOR_MIN_VISITS * 16 // 4  # queries that visit each of the 16 lists 32 times with nprobe 4
    assert goes_list_major(index, ivf_params(index, IvfSettings(4)), enough)
    assert not goes_list_major(index, ivf_params(index, IvfSettings(4)), enough - 1)
    assert not goes_list_major(index, ivf_params(index, IvfSettings(4, 100)), enough)  # FAISS's per-query budget
    assert not goes_list_major(index, None, enough)  # not a CPU ivf index
    l2 = faiss.IndexIVFFlat(faiss.IndexFlatL2(16), 16, 16)
    l2.train(rows.numpy())
    assert not goes_list_major(l2, ivf_params(l2, IvfSettings(4)), enough)
    with pytest.raises(QascError, match="inner product"):
        list_major_search(l2, rows[:3].numpy(), 2, 1)
    searcher = store_searcher("ivf", index, rows, {"rerank": 2}, IvfSettings(4))
    queries = rows[:enough] + 0.05 * torch.randn(enough, 16, generator=torch.Generator().manual_seed(2))
    got = searcher.search(queries, 5)  # list by list, re-ranked exactly
    per_query = torch.cat([searcher.search(queries[i:i + 64], 5)[1] for i in range(0, enough, 64)])  # query by query
    assert torch.equal(got[1], per_query)
