"""Every bad input of docs/bad_inputs.md: one clear line, exit 2, nothing written or lost. Each table row is a
test here (or names the test elsewhere that covers it); test_table_matches_the_tests keeps the two in sync."""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.store import IngestConfig, Store, ingest, verify_store
from qasc.jobs.cli import main
from tests.conftest import REPO
from tests.engine.test_ingest import HashEmbedder
from tests.engine.test_store import write_corpus

pytestmark = pytest.mark.slow

TABLE = REPO / "docs" / "bad_inputs.md"
_HELD: list[int] = []  # file descriptors a case keeps open while the command runs


def text(tmp: Path, name: str, data: str | bytes) -> str:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def jsonl(tmp: Path, *lines: str) -> str:
    return text(tmp, "in/records.jsonl", "\n".join(lines) + "\n")


def parquet(tmp: Path, table: pa.Table, name: str = "in/table.parquet") -> str:
    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, tmp / name)
    return str(tmp / name)


def fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "pipe.md")
    return str(tmp / "pipe.md")


def dangling(tmp: Path) -> str:
    (tmp / "in").mkdir()
    (tmp / "in" / "ok.md").write_text("A good file.")
    os.symlink(tmp / "gone.md", tmp / "in" / "broken.md")
    return str(tmp / "in")


