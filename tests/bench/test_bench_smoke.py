"""Each benchmark's main() runs at tiny sizes and returns its JSON record (the scripts stay runnable)."""

from __future__ import annotations

import pytest

from tests.conftest import CHROMA

needs_chroma = pytest.mark.skipif(not (CHROMA / "questions.csv").is_file(), reason=f"chroma_general not at {CHROMA}")

SENTENCES = ["Short one.", "A second, somewhat longer sentence for the batch.", "Third.",
             "Lighthouses use Fresnel lenses to throw light far out to sea."]


def test_kernels_bench():
    from bench import kernels

    rec = kernels.main(["--qs", "1,3", "--ls", "16", "--settings", "default,r3-adaptive", "--repeats", "1",
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
