"""`qasc eval`: QASC against chunk-then-retrieve baselines on a Chroma-format data set.

Stages: load data -> embed questions -> (QASC) build or reuse the sentence store -> chunk and embed every
baseline (cached on disk) -> ranked hits per question -> per-question scores for every candidate
(baseline: k; QASC: grid setting x selector; both: token budgets) -> leave-one-corpus-out choice ->
ablations -> offline stand-in subset -> report (report.md, results.json, PNG plots, spans JSONL).
The stages' parts: config.py (EvalConfig), methods.py (method names -> chunkers), engine_setup.py (embedder, store),
scoring.py (candidates and their scores), views.py (cross-validated views, ablations); report.py writes the outputs.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from qasc.jobs.eval import baselines as B
from qasc.jobs.eval import context as C
from qasc.jobs.eval import qasc as Q
from qasc.jobs.eval.config import QUICK_CORPORA, QUICK_QUESTIONS, EvalConfig, Log, grid_name
from qasc.jobs.eval.crossval import CVResult
from qasc.jobs.eval.data import Dataset, load_dataset
from qasc.jobs.eval.engine_setup import (
    default_engine_factory,
    make_embedder,
    query_embeddings,
    resolve_eval_dtype,
    seed_sentence_cache,
)
from qasc.jobs.eval.methods import make_chunkers
from qasc.jobs.eval.metrics import bootstrap_ci
from qasc.jobs.eval.retrieval import ChunkSet, EvalCache, TokenCutter, build_chunkset, embed_corpus
from qasc.jobs.eval.scoring import MethodRun, baseline_run, qasc_run
from qasc.jobs.eval.views import ablations, heldout_hits, views
from qasc.kernels.params import QascParams

# ------------------------------------------------------------------------------------------------ main

def quick_subset(ds: Dataset) -> Dataset:
    keep = [c for c in QUICK_CORPORA if c in ds.corpora] or ds.corpus_ids[:2]
    return ds.subset(keep, QUICK_QUESTIONS)


def evaluate_methods(dataset: Dataset, query_emb: np.ndarray, chunksets: dict[str, tuple[B.Chunker, ChunkSet]],
                     engine, grid: Sequence[Q.Setting], cfg: EvalConfig, cutter: TokenCutter,
                     log, embedder=None, cache: EvalCache | None = None) -> dict[str, MethodRun]:
    """Every baseline (and, with cfg.baseline_context and an embedder, each again with QASC's heading context)
    and QASC's grid -> their runs by name."""
    runs: dict[str, MethodRun] = {}
    default = QascParams()
    weight, residual = default.context_weight, default.heading_residual
    lexical = default.lexical_weight  # the baselines get QASC's whole scoring model too
    for name, (chunker, chunks) in chunksets.items():
        runs[name] = baseline_run(chunks, chunker, query_emb, dataset.questions, cfg, cutter)
        own_ranking = hasattr(chunker, "rank")  # a retriever of its own: no dense re-ranking with QASC's context
        if cfg.baseline_context and weight > 0 and embedder is not None and not own_ranking:  # QASC's lever
            runs[name + C.SUFFIX] = baseline_run(chunks, chunker, query_emb, dataset.questions, cfg, cutter,
                                                 (dataset.corpora, engine, embedder, cache, weight, residual,
                                                  lexical))
    if engine is not None:
        runs["qasc"] = qasc_run(engine, query_emb, dataset.questions, grid, cfg, cutter, log)
    return runs


@dataclass
class SetRun:
    """One data set's stages up to the per-question scores of every candidate of every method."""

    dataset: Dataset
    runs: dict[str, MethodRun]
    engine: object | None  # engine.query.Engine (None when QASC is not among the methods)
    query_emb: np.ndarray  # (Q, dim)
    cutter: TokenCutter
    chunksets: dict[str, tuple[B.Chunker, ChunkSet]]
    grid: list[Q.Setting]
    dtype: str
    timings: dict[str, float]


def prepare_runs(cfg: EvalConfig, embedder, cache: EvalCache, log, engine_factory: Callable | None = None,
                 out_dir: Path | None = None) -> SetRun:
    """Load cfg.data_dir, embed its questions, build/reuse the store and every baseline's chunks, and score
    every candidate of every method on every question."""
    timings: dict[str, float] = {}
    out_dir = out_dir or Path(cfg.out_dir)
    t0 = time.perf_counter()
    full_ds = load_dataset(cfg.data_dir)
    ds = quick_subset(full_ds) if cfg.quick else full_ds
    log(f"data {ds.root}: {len(ds.corpora)} corpora, {sum(map(len, ds.corpora.values()))} chars, "
        f"{len(ds.questions)} questions ({sum(q.multi for q in ds.questions)} multi-reference)")
    dtype = resolve_eval_dtype(cfg.device, cfg.dtype)
    qemb = query_embeddings(embedder, ds.questions, cache)
    timings["load_and_queries"] = time.perf_counter() - t0

    methods = list(dict.fromkeys(cfg.methods))
    engine = None
    t0 = time.perf_counter()
    if "qasc" in methods:
        factory = engine_factory or default_engine_factory
        engine = factory(ds, cache, out_dir, cfg.device, dtype, log, embedder=embedder)
        seeded = seed_sentence_cache(engine, embedder, ds, cache)
        if seeded:
            log(f"sentence embeddings of {seeded} corpora taken from the store")
    timings["store"] = time.perf_counter() - t0

    def sentence_source(cid: str, text: str):
        chunker = B.SentenceChunker(embedder.tokenizer)
        spans = chunker.spans(cid, text)
        emb, n_tok, _ = embed_corpus(embedder, chunker.key(), cid, text, spans, cache)
        return spans, emb, n_tok

    t0 = time.perf_counter()
    chunkers = make_chunkers(methods, embedder, sentence_source, cfg, log)
    chunksets: dict[str, tuple[B.Chunker, ChunkSet]] = {}
    for ch in chunkers:
        t1 = time.perf_counter()
        chunksets[ch.name] = (ch, build_chunkset(ch, ds.corpora, embedder, cache, log))
        log(f"{ch.name}: {len(chunksets[ch.name][1])} chunks ({time.perf_counter() - t1:.1f} s)")
    timings["chunk_and_embed"] = time.perf_counter() - t0

    cutter = TokenCutter(embedder.tokenizer, ds.corpora)
    grid = Q.qasc_grid(quick=cfg.quick or cfg.grid == "quick", grid=cfg.grid)
    t0 = time.perf_counter()
    runs = evaluate_methods(ds, qemb, chunksets, engine, grid, cfg, cutter, log, embedder, cache)
    timings["retrieve_and_score"] = time.perf_counter() - t0
    return SetRun(ds, runs, engine, qemb, cutter, chunksets, grid, dtype, timings)


def start_run(cfg: EvalConfig, embedder, log) -> tuple[Path, EvalCache, object]:
    """The output folder (created), the cache, and the embedder (made from cfg unless one is lent)."""
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if embedder is None:
        embedder = make_embedder(cfg.device, resolve_eval_dtype(cfg.device, cfg.dtype))
        log(f"embedder {embedder.name} on {embedder.device} in {embedder.dtype}")
    return out_dir, EvalCache(cfg.cache_dir), embedder


def run_eval(cfg: EvalConfig, engine_factory: Callable | None = None, embedder=None, log=None) -> dict:
    """The whole evaluation -> results dict (also written to cfg.out_dir with the report and plots)."""
    from transformers.utils import logging as hf_logging

    from qasc.jobs.eval import report

    hf_logging.set_verbosity_error()  # "sequence longer than 512": we only count tokens of long chunks
    log = log or Log()
    t_start = time.perf_counter()
    out_dir, cache, embedder = start_run(cfg, embedder, log)
    prepared = prepare_runs(cfg, embedder, cache, log, engine_factory, out_dir)
    ds, runs, engine, qemb, cutter = (prepared.dataset, prepared.runs, prepared.engine, prepared.query_emb,
                                      prepared.cutter)
    chunksets, grid, dtype, timings = prepared.chunksets, prepared.grid, prepared.dtype, prepared.timings
    methods = list(dict.fromkeys(cfg.methods))

    t0 = time.perf_counter()
    results, cvs = views(runs, ds, cfg)
    timings["crossval"] = time.perf_counter() - t0

    ablation_rows: list[dict] = []
    if "qasc" in runs:
        t0 = time.perf_counter()
        log("ablations")
        ablation_rows = ablations(runs["qasc"], cvs["qasc"], engine, qemb, ds, cfg, cutter, log)
        timings["ablations"] = time.perf_counter() - t0
        q_hits = heldout_hits(runs["qasc"], cvs["qasc"], ds, cutter)
        results["granularity"] = Q.sentence_histogram(q_hits)

    subset = None
    if "llm-ppl" in methods:
        t0 = time.perf_counter()
        subset = run_ppl_subset(ds, qemb, chunksets, engine_factory or default_engine_factory, embedder, cache,
                                out_dir, grid, cfg, dtype, log)
        timings["ppl_subset"] = time.perf_counter() - t0

    faith = None
    if cfg.llm_url:
        t0 = time.perf_counter()
        faith = faithfulness(runs, cvs, ds, cfg, cutter, log)
        timings["faithfulness"] = time.perf_counter() - t0

    timings["total"] = time.perf_counter() - t_start
    results.update({
        "dataset": {"name": ds.name, "root": ds.root, "fingerprint": ds.fingerprint(),
                    "corpora": {c: len(t) for c, t in sorted(ds.corpora.items())},
                    "questions": len(ds.questions), "multi_reference": int(sum(q.multi for q in ds.questions)),
                    "questions_per_corpus": {c: sum(q.corpus_id == c for q in ds.questions) for c in ds.corpus_ids}},
        "config": {**asdict(cfg), "grid_axes": _jsonable(Q.grid_axes(grid_name(cfg))), "grid_size": len(grid)},
        "environment": _environment(embedder),
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "cache": {"dir": cfg.cache_dir, "hits": cache.hits, "misses": cache.misses},
        "ablations": ablation_rows,
        "ppl_subset": subset,
        "faithfulness": faith,
        "unit": "percent (precision, recall, iou, f1, density); model tokens (tokens)",
    })
    results["targets"] = report.targets(results)
    spans = {name: heldout_hits(run, cvs[name], ds, cutter) for name, run in runs.items()}
    report.write_all(out_dir, results, spans, ds, cvs)
    log(f"wrote {out_dir}/report.md, results.json, spans.jsonl and plots in {timings['total']:.0f} s")
    return results


def run_ppl_subset(ds: Dataset, qemb: np.ndarray, chunksets, engine_factory, embedder, cache: EvalCache,
                   out_dir: Path, grid, cfg: EvalConfig, dtype: str, log) -> dict | None:
    """The offline stand-in on its corpus subset, with every other method re-scored on the same subset."""
    keep = [c for c in cfg.ppl_corpora if c in ds.corpora]
    if not keep:
        log(f"llm-ppl skipped: none of {cfg.ppl_corpora} in the data set")
        return None
    sub = ds.subset(keep)
    idx = np.asarray([q.qid for q in sub.questions], dtype=np.int64)
    pos = {q.qid: i for i, q in enumerate(ds.questions)}
    sub_qemb = qemb[[pos[i] for i in idx]]
    chars = sum(len(sub.corpora[c]) for c in keep)
    log(f"llm-ppl (offline stand-in) on {keep}: {chars} chars, {len(sub.questions)} questions")
    done = {"tokens": 0}
    t_start = time.perf_counter()

    def progress(n: int) -> None:
        done["tokens"] += n
        if done["tokens"] // 4000 != (done["tokens"] - n) // 4000:
            rate = done["tokens"] / max(time.perf_counter() - t_start, 1e-9)
            log(f"  SmolLM2: {done['tokens']} tokens scored ({rate:.0f} tokens/s)")

    ppl = B.PerplexityChunker(embedder.tokenizer, progress=progress)
    sub_sets = {name: (ch, cs.restrict(keep)) for name, (ch, cs) in chunksets.items()}
    sub_sets[ppl.name] = (ppl, build_chunkset(ppl, sub.corpora, embedder, cache, log))
    engine = (engine_factory(sub, cache, out_dir, cfg.device, dtype, log, embedder=embedder)
              if "qasc" in cfg.methods else None)
    cutter = TokenCutter(embedder.tokenizer, sub.corpora)
    runs = evaluate_methods(sub, sub_qemb, sub_sets, engine, grid, cfg, cutter, log, embedder, cache)
    res, _ = views(runs, sub, cfg)
    return {"corpora": keep, "chars": chars, "questions": len(sub.questions),
            "share_of_chars": chars / sum(len(t) for t in ds.corpora.values()),
            "heldout": res["heldout"], "budget": res["budget"], "seconds": round(time.perf_counter() - t_start, 1)}


def faithfulness(runs: dict[str, MethodRun], cvs: dict[str, CVResult], ds: Dataset, cfg: EvalConfig,
                 cutter: TokenCutter, log) -> dict:
    """Generate-and-judge on a seeded sample of questions for every method's held-out selection."""
    from qasc.jobs.eval.llm import ChatClient, generate_and_judge

    client = ChatClient(cfg.llm_url, cfg.llm_model)
    rng = np.random.default_rng(cfg.seed)
    n = min(cfg.judge_questions, len(ds.questions))
    sample = sorted(rng.choice(len(ds.questions), size=n, replace=False).tolist())
    out = {"questions": n, "model": cfg.llm_model, "url": cfg.llm_url, "methods": {}}
    for name, run in runs.items():
        hits = heldout_hits(run, cvs[name], ds, cutter)
        scores = []
        for i in sample:
            q = ds.questions[i]
            ctx = [ds.corpora[h[0]][h[1]:h[2]] for h in hits[i]]
            ev = [ds.corpora[q.corpus_id][s:e] for s, e in q.evidence]
            scores.append(generate_and_judge(client, q.text, ctx, ev)["score"])
        v = np.asarray(scores) * 100
        lo, hi = bootstrap_ci(v, cfg.n_boot, cfg.seed)
        out["methods"][name] = {"mean": float(v.mean()), "lo": lo, "hi": hi}
        log(f"  judged {name}: {v.mean():.1f}")
    return out


def _jsonable(axes: dict) -> dict:
    return {k: [x if not isinstance(x, dict) else dict(x) for x in v] for k, v in axes.items()}


def _environment(embedder) -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "model": getattr(embedder, "name", "?"), "fingerprint": getattr(embedder, "fingerprint", "?")}
