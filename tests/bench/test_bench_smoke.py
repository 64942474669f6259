"""Each benchmark's main() runs at tiny sizes and returns its JSON record (the scripts stay runnable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CHROMA

needs_chroma = pytest.mark.skipif(not (CHROMA / "questions.csv").is_file(), reason=f"chroma_general not at {CHROMA}")

SENTENCES = ["Short one.", "A second, somewhat longer sentence for the batch.", "Third.",
             "Lighthouses use Fresnel lenses to throw light far out to sea."]


def test_kernels_bench():
    from bench import kernels

    rec = kernels.main(["--qs", "1,3", "--ls", "16", "--settings", "default,context", "--repeats", "1",
                        "--ref-rows", "2"])
    assert len(rec["rows"]) == 4 and all(r["equal"] for r in rec["rows"])


def test_query_bench_synthetic():
    from bench import query

    rec = query.main(["--synthetic", "600", "--no-model", "--batch", "16", "--single", "3", "--repeats", "1"])
    assert rec["kernels_batch_qps"] > 0 and "search" in rec["stages_ms"]


def test_embed_bench():
    from bench import embed

    rec = embed.main(["--sentences", *SENTENCES, "--repeats", "1", "--batch-tokens", "1024", "--max-batch-sizes",
                      "32", "--st-batch-sizes", "32", "--no-memory"])
    assert rec["min_cosine_vs_st"] > 0.999 and rec["ours_default_sps"] > 0


@needs_chroma
def test_splitters_bench():
    from bench import splitters

    rec = splitters.main(["--max-kb", "3", "--repeats", "1", "--pysbd-kb", "1"])
    assert rec["refs"] > 0 and {r["splitter"] for r in rec["rows"]} >= {"blingfire", "ours (split_sentences)"}


@needs_chroma
def test_ingest_scaling_bench():
    from bench import ingest_scaling

    rec = ingest_scaling.main(["--kb", "1", "--scales", "1", "--repeats", "1", "--doc-kb", "1"])
    assert rec["rows"][0]["sentences"] > 0


def test_ingest_bench():
    """--quick: the demo corpus; ingest's phases and the raw encode of the same texts, one JSON record."""
    from bench import ingest

    rec = ingest.main(["--quick"])
    corpus = rec["corpora"][0]
    assert corpus["sentences"] > 0 and corpus["tokens"]["all"] >= corpus["tokens"]["sentences"] > 0
    assert rec["ingest_sentences_per_s"] > 0 and rec["embed_sentences_per_s"] > 0 and rec["ratio_tokens"] > 0
    assert {"split", "embed sentences", "embed passages", "term counts", "write, checksums", "index"} <= set(
        corpus["phases"])


def test_kernels_bench_time_budget():
    """--budget-s: sizes started after the budget are listed as skipped; a partial record follows each size."""
    from bench import kernels

    rec = kernels.main(["--qs", "1,2", "--ls", "8", "--settings", "default", "--repeats", "1", "--no-ref",
                        "--budget-s", "1e-9"])
    assert [r.get("note", "")[:8] for r in rec["rows"]] == ["", "skipped:"] and rec["skipped"] == ["Q=2 L=8 default"]


