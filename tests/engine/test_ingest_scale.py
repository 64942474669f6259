"""Ingest at scale: the plan reads no document, workers hand the driver small records only, large .jsonl /
.parquet inputs are cut into units without changing what is stored, the doc_id set, and an input error in a
later shard or unit leaves an existing store untouched."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.store import IngestConfig, LocalRunner, ReadOptions, Store, ingest, verify_store
from qasc.engine.store.inputs import pack_units, plan_files, read_unit
from qasc.engine.store.manifest import DocIdSet, id_hashes
from tests.engine.test_ingest import HashEmbedder
from tests.engine.test_store import write_corpus


def tiny(model: str) -> EngineConfig:
    return EngineConfig(embedder=EmbedderConfig(model=model))


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def doc_text(i: int) -> str:
    return " ".join(f"Sentence {j} of document {i} is about lighthouse number {i * j}." for j in range(1 + i % 5))


def write_jsonl(path: Path, n: int, blank_every: int = 4) -> Path:
    lines = []
    for i in range(n):
        lines.append(json.dumps({"id": f"j{i}", "text": doc_text(i), "n": i}))
        if i % blank_every == 0:
            lines.append("")  # blank lines are skipped but counted in line numbers
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class RecordingRunner(LocalRunner):
    """The local runner, keeping what it hands the driver."""

    def __init__(self, embedder) -> None:
        super().__init__(embedder)
        self.handed: list[dict] = []

    def run(self, units, ctx, done, on_shard, on_unit, progress) -> None:
        def shard(record: dict) -> None:
            self.handed.append(pickle.loads(pickle.dumps(record)))  # a copy: the driver pops doc_ids
            on_shard(record)

        def unit(summary: dict) -> None:
            self.handed.append(dict(summary))
            on_unit(summary)

        super().run(units, ctx, done, shard, unit, progress)


def plain(value) -> bool:
    """Only str / int / float / bool / None, lists and dicts of them (no arrays, documents or sentences)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(plain(v) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


def test_plan_reads_no_document(tmp_path):
    """The plan takes sizes only: a file that cannot be decoded passes the plan; reading its unit fails."""
    good = tmp_path / "in" / "good.md"
    good.parent.mkdir()
    good.write_text("A good file. Two sentences.")
    (tmp_path / "in" / "latin.txt").write_bytes("Café crème.".encode("latin-1"))
    segments, sources, skipped = plan_files([str(tmp_path / "in")], ReadOptions(), 1 << 20)
    assert [s.doc_id for s in segments] == ["good", "latin"] and not skipped
    assert [s["bytes"] for s in sources] == [good.stat().st_size, 11]
    units = pack_units(segments, 1 << 20)
    with pytest.raises(QascError, match=r"latin\.txt: not valid utf-8 \(byte 0xe9 at offset 3\)"):
        list(read_unit(units[0], ReadOptions()))


def test_large_jsonl_is_cut_at_line_starts(tmp_path):
    """A .jsonl file larger than a unit: segments start at line starts and know their line numbers."""
    path = write_jsonl(tmp_path / "docs.jsonl", 60)
    segments, _, _ = plan_files([str(path)], ReadOptions(), 500)
    assert len(segments) > 5 and segments[0].start == 0 and segments[-1].end == path.stat().st_size
    data = path.read_bytes()
    for a, b in zip(segments, segments[1:], strict=False):
        assert a.end == b.start and data[b.start - 1:b.start] == b"\n"
        assert b.row == data[:b.start].count(b"\n") + 1
    docs = [d for u in pack_units(segments, 500) for d in read_unit(u, ReadOptions())]
    whole = [d for u in pack_units(plan_files([str(path)], ReadOptions(), 1 << 20)[0], 1 << 20)
             for d in read_unit(u, ReadOptions())]
    assert docs == whole and [d.doc_id for d in docs] == [f"j{i}" for i in range(60)]
    lines = data.split(b"\n")
    for d in docs:  # the source names the line that holds the document
        assert json.loads(lines[int(d.source.rsplit(":", 1)[1]) - 1])["id"] == d.doc_id


@pytest.mark.slow
def test_small_units_store_the_same_documents(tmp_path, tiny_model, hash_embedder):
    """Units of a few hundred bytes (a .jsonl and a multi-row-group .parquet cut into many) store the same
    documents, sentences and embeddings as one unit; the driver is handed small plain records only."""
    jsonl = write_jsonl(tmp_path / "docs.jsonl", 40)
    table = pa.table({"id": [f"p{i}" for i in range(30)], "text": [doc_text(i) for i in range(30)],
                      "year": list(range(30))})
    pq.write_table(table, tmp_path / "docs.parquet", row_group_size=7)
    paths = [str(write_corpus(tmp_path / "md")), str(jsonl), str(tmp_path / "docs.parquet")]
    runner = RecordingRunner(hash_embedder)
    ingest(paths, tmp_path / "small", tiny(tiny_model), IngestConfig(shard_chars=300, unit_bytes=400),
           runner=runner, progress=False)
    ingest(paths, tmp_path / "one", tiny(tiny_model), IngestConfig(shard_chars=300), embedder=hash_embedder,
           progress=False)
    a, b = Store.open(tmp_path / "small"), Store.open(tmp_path / "one")
    assert a.doc_ids == b.doc_ids and a.sources == b.sources and a.metadata == b.metadata
    assert [d.texts() for d in a.docs] == [d.texts() for d in b.docs]
    np.testing.assert_array_equal(a.embeddings, b.embeddings)
    assert a.manifest["counts"]["shards"] > b.manifest["counts"]["shards"] > 1
    assert all(ok for _, ok, _ in verify_store(tmp_path / "small"))

    shards = [r for r in runner.handed if "checksums" in r]
    units = [r for r in runner.handed if "checksums" not in r]
    assert len(shards) == a.manifest["counts"]["shards"] and len(units) > 5
    for record in runner.handed:
        assert plain(record), record
    for record in shards:  # names, counts, digests and the doc_ids: no text, no embeddings
        assert set(record) == {"unit", "index", "documents", "sentences", "headings", "passages", "n_documents",
                               "n_sentences", "n_headings", "n_passages", "dim", "chars", "checksums", "doc_ids",
                               "lexical", "passage_lexical", "n_terms", "n_passage_terms", "term_rule"}
        assert len(pickle.dumps(record)) < 1200 + 40 * record["n_documents"]  # six files named: not growing with text
    assert sum(len(r["doc_ids"]) for r in shards) == len(a.doc_ids)


@pytest.mark.slow
def test_input_error_in_a_later_unit_leaves_the_store_untouched(tmp_path, tiny_model, hash_embedder):
    """Shards of earlier units are embedded and staged, then a bad document (or a doc_id repeated across
    units) aborts: the existing store is byte for byte what it was and nothing is staged."""
    store = tmp_path / "store"
    ingest([str(write_corpus(tmp_path / "a"))], store, tiny(tiny_model), embedder=hash_embedder, progress=False)
    before = tree_digest(store)
    settings_ = IngestConfig(shard_chars=200, unit_bytes=300)

    folder = write_corpus(tmp_path / "b", {f"doc{i:02d}": doc_text(i) for i in range(12)})
    (folder / "zz.txt").write_bytes("Café crème.".encode("latin-1"))  # sorted last: the last unit
    notes: list[str] = []
    runner = RecordingRunner(hash_embedder)
    with pytest.raises(QascError, match=r"zz\.txt: not valid utf-8"):
        ingest([str(folder)], store, settings=settings_, runner=runner, progress=False, log=notes.append)
    assert sum("checksums" in r for r in runner.handed) >= 3  # earlier shards were written before the error
    assert tree_digest(store) == before and not (store / "_staging").exists()

    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i if i != 9 else 2, "text": doc_text(i)}) + "\n" for i in range(10)))
    with pytest.raises(QascError, match=rf"duplicate doc_id '2': {jsonl}:3 and {jsonl}:10"):
        ingest([str(jsonl)], store, settings=settings_, embedder=hash_embedder, progress=False)
    assert tree_digest(store) == before and not (store / "_staging").exists()
    with pytest.raises(QascError, match=r"duplicate doc_id 'beta': .*c2\.jsonl:2 is already in the store"):
        (tmp_path / "c2.jsonl").write_text(json.dumps({"id": "new", "text": "New."}) + "\n"
                                           + json.dumps({"id": "beta", "text": "Again."}) + "\n")
        ingest([str(tmp_path / "c2.jsonl")], store, settings=settings_, embedder=hash_embedder, progress=False)
    assert tree_digest(store) == before
    assert all(ok for _, ok, _ in verify_store(store))


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 300), max_size=40), max_size=12),
       queries=st.lists(st.integers(0, 400), max_size=50))
def test_doc_id_set_matches_a_python_set(batches, queries):
    ids, ref = DocIdSet(), set()
    for batch in batches:
        names = [f"id-{b}" for b in batch]
        hits = ids.hits(id_hashes(names))
        assert hits.tolist() == [n in ref for n in names]
        ids.add(id_hashes(names))
        ref.update(names)
    names = [f"id-{q}" for q in queries]
    assert ids.hits(id_hashes(names)).tolist() == [n in ref for n in names]
    assert len(ids.levels) <= max(1, int(np.log2(max(len(ids), 1))) + 1)


@pytest.fixture
def hash_embedder(tiny_model):
    return HashEmbedder(tiny_model)
