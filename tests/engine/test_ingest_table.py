"""In-memory inputs: `ingest_table` from an Arrow table, a pandas DataFrame or records builds the same store,
byte for byte, as `ingest` of the same documents written as .parquet / .jsonl; bad tables write nothing;
appends and resumes work as for files; query results as an Arrow table; the docs example (extracted from
docs/query.md)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.store import IngestConfig, ResumableError, Store, ingest, ingest_table, verify_store
from qasc.engine.store.schema import MANIFEST
from tests.conftest import DEMO_CORPUS, REPO
from tests.engine.test_integrations import README_MARK, readme_examples

pytestmark = pytest.mark.slow

SETTINGS = IngestConfig(shard_chars=3000)  # several shards from the demo documents


def records() -> list[dict]:
    """The demo documents plus a few short ones, with metadata columns (a string, an int, a list)."""
    out = [{"id": p.stem, "text": p.read_text(encoding="utf-8"), "title": p.stem.title(), "year": 2000 + i,
            "tags": [p.stem[:3], "demo"]} for i, p in enumerate(sorted(DEMO_CORPUS.glob("*.md")))]
    out += [{"id": f"note-{i}", "text": f"Note {i}. The lighthouse keeper wrote {i} lines about bread and sun.",
             "title": f"Note {i}", "year": 2020 + i, "tags": ["note"]} for i in range(4)]
    return out


@pytest.fixture(scope="module")
def config(tiny_model) -> EngineConfig:
    return EngineConfig(embedder=EmbedderConfig(model=tiny_model))


def digests(store: Path) -> dict[str, str]:
    """sha256 of every file of a store but the manifest (it holds timestamps): the Parquet files and the index."""
    return {p.relative_to(store).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file() and p.name not in (MANIFEST, ".lock")}


def assert_identical(a: Path, b: Path) -> None:
    da, db = digests(a), digests(b)
    assert any(k.startswith("index-") for k in da) and any(k.startswith("documents/") for k in da)
    assert da == db
    ma, mb = (json.loads((s / MANIFEST).read_text()) for s in (a, b))
    for key in ("counts", "shards", "checksums", "config", "ingest", "splitter", "index", "fingerprint"):
        assert ma[key] == mb[key], key


def test_arrow_table_equals_parquet_file(tmp_path, config):
    table = pa.Table.from_pylist(records())
    path = tmp_path / "docs.parquet"
    pq.write_table(table, path)
    ingest([str(path)], tmp_path / "from_file", config, SETTINGS, progress=False)
    summary = ingest_table(table, tmp_path / "from_table", config, SETTINGS, source=str(path), progress=False)
    assert summary["documents"] == len(records()) and json.loads(
        (tmp_path / "from_table" / MANIFEST).read_text())["counts"]["shards"] > 1
    assert_identical(tmp_path / "from_file", tmp_path / "from_table")
    store = Store.open(tmp_path / "from_table")
    assert store.metadata[0] == {"title": "Lighthouses", "year": 2000, "tags": ["lig", "demo"]}
    assert store.sources[1] == f"{path}#row1"
    verify_store(tmp_path / "from_table")

    # a pandas DataFrame (pandas comes with ray[data]) is the same table
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(records())
    ingest_table(df, tmp_path / "from_pandas", config, SETTINGS, source=str(path), progress=False)
    assert_identical(tmp_path / "from_file", tmp_path / "from_pandas")

    # the default label: the same bytes but for the source column
    ingest_table(table, tmp_path / "labelled", config, SETTINGS, progress=False)
    assert Store.open(tmp_path / "labelled").sources[:2] == ["table#row0", "table#row1"]
    assert digests(tmp_path / "labelled")["sentences/part-000000.parquet"] == digests(tmp_path / "from_file")[
        "sentences/part-000000.parquet"]


def test_records_equal_jsonl_file(tmp_path, config):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records()), encoding="utf-8")
    ingest([str(path)], tmp_path / "from_file", config, SETTINGS, progress=False)
    ingest_table(iter(records()), tmp_path / "from_records", config, SETTINGS, source=str(path), progress=False)
    assert_identical(tmp_path / "from_file", tmp_path / "from_records")
    assert Store.open(tmp_path / "from_records").sources[0] == f"{path}:1"


def test_append_and_duplicates_against_the_store(tmp_path, config):
    rows = records()
    store = tmp_path / "store"
    ingest_table(pa.Table.from_pylist(rows[:3]), store, config, SETTINGS, progress=False)
    before = digests(store)
    with pytest.raises(QascError, match=r"duplicate doc_id 'sourdough': table#row0 is already in the store"):
        ingest_table(pa.Table.from_pylist(rows[2:]), store, progress=False)
    assert digests(store) == before
    summary = ingest_table(rows[3:], store, progress=False)  # records; the store's config and settings
    assert summary["documents"] == 4 and summary["store_documents"] == 7
    assert Store.open(store).doc_ids == [r["id"] for r in rows]
    verify_store(store)


def test_interrupted_ingest_resumes(tmp_path, config, monkeypatch):
    table = pa.Table.from_pylist(records())
    ingest_table(table, tmp_path / "reference", config, SETTINGS, progress=False)
    monkeypatch.setenv("QASC_FAILPOINT", "shard-written:2:enospc")
    with pytest.raises(ResumableError):
        ingest_table(table, tmp_path / "store", config, SETTINGS, progress=False)
    monkeypatch.delenv("QASC_FAILPOINT")
    notes: list[str] = []
    summary = ingest_table(table, tmp_path / "store", config, SETTINGS, progress=False, log=notes.append)
    assert summary["resumed_shards"] == 2, notes
    assert_identical(tmp_path / "reference", tmp_path / "store")


BAD = [
    ("missing id", pa.table({"doc": ["a"], "text": ["Some text."]}), r"table: no 'id' column \(columns: doc, text\)"),
    ("missing text", pa.table({"id": ["a"], "body": ["Some text."]}), r"table: no 'text' column"),
    ("duplicate ids", pa.table({"id": ["a", "b", "a"], "text": ["One.", "Two.", "Three."]}),
     r"duplicate doc_id 'a': table#row0 and table#row2"),
    ("int text", pa.table({"id": ["a", "b"], "text": [1, 2]}), r"table: column 'text' must hold strings, got int64"),
    ("null text", pa.table({"id": ["a", "b"], "text": ["One.", None]}), r"table#row1: 'text' must be a string"),
    ("empty text", pa.table({"id": ["a", "b"], "text": ["One.", "  "]}), r"table#row1: empty document"),
    ("null id", pa.table({"id": ["a", None], "text": ["One.", "Two."]}), r"table#row1: missing 'id'"),
    ("float id", pa.table({"id": [1.5], "text": ["One."]}), r"table#row0: 'id' must be a string or an integer"),
    ("empty table", pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
     r"table: empty collection"),
    ("record not a mapping", [{"id": "a", "text": "One."}, "Two."], r"records:2: expected a mapping"),
    ("record without text", [{"id": "a", "body": "One."}], r"records:1: no 'text' field \(fields: id, body\)"),
    ("record duplicate", [{"id": 1, "text": "One."}, {"id": "1", "text": "Two."}],
     r"duplicate doc_id '1': records:1 and records:2"),
    ("record int text", [{"id": "a", "text": 3}], r"records:1: 'text' must be a string, got int"),
    ("a path", "docs.parquet", r"pass files and folders to ingest\(\)"),
]


@pytest.mark.parametrize(("data", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_tables_write_nothing(tmp_path, config, data, message):
    with pytest.raises(QascError, match=message):
        ingest_table(data, tmp_path / "store", config, progress=False)
    assert not (tmp_path / "store").exists()


def test_bad_dataframe(tmp_path, config):
    pd = pytest.importorskip("pandas")
    with pytest.raises(QascError, match=r"table: cannot convert the DataFrame to Arrow \(Expected bytes, got a 'int' "
                                        r"object; Conversion failed for column text with type object\)"):
        ingest_table(pd.DataFrame({"id": ["a", "b"], "text": ["One.", 2]}), tmp_path / "store", config,
                     progress=False)
    with pytest.raises(QascError, match=r"table: no 'id' column"):
        ingest_table(pd.DataFrame({"text": ["One."]}), tmp_path / "store", config, progress=False)
    with pytest.raises(QascError, match=r"table: empty collection \(no records\)"):  # its columns are float64
        ingest_table(pd.DataFrame({"id": [], "text": []}), tmp_path / "store", config, progress=False)
    assert not (tmp_path / "store").exists()


def test_query_results_as_arrow_table(demo_store):
    from qasc.engine.query import Engine
    from qasc.jobs.results import RESULT_COLUMNS, result_rows, results_schema, to_table

    engine = Engine.open(str(demo_store), device="cpu")
    questions = ["How long should sourdough dough proof?", "Who invented the lighthouse lens?"]
    results = engine.query(questions)
    table = to_table(results)
    assert table.schema == results_schema() and tuple(table.column_names) == RESULT_COLUMNS
    assert table.to_pylist() == pa.Table.from_pylist(result_rows(["0", "1"], results), schema=results_schema()
                                                     ).to_pylist()
    assert to_table(results, ids=["a", "b"]).column("query_id").to_pylist()[0] == "a"
    assert to_table([]).num_rows == 0
    with pytest.raises(QascError, match="1 query ids for 2 results"):
        to_table(results, ids=["a"])


def run_readme_example(name: str, tmp_path: Path, tmpdir: Path | None = None) -> str:
    """Runs the `<!-- readme-test: NAME -->` block of README.md or docs/*.md as a user would (repository root,
    this checkout's packages first, no Ray address inherited from this session, temporary files under tmpdir or
    tmp_path) -> its stdout."""
    examples = readme_examples()
    assert name in examples, f"README.md and docs/*.md have no example marked {README_MARK}{name} -->"
    script = tmp_path / f"readme_{name}.py"
    script.write_text(examples[name], encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TMPDIR=str(tmpdir or tmp_path), PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), "the example printed nothing"
    return out.stdout


@pytest.mark.timeout(600)
def test_readme_in_memory_example_runs(tmp_path):
    out = run_readme_example("in-memory", tmp_path)
    assert "query_id: string" in out and "'query_id': 'tea', 'rank': 0, 'doc_id': 'tea'" in out