def lock(store: Path) -> None:
    fd = os.open(store / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _HELD.append(fd)


GOOD = "A good document. It has two sentences."


@dataclass(frozen=True)
class Case:
    id: str
    args: Callable[[Path, Path], list[str]]  # (tmp, store) -> command-line arguments after `ingest`
    message: str | None  # regex the one-line error must match; None: the command must succeed
    store: str = "new"  # new: nothing may be created | append: an existing store must stay identical
    local: bool = True  # run with --local (no Ray)


CASES = [
    Case("missing-path", lambda t, s: [str(t / "nope.md")], r"nope\.md: no such file or directory"),
    Case("unreadable-path", lambda t, s: [dangling(t)], r"broken\.md: cannot read \(No such file"),
    Case("not-a-file", lambda t, s: [fifo(t)], r"pipe\.md: not a regular file or folder"),
    Case("empty-file", lambda t, s: [text(t, "in/empty.md", "")], r"empty\.md: empty file \(no text\)"),
    Case("whitespace-file", lambda t, s: [text(t, "in/blank.txt", " \n\n\t \n")], r"blank\.txt: empty file"),
    Case("empty-folder", lambda t, s: [text(t, "in/logo.png", b"\x89PNG") and str(t / "in")],
         r"in: empty collection: no text/markdown files"),
    Case("empty-jsonl", lambda t, s: [jsonl(t, "", "  ")], r"records\.jsonl: empty collection \(no records\)"),
    Case("empty-parquet", lambda t, s: [parquet(t, pa.table({"id": pa.array([], pa.string()),
                                                               "text": pa.array([], pa.string())}))],
         r"table\.parquet: empty collection \(no records\)"),
    Case("binary-file", lambda t, s: [text(t, "in/blob.md", b"PK\x03\x04\x00\x00binary")],
         r"blob\.md: looks like a binary file \(NUL byte at offset 4\)"),
    Case("non-utf8", lambda t, s: [text(t, "in/latin.txt", "Café crème.".encode("latin-1"))],
         r"latin\.txt: not valid utf-8 \(byte 0xe9 at offset 3\); pass --encoding ENC or --errors replace"),
    Case("non-utf8-encoding-flag", lambda t, s: [text(t, "in/latin.txt", "Café crème.".encode("latin-1")),
                                                 "--encoding", "latin-1"], None),
    Case("non-utf8-errors-replace", lambda t, s: [text(t, "in/latin.txt", "Café crème.".encode("latin-1")),
                                                  "--errors", "replace"], None),
    Case("unknown-encoding", lambda t, s: [text(t, "a.md", GOOD), "--encoding", "klingon"],
         r"unknown --encoding 'klingon'"),
    Case("duplicate-ids", lambda t, s: [text(t, "in/a.md", GOOD) and text(t, "in/a.txt", GOOD) and str(t / "in")],
         r"duplicate doc_id 'a': .*a\.md and .*a\.txt"),
    Case("duplicate-ids-jsonl", lambda t, s: [jsonl(t, '{"id": "x", "text": "One."}', '{"id": "x", "text": "Two."}')],
         r"duplicate doc_id 'x': .*records\.jsonl:1 and .*records\.jsonl:2"),
    Case("duplicate-id-in-store", lambda t, s: [text(t, "in/alpha.md", GOOD)],
         r"duplicate doc_id 'alpha': .*alpha\.md is already in the store", store="append"),
    Case("other-model", lambda t, s: [text(t, "in/new.md", GOOD), "--model", "all-MiniLM-L6-v2"],
         r"was built with model '.*tiny_model.*' \(fingerprint \w+\); refusing to add embeddings of "
         r"'all-MiniLM-L6-v2'", store="append"),
    Case("other-splitter", lambda t, s: [text(t, "in/new.md", GOOD), "--max-sentence-tokens", "64"],
         r"was split with other settings \(store max_sentence_tokens=128, now 64\)", store="append"),
    Case("other-dtype-store", lambda t, s: [text(t, "in/new.md", GOOD), "--dtype-store", "float16"],
         r"stores float32 embeddings; refusing --dtype-store float16", store="append"),
    Case("invalid-json", lambda t, s: [jsonl(t, '{"id": "a", "text": "One."}', '{"id": "b" "text": "Two."}')],
         r"records\.jsonl:2: invalid JSON \(Expecting ',' delimiter at column 12\)"),
    Case("jsonl-not-object", lambda t, s: [jsonl(t, '["a", "One."]')],
         r"records\.jsonl:1: expected a JSON object with 'id' and 'text', got list"),
    Case("missing-field", lambda t, s: [jsonl(t, '{"id": "a", "body": "One."}')],
         r"records\.jsonl:1: no 'text' field \(fields: id, body\); pass --id-field/--text-field"),
    Case("unknown-column", lambda t, s: [parquet(t, pa.table({"id": ["a"], "text": ["One."], "lang": ["en"]})),
                                         "--text-field", "body"],
         r"table\.parquet: no 'body' column \(columns: id, text, lang\); pass --id-field/--text-field"),
    Case("non-string-text", lambda t, s: [parquet(t, pa.table({"id": ["a"], "text": [42]}))],
         r"table\.parquet: column 'text' must hold strings, got int64"),
    Case("bad-id", lambda t, s: [jsonl(t, '{"id": null, "text": "One."}')],
         r"records\.jsonl:1: 'id' must be a string or an integer, got NoneType"),
    Case("empty-record", lambda t, s: [jsonl(t, '{"id": "a", "text": "One."}', '{"id": "b", "text": "  "}')],
         r"records\.jsonl:2: empty document \(no text\)"),
    Case("corrupt-parquet-input", lambda t, s: [text(t, "in/broken.parquet", b"PAR1 this is not parquet")],
         r"broken\.parquet: not a readable Parquet file"),
    Case("store-is-a-file", lambda t, s: [text(t, "a.md", GOOD), "--store", text(t, "file.txt", "mine")],
         r"--store .*file\.txt: exists and is a file"),
    Case("store-foreign-folder", lambda t, s: [text(t, "a.md", GOOD), "--store",
                                               text(t, "mine/notes.txt", "mine") and str(t / "mine")],
         r"--store .*mine: folder exists and is not a QASC store \(no manifest\.json; holds notes\.txt\)"),
    Case("store-locked", lambda t, s: [lock(s) or text(t, "in/new.md", GOOD)],
         r"another ingest is writing this store right now", store="append"),
    Case("ray-unreachable", lambda t, s: [text(t, "a.md", GOOD), "--ray-address", "127.0.0.1:1"],
         r"cannot connect to Ray at 127\.0\.0\.1:1: Connection refused", local=False),
    Case("workers-zero", lambda t, s: [text(t, "a.md", GOOD), "--workers", "0"], r"--workers must be >= 1, got 0"),
    Case("workers-local", lambda t, s: [text(t, "a.md", GOOD), "--workers", "2"], r"--workers 2 needs Ray"),
    Case("sentence-tokens-range", lambda t, s: [text(t, "a.md", GOOD), "--max-sentence-tokens", "300"],
         r"--max-sentence-tokens must be in \[1, 254\].*got 300"),
    Case("sentence-tokens-zero", lambda t, s: [text(t, "a.md", GOOD), "--max-sentence-tokens", "0"],
         r"--max-sentence-tokens must be in \[1, 254\].*got 0"),
    Case("passage-tokens-range", lambda t, s: [text(t, "a.md", GOOD), "--passage-tokens", "-1"],
         r"--passage-tokens must be in \[0, 254\].*got -1"),
    Case("other-passages", lambda t, s: [text(t, "in/new.md", GOOD), "--passage-tokens", "64"],
         r"was split with other settings \(store passage_tokens=128, now 64\)", store="append"),
    Case("batch-tokens", lambda t, s: [text(t, "a.md", GOOD), "--batch-tokens", "10"],
         r"--batch-tokens \(10\) must be >= --max-length \(256\)"),
    Case("shard-chars", lambda t, s: [text(t, "a.md", GOOD), "--shard-chars", "-5"], r"--shard-chars must be >= 1"),
    Case("index-kind", lambda t, s: [text(t, "a.md", GOOD), "--index", "annoy"], r"unknown index kind 'annoy'"),
    Case("dtype-store", lambda t, s: [text(t, "a.md", GOOD), "--dtype-store", "int8"],
         r"--dtype-store must be one of float32, float16, got 'int8'"),
    Case("errors-mode", lambda t, s: [text(t, "a.md", GOOD), "--errors", "loud"], r"--errors must be one of"),
    Case("compute-dtype", lambda t, s: [text(t, "a.md", GOOD), "--dtype", "float8"], r"unknown dtype 'float8'"),
    Case("no-cuda", lambda t, s: [text(t, "a.md", GOOD), "--device", "cuda"], r"CUDA is not available"),
    Case("line-breaks", lambda t, s: [text(t, "a.md", GOOD), "--line-breaks", "sometimes"],
         r"line_breaks must be ignore\|paragraph\|always"),
    Case("max-chars", lambda t, s: [text(t, "a.md", GOOD), "--max-chars", "3"], r"max_chars must be >= 16"),
    Case("same-fields", lambda t, s: [text(t, "a.md", GOOD), "--id-field", "text"],
         r"--id-field and --text-field must be two different names"),
]

ELSEWHERE = {  # rows of the table covered by tests in other files
    "ten-megabyte-line": "tests/engine/test_ingest.py::test_ten_megabyte_line_without_breaks",
    "parquet-truncated": "tests/engine/test_verify.py::test_damage_is_detected",
    "parquet-bitflip": "tests/engine/test_verify.py::test_damage_is_detected",
    "parquet-missing": "tests/engine/test_verify.py::test_damage_is_detected",
    "index-truncated": "tests/engine/test_verify.py::test_damage_is_detected",
    "index-bitflip": "tests/engine/test_verify.py::test_damage_is_detected",
    "offsets-outside": "tests/engine/test_verify.py::test_offsets_outside_the_document_are_caught",
    "incomplete-store": "tests/engine/test_ingest_resume.py::test_sigkill_at_several_points_then_rerun",
    "corrupt-manifest": "tests/engine/test_store.py::test_open_errors",
    "query-embeddings": "tests/engine/test_store.py::test_search_pads_missing_hits_and_rejects_bad_queries",
    **{case: "tests/engine/test_ingest_table.py::test_bad_tables_write_nothing" for case in (
        "table-missing-column", "table-text-not-string", "table-bad-row", "table-duplicate-id", "records-not-mapping")},
    "table-id-in-store": "tests/engine/test_ingest_table.py::test_append_and_duplicates_against_the_store",
    "dataframe-unconvertible": "tests/engine/test_ingest_table.py::test_bad_dataframe",
    **{case: "tests/jobs/test_rerank_cmd.py::test_cli_query_refuses_a_bad_reranker" for case in (
        "reranker-missing", "reranker-file", "reranker-encoder", "reranker-offline", "rerank-top-zero",
        "rerank-top-alone")},
    **{case: "tests/engine/test_rerank.py::test_loader_refuses_what_is_no_cross_encoder" for case in (
        "reranker-empty", "reranker-labels")},
}
API_CASES = ["nan-embeddings", "disk-full", "query-model", "store-without-manifest",  # the test functions below
             "append-to-damaged-store"]


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base_store(tmp_path_factory, tiny_model) -> Path:
    tmp = tmp_path_factory.mktemp("base")
    ingest([str(write_corpus(tmp / "c"))], tmp / "store", EngineConfig(embedder=EmbedderConfig(model=tiny_model)))
    return tmp / "store"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, tmp_path, base_store, tiny_model, capsys):
    store = tmp_path / "store"
    if case.store == "append":
        shutil.copytree(base_store, store)
        before = tree_digest(store)
    try:
        args = case.args(tmp_path, store)
        outside = {p: tree_digest(p) if p.is_dir() else p.read_bytes()
                   for p in map(Path, args) if (p.is_file() or p.is_dir()) and p.parent == tmp_path}
        local = ["--local"] if case.local else []
        code = main(["ingest", *local, "--progress", "--model", tiny_model, "--store", str(store), *args])
    finally:
        while _HELD:
            os.close(_HELD.pop())
    out, err = capsys.readouterr()
    if case.message is None:
        assert code == 0, err
        assert Store.open(store).docs[0].text.startswith("Caf")
        return
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("qasc ingest: error: ") and re.search(case.message, lines[0]), lines[0]
    if case.store == "append":  # nothing lost: the store is byte for byte what it was, and verifies
        assert tree_digest(store) == before
        assert all(ok for _, ok, _ in verify_store(store))
    else:  # nothing written: no store folder, and the user's own files untouched
        assert not store.exists()
        for path, content in outside.items():
            assert (tree_digest(path) if path.is_dir() else path.read_bytes()) == content


