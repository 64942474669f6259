"""Mapped arrays (engine.store.mapped): written at ingest, memory-mapped at open. A store opened through them answers
exactly as the same store opened the old way (every shard read, every table built), reads neither its sentences'
Parquet files nor its term counts, rebuilds no table it saved; tables of other code are not used; an append writes
the next generation's folder; a store without them opens as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from qasc.engine import presets, tables
from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.lexical import LexicalIndex
from qasc.engine.query import Engine
from qasc.engine.store import IngestConfig, Store, ingest, reader, verify_store
from qasc.engine.store import lexical as saved_terms
from qasc.engine.tables import StoreTables
from tests.engine.test_lexical_store import DOCS, QUESTIONS
from tests.engine.test_store import write_corpus

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def config(tiny_model) -> EngineConfig:
    return EngineConfig(embedder=EmbedderConfig(model=tiny_model))


@pytest.fixture(scope="module")
def mapped_store(tmp_path_factory, config) -> Path:
    tmp = tmp_path_factory.mktemp("mapped_store")
    ingest([str(write_corpus(tmp / "src", DOCS))], tmp / "store", config, IngestConfig(shard_chars=150))
    return tmp / "store"


def without_mapped(src: Path, dst: Path) -> Path:
    """A copy of the store as written before mapped arrays (its manifest without them)."""
    root = Path(shutil.copytree(src, dst))
    m = json.loads((root / "manifest.json").read_text())
    m.pop("mapped")
    m["checksums"] = {k: v for k, v in m["checksums"].items() if not k.startswith("mapped-")}
    (root / "manifest.json").write_text(json.dumps(m))
    return root


def answers(root: Path) -> list:
    """Every preset's chunks (scores exact), with the lexical term, for QUESTIONS."""
    engine = Engine.open(str(root), device="cpu")
    out = []
    for name in presets.PRESETS:
        params, retrieval = presets.apply(name, engine.config.qasc, engine.config.retrieval)
        params = params.replace(lexical_weight=0.8, budget_tokens=None)
        out.append([[(c.doc_id, c.char_start, c.char_end, c.score, c.text) for c in q]
                    for q in engine.query(QUESTIONS, params, retrieval)])
    return out


def test_ingest_writes_mapped_arrays_that_verify_checks(mapped_store):
    m = json.loads((mapped_store / "manifest.json").read_text())
    folder = mapped_store / m["mapped"]["folder"]
    assert m["mapped"]["folder"] == "mapped-0001" and len(m["shards"]) >= 3
    assert (folder / "vectors.npy").is_file() and {t["key"][0] for t in m["mapped"]["tables"]} >= {
        "lexical_index", "neighbour_dots", "block_stats", "heading_tensors"}
    assert all(str(p.relative_to(mapped_store)) in m["checksums"] for p in folder.rglob("*") if p.is_file())
    result = {name: (ok, detail) for name, ok, detail in verify_store(mapped_store)}
    assert all(ok for ok, _ in result.values()) and "equal the shards'" in result["mapped"][1]


def test_the_mapped_open_answers_exactly_as_the_old_way(mapped_store, tmp_path):
    store = Store.open(mapped_store)
    old = Store.open(without_mapped(mapped_store, tmp_path / "old"))
    assert store.mapped is not None and old.mapped is None
    assert np.array_equal(store.embeddings, old.embeddings) and store.doc_ids == old.doc_ids
    assert store.heading_paths == old.heading_paths and np.array_equal(store.row_heading, old.row_heading)
    saved = store.saved_tables("cpu")
    built = StoreTables(old, torch.device("cpu"))
    for key, value in saved.items():  # each saved table equals the one the engine builds
        name, *args = key
        got = getattr(built, name)(*args)
        if isinstance(value, LexicalIndex):
            assert value.vocab == got.vocab and all(torch.equal(getattr(value, a), getattr(got, a))
                                                    for a in ("row_ptr", "row_terms", "row_weights"))
        elif isinstance(value, tuple):
            assert all((a is None and b is None) or torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                       for a, b in zip(value, got, strict=True))
        elif value is not None:
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(got)), key
    assert answers(mapped_store) == answers(tmp_path / "old")


def test_the_mapped_open_reads_no_sentences_nor_term_counts(mapped_store, monkeypatch):
    """Opening and answering reads the documents' tables only: loading a shard's sentences, counting or reading
    term counts, or building the BM25 index would raise."""
    expected = answers(mapped_store)

    def refuse(*args, **kwargs):
        raise AssertionError("rebuilt at open")

    for owner, name in ((reader, "load_shard"), (saved_terms, "read_counts"), (saved_terms, "count_terms"),
                        (LexicalIndex, "build"), (LexicalIndex, "from_counts"), (tables, "neighbour_dots"),
                        (tables, "block_stats")):  # the kernels behind the saved per-store tables
        monkeypatch.setattr(owner, name, refuse)
    assert answers(mapped_store) == expected


