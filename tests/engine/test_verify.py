"""`qasc verify`: a good store passes; each kind of damage fails the right check (and Store.open refuses it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.store import IngestConfig, Store, file_digest, ingest, verify_store
from qasc.jobs.cli import main
from tests.engine.test_store import write_corpus

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def good_store(tmp_path_factory, tiny_model) -> Path:
    tmp = tmp_path_factory.mktemp("verify")
    ingest([str(write_corpus(tmp / "c"))], tmp / "store", EngineConfig(embedder=EmbedderConfig(model=tiny_model)),
           IngestConfig(shard_chars=100))
    return tmp / "store"


@pytest.fixture
def store(good_store, tmp_path) -> Path:
    """A fresh copy of the good store to damage."""
    return Path(shutil.copytree(good_store, tmp_path / "store"))


def failed(path: Path) -> set[str]:
    return {name for name, ok, _ in verify_store(path) if not ok}


def rewrite_manifest(path: Path, edit) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_good_store_passes(good_store, capsys):
    assert main(["verify", "--store", str(good_store)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in out[:-1]] == ["checksums", "tables", "offsets", "embeddings", "mapped",
                                                       "lexical", "index", "model"]
    assert all(line.startswith("ok") for line in out[:-1]) and out[-1].endswith(": OK")


def _flip(path: Path, at: float) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _sentences(store: Path) -> Path:
    return store / json.loads((store / "manifest.json").read_text())["shards"][1]["sentences"]


def _lexical(store: Path, key: str = "lexical") -> Path:
    return store / json.loads((store / "manifest.json").read_text())["shards"][1][key]


def _index(store: Path) -> Path:
    return next(store.glob("index-*.faiss"))


@pytest.mark.parametrize("damage, checks, message", [
    (lambda s: _truncate(_sentences(s)), {"checksums", "tables"}, "truncated or replaced"),
    (lambda s: _flip(_sentences(s), 0.3), {"checksums", "tables"}, "corrupt or truncated Parquet"),
    (lambda s: _sentences(s).unlink(), {"checksums", "tables"}, "missing store file"),
    (lambda s: _truncate(_index(s)), {"checksums", "index"}, "truncated or replaced"),
    (lambda s: _flip(_index(s), 0.7), {"checksums", "index"}, "checksum mismatch"),
    (lambda s: rewrite_manifest(s, lambda m: m["counts"].update(sentences=m["counts"]["sentences"] + 1)),
     {"tables"}, "the manifest says"),
    (lambda s: rewrite_manifest(s, lambda m: m.update(dim=16)), {"tables", "index", "model", "offsets", "embeddings"},
     "embedding column"),
    (lambda s: rewrite_manifest(s, lambda m: m.update(fingerprint="0" * 16)), {"model"}, None),
    (lambda s: _truncate(_lexical(s)), {"checksums", "lexical"}, None),
    (lambda s: _flip(_lexical(s, "passage_lexical"), 0.4), {"checksums", "lexical"}, None),
    (lambda s: _lexical(s).unlink(), {"checksums", "lexical"}, None),
    (lambda s: rewrite_manifest(s, lambda m: m["shards"][0].update(n_terms=m["shards"][0]["n_terms"] + 1)),
     {"lexical"}, None),
    (lambda s: rewrite_manifest(s, lambda m: m["shards"][0].pop("passage_lexical")), {"lexical"}, None),
], ids=["parquet-truncated", "parquet-bitflip", "parquet-missing", "index-truncated", "index-bitflip",
        "count-mismatch", "dim-mismatch", "model-mismatch", "lexical-truncated", "passage-lexical-bitflip",
        "lexical-missing", "lexical-terms-mismatch", "passage-lexical-unlisted"])
def test_damage_is_detected(store, damage, checks, message, capsys):
    damage(store)
    assert checks <= failed(store)
    assert main(["verify", "--store", str(store)]) == 1
    assert "FAILED" in capsys.readouterr().out
    if message:
        if message in FAST_PATH_MESSAGES:  # damage to a file the mapped open reads too
            with pytest.raises(QascError, match=FAST_PATH_MESSAGES[message]):
                Store.open(store, load_index=True)
        with pytest.raises(QascError, match=message):  # the shards read the old way (a store without mapped arrays)
            Store.open(without_mapped(store), load_index=True)  # a flat store's default open skips its unused index


# what the mapped open (engine.store.mapped) says of damage to the files it reads; a sentences file it does not read
# (a flipped byte, offsets rewritten) is verify's to find
FAST_PATH_MESSAGES = {"truncated or replaced": "truncated or replaced", "missing store file": "missing store file",
                      "checksum mismatch": "checksum mismatch", "the manifest says": "the manifest says",
                      "embedding column": "vectors.npy: .* the store needs"}


def without_mapped(path: Path) -> Path:
    """The store as written before mapped arrays: its manifest without them (their folder stays, unread)."""
    rewrite_manifest(path, lambda m: (m.pop("mapped"), m.update(checksums={
        k: v for k, v in m["checksums"].items() if not k.startswith("mapped-")})))
    return path


def test_offsets_outside_the_document_are_caught(store):
    """A sentences file rewritten (with matching checksums) so that one span leaves its document."""
    path = _sentences(store)
    table = pq.read_table(path)
    ends = table.column("char_end").to_numpy().copy()
    ends[-1] = 10**9
    pq.write_table(table.set_column(table.schema.get_field_index("char_end"), "char_end",
                                    pa.array(ends)), path)
    rel = str(path.relative_to(store))
    rewrite_manifest(store, lambda m: m["checksums"].update({rel: file_digest(path)}))
    assert "tables" in failed(store)
    with pytest.raises(QascError, match="fall outside the document"):
        Store.open(without_mapped(store))


def test_term_counts_that_differ_from_the_texts_are_caught(store):
    """A term counts file rewritten (checksums matching, format intact) with one count changed: verify counts the
    shard's texts again and finds it; the engine's index would otherwise carry the wrong weights."""
    path = _lexical(store)
    table = pq.read_table(path)
    counts = table.column("counts").to_pylist()
    counts[0][0] += 1
    pq.write_table(table.set_column(2, "counts", pa.array(counts, table.schema.field("counts").type)), path)
    rel = str(path.relative_to(store))
    rewrite_manifest(store, lambda m: m["checksums"].update({rel: file_digest(path)}))
    result = {name: (ok, detail) for name, ok, detail in verify_store(store)}
    assert {n for n, (ok, _) in result.items() if not ok} == {"lexical"}
    assert "differ from the shard's texts" in result["lexical"][1]


def test_not_a_store_exits_2(tmp_path, capsys):
    assert main(["verify", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a QASC store" in err


def test_index_is_not_ok_when_the_tables_cannot_be_read(store):
    _flip(store / "sentences" / "part-000000.parquet", 0.5)
    result = {name: (ok, detail) for name, ok, detail in verify_store(store)}
    assert not result["tables"][0]
    assert not result["index"][0] and "not checked" in result["index"][1]


def test_manifest_edits_that_used_to_pass(store, tmp_path):
    """ntotal that is not the index's, a file without a checksum, a shard outside the store, a wrong row_start."""
    base = tmp_path / "base"
    shutil.copytree(store, base)

    def fresh(name):
        return Path(shutil.copytree(base, tmp_path / name))

    s = fresh("ntotal")
    rewrite_manifest(s, lambda m: m["index"].__setitem__("ntotal", m["index"]["ntotal"] + 1))
    assert "index" in failed(s)

    s = fresh("nosum")
    rewrite_manifest(s, lambda m: m["checksums"].pop(m["shards"][0]["sentences"]))
    assert "checksums" in failed(s)

    s = fresh("outside")
    rel = "../base/" + json.loads((s / "manifest.json").read_text())["shards"][0]["sentences"]

    def outside(m):
        old = m["shards"][0]["sentences"]
        m["shards"][0]["sentences"] = rel
        m["checksums"][rel] = m["checksums"].pop(old)

    rewrite_manifest(s, outside)
    assert {"checksums", "tables"} <= failed(s)
    with pytest.raises(QascError, match="outside the store"):
        Store.open(s)

    s = fresh("rowstart")
    rewrite_manifest(s, lambda m: m["shards"][-1].__setitem__("row_start", 5))
    assert "tables" in failed(s)


