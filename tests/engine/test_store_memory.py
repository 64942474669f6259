"""The query path's memory: one copy of the embeddings in the store's dtype (shared by the Store and the Engine),
float16 stores answering like float32 ones, the blocked exact top-k against FAISS and numpy, IVF recall."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qasc.engine.config import EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.store import index as faiss_index
from qasc.engine.store.index import exact_search, exact_topk, recall_at_depth, rerank
from qasc.engine.store.reader import Store


def unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1).numpy()


def reference_topk(emb: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every score of every row, sorted by (score descending, row ascending): the slow twin of exact_topk."""
    sims = q.astype(np.float64) @ emb.astype(np.float32).astype(np.float64).T  # (Q, N)
    scores = np.full((len(q), k), -np.inf)
    rows = np.full((len(q), k), -1, np.int64)
    for i in range(len(q)):
        order = np.lexsort((np.arange(len(emb)), -sims[i]))[:k]
        scores[i, : len(order)], rows[i, : len(order)] = sims[i, order], order
    return scores, rows


@pytest.mark.parametrize("n,k,block", [(0, 3, 1 << 24), (5, 16, 1 << 24), (37, 4, 64), (1000, 16, 4096),
                                       (1000, 1, 1 << 24)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_exact_topk_equals_numpy_and_faiss(n, k, block, dtype):
    import faiss

    emb = unit_rows(n, 24, seed=n).astype(dtype)
    q = unit_rows(13, 24, seed=99)
    scores, rows = exact_topk(torch.from_numpy(emb), torch.from_numpy(q), k, block_elements=block)
    want_s, want_r = reference_topk(emb, q, k)
    np.testing.assert_array_equal(rows.numpy(), want_r)  # fewer rows than k: -1 / -inf padding
    np.testing.assert_allclose(scores.numpy(), want_s, atol=1e-5)
    if n:
        flat = faiss.IndexFlatIP(24)
        flat.add(emb.astype(np.float32))
        f_scores, f_rows = faiss_index.search(flat, q, k)
        np.testing.assert_array_equal(rows.numpy(), f_rows)
        np.testing.assert_allclose(scores.numpy(), f_scores, atol=1e-5)


def test_exact_topk_ties_take_the_lower_rows():
    """Many equal scores: the lowest rows among equal scores at the cut, listed lower row first; FAISS keeps the
    same scores (which of the tied rows it keeps is its own choice, not always the lowest)."""
    import faiss

    rng = np.random.default_rng(0)
    emb = rng.integers(-1, 2, size=(300, 8)).astype(np.float32)  # integer dots: exact, heavily tied
    q = rng.integers(-1, 2, size=(20, 8)).astype(np.float32)
    for block in (1 << 24, 40, 9):
        scores, rows = exact_topk(torch.from_numpy(emb), torch.from_numpy(q), 10, block_elements=block)
        want_s, want_r = reference_topk(emb, q, 10)
        np.testing.assert_array_equal(rows.numpy(), want_r)
        np.testing.assert_array_equal(scores.numpy(), want_s)
    flat = faiss.IndexFlatIP(8)
    flat.add(emb)
    f_scores, _ = flat.search(q, 10)
    np.testing.assert_array_equal(f_scores, scores.numpy())


def test_exact_search_checks_its_input():
    emb = unit_rows(10, 8, 0)
    with pytest.raises(QascError, match="shape"):
        exact_search(emb, np.zeros((2, 7), np.float32), 3)
    with pytest.raises(QascError, match="NaN"):
        exact_search(emb, np.full((2, 8), np.nan, np.float32), 3)
    with pytest.raises(QascError, match="positive"):
        exact_search(emb, emb[:2], 0)


def test_recall_at_depth():
    exact = np.array([[0, 1, 2, 3], [4, 5, -1, -1], [-1, -1, -1, -1]])
    hits = np.array([[3, 9, 1, 8], [5, 4, 7, -1], [1, 2, 3, 4]])
    # query 0 finds 2 of 4, query 1 both of its 2, query 2 has no exact rows (not counted)
    assert recall_at_depth(hits, exact) == pytest.approx((2 / 4 + 2 / 2) / 2)
    assert recall_at_depth(torch.as_tensor(exact), exact) == 1.0
    with pytest.raises(QascError):
        recall_at_depth(hits[:2], exact)


def test_rerank_orders_hits_by_exact_score():
    emb = torch.from_numpy(unit_rows(50, 16, 1))
    q = torch.from_numpy(unit_rows(4, 16, 2))
    hits = torch.stack([torch.randperm(50, generator=torch.Generator().manual_seed(i))[:12] for i in range(4)])
    hits[0, 5:] = -1  # fewer hits than k
    scores, rows = rerank(emb, q, hits, 8)
    for i in range(4):
        cand = [r for r in hits[i].tolist() if r >= 0]
        best = sorted(cand, key=lambda r: (-float(emb[r] @ q[i]), r))[:8]
        assert rows[i, : len(best)].tolist() == best and (rows[i, len(best):] == -1).all()
        assert torch.isinf(scores[i, len(best):]).all()


def test_rerank_blocks_of_queries_equal_one_block():
    """Gathering the hits' vectors a few queries at a time (tiny block_elements) gives the same scores and rows
    as all queries at once; a float16 store too."""
    emb = torch.from_numpy(unit_rows(300, 16, 3))
    q = torch.from_numpy(unit_rows(37, 16, 4))
    hits = torch.randint(-1, 300, (37, 20), generator=torch.Generator().manual_seed(5))
    for vectors in (emb, emb.half()):
        whole = rerank(vectors, q, hits, 9, block_elements=1 << 30)
        for block in (1, 16 * 20, 7 * 16 * 20):  # one query (the floor), one query, seven queries per block
            got = rerank(vectors, q, hits, 9, block_elements=block)
            assert torch.equal(got[1], whole[1]) and torch.equal(got[0], whole[0])


def test_default_nprobe_scales_with_nlist():
    """The default probes IVF_PROBE_SHARE of the lists, at least IVF_NPROBE (never more than nlist); a stored
    nprobe below the rule (stores of the fixed-16 default) is raised to it, an explicit nprobe is kept."""
    share, floor = faiss_index.IVF_PROBE_SHARE, faiss_index.IVF_NPROBE
    assert [faiss_index.default_nprobe(n) for n in (1, 10, floor, 100)] == [1, 10, floor, floor]
    assert faiss_index.default_nprobe(3998) == int(np.ceil(3998 * share)) > floor
    for rows in (1000, 200_000, 1_000_000):
        params = faiss_index.default_params("ivf", rows)
        assert params["nprobe"] == faiss_index.default_nprobe(params["nlist"]) <= params["nlist"]
    old = {"nlist": 3998, "nprobe": 16, "codes": "SQ8"}
    assert faiss_index.set_nprobe(old, None) == faiss_index.default_nprobe(3998)
    assert faiss_index.set_nprobe({**old, "nprobe": 900}, None) == 900
    assert faiss_index.set_nprobe(old, 16) == 16 and faiss_index.set_nprobe({"nprobe": 3}, None) == 3
    with pytest.raises(QascError, match="nprobe"):
        faiss_index.set_nprobe(old, 3999)


def clustered(n: int, dim: int, seed: int, centres: int = 40, noise: float = 1.0) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    c = torch.nn.functional.normalize(torch.randn(centres, dim, generator=g), dim=1)
    pick = torch.randint(0, centres, (n,), generator=g)
    return torch.nn.functional.normalize(c[pick] + noise * torch.randn(n, dim, generator=g) / dim**0.5, dim=1).numpy()


@pytest.mark.parametrize("codes", ["SQ8", "Flat"])
def test_ivf_recall_against_exact(codes):
    """An ivf index of each kind of codes, searched at the default nprobe: recall@16 of exact reported and high;
    probing every list finds (nearly) all of it."""
    emb = clustered(6000, 64, seed=3, noise=1.6)
    q = torch.nn.functional.normalize(torch.from_numpy(emb[:200]) + 0.5 * torch.randn(200, 64) / 8, dim=1)
    params = {**faiss_index.default_params("ivf", len(emb)), "codes": codes}
    index = faiss_index.new_index("ivf", 64, params)
    faiss_index.train(index, emb[faiss_index.training_sample(len(emb), params["nlist"], emb.shape[1])])
    faiss_index.add(index, emb)
    _, exact = exact_topk(torch.from_numpy(emb), q, 16)
    _, hits = faiss_index.search(index, q.numpy(), 32)
    _, hits = rerank(torch.from_numpy(emb), q, torch.from_numpy(hits), 16)
    recall = recall_at_depth(hits, exact)
    print(f"ivf {codes} nlist {params['nlist']} nprobe {params['nprobe']}: recall@16 {recall:.3f}")
    assert recall >= 0.9
    index.nprobe = params["nlist"]
    _, all_hits = faiss_index.search(index, q.numpy(), 32)
    assert recall_at_depth(rerank(torch.from_numpy(emb), q, torch.from_numpy(all_hits), 16)[1], exact) >= 0.99
    assert faiss_index.reconstruct_matches({"kind": "ivf", "params": params},
                                           faiss_index.reconstruct(index, np.arange(50)), emb[:50])
    assert not faiss_index.reconstruct_matches({"kind": "ivf", "params": params},
                                               faiss_index.reconstruct(index, np.arange(50)), emb[50:100])


# ------------------------------------------------------------------------------- the Store and the Engine


def memory_store(dtype: str, n: int = 3000) -> Store:
    """A Store over SyntheticStore's documents and vectors, held in `dtype` (no files)."""
    from bench.query import SyntheticStore

    syn = SyntheticStore(n, dim=64, doc_len=60, seed=5)
    emb = np.ascontiguousarray(syn.embeddings.astype(dtype))
    manifest = {"dim": 64, "dtype": dtype, "index": {"kind": "flat"}, "config": {}}
    return Store(None, manifest, syn.docs, [{}] * len(syn.docs), [""] * len(syn.docs), emb, None)


def spans(results):
    return [[(c.doc_id, c.char_start, c.char_end) for c in r] for r in results]


def test_float16_engine_answers_like_float32(monkeypatch):
    """Same chunks, scores within fp16 tolerance; the blocked float32 stats equal the kernels' unblocked ones."""
    import qasc.engine.query as query
    import qasc.engine.tables as tables
    from qasc.kernels.extents import block_stats, neighbour_dots
    from qasc.kernels.params import QascParams

    monkeypatch.setattr(tables, "STATS_BLOCK_ROWS", 700)  # several blocks, cut inside documents
    e32 = query.Engine(memory_store("float32"), None, EngineConfig(), torch.device("cpu"))
    e16 = query.Engine(memory_store("float16"), None, EngineConfig(), torch.device("cpu"))
    assert e16.embeddings.dtype == torch.float16 and e32.embeddings.dtype == torch.float32
    full = e16.embeddings.float()
    torch.testing.assert_close(e16.tables.neighbour_dots(5), neighbour_dots(full, 5), atol=1e-6, rtol=0)
    torch.testing.assert_close(e16.tables.neighbour_dots(5), e32.tables.neighbour_dots(5), atol=2e-3, rtol=0)
    for kind in ("paragraph", "section"):
        ids = e16.tables.paragraph if kind == "paragraph" else e16.tables.section
        want = block_stats(full, e16.tables.doc_of_row.long() * (int(ids.max()) + 1) + ids)
        got = e16.tables.block_stats(kind)
        assert got[0].dtype == torch.int32 and torch.equal(got[0].long(), want[0]) and got[1].dtype == torch.float32
        torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1], e32.tables.block_stats(kind)[1], atol=1e-2, rtol=1e-3)
    # queries: noisy copies of stored rows, so the top hits are clear
    g = torch.Generator().manual_seed(7)
    q = torch.nn.functional.normalize(e32.embeddings[::97][:24] + 0.3 * torch.randn(24, 64, generator=g) / 8, dim=1)
    for params in (QascParams(), QascParams(max_extent=1, merge_picks=True, top_k=3)):
        r32, r16 = e32.query_embedded(q, params), e16.query_embedded(q, params)
        assert spans(r16) == spans(r32) and any(r32)
        for a, b in zip(r32, r16, strict=True):
            np.testing.assert_allclose([c.score for c in b], [c.score for c in a], atol=5e-3)


