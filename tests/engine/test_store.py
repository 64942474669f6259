"""The store: schemas, round trip with exact offsets, every index kind against exact search, float16, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from qasc.engine.errors import QascError
from qasc.engine.store import (
    DOCUMENTS_SCHEMA,
    IngestConfig,
    Store,
    exact_search,
    ingest,
    sentences_schema,
    verify_store,
)
from qasc.engine.store import index as faiss_index
from qasc.engine.store.files import ResumableError

DOCS = {
    "alpha": "# Alpha\n\nThe first document has two paragraphs. It talks about lighthouses and lenses.\n\n"
             "A second paragraph follows here. Fresnel built a lens in 1822.",
    "beta": "Bread needs flour, water and salt. The dough rises overnight!\n\n## Baking\n\nBake it hot. "
            "Then let it cool before cutting.",
    "gamma": "Solar panels convert light into electricity. Batteries store the surplus for the night.",
}


def write_corpus(folder: Path, docs: dict[str, str] = DOCS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (folder / f"{name}.md").write_text(text, encoding="utf-8")
    return folder


def snapshot(path: str | Path) -> dict:
    """Everything a store holds that must not depend on how it was built (crashes, resumes, Ray)."""
    store = Store.open(path, load_index=True)
    m = store.manifest
    return {
        "doc_ids": store.doc_ids,
        "texts": [d.text for d in store.docs],
        "metadata": store.metadata,
        "arrays": [np.stack([d.char_start, d.char_end, d.paragraph, d.section, d.n_tokens]) for d in store.docs],
        "embeddings": store.embeddings,
        "index": faiss_index.reconstruct(store.index, np.arange(store.index.ntotal)),
        "counts": m["counts"],
        "shards": [{k: s.get(k) for k in ("id", "documents", "sentences", "headings", "passages", "lexical",
                                          "passage_lexical", "n_documents", "n_sentences", "n_headings", "n_passages",
                                          "n_terms", "n_passage_terms", "term_rule")} for s in m["shards"]],
        "heading_paths": store.heading_paths,
        "row_heading": store.row_heading,
        "heading_emb": store.heading_emb,
        "passage_rows": np.stack([store.passages.first, store.passages.count, store.passages.n_tokens]),
        "passage_emb": store.passages.emb,
        "parquet": {k: v for k, v in m["checksums"].items() if k.endswith(".parquet")},
        "index_kind": m["index"]["kind"],
    }


def assert_same_store(a: dict, b: dict, atol: float = 0.0) -> None:
    for key in ("doc_ids", "texts", "metadata", "counts", "shards", "index_kind", "heading_paths"):
        assert a[key] == b[key], key
    np.testing.assert_array_equal(a["row_heading"], b["row_heading"])
    np.testing.assert_array_equal(a["passage_rows"], b["passage_rows"])
    for x, y in zip(a["arrays"], b["arrays"], strict=True):
        np.testing.assert_array_equal(x, y)
    if atol:
        np.testing.assert_allclose(a["embeddings"], b["embeddings"], atol=atol)
        np.testing.assert_allclose(a["index"], b["index"], atol=atol)
        np.testing.assert_allclose(a["heading_emb"], b["heading_emb"], atol=atol)
        np.testing.assert_allclose(a["passage_emb"], b["passage_emb"], atol=atol)
    else:
        np.testing.assert_array_equal(a["embeddings"], b["embeddings"])
        np.testing.assert_array_equal(a["index"], b["index"])
        np.testing.assert_array_equal(a["heading_emb"], b["heading_emb"])
        np.testing.assert_array_equal(a["passage_emb"], b["passage_emb"])
        assert a["parquet"] == b["parquet"]


def _unit(n: int, dim: int, seed: int = 0, clusters: int = 0) -> np.ndarray:
    """(n, dim) unit vectors; clustered like sentence embeddings when clusters > 0."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    if clusters:
        x = 0.35 * x + 3 * rng.standard_normal((clusters, dim)).astype(np.float32)[rng.integers(0, clusters, n)]
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _build(kind: str, emb: np.ndarray):
    params = faiss_index.default_params(kind, len(emb))
    index = faiss_index.new_index(kind, emb.shape[1], params)
    if kind == "ivf":
        faiss_index.train(index, emb[faiss_index.training_sample(len(emb), params["nlist"], emb.shape[1])])
    faiss_index.add(index, emb)
    return faiss_index.deserialize(faiss_index.serialize(index), "test")


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_index_kinds_agree_with_exact_search(kind):
    both = _unit(4050, 24, clusters=40)
    emb, queries = both[:4000], both[4000:]
    index = _build(kind, emb)
    scores, rows = faiss_index.search(index, queries, 10)
    exact_scores, exact_rows = exact_search(emb, queries, 10)
    assert scores.dtype == np.float32 and rows.dtype == np.int64 and rows.shape == (50, 10)
    if kind == "flat":  # the same top 10 up to float32 rounding: rows may swap only where scores tie within 1e-6
        np.testing.assert_allclose(scores, exact_scores, atol=1e-5)
        true = lambda r: np.einsum("qd,qkd->qk", queries.astype(np.float64), emb[r].astype(np.float64))  # noqa: E731
        np.testing.assert_allclose(true(rows), true(exact_rows), atol=1e-6)
        assert (rows == exact_rows).mean() > 0.95
    recall = np.mean([len(set(r) & set(e)) / 10 for r, e in zip(rows, exact_rows, strict=True)])
    assert recall >= 0.9, recall
    entry = {"kind": kind, "params": faiss_index.default_params(kind, len(emb))}
    assert faiss_index.reconstruct_matches(entry, faiss_index.reconstruct(index, np.array([0, 123, 3999])),
                                           emb[[0, 123, 3999]])


