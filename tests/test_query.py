"""The query engine: exact spans, batch == one at a time, token cap, no overlap, CLI and Ray job."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from engine.config import RetrievalConfig
from kernels.params import QascParams
from tests.conftest import CHROMA

CHROMA_QUESTIONS = CHROMA / "questions.csv"

pytestmark = pytest.mark.slow

QUESTIONS = [
    "How long should sourdough dough proof?",
    "Who invented the lens used in lighthouses?",
    "How big a solar array do I need?",
    "What do lithium iron phosphate batteries tolerate?",
    "Why does the crust darken?",
]
SETTINGS = [
    QascParams(),
    QascParams(percentile=75, radius=2, top_k=None, snap="paragraph", max_tokens=60),
    QascParams(percentile=60, radius=3, adaptive=True, margin=0.15, clip_to_paragraph=True, top_k=3),
    QascParams(percentile=50, radius=1, gap=2, budget_tokens=120, top_k=None, score="window_mean"),
]


@pytest.fixture(scope="module")
def demo_engine(demo_store):
    from engine.query import Engine

    return Engine.open(str(demo_store), device="cpu")


def _check_chunks(engine, results, params):
    texts = {d.doc_id: d.text for d in engine.store.docs}
    for chunks in results:
        spans = {}
        for c in chunks:
            assert texts[c.doc_id][c.char_start : c.char_end] == c.text
            assert c.n_tokens <= params.max_tokens
            spans.setdefault(c.doc_id, []).append((c.char_start, c.char_end))
        for doc_spans in spans.values():
            doc_spans.sort()
            for (_, e0), (s1, _) in zip(doc_spans, doc_spans[1:], strict=False):
                assert e0 <= s1, "chunks of one query overlap"
        if params.budget_tokens is not None:
            assert sum(c.n_tokens for c in chunks) <= params.budget_tokens


@pytest.mark.parametrize("params", SETTINGS)
def test_spans_exact_capped_disjoint(demo_engine, params):
    results = demo_engine.query(QUESTIONS, params, RetrievalConfig(depth=6, neighbourhood=3))
    assert len(results) == len(QUESTIONS)
    assert any(results)
    _check_chunks(demo_engine, results, params)


@pytest.mark.parametrize("params", SETTINGS)
def test_batch_equals_one_at_a_time(demo_engine, params):
    retrieval = RetrievalConfig(depth=6, neighbourhood=3)
    batch = demo_engine.query(QUESTIONS, params, retrieval)
    for question, got in zip(QUESTIONS, batch, strict=True):
        alone = demo_engine.query([question], params, retrieval)[0]
        assert [(c.doc_id, c.char_start, c.char_end, c.seed_ids) for c in alone] == [
            (c.doc_id, c.char_start, c.char_end, c.seed_ids) for c in got
        ]
        np.testing.assert_allclose([c.score for c in alone], [c.score for c in got], rtol=1e-5, atol=1e-6)


def test_answers_the_obvious(demo_engine):
    results = demo_engine.query(["Who introduced the lens of concentric prisms in 1822?"])
    assert "Fresnel" in results[0][0].text


def test_cli_query_jsonl_and_parquet(demo_store, tmp_path, capsys):
    import pyarrow.parquet as pq

    from jobs.cli import main

    queries = tmp_path / "q.csv"
    with open(queries, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "question", "extra"])
        for i, q in enumerate(QUESTIONS):
            w.writerow([f"q{i}", q, "ignored"])
    out = tmp_path / "r.jsonl"
    assert main(["query", "--store", str(demo_store), "--queries", str(queries), "--out", str(out),
                 "--top-k", "2", "--radius", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["query_id"] for r in rows} <= {f"q{i}" for i in range(len(QUESTIONS))}
    assert all(r["rank"] < 2 for r in rows)
    out_pq = tmp_path / "r.parquet"
    assert main(["query", "--store", str(demo_store), "--queries", str(queries), "--out", str(out_pq),
                 "--top-k", "2", "--radius", "1"]) == 0
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
        (["--radius", "-1"], "radius"),
        (["--depth", "0"], "depth"),
        (["--question", "   "], "empty"),
    ],
)
def test_cli_query_rejects_bad_parameters(demo_store, tmp_path, capsys, argv, message):
    from jobs.cli import main

    base = ["query", "--store", str(demo_store)]
    if "--question" not in argv:
        base += ["--question", "sourdough"]
    assert main(base + argv) == 2
    assert message in capsys.readouterr().err


def test_cli_query_rejects_bad_queries_file(demo_store, tmp_path, capsys):
    from jobs.cli import main

    bad = tmp_path / "q.csv"
    bad.write_text("text\nhello\n")
    out = tmp_path / "out.jsonl"
    assert main(["query", "--store", str(demo_store), "--queries", str(bad), "--out", str(out)]) == 2
    assert "no `question` or `query` column" in capsys.readouterr().err
    assert not out.exists()


def test_ray_query_job_equals_local(demo_store, ray_session):
    from engine.query import Engine
    from jobs.query_cmd import result_rows
    from jobs.query_ray import run_query_job

    params, retrieval = QascParams(top_k=2, radius=1), RetrievalConfig(depth=6, neighbourhood=2)
    ids = [f"q{i}" for i in range(len(QUESTIONS))]
    local = result_rows(ids, Engine.open(str(demo_store), device="cpu").query(QUESTIONS, params, retrieval))
    remote = run_query_job(str(demo_store), ids, QUESTIONS, params, retrieval, workers=2, device="cpu", shard_size=2)
    assert [{k: v for k, v in r.items() if k != "score"} for r in remote] == [
        {k: v for k, v in r.items() if k != "score"} for r in local
    ]
    np.testing.assert_allclose([r["score"] for r in remote], [r["score"] for r in local], rtol=1e-5, atol=1e-6)


def test_chroma_general_every_question_answered(chroma_store):
    from engine.query import Engine

    engine = Engine.open(str(chroma_store), device="cpu")
    with open(CHROMA_QUESTIONS, newline="", encoding="utf-8") as fh:
        questions = [row["question"] for row in csv.DictReader(fh)]
    assert len(questions) == 472
    params = QascParams(top_k=3, radius=1)
    results = engine.query(questions, params)
    assert len(results) == 472 and all(results)
    _check_chunks(engine, results, params)