def test_open_rereads_a_store_an_append_committed_meanwhile(store, tmp_path, tiny_model, monkeypatch):
    """A reader that read the manifest just before an append committed finds the previous index file gone:
    Store.open reads the store again from the new manifest instead of reporting a damaged store."""
    appended = Path(shutil.copytree(store, tmp_path / "appended"))
    ingest([str(write_corpus(tmp_path / "more", {"zz": "A new document. It has two sentences."}))], appended,
           EngineConfig(embedder=EmbedderConfig(model=tiny_model)))
    old_index = json.loads((store / "manifest.json").read_text())["index"]["file"]
    assert json.loads((appended / "manifest.json").read_text())["index"]["file"] != old_index
    real_open = Store._open.__func__
    calls = []

    def racing_open(cls, root, manifest, *args):
        if not calls:  # the append commits between the reader's manifest read and its file reads
            shutil.copytree(appended, root, dirs_exist_ok=True)
            (root / old_index).unlink()
        calls.append(manifest["counts"]["documents"])
        return real_open(cls, root, manifest, *args)

    monkeypatch.setattr(Store, "_open", classmethod(racing_open))
    opened = Store.open(store, load_index=True)
    assert "zz" in opened.doc_ids and len(calls) == 2 and calls[1] == calls[0] + 1