def test_engine_per_row_arrays_are_int32_and_results_keep_their_types():
    """The per-row arrays (4 bytes per row each: 4 MB per array at 1M rows) hold the documents' own values; the
    result columns keep their declared dtypes (doc and character spans int64)."""
    from qasc.engine.query import Engine

    store = memory_store("float16", n=1200)
    engine = Engine(store, None, EngineConfig(), torch.device("cpu"))
    lengths = [len(d) for d in store.docs]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    doc = np.repeat(np.arange(len(lengths)), lengths)
    want = {"doc_of_row": doc, "doc_first": offsets[doc], "doc_last": offsets[doc + 1] - 1,
            "paragraph": np.concatenate([d.paragraph for d in store.docs]),
            "section": np.concatenate([d.section for d in store.docs]),
            "n_tokens": np.concatenate([d.n_tokens for d in store.docs])}
    for name, values in want.items():
        got = getattr(engine.tables, name)
        assert got.dtype == torch.int32, name
        np.testing.assert_array_equal(got.numpy(), values, err_msg=name)
    table = engine.row_table
    assert {a.dtype for a in (table.doc, table.sent, table.char_start, table.char_end)} == {np.dtype(np.int32)}
    np.testing.assert_array_equal(table.char_start, np.concatenate([d.char_start for d in store.docs]))
    _, cols = next(engine.query_columns(engine.embeddings[::50][:8].float()))
    assert len(cols.doc) and cols.doc.dtype == np.int64 and cols.char_start.dtype == np.int64
    assert all(store.docs[d].text[a:b] == t for d, a, b, t in zip(cols.doc, cols.char_start, cols.char_end,
                                                                   cols.text, strict=True))


