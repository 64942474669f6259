"""The Ray Data stage `QascQuery`: on a local Ray, `map_batches` over a Parquet file of questions gives the
same rows as `qasc query` (local path) on the same questions; batch formats, ids, overrides and bad batches;
the docs example (extracted from docs/integrations.md) runs."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qasc.engine.errors import QascError
from qasc.jobs.results import RESULT_COLUMNS, results_schema
from tests.conftest import RAY_MODULES
from tests.engine.test_integrations import run_readme_example
from tests.engine.test_query import QUESTIONS

pytestmark = pytest.mark.slow

IDS = [f"q{i}" for i in range(len(QUESTIONS))]
OVERRIDES = {"top_k": 2, "max_extent": 3, "depth": 6, "neighbourhood": 2}


def cli_flags(overrides: dict) -> list[str]:
    return [x for k, v in overrides.items() for x in ("--" + k.replace("_", "-"), str(v))]


def sorted_rows(table: pa.Table) -> list[dict]:
    order = {qid: i for i, qid in enumerate(IDS)}
    return sorted(table.to_pylist(), key=lambda r: (order[r["query_id"]], r["rank"]))


def assert_same_rows(got: list[dict], want: list[dict]) -> None:
    """Every column equal; scores to float32 rounding (a batch of 2 pads its questions unlike a batch of 4)."""
    strip = lambda rows: [{k: v for k, v in r.items() if k != "score"} for r in rows]  # noqa: E731
    assert strip(got) == strip(want)
    np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def questions_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("questions") / "questions.parquet"
    pq.write_table(pa.table({"id": IDS, "question": QUESTIONS}), path)
    return path


@pytest.fixture(scope="module")
def cli_rows(demo_store, questions_file) -> list[dict]:
    """`qasc query --queries questions.parquet --out X.parquet` (local path) with the same overrides, run in
    process as tests/jobs/test_query_cmd.py runs it (tests/jobs/test_ray_job_submit.py runs it as a process)."""
    from qasc.jobs.cli import main

    out = questions_file.parent / "cli.parquet"
    assert main(["query", "--store", str(demo_store), "--queries", str(questions_file), "--out", str(out),
                 "--device", "cpu", *cli_flags(OVERRIDES)]) == 0
    table = pq.read_table(out)
    assert table.num_rows >= len(QUESTIONS)
    return sorted_rows(table)


def test_map_batches_equals_qasc_query(demo_store, questions_file, cli_rows, tmp_path, ray_session):
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    from qasc.jobs.ray_data import QascQuery

    DataContext.get_current().enable_progress_bars = False
    ds = ray.data.read_parquet(str(questions_file))
    answers = ds.map_batches(QascQuery, fn_constructor_kwargs={"store": str(demo_store), "device": "cpu",
                                                               **OVERRIDES},
                             batch_size=2, compute=ActorPoolStrategy(size=1), num_gpus=0, num_cpus=1)
    answers.write_parquet(str(tmp_path / "answers"))
    table = pq.read_table(tmp_path / "answers")
    assert tuple(table.column_names) == RESULT_COLUMNS
    assert table.schema.remove_metadata().equals(results_schema())
    assert_same_rows(sorted_rows(table), cli_rows)


def test_batch_formats_ids_and_bad_batches(demo_store, cli_rows):
    pd = pytest.importorskip("pandas")
    from qasc.jobs.ray_data import QascQuery

    stage = QascQuery(str(demo_store), device="cpu", params={"top_k": 2, "max_extent": 3}, retrieval={"depth": 6},
                      neighbourhood=2)
    assert stage.params.top_k == 2 and stage.retrieval.neighbourhood == 2
    for batch in ({"id": np.array(IDS), "question": np.array(QUESTIONS, dtype=object)},  # batch_format numpy
                  pd.DataFrame({"id": IDS, "question": QUESTIONS}),  # batch_format pandas
                  pa.table({"id": IDS, "question": QUESTIONS})):  # batch_format pyarrow
        out = stage(batch)
        assert out.schema == results_schema()
        assert_same_rows(sorted_rows(out), cli_rows)
    no_ids = stage({"question": np.array(QUESTIONS[:1], dtype=object)})
    assert set(no_ids.column("query_id").to_pylist()) == {QUESTIONS[0]}
    assert stage({"question": np.array([], dtype=object)}).num_rows == 0
    with pytest.raises(QascError, match=r"no `question` column \(columns: query\)"):
        stage({"query": np.array(QUESTIONS)})
    with pytest.raises(QascError, match="empty question in row 1"):
        stage({"question": np.array(["Why?", " "], dtype=object)})
    with pytest.raises(QascError, match=r"row 1 of a batch has no usable id \(None\)"):
        stage(pa.table({"id": ["a", None], "question": QUESTIONS[:2]}))
    with pytest.raises(QascError, match="unknown QASC parameter"):
        QascQuery(str(demo_store), device="cpu", top_kk=3)


def test_ray_tests_share_one_xdist_worker(request):
    """tests/conftest.py: under `make test` (pytest-xdist) the tests on the session's Ray share one worker (one
    instance), the ones that start their own Ray share the other group, and every other test is spread."""
    if not request.config.pluginmanager.hasplugin("xdist"):
        pytest.skip("pytest-xdist not installed")
    assert request.node.get_closest_marker("xdist_group").args == ("ray",)
    items = request.session.items  # every collected test (each worker collects them all)
    group = {item: (m.args if (m := item.get_closest_marker("xdist_group")) else None) for item in items}
    own = [item for item in items if item.get_closest_marker("own_ray") is not None]
    assert len(own) >= 3 and all(group[item] == ("own-ray",) for item in own)
    with_ray = [item for item in items if "ray_session" in item.fixturenames]  # the fixture's users, in any module
    assert with_ray and not set(with_ray) & set(own)
    assert all(group[item] == ("ray",) for item in with_ray)
    others = [item for item in items if item not in with_ray and item not in own
              and item.path.name not in RAY_MODULES]
    assert all(group[item] is None for item in others)  # spread over the workers


@pytest.mark.own_ray
@pytest.mark.timeout(600)
def test_readme_ray_data_example_runs(tmp_path):
    short = Path(tempfile.mkdtemp(prefix="qasc-rd-"))  # Ray's socket paths under TMPDIR must stay < 108 bytes
    try:
        out = run_readme_example("ray-data", tmp_path, tmpdir=short)  # its own Ray instance, in a subprocess
    finally:
        shutil.rmtree(short, ignore_errors=True)
    lines = [line for line in out.splitlines() if line.startswith("{'query_id'")]
    assert {line.split("'")[3] for line in lines} == {"q1", "q2", "q3"}, out