def test_nan_embeddings(tmp_path, tiny_model):
    docs = {"a": "Fine sentence.", "b": "This one has NaN here. Fine again.", "c": "Also fine."}
    with pytest.raises(QascError, match=r"shard 1 \(documents 'b' \.\. 'b'\): the embedding model produced "
                                        r"NaN/inf vectors; refusing to store them"):
        ingest([str(write_corpus(tmp_path / "c", docs))], tmp_path / "store",
               EngineConfig(embedder=EmbedderConfig(model=tiny_model)), IngestConfig(shard_chars=10),
               embedder=HashEmbedder(tiny_model, poison="NaN here"))
    assert not (tmp_path / "store").exists()  # shard 0 was written, then rolled back with the rest


def test_disk_full(tmp_path, tiny_model, monkeypatch, base_store):
    """ENOSPC while writing: a clear message, the finished shards are kept, the same command resumes."""
    monkeypatch.setenv("QASC_FAILPOINT", "parquet-write:7:enospc")  # shard 0 = 6 files fine (documents, sentences,
    # headings, passages, lexical, passage_lexical), shard 1: disk full
    corpus = write_corpus(tmp_path / "c")
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    with pytest.raises(QascError, match=r"cannot write shard 1 into .*: No space left on device; finished shards "
                                        r"are kept, run the same ingest again to resume"):
        ingest([str(corpus)], tmp_path / "store", config, settings=IngestConfig(shard_chars=100))
    assert len(list((tmp_path / "store" / "_staging" / "shards").glob("*.json"))) == 1
    monkeypatch.delenv("QASC_FAILPOINT")
    summary = ingest([str(corpus)], tmp_path / "store", config, settings=IngestConfig(shard_chars=100))
    assert summary["resumed_shards"] == 1 and all(ok for _, ok, _ in verify_store(tmp_path / "store"))