def test_search_pads_missing_hits_and_rejects_bad_queries():
    emb = _unit(5, 8)
    for search in (lambda q, k: faiss_index.search(_build("flat", emb), q, k), lambda q, k: exact_search(emb, q, k)):
        scores, rows = search(emb[:2], 8)
        assert rows.shape == (2, 8) and (rows[:, 5:] == -1).all() and np.isneginf(scores[:, 5:]).all()
        assert rows[0, 0] == 0 and rows[1, 0] == 1
        with pytest.raises(QascError, match="shape"):
            search(_unit(2, 9), 3)
        with pytest.raises(QascError, match="NaN"):
            search(np.full((1, 8), np.nan, np.float32), 3)
        with pytest.raises(QascError, match="positive"):
            search(emb[:1], 0)


def test_choose_kind():
    assert faiss_index.choose_kind(10) == "flat"
    assert faiss_index.choose_kind(faiss_index.AUTO_FLAT_MAX + 1) == "ivf"
    assert faiss_index.choose_kind(10, "hnsw") == "hnsw"
    with pytest.raises(QascError, match="unknown index kind"):
        faiss_index.choose_kind(10, "annoy")


@pytest.fixture(scope="module")
def small_store(tmp_path_factory, tiny_model) -> Path:
    from qasc.engine.config import EmbedderConfig, EngineConfig

    tmp = tmp_path_factory.mktemp("small")
    path = tmp / "store"
    ingest([str(write_corpus(tmp / "corpus"))], path, EngineConfig(embedder=EmbedderConfig(model=tiny_model)),
           IngestConfig(shard_chars=100))
    return path