def test_gpu_summary(tmp_path):
    """bench/gpu_check.sh's summary: per-step rc/seconds/note/record, skipped steps, headline; targets only on CUDA."""
    import json

    from bench import gpu_summary

    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "steps.tsv").write_text("embed\t0\t12\t\nkernels\t124\t90\ttimeout 90s\nsubset\t-\t-\tskipped: no model\n")
    (work / "embed.json").write_text(json.dumps({"device": "cuda", "ours_default_sps": 2e5, "ours_best_sps": 2.5e5}))
    (work / "kernels.json").write_text(json.dumps({"device": "cuda", "partial": True, "rows": [
        {"Q": 1000, "L": 256, "setting": "default", "queries/s": 5.0},
        {"Q": 10000, "L": 256, "setting": "default", "queries/s": 7.0}]}))
    (work / "missing.txt").write_text("faiss (not needed)\n")
    summary = gpu_summary.main([str(work), str(out)])
    steps = summary["steps"]
    assert steps["embed"]["rc"] == 0 and steps["kernels"]["note"] == "timeout 90s" and steps["subset"]["rc"] is None
    assert summary["headline"]["kernels_largest_q"]["default"]["Q"] == 10000
    assert summary["headline"]["targets"]["embed_sps>=150k"] is True
    assert summary["headline"]["targets"]["query_qps_1m>=50k"] is None
    assert json.loads((out / "summary.json").read_text())["missing"] == ["faiss (not needed)"]
    assert "subset: rc=None" in (out / "summary.txt").read_text()