def test_engine_holds_the_store_vectors_without_a_copy():
    from qasc.engine.query import Engine

    for dtype in ("float32", "float16"):
        store = memory_store(dtype, n=500)
        engine = Engine(store, None, EngineConfig(), torch.device("cpu"))
        assert engine.embeddings is store.vectors and engine.embeddings.dtype == getattr(torch, dtype)
        assert engine.embeddings.data_ptr() == store.embeddings.ctypes.data  # the numpy view, same memory
        np.testing.assert_array_equal(store.embedding_rows(3, 9), store.embeddings[3:9].astype(np.float32))


@pytest.fixture(scope="module")
def fp16_stores(tmp_path_factory, tiny_model):
    """The demo corpus ingested twice with the tiny model: float32 and float16 embeddings (flat index)."""
    from qasc.engine.config import EmbedderConfig
    from qasc.engine.store import IngestConfig, ingest
    from tests.conftest import DEMO_CORPUS

    root = tmp_path_factory.mktemp("fp16")
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    for dtype in ("float32", "float16"):
        ingest([str(DEMO_CORPUS)], root / dtype, config, IngestConfig(dtype_store=dtype, shard_chars=800))
    return root


@pytest.mark.slow
def test_opened_store_is_one_copy_and_fp16_gives_the_same_chunks(fp16_stores):
    from qasc.engine.query import Engine

    e32 = Engine.open(str(fp16_stores / "float32"), device="cpu")
    e16 = Engine.open(str(fp16_stores / "float16"), device="cpu")
    for eng, dtype in ((e32, torch.float32), (e16, torch.float16)):
        assert eng.store.index is None  # flat: exact search over the engine's own vectors, no FAISS copy
        assert eng.embeddings is eng.store.vectors and eng.embeddings.dtype == dtype
        assert eng.embeddings.data_ptr() == eng.store.embeddings.ctypes.data
        assert eng.embeddings.shape[0] == eng.store.manifest["counts"]["sentences"] > 20
    np.testing.assert_allclose(e16.store.embeddings.astype(np.float32), e32.store.embeddings, atol=1e-3)
    q = e32.embed_queries(["How long should the dough rest?", "Who designed the lighthouse lens?",
                           "How many solar panels do I need?"])
    r32, r16 = e32.query_embedded(q), e16.query_embedded(q)
    assert spans(r16) == spans(r32) and all(r32)
    for a, b in zip(r32, r16, strict=True):
        np.testing.assert_allclose([c.score for c in b], [c.score for c in a], atol=5e-3)
    indexed = Store.open(fp16_stores / "float16", load_index=True)  # FAISS flat over the same rows
    want_s, want_r = indexed.search(q, 5)
    got_s, got_r = e16.store.search(q, 5)
    np.testing.assert_array_equal(got_r, want_r)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5)


