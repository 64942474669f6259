"""engine.store.search on real MiniLM vectors (chroma_general's sentences, the bundled model): in every ivf mode
that ships (full vectors, stores written before SQ8; 8-bit codes, re-ranked 2 x k) the searcher gives FAISS's own
hits or better, its recall against the exact top k is reported and bounded, and the exact searcher gives the
brute-force top k."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from qasc.engine.errors import QascError
from qasc.engine.store import index as faiss_index
from qasc.engine.store.search import ExactSearcher, FaissSearcher, IvfSettings, ivf_params, store_searcher
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
        if codes == "Flat":
            assert torch.equal(got_r, own_r) and torch.equal(got_s, own_s)
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
