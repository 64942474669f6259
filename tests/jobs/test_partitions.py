"""Partitioned collections: a collection answers exactly as one store of the same documents (result files
compared byte for byte), locally and on Ray, in both presets; a killed query actor gives the same file; a missing or
damaged partition is one line naming it and leaves no output; `qasc ingest --partitions`, `qasc collection` and
`qasc verify` on a collection.

Exactness holds for the same rows' vectors: the model's batched encode gives a sentence vectors that differ in the
last bits with its batch's other members (docs/collections.md, "Where it is exact"), so both sides here are
ingested with a model that embeds one text at a time (`OneAtATime`), as the same document's vector then is
whatever partition or shard holds it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.conftest import DEMO_CORPUS

pytestmark = pytest.mark.slow

EXTRA_DOCS = {  # headings shared across documents (one path id, numbered at its first document), passages, ties
    "alpha": "# Overview\n\nLighthouses guide ships at night. Their lamps turn slowly.\n\n## Keepers\n\nKeepers lived "
             "in the tower. They trimmed the wicks every evening.\n",
    "beta": "# Overview\n\nSolar panels turn light into current. Cells are made of silicon.\n\n## Storage\n\nBatteries "
            "keep the energy for the night. Inverters change the current.\n",
    "gamma": "# Bread\n\nSourdough rises slowly. The starter holds wild yeast.\n\n## Crust\n\nThe crust darkens in "
             "the oven. Steam keeps it thin and crisp.\n",
    "delta": "Plain text without headings. The crust of a loaf darkens when sugars brown. Lighthouses use lenses.\n",
    "epsilon": "# Overview\n\n## Keepers\n\nA keeper wrote the log. Storms broke the lamp twice.\n",
    "zeta": "# Grid\n\nThe grid balances supply and demand. Night brings no solar current.\n",
}
QUESTIONS = ["Why does the crust darken?", "What did lighthouse keepers do?", "How is solar energy stored for the "
             "night?", "Who invented the Fresnel lens?", "What holds the wild yeast?", "What broke the lamp?",
             "How do inverters work?", "What balances the grid?"]


class OneAtATime:
    """The model, each text encoded alone: a text's vector does not depend on what else is in the call."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, texts, *args, **kwargs):
        if not len(texts):
            return self.inner.encode(texts, *args, **kwargs)
        return np.concatenate([self.inner.encode([t], *args, **kwargs) for t in texts])


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model):
    """One store of all documents, the same documents as a hashed collection of 3 partitions (Python API, with
    the one-at-a-time model), and an assembled collection of two stores holding the first and last documents."""
    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.embedder import Embedder
    from qasc.engine.store import ingest
    from qasc.engine.store.collection import assemble, ingest_partitions

    root = tmp_path_factory.mktemp("partitions")
    docs = {p.stem: p.read_text(encoding="utf-8") for p in sorted(DEMO_CORPUS.glob("*.md"))} | EXTRA_DOCS
    records = [{"id": k, "text": v} for k, v in docs.items()]
    for name, recs in (("all", records), ("first", records[:4]), ("last", records[4:])):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    model = OneAtATime(Embedder(tiny_model, "cpu"))
    ingest([str(root / "all.jsonl")], root / "single", config, embedder=model, progress=False)
    ingest_partitions([str(root / "all.jsonl")], root / "hashed", 3, config, embedder=model, progress=False)
    for name in ("first", "last"):
        ingest([str(root / f"{name}.jsonl")], root / name, config, embedder=model, progress=False)
    assemble(root / "assembled", [root / "first", root / "last"])
    queries = root / "q.jsonl"
    queries.write_text("".join(json.dumps({"id": f"q{i}", "question": q}) + "\n" for i, q in enumerate(QUESTIONS)))
    return root


def answer(store, out, preset, *extra) -> bytes:
    from qasc.jobs.cli import main

    assert main(["query", "--store", str(store), "--queries", str(out.parent / "q.jsonl"), "--out", str(out),
                 "--preset", preset, *extra]) == 0
    return out.read_bytes()


@pytest.mark.parametrize("preset", ["answers", "context"])
def test_collection_answers_byte_identical_to_one_store(built, preset):
    from qasc.engine.query import Engine

    want = answer(built / "single", built / f"single-{preset}.parquet", preset)
    for name in ("hashed", "assembled"):
        assert answer(built / name, built / f"{name}-{preset}.parquet", preset) == want, name
    counts = [p["documents"] for p in json.loads((built / "hashed" / "collection.json").read_text())["partitions"]]
    assert sum(counts) == 9 and sum(c > 0 for c in counts) >= 2  # the documents really are spread
    one, coll = Engine.open(str(built / "single"), device="cpu"), Engine.open(str(built / "hashed"), device="cpu")
    assert coll.store.heading_paths == one.store.heading_paths and "Overview" in one.store.heading_paths
    assert np.array_equal(coll.store.row_heading, one.store.row_heading)


