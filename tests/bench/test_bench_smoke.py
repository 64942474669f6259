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