def test_the_mapped_open_reads_texts_only_where_a_chunk_needs_them(mapped_store, tmp_path):
    """Opening reads no document's text; a query reads the texts of the shards its chunks come from and no other;
    the documents made on access equal the old open's."""
    from qasc.engine.store.documents import HEADER_COLUMNS

    assert "text" not in HEADER_COLUMNS
    embedder = Engine.open(str(mapped_store), device="cpu").embedder
    store = Store.open(mapped_store)
    shards = json.loads((mapped_store / "manifest.json").read_text())["shards"]
    texts = store.doc_texts
    assert texts._loaded == {} and len(shards) >= 3
    chunks = Engine(store, embedder, store.config, torch.device("cpu")).query(["Which animals herd sheep?"])[0]
    first = texts.first_doc  # each shard's first document
    shard_of = {store.doc_ids[d]: i for i in range(len(shards)) for d in range(first[i], first[i + 1])}
    assert chunks and set(texts._loaded) == {shard_of[c.doc_id] for c in chunks} and len(texts._loaded) < len(shards)
    old = Store.open(without_mapped(mapped_store, tmp_path / "old"))
    assert [(d.doc_id, d.text) for d in store.docs] == [(d.doc_id, d.text) for d in old.docs]
    assert all(np.array_equal(getattr(a, c), getattr(b, c)) for a, b in zip(store.docs, old.docs, strict=True)
               for c in ("char_start", "char_end", "paragraph", "section", "n_tokens"))
    assert list(texts) == [d.text for d in old.docs] and store.docs[1:3][1].doc_id == old.docs[2].doc_id


def test_tables_of_other_code_are_built_again(mapped_store, tmp_path, monkeypatch):
    root = Path(shutil.copytree(mapped_store, tmp_path / "other"))
    m = json.loads((root / "manifest.json").read_text())
    m["mapped"]["tables_fingerprint"] = "tables-older"
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.warns(UserWarning, match="qasc refresh --store"):
        assert Store.open(root).saved_tables("cpu") == {}
    assert Store.open(mapped_store).saved_tables("cpu")
    built = []
    real = LexicalIndex.from_counts.__func__
    monkeypatch.setattr(LexicalIndex, "from_counts", classmethod(lambda cls, *a: built.append(1) or real(cls, *a)))
    with pytest.warns(UserWarning, match="qasc refresh --store"):
        assert answers(root) == answers(mapped_store) and built


def test_refresh_saves_stale_tables_again(mapped_store, tmp_path, monkeypatch, capsys):
    """`qasc refresh` on a store whose tables are of other code: the tables computed again under a folder named
    for this engine, the manifest's entry and checksums with them, the old folder gone, verify clean, the same
    answers with no table rebuilt at open; a second refresh has nothing to do; a store without mapped arrays is
    refused in one line (exit 2), unchanged."""
    from qasc.engine.store.mapped import tables_fingerprint
    from qasc.jobs.cli import main

    root = Path(shutil.copytree(mapped_store, tmp_path / "stale"))
    m = json.loads((root / "manifest.json").read_text())
    m["mapped"]["tables_fingerprint"] = "tables-older"
    (root / "manifest.json").write_text(json.dumps(m))
    assert main(["refresh", "--store", str(root)]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["refreshed"] and out["previous"] == "tables-older" and out["fingerprint"] == tables_fingerprint()
    entry = json.loads((root / "manifest.json").read_text())["mapped"]
    assert entry["tables_fingerprint"] == entry["tables_folder"] == tables_fingerprint()
    assert not (root / "mapped-0001" / "tables").exists() and (root / "mapped-0001" / entry["tables_folder"]).is_dir()
    assert [t["key"] for t in entry["tables"]] == [t["key"] for t in m["mapped"]["tables"]]
    assert all(ok for _, ok, _ in verify_store(root))
    expected = answers(mapped_store)

    def refuse(*args, **kwargs):
        raise AssertionError("rebuilt at open")

    for owner, name in ((LexicalIndex, "build"), (LexicalIndex, "from_counts"), (tables, "neighbour_dots"),
                        (tables, "block_stats")):
        monkeypatch.setattr(owner, name, refuse)
    assert answers(root) == expected
    monkeypatch.undo()
    assert main(["refresh", "--store", str(root)]) == 0
    assert not json.loads(capsys.readouterr().out.splitlines()[-1])["refreshed"]
    old = without_mapped(mapped_store, tmp_path / "old")
    before = (old / "manifest.json").read_bytes()
    assert main(["refresh", "--store", str(old)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no saved tables to refresh" in err[0]
    assert (old / "manifest.json").read_bytes() == before


def test_a_store_without_mapped_arrays_opens_and_an_append_writes_them(mapped_store, tmp_path, config):
    old = without_mapped(mapped_store, tmp_path / "old")
    shutil.rmtree(old / "mapped-0001")
    assert Store.open(old).mapped is None and all(ok for _, ok, _ in verify_store(old))
    ingest([str(write_corpus(tmp_path / "more", {"owls": "# Owls\n\nOwls hunt at night. Owls eat mice."}))], old,
           config)
    m = json.loads((old / "manifest.json").read_text())
    assert m["mapped"]["folder"] == "mapped-0002" and Store.open(old).mapped is not None
    assert all(ok for _, ok, _ in verify_store(old))
    ingest([str(write_corpus(tmp_path / "more2", {"bats": "Bats hunt at night too."}))], old, config)
    assert sorted(p.name for p in old.glob("mapped-*")) == ["mapped-0003"]  # the previous generation's removed
    assert answers(old) == answers(without_mapped(old, tmp_path / "old3"))


def test_a_damaged_mapped_array_is_refused_by_name(mapped_store, tmp_path):
    root = Path(shutil.copytree(mapped_store, tmp_path / "bad"))
    vectors = root / "mapped-0001" / "vectors.npy"
    data = vectors.read_bytes()
    vectors.write_bytes(data[:-4])
    with pytest.raises(QascError, match="vectors.npy.*truncated or replaced"):
        Store.open(root)
    vectors.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    result = {name: ok for name, ok, _ in verify_store(root)}
    assert not result["checksums"] and not result["mapped"]