@pytest.mark.parametrize("preset", ["answers", "context"])
def test_collection_on_ray_answers_as_one_store(built, preset, ray_session):
    want = answer(built / "single", built / f"single-ray-{preset}.parquet", preset)  # local, one store
    assert answer(built / "hashed", built / f"hashed-ray-{preset}.parquet", preset, "--ray") == want


def test_killed_query_actor_gives_the_same_output(built, ray_session, monkeypatch, tmp_path):
    import os

    from qasc.jobs.ingest_ray import FAULT_MARKER_ENV

    want = answer(built / "single", built / "single-kill.parquet", "answers")
    marker = tmp_path / "actor-killed"
    monkeypatch.setenv(FAULT_MARKER_ENV, str(marker))  # the first shard's actor SIGKILLs itself once
    got = answer(built / "hashed", built / "hashed-kill.parquet", "answers", "--ray")
    assert marker.exists() and int(marker.read_text()) != os.getpid(), "the fault was not injected"
    assert got == want


def test_missing_or_damaged_partition_is_one_line_and_no_output(built, tmp_path, capsys):
    from qasc.engine.errors import QascError
    from qasc.engine.query import Engine
    from qasc.jobs.cli import main

    coll = tmp_path / "coll"
    shutil.copytree(built / "hashed", coll)
    (tmp_path / "q.jsonl").write_bytes((built / "q.jsonl").read_bytes())
    assert main(["verify", "--store", str(coll)]) == 0
    assert "OK" in capsys.readouterr().out
    held = [p for p in sorted(coll.glob("part-*")) if (p / "manifest.json").exists()]
    damaged = next(held[0].rglob("*.parquet"))
    damaged.write_bytes(damaged.read_bytes()[:-100])  # truncated
    shutil.rmtree(held[1])  # missing
    for flags in ([], ["--ray"]):
        out = tmp_path / "out.parquet"
        assert main(["query", "--store", str(coll), "--queries", str(tmp_path / "q.jsonl"), "--out", str(out),
                     *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "partition" in err and held[0].name in err, err
        assert not out.exists() and not list(tmp_path.glob(".out.parquet*"))
    with pytest.raises(QascError, match=held[0].name):
        Engine.open(str(coll), device="cpu")
    assert main(["verify", "--store", str(coll)]) == 1
    report = capsys.readouterr().out
    assert f"FAIL {held[0].name}/" in report and f"FAIL {held[1].name}/open" in report


def test_cli_ingest_partitions_appends_by_hash_and_verifies(tmp_path, tiny_model, capsys):
    from qasc.engine.store.collection import partition_name, partition_of, read_collection, stored_doc_ids
    from qasc.jobs.cli import main

    first = tmp_path / "a.jsonl"
    first.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in list(EXTRA_DOCS.items())[:4]))
    second = tmp_path / "b.jsonl"
    second.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in list(EXTRA_DOCS.items())[4:]))
    coll = tmp_path / "coll"
    for path in (first, second):  # the second run appends: each document to the partition its doc_id hashes to
        assert main(["ingest", str(path), "--store", str(coll), "--partitions", "2", "--local", "--model",
                     tiny_model, "--no-progress"]) == 0
    assert "collection" in capsys.readouterr().out
    for p in range(2):
        assert all(partition_of(d, 2) == p for d in stored_doc_ids(coll / partition_name(p)))
    assert read_collection(coll)["documents"] == len(EXTRA_DOCS)
    assert main(["verify", "--store", str(coll)]) == 0
    assert main(["ingest", str(first), "--store", str(coll), "--partitions", "3", "--local"]) == 2
    assert "appends need --partitions 2" in capsys.readouterr().err
    assert main(["query", "--store", str(coll), "--question", "What broke the lamp?"]) == 0
    assert "lamp" in capsys.readouterr().out


@pytest.mark.own_ray
def test_collection_on_a_two_node_cluster_answers_as_one_store(built):
    """Two Ray nodes on this machine (ray.cluster_utils.Cluster: a head and a second node, each a raylet of its own
    with 1 CPU and a resource of its own), the hashed collection's partitions spread over them by `qasc query
    --ray-address` in a process of its own: both presets byte-identical to the single store, the job's summary
    naming both nodes and each actor's peak RSS."""
    import os
    import subprocess
    import sys

    from ray.cluster_utils import Cluster

    from tests.conftest import REPO

    want = {preset: answer(built / "single", built / f"single-2n-{preset}.parquet", preset)
            for preset in ("answers", "context")}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1},
                                                            "include_dashboard": False})
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    try:
        cluster.add_node(num_cpus=1, resources={"node_b": 1})
        cluster.wait_for_nodes()
        for preset in ("answers", "context"):
            out = built / f"hashed-2n-{preset}.parquet"
            job = subprocess.run([sys.executable, "-m", "qasc.jobs.cli", "query", "--store", str(built / "hashed"),
                                  "--queries", str(built / "q.jsonl"), "--out", str(out), "--preset", preset,
                                  "--ray-address", cluster.address], cwd=REPO, env=env, capture_output=True, text=True,
                                 timeout=600)
            assert job.returncode == 0, job.stderr[-2000:]
            assert out.read_bytes() == want[preset], preset
            summary = next(line for line in job.stderr.splitlines() if "Ray actors" in line)
            assert "2 node(s)" in summary and "peak RSS" in summary, summary
    finally:
        cluster.shutdown()


