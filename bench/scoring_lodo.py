"""The scoring model on the six development sets: `qasc query`'s answer per variant, held out by data set.

Each variant is a complete `qasc query` setting (QascParams + RetrievalConfig, selection included: what a user
gets from the CLI). Per set, one store (the eval cache's) and the question vectors are built once; every variant
is one engine pass per set (~1-8 s). Beside them, the simple retrievers that practitioners build over the same
sentences: dense cosine, BM25 (the store's own LexicalIndex), reciprocal rank fusion of the two (k = 60 over each
one's top 100), BM25 over each sentence prefixed by its heading path ("contextual chunk headers", bm25-ctx) and
its RRF with dense (rrf-ctx), each at k = 1..10. Leave-one-dataset-out: for each held-out set, each family's member
(variant, or k) is chosen on the other five sets' pooled questions (mean F1) and scored on the held-out one.

    python -m bench.scoring_lodo --variants defaults,nogates --out /tmp/lodo.json

Prints one table (held-out F1 per set, every family) and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

SETS = ("chroma_general", "tatqa_finance", "medquad_health", "policyqa_privacy", "qasper_papers", "wiki_sentences")
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
RRF_K = 60
RRF_DEPTH = 100


def load_sets(names, cache_dir: str, log):
    from qasc.jobs.eval.data import load_dataset
    from qasc.jobs.eval.engine_setup import (
        default_engine_factory,
        make_embedder,
        query_embeddings,
        resolve_eval_dtype,
    )
    from qasc.jobs.eval.retrieval import EvalCache

    embedder = make_embedder("cpu", "fast")
    dtype = resolve_eval_dtype("cpu", "fast")  # the harness's rule: the same cached stores as `qasc eval`
    cache = EvalCache(cache_dir)
    out = {}
    for name in names:
        ds = load_dataset(DATA / name)
        engine = default_engine_factory(ds, cache, Path("/tmp"), "cpu", dtype, log, embedder=embedder)
        qemb = query_embeddings(embedder, ds.questions, cache)
        out[name] = (ds, engine, np.asarray(qemb, dtype=np.float32))
        log(f"{name}: {len(ds.questions)} questions, {engine.n_total} sentences")
    return out


def f1_of(hits_per_q, questions) -> np.ndarray:
    from qasc.jobs.eval.scoring import score_hits

    return score_hits(hits_per_q, questions)["f1"]


def run_variant(engine, qemb, ds, params, retrieval) -> np.ndarray:
    from qasc.jobs.eval.qasc import chunks_to_hits, torch_threads

    texts = [q.text for q in ds.questions]
    with torch_threads(1):
        res = engine.query_embedded(qemb, params, retrieval, questions=texts)
    return f1_of(chunks_to_hits(res), ds.questions)


def simple_retrievers(engine, qemb, ds, ks=range(1, 11)) -> dict[str, np.ndarray]:
    """dense / bm25 / rrf over the store's sentences at each k -> name -> F1 (Q,)."""
    import torch

    table = engine.row_table
    emb = engine.embeddings.float()
    sims = torch.as_tensor(qemb) @ emb.T  # (Q, N)
    index = engine.tables.lexical_index()
    ptr, terms, _ = index.query_terms([q.text for q in ds.questions])
    bm25 = index.dense_scores(ptr, terms)  # (Q, N)
    bm25_ctx = headed_bm25(engine, [q.text for q in ds.questions])
    out = {}
    for name, score in (("dense", sims), ("bm25", bm25), ("rrf", rrf_of(sims, bm25)), ("bm25-ctx", bm25_ctx),
                        ("rrf-ctx", rrf_of(sims, bm25_ctx))):
        order = score.topk(max(ks), dim=1).indices.numpy()
        for k in ks:
            hits = [[(table.doc_ids[int(table.doc[r])], int(table.char_start[r]), int(table.char_end[r]), 0, 0.0, 1)
                     for r in row[:k]] for row in order]
            out[f"{name}-sentences|k={k}"] = f1_of(hits, ds.questions)
    return out


def rrf_of(a, b):
    """(Q, N) scores of two rankings -> (Q, N) reciprocal rank fusion, k = RRF_K over each one's top RRF_DEPTH."""
    import torch

    depth = min(RRF_DEPTH, a.shape[1])
    ranks = 1.0 / (RRF_K + torch.arange(1, depth + 1, dtype=torch.float32))
    out = torch.zeros_like(a)
    for score in (a, b):
        top = score.topk(depth, dim=1).indices
        out.scatter_add_(1, top, ranks.expand_as(top).contiguous())
    return out