def test_scale_helpers(tmp_path):
    """bench.scale's parts: the corpus splits into the sentences asked for and is reused (bench.synthetic);
    recall@depth; noisy queries stay near their source."""
    import numpy as np
    import torch

    from bench import scale, synthetic
    from qasc.engine.splitter import split_sentences
    from qasc.engine.store.index import exact_search

    root = synthetic.corpus_dir(tmp_path, 700, 3)
    info = synthetic.write_corpus(root, 700, 3)
    files = sorted((root / "docs").rglob("*.md"))
    docs = [split_sentences(f.read_text(), doc_id=f.stem) for f in files]
    assert len(files) == info["documents"] and abs(sum(len(d) for d in docs) - 700) <= 7
    assert max(len(d) for d in docs) <= 400 and len({t for d in docs for t in d.texts()}) > 600  # varied sentences
    assert any(int(d.section.max()) > 0 for d in docs) and any(int(d.paragraph.max()) > 2 for d in docs)
    assert synthetic.write_corpus(root, 700, 3)["reused"] and not synthetic.write_corpus(root, 700, 4)["reused"]
    emb = torch.nn.functional.normalize(torch.randn(500, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    q, src = synthetic.noisy_queries(emb, 30, 0.3, seed=1)
    _, r = exact_search(emb.numpy(), q.numpy(), 7)
    assert (r[:, 0] == src.numpy()).mean() > 0.9
    assert scale.recall_at_depth(r, r) == 1.0 and scale.recall_at_depth(r[:, ::-1], r) == 1.0
    assert scale.recall_at_depth(np.where(np.arange(7) < 2, r, -1), r) == 2 / 7


def test_scale_table_embedder(tmp_path, tiny_model):
    """--embedder table: the model's word-embedding table mean-pooled == the same computed with torch; a store built
    with it through engine.store.ingest (the ingest child) holds the corpus with unit vectors and an IVF index."""
    import numpy as np
    import torch
    from transformers import AutoModel

    from bench import scale, synthetic
    from qasc.engine.store.reader import Store

    emb = synthetic.TableEmbedder(Path(tiny_model))
    texts = ["A first sentence.", "Second, longer sentence with more words in it.", "A first sentence."]
    vecs = emb.encode(texts)
    table = AutoModel.from_pretrained(tiny_model).embeddings.word_embeddings.weight.detach()
    for text, v in zip(texts, vecs, strict=True):
        ref = table[torch.tensor(emb.tokenizer(text)["input_ids"])].mean(0)
        assert np.allclose(v, (ref / ref.norm()).numpy(), atol=1e-5)
    assert np.array_equal(vecs[0], vecs[2]) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)
    root = synthetic.corpus_dir(tmp_path, 500, 1)
    synthetic.write_corpus(root, 500, 1)
    scale.ingest_child({"corpus": str(root / "docs"), "store": str(tmp_path / "s"), "model": tiny_model,
                        "index": "ivf", "dtype_store": "float16"})
    store = Store.open(tmp_path / "s")
    assert abs(len(store) - 500) <= 5 and store.manifest["index"]["kind"] == "ivf"
    assert np.allclose(np.linalg.norm(store.embeddings, axis=1), 1, atol=1e-2)


@pytest.mark.slow
def test_scale_bench_tiny(tmp_path):
    """bench.scale at a tiny size: corpus, 1-layer model, ingest and query children, streaming, a MiniLM quality
    check on the demo corpus; the JSON keys of issue 14 with sane values."""
    import shutil

    from bench import scale, synthetic
    from qasc.engine.chunker import __file__ as engine_file

    demo = tmp_path / "demo"
    shutil.copytree(Path(engine_file).parent / "data" / "demo", demo)
    rec = scale.main(["--sentences", "600", "--queries", "60", "--exact-queries", "40", "--stream-queries", "100",
                      "--repeats", "1", "--work", str(tmp_path / "work"), "--quality-corpora", str(demo),
                      "--quality-queries", "10"])
    assert set(scale.KEYS) <= set(rec)
    assert 0.0 <= rec["ivf_recall_at_depth"] <= 1.0 and rec["index"] == "ivf"
    assert rec["ingest_sentences_per_s"] > 0 and rec["query_per_s_exact"] > 0 and rec["query_per_s_ivf"] > 0
    assert 0 < rec["driver_peak_rss_gb"] < 64 and 0 < rec["peak_rss_gb"] < 64
    assert abs(rec["sentences"] - 600) <= 6 and rec["query_ivf"]["source_in_hits"] > 0.5
    assert rec["query_ivf"]["stream_rows"] > 0 and rec["rss_growth_100k_queries_gb"] >= 0
    assert rec["quality"]["noisy_sentences"]["queries"] == 10 and 0 <= rec["quality"]["noisy_sentences"][
        "same_top_chunk"] <= 1
    # the corpus is reused (keyed by size and seed), the store re-ingested unless --reuse-store
    again = synthetic.write_corpus(synthetic.corpus_dir(tmp_path / "work", 600, 0), 600, 0)
    assert again["reused"] and again["documents"] == rec["corpus"]["documents"]
    # the same queries with a token budget: the budget fill appends passages / rows to every query's chunks
    budget = scale.main(["--sentences", "600", "--queries", "60", "--exact-queries", "40", "--stream-queries", "0",
                         "--repeats", "1", "--work", str(tmp_path / "work"), "--reuse-store", "--no-quality",
                         "--budget-tokens", "200"])
    assert rec["budget_tokens"] is None and budget["budget_tokens"] == 200
    assert budget["query_ivf"]["rows"] > rec["query_ivf"]["rows"]
    # --reuse-store keeps a store whose ingest record is missing (an ingest run without this driver): no rebuild
    manifests = list((tmp_path / "work").glob("store-*/manifest.json"))
    assert len(manifests) == 1
    stamp = manifests[0].stat().st_mtime_ns
    record = manifests[0].parent.with_name(manifests[0].parent.name + ".ingest.json")
    record.unlink()
    kept = scale.main(["--sentences", "600", "--queries", "20", "--exact-queries", "10", "--stream-queries", "0",
                       "--repeats", "1", "--work", str(tmp_path / "work"), "--reuse-store", "--no-quality"])
    assert manifests[0].stat().st_mtime_ns == stamp and record.is_file()
    assert kept["sentences"] == rec["sentences"] and kept["ingest"]["reused"]
    with pytest.raises(SystemExit):
        scale.parse_args(["--budget-tokens", "-1"])


@pytest.mark.slow
def test_one_question_bench(demo_store):
    """bench.one_question on the demo store: the mapped open and the old way answer alike, both timed."""
    from bench import one_question

    rec = one_question.main(["--store", str(demo_store), "--repeats", "1", "--question", "How long to proof dough?"])
    assert rec["same_answers"] and rec["mapped_s"] > 0 and rec["old_s"] > 0 and rec["model_load_s"] > 0
    steps = ("torch_import", "other_imports", "model_load", "store_open", "first_query")
    assert all(rec[f"{step}_s"] > 0 for step in steps)


def test_ingest_memory_bench(tmp_path):
    """bench.ingest_memory: a small ivf ingest with RSS marks at every index-building step, then the peak."""
    from bench import ingest_memory

    rec = ingest_memory.main(["--sentences", "400", "--work", str(tmp_path)])
    phases = [m["phase"] for m in rec["phases"]]
    assert rec["index"] == "ivf" and rec["sentences"] >= 390
    for step in ("index: training starts (sample gathered)", "index: adding done", "index: written"):
        assert step in phases
    assert rec["driver_peak_rss_gb"] >= max(m["rss_gb"] for m in rec["phases"]) > 0


def test_query_parts_bench():
    from bench import query_parts

    rec = query_parts.main(["--rows", "3000", "--paths", "600", "--queries", "16", "--entries", "20", "--dim", "16",
                            "--repeats", "1"])
    assert {r["part"] for r in rec["rows"]} == {"dots", "paths", "top"}
    assert all(r["exact_share"] > 0.9 for r in rec["rows"] if r["part"] == "paths")


@pytest.mark.slow
def test_partitions_bench_real_model(tmp_path):
    """bench.partitions on the demo corpus in 3 shards (the shipped model, batched as ingest batches): split by shard
    into 3 partition stores (the same vectors), the collection's result file is the store's, byte for byte."""
    from bench import partitions
    from qasc.engine.store import IngestConfig, ingest
    from tests.conftest import DEMO_CORPUS

    ingest([str(DEMO_CORPUS)], tmp_path / "store", settings=IngestConfig(shard_chars=900), progress=False)
    questions = tmp_path / "q.csv"
    questions.write_text("question\nWhy does the crust darken?\nWho invented the Fresnel lens?\nHow do solar cells "
                         "work?\nWhat does a lighthouse keeper do?\n")
    rec = partitions.main(["--store", str(tmp_path / "store"), "--questions", str(questions), "--partitions", "3",
                           "--out", str(tmp_path / "parts"), "--no-alone"])
    assert rec["partitions"] == 3 and rec["identical"] == {"answers": True, "context": True}
    assert {r["run"] for r in rec["runs"]} == {"store", "collection"}


def test_memory_limit_script():
    """bench/memory_limit.sh: a command inside its limit runs (exit 0, its peak under the limit); one over it is
    OOM-killed (exit 137) and says so; bad usage exits 2."""
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "bench" / "memory_limit.sh"
    if os.geteuid() != 0 or not (Path("/sys/fs/cgroup/memory").is_dir() or Path("/sys/fs/cgroup/cgroup.controllers")
                                 .is_file()):
        pytest.skip("needs root and a memory cgroup")
    run = lambda gib, n: subprocess.run(["bash", str(script), gib, "--", sys.executable, "-c",  # noqa: E731
                                         f"x = bytearray({n}); print(len(x))"], capture_output=True, text=True)
    ok = run("0.5", 50_000_000)
    if ok.returncode != 0 and "Permission denied" in ok.stderr:
        pytest.skip("the memory cgroup is not writable here")
    rec = json.loads(ok.stdout.splitlines()[-1])
    assert ok.returncode == 0 and rec["rc"] == 0 and 0.04 < rec["group_peak_gib"] <= 0.5 and rec["oom_kills"] == 0
    over = run("0.1", 400_000_000)
    rec = json.loads(over.stdout.splitlines()[-1])
    assert over.returncode == 137 and rec["rc"] == 137 and rec["oom_kills"] == 1
    assert subprocess.run(["bash", str(script)], capture_output=True).returncode == 2
    assert subprocess.run(["bash", str(script), "0.5", "--evict", "/no/such/folder", "--", "true"],
                          capture_output=True).returncode == 2