@pytest.mark.slow
def test_ivf_store_nprobe_override_and_recall(tmp_path, tiny_model):
    from qasc.engine.config import EmbedderConfig
    from qasc.engine.query import Engine
    from qasc.engine.store import IngestConfig, ingest, verify_store
    from tests.conftest import DEMO_CORPUS

    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    ingest([str(DEMO_CORPUS)], tmp_path / "s", config, IngestConfig(index="ivf", dtype_store="float16"))
    store = Store.open(tmp_path / "s")
    params = store.manifest["index"]["params"]
    assert params["codes"] == faiss_index.IVF_DEFAULT_CODES and store.index.nprobe == params["nprobe"]
    assert all(ok for _, ok, _ in verify_store(tmp_path / "s"))
    _, exact = exact_topk(store.vectors, store.vectors.float(), 4)
    _, hits = store.search(store.embeddings, 4)
    assert recall_at_depth(hits, exact) >= 0.9
    assert Store.open(tmp_path / "s", nprobe=params["nlist"]).index.nprobe == params["nlist"]
    assert Engine.open(str(tmp_path / "s"), device="cpu", nprobe=1).store.index.nprobe == 1
    with pytest.raises(QascError, match="nprobe"):
        Store.open(tmp_path / "s", nprobe=params["nlist"] + 1)
    from qasc.jobs.cli import main  # qasc query --max-codes: a budget of codes per query, through the same search

    answers = {}
    for budget in (None, 0, 1):
        out = tmp_path / f"answers-{budget}.jsonl"
        flags = [] if budget is None else ["--max-codes", str(budget)]
        assert main(["query", "--store", str(tmp_path / "s"), "--question", "sourdough starter", "--out", str(out),
                     *flags]) == 0
        answers[budget] = out.read_text()
    assert answers[0] == answers[None] and answers[1] != answers[None]  # 0: no budget; 1 code: other chunks
    from qasc.engine.store.search import IvfSettings  # the same settings as one value, passed to Engine.open

    ivf = Engine.open(str(tmp_path / "s"), device="cpu", ivf=IvfSettings(1, 3))
    assert ivf.store.ivf == IvfSettings(1, 3) and ivf.store.index.nprobe == 1 and ivf.store.index.max_codes == 0
    with pytest.raises(QascError, match="nprobe or ivf, not both"):
        Store.open(tmp_path / "s", nprobe=2, ivf=IvfSettings(2))