@pytest.mark.slow
def test_round_trip_exact_offsets_and_schemas(small_store, tiny_model):
    from qasc.engine.tokencap import count_tokens, load_tokenizer

    store = Store.open(small_store)
    assert store.doc_ids == sorted(DOCS) and [d.text for d in store.docs] == [DOCS[k] for k in sorted(DOCS)]
    assert store.metadata == [{}, {}, {}]
    tokenizer = load_tokenizer(tiny_model)
    for doc in store.docs:
        texts = doc.texts()
        assert texts and all(t == t.strip() and t for t in texts)
        np.testing.assert_array_equal(doc.n_tokens, count_tokens(tokenizer, texts))
    assert store.doc_offsets.tolist() == [0, *np.cumsum([len(d) for d in store.docs]).tolist()]
    assert store.embeddings.shape == (store.doc_offsets[-1], 32) and store.embeddings.dtype == np.float32
    m = store.manifest
    assert m["counts"] == {"documents": 3, "sentences": len(store), "shards": 3}
    assert m["dim"] == 32 and m["dtype"] == "float32" and m["splitter"]["max_sentence_tokens"] == 128
    assert m["config"]["embedder"]["model"] == tiny_model and m["engine_version"]
    for shard in m["shards"]:
        assert pq.read_schema(small_store / shard["documents"]).names == DOCUMENTS_SCHEMA.names
        assert pq.read_schema(small_store / shard["sentences"]).equals(sentences_schema(32, "float32"),
                                                                       check_metadata=False)
        chunks = pq.read_metadata(small_store / shard["sentences"]).row_group(0)
        dictionary = {chunks.column(i).path_in_schema: chunks.column(i).has_dictionary_page
                      for i in range(chunks.num_columns)}
        assert dictionary["doc_id"] and not dictionary["embedding.list.element"]  # vectors: plain values
    assert store.index is None  # a flat store searches exactly over its own vectors (no FAISS copy)
    scores, rows = store.search(store.embeddings, 3)
    np.testing.assert_array_equal(rows[:, 0], np.arange(len(store)))
    indexed = Store.open(small_store, load_index=True)
    assert indexed.index is not None and indexed.index.ntotal == len(store)
    f_scores, f_rows = indexed.search(store.embeddings, 3)
    np.testing.assert_array_equal(f_rows[:, 0], rows[:, 0])
    np.testing.assert_allclose(f_scores, scores, atol=1e-5)
    assert not (small_store / "_staging").exists()
    assert all(ok for _, ok, _ in verify_store(small_store))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_index_flag_and_float16(tmp_path, tiny_model, kind):
    from qasc.engine.config import EmbedderConfig, EngineConfig

    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    corpus = write_corpus(tmp_path / "corpus")
    summary = ingest([str(corpus)], tmp_path / "s", config, IngestConfig(index=kind, dtype_store="float16"))
    assert summary["index"] == kind
    store = Store.open(tmp_path / "s")
    assert store.manifest["index"]["kind"] == kind and store.manifest["dtype"] == "float16"
    assert pq.read_schema(tmp_path / "s" / store.manifest["shards"][0]["sentences"]).field("embedding").type == \
        sentences_schema(32, "float16").field("embedding").type
    assert store.embeddings.dtype == np.float16 and store.vectors.dtype == torch.float16  # kept in the store's dtype
    np.testing.assert_allclose(np.linalg.norm(store.embeddings.astype(np.float32), axis=1), 1, atol=1e-2)
    assert (store.search(store.embeddings, 1)[1][:, 0] == np.arange(len(store))).mean() > 0.9
    assert all(ok for _, ok, _ in verify_store(tmp_path / "s"))
    if kind == "ivf":  # FAISS's own search of the 8-bit lists, its 2 x k hits re-ranked exactly
        from qasc.engine.store.search import FaissSearcher, IvfSettings

        searcher = store.searcher()
        assert isinstance(searcher, FaissSearcher) and searcher.rerank == 2
        assert store.ivf == IvfSettings(store.index.nprobe, 0)  # the store's nprobe, resolved at open
        q = torch.from_numpy(store.embeddings[:60].astype(np.float32)) + 0.05
        got_s, got_r = store.search_tensor(q, 5)
        wide_s, wide_r = faiss_index.search(store.index, q.numpy(), 10)  # FAISS alone, the 8-bit scores
        want_s, want_r = faiss_index.rerank(store.vectors, q, torch.from_numpy(wide_r), 5)
        assert torch.equal(got_r, want_r) and torch.equal(got_s, want_s)
        budget = store.searcher(IvfSettings(store.ivf.nprobe, 4))  # a budget of codes per query (max_codes)
        budget_r = budget.search(q, 5)[1]
        assert (budget_r != got_r).any()  # fewer codes scanned: other hits
        assert store.index.max_codes == 0  # the setting is passed per search, the index is left alone
        one = store.searcher(IvfSettings(1)).search(q, 5)[1]  # one list probed: fewer of the exact hits
        every = store.searcher(IvfSettings(store.index.nlist)).search(q, 5)[1]  # every list probed
        exact_r = faiss_index.exact_topk(store.vectors, q, 5)[1]
        assert faiss_index.recall_at_depth(every, exact_r) >= 0.95
        assert faiss_index.recall_at_depth(one, exact_r) <= faiss_index.recall_at_depth(got_r, exact_r)
        with pytest.raises(QascError, match="max_codes must be >= 0"):
            IvfSettings(None, -1)


def test_open_errors(tmp_path):
    with pytest.raises(QascError, match="no such store"):
        Store.open(tmp_path / "absent")
    (tmp_path / "plain").mkdir()
    with pytest.raises(QascError, match="not a QASC store"):
        Store.open(tmp_path / "plain")
    (tmp_path / "crashed" / "_staging").mkdir(parents=True)
    with pytest.raises(QascError, match="incomplete store"):
        Store.open(tmp_path / "crashed")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text('{"format": "qasc-st')
    with pytest.raises(QascError, match="corrupt manifest"):
        Store.open(tmp_path / "broken")
    (tmp_path / "broken" / "manifest.json").write_text(json.dumps({"format": "qasc-store", "format_version": 1}))
    with pytest.raises(QascError, match="incomplete manifest"):
        Store.open(tmp_path / "broken")


