"""The metric reproduces Chroma's published number, and `qasc eval --quick` runs on the real model and data.

Slow: the real embedding model on chroma_general. Embeddings are cached under QASC_EVAL_CACHE
(default /tmp/qasc-eval-cache), so only a cold cache embeds (the sanity check: ~1.4 MB once).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import CHROMA

pytestmark = pytest.mark.slow
CACHE = os.environ.get("QASC_EVAL_CACHE", "/tmp/qasc-eval-cache")


@pytest.fixture(scope="module")
def chroma():
    if not (CHROMA / "corpora").is_dir():
        pytest.skip(f"chroma_general not found at {CHROMA}")
    from qasc.jobs.eval.data import load_dataset

    return load_dataset(CHROMA)


@pytest.fixture(scope="module")
def eval_embedder():
    from qasc.jobs.eval.engine_setup import make_embedder

    return make_embedder("cpu", "fast")


def test_recursive_200_tokens_k5_matches_chroma(chroma, eval_embedder):
    """Chroma's report: RecursiveTokenChunker 200 tokens, overlap 0, k=5 -> recall 75.7, precision 6.5."""
    from qasc.jobs.eval.baselines import RecursiveTokenChunker
    from qasc.jobs.eval.engine_setup import query_embeddings
    from qasc.jobs.eval.retrieval import EvalCache, build_chunkset, ranked_hits
    from qasc.jobs.eval.scoring import score_hits

    cache = EvalCache(CACHE)
    chunks = build_chunkset(RecursiveTokenChunker(200), chroma.corpora, eval_embedder, cache)
    qemb = query_embeddings(eval_embedder, chroma.questions, cache)
    scores = score_hits(ranked_hits(chunks, qemb, 5), chroma.questions)
    recall, precision = 100 * scores["recall"].mean(), 100 * scores["precision"].mean()
    assert abs(recall - 75.7) < 3.0, recall
    assert abs(precision - 6.5) < 1.0, precision


def test_quick_cli_run(tmp_path):
    if not (CHROMA / "corpora").is_dir():
        pytest.skip(f"chroma_general not found at {CHROMA}")
    from qasc.jobs.cli import main

    out = tmp_path / "eval"
    rc = main(["eval", "--data", str(CHROMA), "--out", str(out), "--quick", "--cache-dir", CACHE,
               "--methods", "fixed-64,recursive-400c,sentences,semantic,qasc", "--bootstrap", "200"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["quick"] is True
    held = res["heldout"]
    baselines = {"fixed-64", "recursive-400c", "sentences", "semantic"}
    assert set(held) == baselines | {"qasc"} | {f"{m} + same context" for m in baselines}
    assert held["qasc"]["f1"]["mean"] > 5.0
    assert (out / "report.md").read_text().startswith("# QASC evaluation")
    lines = [json.loads(line)["method"] for line in open(out / "spans.jsonl")]
    assert baselines | {"qasc"} <= set(lines) <= set(held)
    assert all(lines.count(m) == res["dataset"]["questions"] for m in set(lines))
