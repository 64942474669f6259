"""Resumable ingest: `qasc ingest` SIGKILLed at several points, rerun, equals the uninterrupted store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.store import IngestConfig, Store, ingest, verify_store
from qasc.jobs.cli import main
from tests.conftest import REPO
from tests.engine.test_store import assert_same_store, snapshot, write_corpus

pytestmark = pytest.mark.slow

TOPICS = ["lighthouse", "lens", "bread", "dough", "solar", "battery", "river", "mountain"]


def corpus(folder: Path, names: list[str]) -> Path:
    """One document per name under two headings, 40 sentences each (about 2.4k characters)."""
    docs = {}
    for n, name in enumerate(names):
        words = [TOPICS[(n + i) % len(TOPICS)] for i in range(40)]
        docs[name] = f"# Notes on {name}\n\n## The {TOPICS[n % len(TOPICS)]}\n\n" + " ".join(
            f"Sentence {i} of {name} is about the {w} and number {i * n}." for i, w in enumerate(words))
    return write_corpus(folder, docs)


def run_cli(args: list[str], failpoint: str | None = None, kill_after_shards: int | None = None,
            store: Path | None = None) -> subprocess.CompletedProcess | int:
    """`python -m qasc.jobs.cli ARGS` in a subprocess; SIGKILLed at a failpoint or after N finished shards."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("QASC_FAILPOINT", None)
    if failpoint:
        env["QASC_FAILPOINT"] = failpoint
    cmd = [sys.executable, "-m", "qasc.jobs.cli", *args]
    if kill_after_shards is None:
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if len(list((store / "_staging" / "shards").glob("*.json"))) >= kill_after_shards:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    return proc.wait(timeout=60)


def test_sigkill_at_several_points_then_rerun(tmp_path, tiny_model, capsys):
    names = [f"doc{i}" for i in range(8)]
    src = corpus(tmp_path / "c", names)
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    ingest([str(src)], tmp_path / "reference", config, settings=IngestConfig(shard_chars=2000))
    reference = snapshot(tmp_path / "reference")
    assert reference["counts"]["shards"] == 8

    store = tmp_path / "store"
    args = ["ingest", str(src), "--store", str(store), "--local", "--model", tiny_model, "--shard-chars", "2000"]
    assert run_cli(args, failpoint="shard-written:3").returncode == -signal.SIGKILL
    assert len(list((store / "_staging" / "shards").glob("*.json"))) == 3
    with pytest.raises(QascError, match="incomplete store"):
        Store.open(store)
    assert main(["verify", "--store", str(store)]) == 2
    assert "incomplete store" in capsys.readouterr().err

    assert run_cli(args, kill_after_shards=5, store=store) == -signal.SIGKILL  # killed from outside
    assert not (store / "manifest.json").exists()
    assert run_cli(args, failpoint="before-manifest").returncode == -signal.SIGKILL  # index written, no manifest
    assert not (store / "manifest.json").exists() and list(store.glob("index-*.faiss"))

    done = run_cli(args)
    assert done.returncode == 0, done.stderr
    assert "8 shard(s) resumed" in done.stdout and "resuming, 8 finished shard(s)" in done.stderr
    assert not (store / "_staging").exists()
    assert sorted(p.name for p in store.iterdir()) == [".lock", "documents", "headings", "index-0001.faiss",
                                                       "lexical", "manifest.json", "mapped-0001", "passage_lexical",
                                                       "passages", "sentences"]
    assert_same_store(reference, snapshot(store))  # same rows, same embeddings, same index, same Parquet bytes
    assert main(["verify", "--store", str(store)]) == 0


def test_killed_append_keeps_the_committed_store(tmp_path, tiny_model, capsys):
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    first = corpus(tmp_path / "a", ["a0", "a1", "a2"])
    second = corpus(tmp_path / "b", ["b0", "b1", "b2", "b3"])
    for path in (tmp_path / "reference", tmp_path / "store"):
        ingest([str(first)], path, config, settings=IngestConfig(shard_chars=2000))
    ingest([str(second)], tmp_path / "reference", settings=IngestConfig(shard_chars=2000))
    before = snapshot(tmp_path / "store")

    args = ["ingest", str(second), "--store", str(tmp_path / "store"), "--local", "--shard-chars", "2000"]
    assert run_cli(args, failpoint="shard-written:2").returncode == -signal.SIGKILL
    assert_same_store(before, snapshot(tmp_path / "store"))  # the committed store is untouched
    checks = verify_store(tmp_path / "store")
    assert all(ok for _, ok, _ in checks) and "pending" in [name for name, _, _ in checks]

    done = run_cli(args)
    assert done.returncode == 0, done.stderr
    assert_same_store(snapshot(tmp_path / "reference"), snapshot(tmp_path / "store"))
    assert sorted(p.name for p in (tmp_path / "store").glob("index-*")) == ["index-0002.faiss"]
    assert main(["verify", "--store", str(tmp_path / "store")]) == 0
    capsys.readouterr()
