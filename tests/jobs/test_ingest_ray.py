"""The Ray Data pipeline on a local Ray (num_cpus=2): same store as the local path, and an embedding actor
killed mid-job is restarted and its shard retried."""

from __future__ import annotations

import os

import pytest

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.store import IngestConfig, ingest, verify_store
from qasc.jobs.ingest_ray import FAULT_MARKER_ENV, RayRunner
from tests.conftest import DEMO_CORPUS
from tests.engine.test_store import assert_same_store, snapshot, write_corpus

pytestmark = pytest.mark.slow


def test_ray_equals_local_with_the_real_model(tmp_path, ray_session):
    """The demo corpus, 3 shards, all-MiniLM-L6-v2: same sentences, allclose embeddings and index."""
    local = ingest([str(DEMO_CORPUS)], tmp_path / "local", settings=IngestConfig(shard_chars=900))
    remote = ingest([str(DEMO_CORPUS)], tmp_path / "ray", settings=IngestConfig(shard_chars=900), runner=RayRunner())
    assert remote["mode"] == "ray" and (local["documents"], local["sentences"]) == (remote["documents"],
                                                                                    remote["sentences"])
    a, b = snapshot(tmp_path / "local"), snapshot(tmp_path / "ray")
    assert a["counts"]["shards"] == 3
    assert_same_store(a, b, atol=1e-5)
    assert all(ok for _, ok, _ in verify_store(tmp_path / "ray"))


def test_killed_embedding_actor_is_retried(tmp_path, ray_session, tiny_model, monkeypatch):
    corpus = write_corpus(tmp_path / "c", {f"doc{i}": f"Document number {i}. It has two sentences." for i in range(6)})
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    marker = tmp_path / "actor-killed"
    monkeypatch.setenv(FAULT_MARKER_ENV, str(marker))  # the test-only fault: the first embedding call dies once
    ingest([str(corpus)], tmp_path / "ray", config, IngestConfig(shard_chars=60), runner=RayRunner())
    monkeypatch.delenv(FAULT_MARKER_ENV)
    assert marker.exists(), "the fault was not injected"
    assert int(marker.read_text()) != os.getpid()
    ingest([str(corpus)], tmp_path / "local", config, settings=IngestConfig(shard_chars=60))
    a, b = snapshot(tmp_path / "local"), snapshot(tmp_path / "ray")
    assert a["counts"] == {"documents": 6, "sentences": 12, "shards": 3}
    assert_same_store(a, b, atol=1e-5)
    assert all(ok for _, ok, _ in verify_store(tmp_path / "ray"))


def test_in_memory_table_on_ray(tmp_path, ray_session, tiny_model):
    """ingest_table with the Ray runner: the documents travel in the IngestContext; same store as local."""
    import pyarrow as pa

    from qasc.engine.store import ingest_table

    table = pa.table({"id": [f"doc{i}" for i in range(6)], "text": [f"Document number {i}. It has two sentences."
                                                                     for i in range(6)], "n": list(range(6))})
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    ingest_table(table, tmp_path / "ray", config, IngestConfig(shard_chars=60), runner=RayRunner(), progress=False)
    ingest_table(table, tmp_path / "local", config, IngestConfig(shard_chars=60), progress=False)
    a, b = snapshot(tmp_path / "local"), snapshot(tmp_path / "ray")
    assert a["counts"] == {"documents": 6, "sentences": 12, "shards": 3} and a["metadata"][5] == {"n": 5}
    assert_same_store(a, b, atol=1e-5)
    assert all(ok for _, ok, _ in verify_store(tmp_path / "ray"))


def test_the_index_is_built_by_a_ray_task(tmp_path, ray_session, tiny_model):
    """On Ray the driver neither builds nor holds the index: a Ray task in another process builds and writes it,
    and the store equals the local path's, created and then grown (the task reuses the old index)."""
    docs = {f"doc{i}": f"Document number {i}. It has two sentences." for i in range(6)}
    corpus = write_corpus(tmp_path / "c", docs)
    more = write_corpus(tmp_path / "m", {f"more{i}": f"Another document {i}. Short." for i in range(3)})
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    settings = IngestConfig(shard_chars=60, index="ivf")
    for path in (corpus, more):
        ingest([str(path)], tmp_path / "local", config, settings)
    lines: list[str] = []
    for path in (corpus, more):
        ingest([str(path)], tmp_path / "ray", config, settings, runner=RayRunner(), log=lines.append)
    built = [line for line in lines if "written by the Ray task" in line]
    assert [line.split(" index of ")[0] for line in built] == ["qasc ingest: ivf"] * 2
    assert all(int(line.rsplit("pid ", 1)[1].rstrip(")")) != os.getpid() for line in built)
    assert not any("training an IVF index" in line for line in lines)  # the driver's build_index logs that line
    a, b = snapshot(tmp_path / "local"), snapshot(tmp_path / "ray")
    assert a["counts"] == {"documents": 9, "sentences": 18, "shards": 4} and b["index_kind"] == "ivf"
    assert_same_store(a, b, atol=1e-5)
    # the grown 12-row SQ8 index was retrained where the new rows fell outside its codes' range: verify passes
    for store in ("ray", "local"):
        assert all(ok for _, ok, _ in verify_store(tmp_path / store))


@pytest.mark.own_ray
def test_killed_ray_ingest_resumes_without_the_actor_warning(tmp_path, tiny_model):
    """`qasc ingest --ray` SIGKILLed after 2 recorded shards, then the same command: it resumes and equals the
    uninterrupted local store, and neither run prints Ray's error line about an actor created from arguments in
    the object store (Ray Data's actor pool printed it for every ingest: its actors could not be restarted
    safely, ray-project/ray#53727)."""
    import signal

    from tests.engine.test_ingest_resume import corpus, run_cli

    src = corpus(tmp_path / "c", [f"doc{i}" for i in range(5)])
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    ingest([str(src)], tmp_path / "reference", config, settings=IngestConfig(shard_chars=2000))
    store = tmp_path / "store"
    args = ["ingest", str(src), "--store", str(store), "--ray", "--model", tiny_model, "--shard-chars", "2000",
            "--no-progress"]
    killed = run_cli(args, failpoint="shard-written:2")
    assert killed.returncode == -signal.SIGKILL
    assert len(list((store / "_staging" / "shards").glob("*.json"))) == 2
    done = run_cli(args)
    assert done.returncode == 0, done.stderr
    assert "2 shard(s) resumed" in done.stdout
    for run in (killed, done):
        assert "object store" not in run.stderr and "max_restarts" not in run.stderr, run.stderr
    manifest = snapshot(store)
    assert manifest["counts"]["shards"] == 5
    assert_same_store(snapshot(tmp_path / "reference"), manifest, atol=1e-5)