@pytest.mark.slow
def test_index_built_in_a_child_process_is_the_same(tmp_path, tiny_model, monkeypatch):
    """From INDEX_CHILD_MIN_ROWS rows on, the local ingest builds its index in a child process: the same index
    file bytes as in process, the child's peak RSS reported, and a child that dies leaves a resumable store."""
    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.store import index_child

    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    corpus = write_corpus(tmp_path / "corpus")
    here = ingest([str(corpus)], tmp_path / "here", config, IngestConfig(index="ivf"))
    assert here["index_peak_rss_gb"] is None  # small: built in process
    monkeypatch.setattr(index_child, "INDEX_CHILD_MIN_ROWS", 0)
    child = ingest([str(corpus)], tmp_path / "child", config, IngestConfig(index="ivf"))
    assert child["index_peak_rss_gb"] > 0
    a, b = (json.loads((tmp_path / n / "manifest.json").read_text()) for n in ("here", "child"))
    assert a["index"] == b["index"] and a["checksums"][a["index"]["file"]] == b["checksums"][b["index"]["file"]]
    assert all(ok for _, ok, _ in verify_store(tmp_path / "child"))

    real = index_child.build_in_child

    def dies(*args, **kwargs):  # the child killed before it writes a result (as the kernel's OOM killer would)
        return real(*args, **kwargs, command=[sys.executable, "-c", "import os; os._exit(137)"])

    monkeypatch.setattr(index_child, "build_in_child", dies)
    with pytest.raises(ResumableError, match="index build process exited with 137.*run the same ingest again"):
        ingest([str(corpus)], tmp_path / "dead", config, IngestConfig(index="ivf"))
    monkeypatch.setattr(index_child, "build_in_child", real)
    resumed = ingest([str(corpus)], tmp_path / "dead", config, IngestConfig(index="ivf"))
    assert resumed["resumed_shards"] > 0 and all(ok for _, ok, _ in verify_store(tmp_path / "dead"))


@pytest.mark.slow
def test_a_mapped_ivf_index_is_not_hashed_at_open(tmp_path, tiny_model):
    """An ivf index is mapped at open, not read: a flipped byte (same size) is not looked for there (hashing would
    read the whole file) but by qasc verify; its size is still checked at open. An index read whole is hashed
    (test_verify's index-bitflip)."""
    from qasc.engine.config import EmbedderConfig, EngineConfig

    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    ingest([str(write_corpus(tmp_path / "corpus"))], tmp_path / "ivf", config, IngestConfig(index="ivf"))
    index_file = next((tmp_path / "ivf").glob("index-*.faiss"))
    data = bytearray(index_file.read_bytes())
    data[int(len(data) * 0.9)] ^= 0x01  # in the inverted lists' codes
    index_file.write_bytes(bytes(data))
    assert Store.open(tmp_path / "ivf").index is not None
    failed = {name for name, ok, _ in verify_store(tmp_path / "ivf") if not ok}
    assert "checksums" in failed
    index_file.write_bytes(bytes(data[:-1]))
    with pytest.raises(QascError, match="truncated or replaced"):
        Store.open(tmp_path / "ivf")


def test_index_child_reports_errors_as_the_drivers(tmp_path):
    """A QascError raised in the child is raised in the driver with its message; other errors become QascError."""
    from qasc.engine.store import index_child

    bad = [{"n_sentences": 3, "sentences": "missing.parquet", "dim": 4}]
    with pytest.raises(QascError, match="missing.parquet: missing store file"):
        index_child.build_in_child(str(tmp_path), bad, None, "flat", 4, "index-0001.faiss", lambda line: None)
    with pytest.raises(QascError, match="building the index failed: KeyError"):  # not a QascError in the child
        index_child.build_in_child(str(tmp_path), [{}], None, "flat", 4, "index-0001.faiss", lambda line: None)
    assert not (tmp_path / "index-0001.faiss").exists()


def test_a_stored_config_with_unknown_settings_opens_with_a_warning():
    """A store written by another qasc version may carry settings this one does not know: they are left out with
    a warning, the known ones keep their stored values (a TypeError before)."""
    from qasc.engine.config import EngineConfig

    data = json.loads(EngineConfig().to_json())
    data["qasc"]["a_later_setting"] = 0.02
    data["qasc"]["percentile"] = 80.0
    data["retrieval"]["rerank"] = 3
    with pytest.warns(UserWarning) as caught:
        config = EngineConfig.from_dict(data)
    messages = [str(w.message) for w in caught]
    assert any("qasc settings ['a_later_setting'] are unknown" in m for m in messages)
    assert any("retrieval settings ['rerank'] are unknown" in m for m in messages)
    assert config.qasc.percentile == 80.0 and config.retrieval == EngineConfig().retrieval


