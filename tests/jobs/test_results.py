"""jobs/results.py's ResultWriter: streamed .parquet (row groups) and .jsonl equal to the rows written, atomic
(a failed run leaves the previous file and no temp file), bad targets refused before any work."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qasc.engine.columns import results_schema
from qasc.engine.errors import QascError
from qasc.jobs.results import ResultWriter, rows_to_table


def _rows(lo: int, n: int) -> list[dict]:
    return [{"query_id": f"q{i // 3}", "rank": i % 3, "doc_id": f"d{i % 7}", "char_start": i, "char_end": i + 5,
             "score": 0.25 + i / 1024, "text": f"tëxt {i}\n\"quoted\"", "n_tokens": 4, "seed_ids": list(range(i % 4)),
             "sentence_start": i, "sentence_end": i + i % 2} for i in range(lo, lo + n)]


def _batches() -> list:
    """Record batches of 7, 0, 11 and 3 rows (a Table among them), as Engine.query_batches yields slices."""
    sizes, out, lo = (7, 0, 11, 3), [], 0
    for n in sizes:
        out.append(rows_to_table(_rows(lo, n)).to_batches()[0] if n else results_schema().empty_table())
        lo += n
    return out


@pytest.mark.parametrize("row_group_rows", [1, 8, 10_000])
def test_parquet_streams_row_groups(tmp_path, row_group_rows):
    out = tmp_path / "r.parquet"
    with ResultWriter(out, row_group_rows=row_group_rows) as w:
        for b in _batches():
            w.write(b)
        assert not out.exists()  # nothing at the target until the run succeeds
    assert w.rows == 21
    f = pq.ParquetFile(out)
    assert f.schema_arrow.equals(results_schema())
    assert f.read().to_pylist() == pa.Table.from_pylist(_rows(0, 21), schema=results_schema()).to_pylist()
    # row groups of at least row_group_rows rows, written as the batches came: 7 | 11 | 3 with 1 or 8, one with 10k
    assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == {
        1: [7, 11, 3], 8: [18, 3], 10_000: [21]}[row_group_rows]
    assert [p.name for p in tmp_path.iterdir()] == ["r.parquet"]


def test_jsonl_lines_are_the_rows(tmp_path):
    out = tmp_path / "r.jsonl"
    with ResultWriter(out) as w:
        assert w.write_all(_batches()) == 21
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == pa.Table.from_pylist(_rows(0, 21), schema=results_schema()).to_pylist()


@pytest.mark.parametrize("name", ["r.jsonl", "r.parquet"])
def test_failed_run_leaves_previous_file(tmp_path, name):
    out = tmp_path / name
    out.write_bytes(b"previous results")

    def batches():
        yield from _batches()[:2]
        raise RuntimeError("killed mid-run")

    with pytest.raises(RuntimeError, match="mid-run"), ResultWriter(out, row_group_rows=1) as w:
        w.write_all(batches())
    assert out.read_bytes() == b"previous results"
    assert [p.name for p in tmp_path.iterdir()] == [name]  # the temp file is gone


def test_bad_targets_and_batches_refused(tmp_path):
    with pytest.raises(QascError, match=r"\.jsonl or \.parquet"):
        ResultWriter(tmp_path / "r.csv")
    with pytest.raises(QascError, match="does not exist"):
        ResultWriter(tmp_path / "missing" / "r.jsonl")
    with pytest.raises(QascError, match="columns"), ResultWriter(tmp_path / "r.parquet") as w:
        w.write(pa.table({"x": [1]}))
    assert list(tmp_path.iterdir()) == []
