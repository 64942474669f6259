"""`qasc query`: .jsonl and .parquet results, bad parameters and files, the Ray job equal to the local path,
and the results module's rows <-> Chunk round trip."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from qasc.engine.config import RetrievalConfig
from qasc.kernels.params import QascParams
from tests.engine.test_query import QUESTIONS

pytestmark = pytest.mark.slow


def test_cli_query_jsonl_and_parquet(demo_store, tmp_path, capsys):
    import pyarrow.parquet as pq

    from qasc.jobs.cli import main

    queries = tmp_path / "q.csv"
    with open(queries, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "question", "extra"])
        for i, q in enumerate(QUESTIONS):
            w.writerow([f"q{i}", q, "ignored"])
    out = tmp_path / "r.jsonl"
    assert main(["query", "--store", str(demo_store), "--queries", str(queries), "--out", str(out),
                 "--top-k", "2", "--max-extent", "3"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["query_id"] for r in rows} <= {f"q{i}" for i in range(len(QUESTIONS))}
    assert all(r["rank"] < 2 for r in rows)
    out_pq = tmp_path / "r.parquet"
    assert main(["query", "--store", str(demo_store), "--queries", str(queries), "--out", str(out_pq),
                 "--top-k", "2", "--max-extent", "3"]) == 0
    table = pq.read_table(out_pq).to_pylist()
    assert [(r["query_id"], r["char_start"], r["char_end"]) for r in table] == [
        (r["query_id"], r["char_start"], r["char_end"]) for r in rows
    ]
    assert main(["query", "--store", str(demo_store), "--question", "Who invented the Fresnel lens?"]) == 0
    assert "Fresnel" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--percentile", "120"], "percentile"),
        (["--max-extent", "0"], "max_extent"),
        (["--radius", "1"], "--radius was removed (the window extents"),
        (["-m", "1"], "-m was removed"),
        (["--no-merge"], "--no-merge was removed"),
        (["--depth", "0"], "depth"),
        (["--question", "   "], "empty"),
        (["--out", "answers.csv"], ".jsonl or .parquet"),
        (["--score-margin", "nan"], "score_margin must be a finite number, got nan"),
        (["--length-bonus", "inf"], "length_bonus must be a finite number, got inf"),
        (["--max-extent", "1000000000"], "max_extent must be in [1, 64], got 1000000000"),
        (["--neighbourhood", "1000000000"], "neighbourhood must be in [0, 1000], got 1000000000"),
        (["--device", "tpu"], "--device: unknown device 'tpu'; use auto, cpu, cuda or cuda:N"),
        (["--device", "cuda:abc"], "--device: unknown device 'cuda:abc'"),
        (["--workers", "4"], "--workers 4 needs --ray"),
        (["--nprobe", "4"], "--nprobe applies to ivf stores;"),
        (["--max-codes", "-1"], "--max-codes must be >= 0 (0: no budget), got -1"),
        (["--max-codes", "5"], "--max-codes applies to ivf stores;"),
        (["--max-codes", "5", "--ray"], "--max-codes applies to the local path only"),
        (["--min-seeds", "-1"], "min_seeds must be >= 0, got -1"),
        (["--workers", "0"], "--workers must be >= 1, got 0"),
    ],
)
def test_cli_query_rejects_bad_parameters(demo_store, tmp_path, capsys, argv, message):
    from qasc.jobs.cli import main

    base = ["query", "--store", str(demo_store)]
    if "--question" not in argv:
        base += ["--question", "sourdough"]
    out = tmp_path / "answers.jsonl"
    if "--out" not in argv:
        out.write_text("kept\n")
        base += ["--out", str(out)]
    assert main(base + argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    if "--out" not in argv:
        assert out.read_text() == "kept\n"  # a refused command leaves a previous result file alone


def test_cli_query_rejects_bad_queries_file(demo_store, tmp_path, capsys):
    from qasc.jobs.cli import main

    bad = tmp_path / "q.csv"
    bad.write_text("text\nhello\n")
    out = tmp_path / "out.jsonl"
    assert main(["query", "--store", str(demo_store), "--queries", str(bad), "--out", str(out)]) == 2
    assert "no `question` or `query` column" in capsys.readouterr().err
    assert not out.exists()


def test_cli_query_names_duplicate_ids_and_refuses_empty_stdin(demo_store, tmp_path, capsys, monkeypatch):
    import io

    from qasc.jobs.cli import main

    dup = tmp_path / "dup.csv"
    dup.write_text("id,question\nq0,A?\nq1,B?\nq0,C?\n")
    assert main(["query", "--store", str(demo_store), "--queries", str(dup)]) == 2
    assert "duplicate id 'q0' in rows 0 and 2" in capsys.readouterr().err
    out = tmp_path / "out.jsonl"
    monkeypatch.setattr("sys.stdin", io.StringIO("\n  \n"))
    assert main(["query", "--store", str(demo_store), "--queries", "-", "--out", str(out)]) == 2
    assert "stdin (--queries -): no questions" in capsys.readouterr().err
    assert not out.exists()


def test_ray_query_job_equals_local(demo_store, ray_session):
    """The Ray job's batches, in the order they are yielded, are the local path's rows (Ray Data keeps the
    shards' order: no sort on the driver)."""
    from qasc.engine.query import Engine
    from qasc.jobs.query_ray import run_query_job
    from qasc.jobs.results import result_rows, results_schema

    params, retrieval = QascParams(top_k=2, max_extent=3), RetrievalConfig(depth=6, neighbourhood=2)
    ids = [f"q{i}" for i in range(len(QUESTIONS))]
    local = result_rows(ids, Engine.open(str(demo_store), device="cpu").query(QUESTIONS, params, retrieval))
    batches = list(run_query_job(str(demo_store), ids, QUESTIONS, params, retrieval, workers=2, device="cpu",
                                 shard_size=2))
    assert all(b.schema.equals(results_schema()) for b in batches)
    remote = [r for b in batches for r in b.to_pylist()]
    assert [{k: v for k, v in r.items() if k != "score"} for r in remote] == [
        {k: v for k, v in r.items() if k != "score"} for r in local
    ]
    np.testing.assert_allclose([r["score"] for r in remote], [r["score"] for r in local], rtol=1e-5, atol=1e-6)


def test_rows_round_trip_to_chunks(demo_store):
    from qasc.engine.query import Engine
    from qasc.jobs.results import result_rows, rows_to_chunks, to_table

    ids = [f"q{i}" for i in range(len(QUESTIONS))]
    results = Engine.open(str(demo_store), device="cpu").query(QUESTIONS, QascParams(top_k=2))
    rows = result_rows(ids, results)
    assert rows_to_chunks(ids, rows) == results
    assert to_table(results, ids).to_pylist() == rows
    assert rows_to_chunks(ids, to_table(results, ids).to_pylist()) == results


def test_cli_out_streams_slices(demo_store, tmp_path):
    """--out with a small --batch-size (many slices, each embedded and written as it finishes) gives the rows
    of one big slice."""
    import pyarrow.parquet as pq

    from qasc.jobs.cli import main

    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps({"id": f"x{i}", "question": q}) + "\n" for i, q in enumerate(QUESTIONS)))
    outs = []
    for size in (2, 64):
        out = tmp_path / f"r{size}.parquet"
        assert main(["query", "--store", str(demo_store), "--queries", str(queries), "--out", str(out),
                     "--batch-size", str(size), "--top-k", "3"]) == 0
        outs.append(pq.read_table(out).to_pylist())
    assert outs[0] and [r["query_id"] for r in outs[0]] == sorted(r["query_id"] for r in outs[0])
    drop = lambda rows: [{k: v for k, v in r.items() if k != "score"} for r in rows]  # noqa: E731
    assert drop(outs[0]) == drop(outs[1])
    np.testing.assert_allclose([r["score"] for r in outs[0]], [r["score"] for r in outs[1]], rtol=1e-5, atol=1e-6)


def test_cli_warnings_are_one_line_and_the_callers_format_comes_back(tmp_path, capsys):
    """`qasc CMD` prints a warning as one line (`qasc CMD: warning: ...`, no source echo); main() called in process
    gives the caller's warnings.formatwarning back, whatever the command's outcome."""
    import warnings

    from qasc.jobs.cli import _one_line_warning, main

    assert _one_line_warning("query", UserWarning("stored config: x"), UserWarning, "f.py", 3) == \
        "qasc query: warning: stored config: x\n"
    before = warnings.formatwarning
    assert main(["query", "--store", str(tmp_path / "none"), "--question", "q"]) == 2  # no such store: an error
    assert warnings.formatwarning is before
    assert "qasc query: error:" in capsys.readouterr().err