# the `qasc` section of a store's manifest as the release before the grouped parameters wrote it (its defaults)
PREVIOUS_RELEASE_QASC = {
    "percentile": 90.0, "min_seeds": 1, "max_seeds": None, "radius": 3, "adaptive": True, "threshold": None,
    "margin": 0.1, "clip_to_paragraph": True, "extent": "pooled", "max_extent": 2, "extent_penalty": 0.0,
    "max_picks": 10, "decay": 0.3, "factor": 0.6, "merge": True, "gap": 0, "snap": "none", "max_tokens": 512,
    "score": "window_max", "top_k": 10, "budget_tokens": None, "score_margin": 0.1, "focus_gap": 6,
    "far_margin": 0.05, "block_extents": "section", "length_bonus": 0.02, "context_weight": 12.0,
    "heading_residual": 0.75, "lexical_weight": 0.8, "budget_fill": True, "fill_diversity": 0.02}


def test_a_store_frozen_by_the_previous_release_opens_answers_and_refreezes(small_store, tmp_path, tiny_model):
    """Issue 43, item 4: a store whose manifest holds the settings since removed (the window extents, max_seeds,
    extent_penalty, snap, max_picks) opens and answers with its other settings, with one warning naming them;
    an append (ingest into it again) freezes this version's settings, and the warning is gone."""
    import shutil
    import warnings

    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.query import Engine

    root = tmp_path / "store"
    shutil.copytree(small_store, root)
    fresh = Engine.open(str(root), device="cpu").query(["What is the capital?"])
    m = json.loads((root / "manifest.json").read_text())
    m["config"]["qasc"] = dict(PREVIOUS_RELEASE_QASC)
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.warns(UserWarning) as caught:
        old = Engine.open(str(root), device="cpu")
    removed = [str(w.message) for w in caught if "were removed" in str(w.message)]
    assert len(removed) == 1 and "'radius'" in removed[0] and "'max_picks'" in removed[0], removed
    assert not [w for w in caught if "unknown to this qasc version" in str(w.message)]
    assert old.config.qasc == EngineConfig().qasc  # every setting it still has held the defaults
    assert old.query(["What is the capital?"]) == fresh
    ingest([str(write_corpus(tmp_path / "more", {"extra": "# Extra\n\nOne more document."}))], root,
           EngineConfig(embedder=EmbedderConfig(model=tiny_model)))
    assert set(json.loads((root / "manifest.json").read_text())["config"]["qasc"]) == set(EngineConfig().qasc.to_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Engine.open(str(root), device="cpu")


def test_a_stored_config_with_unknown_splitter_settings_is_refused():
    """Unknown splitter/embedder settings describe how the stored text was cut and embedded: refused, not guessed."""
    from qasc.engine.config import EngineConfig

    data = json.loads(EngineConfig().to_json())
    data["splitter"]["clause_breaks"] = True
    with pytest.raises(QascError, match=r"splitter settings \['clause_breaks'\] are unknown"):
        EngineConfig.from_dict(data)


def test_parquet_vectors_are_written_without_a_dictionary(tmp_path):
    import pyarrow as pa

    from qasc.engine.store.files import atomic_parquet, dictionary_columns

    values = pa.array(np.random.default_rng(0).random(600 * 8).astype(np.float16))
    table = pa.table({"doc_id": pa.array(["a", "b"] * 300), "row": pa.array(range(600), pa.int32()),
                      "embedding": pa.FixedSizeListArray.from_arrays(values, 8),
                      "ragged": pa.array([[1.0, 2.0]] * 600, pa.list_(pa.float32()))})
    assert dictionary_columns(table.schema) == ["doc_id", "row"]
    atomic_parquet(table, tmp_path / "t.parquet", 256)
    assert pq.read_table(tmp_path / "t.parquet").equals(table)
    chunks = pq.read_metadata(tmp_path / "t.parquet").row_group(0)
    dictionary = {chunks.column(i).path_in_schema: chunks.column(i).has_dictionary_page
                  for i in range(chunks.num_columns)}
    assert dictionary == {"doc_id": True, "row": True, "embedding.list.element": False, "ragged.list.element": False}
