"""`qasc query --reranker`: a tiny random cross-encoder answers end to end (.parquet and .jsonl, the budget fill's
rows unscored), and every bad reranker is one line and exit 2 before the result file is touched."""

from __future__ import annotations

import json

import pytest

from qasc.engine.columns import RERANK_COLUMNS, RESULT_COLUMNS
from tests.engine.test_query import QUESTIONS

pytestmark = pytest.mark.slow


def test_cli_query_with_a_reranker(demo_store, tiny_cross_encoder, tmp_path, capsys):
    import pyarrow.parquet as pq

    from qasc.jobs.cli import main

    queries = tmp_path / "q.csv"
    queries.write_text("id,question\n" + "".join(f"q{i},{q}\n" for i, q in enumerate(QUESTIONS)))
    base = ["query", "--store", str(demo_store), "--queries", str(queries)]
    assert main(base + ["--out", str(tmp_path / "off.parquet")]) == 0
    assert tuple(pq.read_table(tmp_path / "off.parquet").column_names) == RESULT_COLUMNS  # off: the old columns
    out = tmp_path / "on.parquet"
    assert main(base + ["--out", str(out), "--reranker", tiny_cross_encoder, "--rerank-top", "8"]) == 0
    table = pq.read_table(out)
    assert tuple(table.column_names) == RESULT_COLUMNS + RERANK_COLUMNS
    assert set(table.column("reranker").to_pylist()) == {tiny_cross_encoder}
    assert table.column("rerank_score").null_count == 0 and table.num_rows > 0
    rows = table.to_pylist()
    for qid in {r["query_id"] for r in rows}:
        assert [r["rank"] for r in rows if r["query_id"] == qid] == list(range(sum(r["query_id"] == qid
                                                                                   for r in rows)))
    jsonl = tmp_path / "ctx.jsonl"  # the context preset: the chunks reranked, then the budget fill (unscored)
    assert main(base + ["--out", str(jsonl), "--reranker", tiny_cross_encoder, "--preset", "context"]) == 0
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert lines and all(x["reranker"] == tiny_cross_encoder for x in lines)
    assert all(x["rerank_score"] is not None or not x["seed_ids"] for x in lines)
    for qid in {x["query_id"] for x in lines}:
        assert sum(x["n_tokens"] for x in lines if x["query_id"] == qid) <= 400
    assert main(["query", "--store", str(demo_store), "--question", QUESTIONS[0], "--reranker",
                 tiny_cross_encoder]) == 0  # the printed table
    assert "#1 score" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["missing", "file", "base_model", "hub_offline", "top_zero", "top_alone"])
def test_cli_query_refuses_a_bad_reranker(demo_store, tmp_path, capsys, monkeypatch, kind):
    from qasc.engine.embedder import resolve_model_path
    from qasc.jobs.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "weights.bin").write_bytes(b"x")
    argv, message = {
        "missing": (["--reranker", str(tmp_path / "none")], f"reranker {tmp_path / 'none'}: no such folder"),
        "file": (["--reranker", str(tmp_path / "weights.bin")], "not a folder"),
        "base_model": (["--reranker", resolve_model_path(None)], "not a sequence classifier (architectures: BertModel"),
        "hub_offline": (["--reranker", "cross-encoder/ms-marco-MiniLM-L-6-v2"],
                        "reranker cross-encoder/ms-marco-MiniLM-L-6-v2: not a local folder, and the model hub is "
                        "offline"),
        "top_zero": (["--reranker", str(tmp_path), "--rerank-top", "0"], "--rerank-top must be >= 1, got 0"),
        "top_alone": (["--rerank-top", "5"], "--rerank-top needs --reranker"),
    }[kind]
    out = tmp_path / "answers.jsonl"
    out.write_text("kept\n")
    assert main(["query", "--store", str(demo_store), "--question", "sourdough", "--out", str(out)] + argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert out.read_text() == "kept\n"


def test_ray_data_stage_takes_the_reranker(demo_store, tiny_cross_encoder):
    """QascQuery(reranker=...) called on a batch as map_batches would: the rerank columns, every row scored."""
    from qasc.jobs.ray_data import QascQuery

    stage = QascQuery(str(demo_store), device="cpu", reranker=tiny_cross_encoder, rerank_top=5)
    table = stage({"id": ["a", "b"], "question": QUESTIONS[:2]})
    assert tuple(table.column_names) == RESULT_COLUMNS + RERANK_COLUMNS and table.num_rows > 0
    assert set(table.column("reranker").to_pylist()) == {tiny_cross_encoder}
    assert tuple(QascQuery(str(demo_store), device="cpu")({"question": QUESTIONS[:1]}).column_names) == RESULT_COLUMNS