def test_actor_shares_fit_every_node_and_partitions_are_dealt_round_robin():
    from qasc.jobs.query_partitions import actor_groups, cpu_share

    assert cpu_share([1.0, 1.0], 3) == 0.5  # 2 actors on one node, 1 on the other: both fit
    assert cpu_share([2.0], 4) == 0.5 and cpu_share([16.0, 16.0], 4) == 1.0
    assert cpu_share([1.0, 0.0, 4.0], 2) == 1.0  # nodes without CPUs take no actor
    assert cpu_share([1.0], 1000) == 0.01
    assert actor_groups(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    assert actor_groups(["a", "b"], 5) == [["a"], ["b"]]


def test_partition_merge_equals_one_exact_search():
    """Rows cut into uneven partitions (of a float16 table), each searched exactly: the merge by (score, global
    row) equals one exact search of all rows, hits and order, ties included (duplicated rows)."""
    import torch

    from qasc.engine.partition import merge_top
    from qasc.engine.store.index import exact_topk

    g = torch.Generator().manual_seed(5)
    table = torch.nn.functional.normalize(torch.randn(300, 16, generator=g), dim=1).half()
    table[200:220] = table[10:30]  # equal scores across partitions
    query = torch.randn(40, 16, generator=g)
    owner = torch.randint(0, 3, (300,), generator=g).numpy()
    scores, ids = [], []
    for p in range(3):
        rows = np.flatnonzero(owner == p)
        s, r = exact_topk(table[torch.as_tensor(rows)], query, 12)
        scores.append(s.numpy())
        ids.append(np.where(r.numpy() >= 0, rows[np.maximum(r.numpy(), 0)], -1))
    want_s, want_r = exact_topk(table, query, 12)
    got_s, got_r = merge_top(scores, ids, 12, "cpu")
    assert torch.equal(got_r, want_r) and torch.equal(got_s, want_s)


def test_retrievers_and_the_ray_data_stage_take_a_collection(built):
    """The LangChain and LlamaIndex retrievers and the Ray Data stage (called as map_batches would) answer a
    collection exactly as the single store (the documents' `source` aside)."""
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from qasc.engine.integrations import langchain as lc
    from qasc.engine.integrations import llamaindex as li
    from qasc.jobs.ray_data import QascQuery

    got = {}
    for name in ("single", "hashed"):
        store = str(built / name)
        docs = lc.QascRetriever(store=store, device="cpu").batch(QUESTIONS[:4])
        nodes = li.QascRetriever(store=store, device="cpu").retrieve(QUESTIONS[4])
        table = QascQuery(store, device="cpu")({"question": np.array(QUESTIONS, dtype=object)})
        # a hashed partition's `source` names the partition and row (part-0001:1), not the input file
        got[name] = ([[(d.page_content, {k: v for k, v in d.metadata.items() if k != "source"}) for d in ds]
                      for ds in docs],
                     [(n.node.get_content(), n.score) for n in nodes], table.to_pylist())
        assert table.num_rows and docs[0] and nodes
    assert got["hashed"] == got["single"]


def test_a_partition_without_heading_paths_answers_as_one_store(tmp_path, tiny_model):
    """An assembled collection whose first partition has no heading paths while the other has some (the heading
    context on, its path dots computed per partition): both presets byte-identical to one store of the same
    documents in the same order."""
    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.embedder import Embedder
    from qasc.engine.store import ingest
    from qasc.engine.store.collection import assemble

    plain = {"delta": EXTRA_DOCS["delta"], "omega": "No headings here either. Lamps and crusts and grids.\n"}
    headed = {k: v for k, v in EXTRA_DOCS.items() if k != "delta"}
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    model = OneAtATime(Embedder(tiny_model, "cpu"))
    for name, docs in (("plain", plain), ("headed", headed), ("single", plain | headed)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n"
                                                        for k, v in docs.items()))
        ingest([str(tmp_path / f"{name}.jsonl")], tmp_path / name, config, embedder=model, progress=False)
    assemble(tmp_path / "coll", [tmp_path / "plain", tmp_path / "headed"])
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "question": q}) + "\n"
                                              for i, q in enumerate(QUESTIONS)))
    for preset in ("answers", "context"):
        want = answer(tmp_path / "single", tmp_path / f"single-{preset}.parquet", preset)
        assert answer(tmp_path / "coll", tmp_path / f"coll-{preset}.parquet", preset) == want, preset