def headed_bm25(engine, questions):
    """BM25 over each sentence prefixed by its heading path ("contextual chunk headers"; the text alone without
    one) -> (Q, N) scores."""
    from qasc.engine.lexical import LexicalIndex

    table, headings = engine.row_table, engine.tables.heading_tensors()
    paths = list(getattr(engine.store, "heading_paths", []))
    row_heading = headings[1].tolist() if headings is not None else [-1] * engine.n_total
    texts = [(paths[h] + " " if h >= 0 else "") + table.texts[int(table.doc[r])][table.char_start[r]:table.char_end[r]]
             for r, h in enumerate(row_heading)]
    index = LexicalIndex.build(texts)
    ptr, terms, _ = index.query_terms(questions)
    return index.dense_scores(ptr, terms)


def lodo(per_set: dict[str, dict[str, np.ndarray]], family) -> dict[str, tuple[str, float]]:
    """per_set: set -> member -> F1 (Q,); family: members to choose among -> held-out set -> (choice, F1 mean)."""
    out = {}
    for held in per_set:
        train = [s for s in per_set if s != held]
        best = max(family, key=lambda m: np.concatenate([per_set[s][m] for s in train]).mean())
        out[held] = (best, float(per_set[held][best].mean()))
    return out


def paired_delta(a: np.ndarray, b: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Per-question F1 of two members over the same questions -> mean(b - a) and its 95% bootstrap interval."""
    d = b - a
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(axis=1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def paired_table(per_set: dict[str, dict[str, np.ndarray]], names) -> str:
    """Every variant against `model`: the pooled paired F1 delta (points) with its interval, and per set."""
    lines = ["ablation vs model (F1 points): pooled delta [95% CI] | per set"]
    for v in names:
        if v == "model":
            continue
        pooled = paired_delta(np.concatenate([per_set[s]["model"] for s in per_set]),
                              np.concatenate([per_set[s][v] for s in per_set]))
        sets = " ".join(f"{s[:6]} {100 * (per_set[s][v].mean() - per_set[s]['model'].mean()):+.1f}" for s in per_set)
        lines.append(f"{v:<22} {100 * pooled[0]:+.2f} [{100 * pooled[1]:+.2f}, {100 * pooled[2]:+.2f}] | {sets}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from bench.scoring_variants import VARIANTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--cache-dir", default=os.environ.get("QASC_EVAL_CACHE", str(Path.home() / ".cache/qasc/eval")))
    ap.add_argument("--out", default=None, help="JSON file: per set, per member, per-question F1")
    ap.add_argument("--families", default="", help="extra families: name=variantA+variantB (chosen by LODO)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    log = lambda m: print(f"[{time.perf_counter() - t0:7.1f}s] {m}", file=sys.stderr, flush=True)  # noqa: E731
    sets = load_sets(args.sets.split(","), args.cache_dir, log)
    names = args.variants.split(",")
    per_set: dict[str, dict[str, np.ndarray]] = {}
    for s, (ds, engine, qemb) in sets.items():
        per_set[s] = simple_retrievers(engine, qemb, ds)
        for v in names:
            params, retrieval = VARIANTS[v]()
            t = time.perf_counter()
            per_set[s][v] = run_variant(engine, qemb, ds, params, retrieval)
            log(f"{s} {v}: F1 {100 * per_set[s][v].mean():.1f} ({time.perf_counter() - t:.1f} s)")
    simple = ("dense", "bm25", "rrf", "bm25-ctx", "rrf-ctx")
    families = {f: [m for m in per_set[next(iter(per_set))] if m.startswith(f + "-sentences|")] for f in simple}
    families["simple-best"] = [m for f in simple for m in families[f]]
    for v in names:
        families[v] = [v]
    for spec in filter(None, args.families.split(";")):
        fname, members = spec.split("=")
        families[fname] = members.split("+")
    rows = {f: lodo(per_set, members) for f, members in families.items()}
    width = max(len(f) for f in rows)
    print(f"{'held-out F1':<{width}} " + " ".join(f"{s[:10]:>10}" for s in per_set) + "   pooled")
    for f, res in rows.items():
        pooled = np.concatenate([per_set[s][res[s][0]] for s in per_set]).mean()
        print(f"{f:<{width}} " + " ".join(f"{100 * res[s][1]:10.1f}" for s in per_set) + f" {100 * pooled:8.1f}")
    if "model" in names:
        print(paired_table(per_set, names))
    if args.out:
        Path(args.out).write_text(json.dumps({s: {m: v.tolist() for m, v in d.items()} for s, d in per_set.items()}))
    print(json.dumps({f: {s: [c, round(100 * v, 2)] for s, (c, v) in res.items()} for f, res in rows.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