def test_query_model(base_store):
    """A store queried with another model or dimension is refused (Store.check_embedder)."""
    store = Store.open(base_store, load_index=False)
    store.check_embedder({"model": "x", "fingerprint": store.manifest["fingerprint"], "dim": store.manifest["dim"]})
    with pytest.raises(QascError, match=r"was built with model .* dim 32\); the query model is 'other' "
                                        r"\(fingerprint abc, dim 384\)"):
        store.check_embedder({"model": "other", "fingerprint": "abc", "dim": 384})


def test_table_matches_the_tests():
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", TABLE.read_text(encoding="utf-8"), flags=re.M)
    assert len(rows) == len(set(rows))
    assert set(rows) == {c.id for c in CASES} | set(ELSEWHERE) | {c.replace("_", "-") for c in API_CASES}
    for target in ELSEWHERE.values():  # each names a test function that exists (not text that looks like one)
        module, name = target.split("::")
        test = getattr(importlib.import_module(module.removesuffix(".py").replace("/", ".")), name, None)
        assert callable(test) and name.startswith("test_"), target
    for name in API_CASES:
        assert f"test_{name.replace('-', '_')}" in globals()


def _ingest_cli(store: Path, tmp: Path, tiny_model: str, capsys) -> tuple[int, str]:
    code = main(["ingest", "--local", "--model", tiny_model, "--store", str(store), text(tmp, "in/new.md", GOOD)])
    return code, capsys.readouterr().err.strip()


def test_store_without_manifest(tmp_path, base_store, tiny_model, capsys):
    """Store files without a manifest and without an ingest to resume: refused, not overwritten."""
    store = tmp_path / "store"
    shutil.copytree(base_store, store)
    (store / "manifest.json").unlink()
    before = tree_digest(store)
    code, err = _ingest_cli(store, tmp_path, tiny_model, capsys)
    assert code == 2 and err.count("\n") == 0
    assert re.search(r"holds store files \(.*\) but no manifest\.json and no unfinished ingest: a damaged store", err)
    assert tree_digest(store) == before


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_append_to_damaged_store(tmp_path, base_store, tiny_model, capsys, damage):
    store = tmp_path / "store"
    shutil.copytree(base_store, store)
    shard = sorted((store / "sentences").glob("*.parquet"))[0]
    if damage == "delete":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:100])
    before = tree_digest(store)
    code, err = _ingest_cli(store, tmp_path, tiny_model, capsys)
    assert code == 2 and err.count("\n") == 0
    assert ("missing store file" if damage == "delete" else "(truncated or replaced)") in err, err
    assert tree_digest(store) == before

