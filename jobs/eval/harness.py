"""`qasc eval`: QASC against chunk-then-retrieve baselines on a Chroma-format data set.

Stages: load data -> embed questions -> (QASC) build or reuse the sentence store -> chunk and embed every
baseline (cached on disk) -> ranked hits per question -> per-question scores for every candidate
(baseline: k; QASC: grid setting x selector; both: token budgets) -> leave-one-corpus-out choice ->
ablations -> offline stand-in subset -> report (report.md, results.json, PNG plots, spans JSONL).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from qasc.engine.errors import QascError
from qasc.jobs.eval import baselines as B
from qasc.jobs.eval import context as C
from qasc.jobs.eval import peer_methods as PM
from qasc.jobs.eval import qasc as Q
from qasc.jobs.eval.crossval import CVResult, best_in_sample, leave_one_corpus_out
from qasc.jobs.eval.data import Dataset, Question, load_dataset
from qasc.jobs.eval.metrics import bootstrap_ci, score_spans
from qasc.jobs.eval.retrieval import (
    ChunkSet,
    EvalCache,
    Hit,
    TokenCutter,
    build_chunkset,
    embed_corpus,
    model_key,
    ranked_hits,
    sha,
    within_budget,
)
from qasc.kernels.params import QascParams

DEFAULT_CACHE_DIR = os.environ.get("QASC_EVAL_CACHE", str(Path.home() / ".cache" / "qasc" / "eval"))
QUICK_CORPORA = ("chatlogs", "state_of_the_union")
QUICK_QUESTIONS = 12  # per corpus
RANK_DEPTH_MAX = 200  # baselines: ranked chunks kept per question (enough to fill the largest budget)
# Embedding batches: much larger than the engine's CPU default (1024 padded tokens, 32 texts). Measured on
# this 2-core box in bf16: 16384 tokens per batch ran 2-6x faster than 1024 (oneDNN likes tall matrices).
EVAL_BATCH_TOKENS = 16384
EVAL_MAX_BATCH = 512
METRIC_KEYS = ("precision", "recall", "iou", "f1", "tokens", "retrieved_chars", "overlap_chars")


@dataclass(frozen=True)
class EvalConfig:
    """Everything one `qasc eval` run depends on (saved in results.json)."""

    data_dir: str
    out_dir: str = "eval-out"
    cache_dir: str | None = DEFAULT_CACHE_DIR
    methods: tuple[str, ...] = B.DEFAULT_METHODS
    llm_url: str | None = None
    llm_model: str = "default"
    quick: bool = False
    ks: tuple[int, ...] = tuple(range(1, 11))
    budgets: tuple[int, ...] = (100, 200, 400, 800)
    ppl_corpora: tuple[str, ...] = QUICK_CORPORA
    judge_questions: int = 40
    n_boot: int = 1000
    seed: int = 0
    device: str = "auto"
    dtype: str = "fast"  # fast: bfloat16 on a CPU with native bf16 (5x faster there), else the engine's auto
    grid: str = "full"  # full | quick
    baseline_context: bool = True  # also rank every baseline with QASC's heading context ("<name> + same context")


@dataclass
class MethodRun:
    """One method's ranked chunks and the per-question scores of every candidate selection."""

    name: str
    family: str
    note: str
    ranked: dict[str, list[list[Hit]]]  # base key (QASC: setting key; baselines: "chunks") -> ranked hits
    candidates: dict[str, dict[str, np.ndarray]]  # "base|selector" -> metric -> (Q,)
    stats: dict = field(default_factory=dict)
    settings: dict[str, Q.Setting] = field(default_factory=dict)  # QASC only

    def selector_keys(self, kinds: Sequence[str]) -> list[str]:
        return [k for k in self.candidates if k.split("|", 1)[1].split("=")[0] in kinds]

    def exact(self, selector: str) -> dict[str, dict[str, np.ndarray]]:
        return {k: v for k, v in self.candidates.items() if k.split("|", 1)[1] == selector}

    def preference(self) -> dict[str, float] | None:
        """QASC: each candidate's candidate-region width, depth x (2 neighbourhood + 1), which breaks near-ties
        of every choice (crossval.choose: the wider region keeps more multi-region evidence); baselines: None."""
        if not self.settings:
            return None
        width = {b: s.retrieval.depth * (2 * s.retrieval.neighbourhood + 1) for b, s in self.settings.items()}
        return {k: float(width[k.split("|", 1)[0]]) for k in self.candidates}


class Log:
    def __init__(self, quiet: bool = False) -> None:
        self.t0 = time.perf_counter()
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ scoring

def score_hits(hits_per_q: Sequence[Sequence[Hit]], questions: Sequence[Question]) -> dict[str, np.ndarray]:
    """Per question, its selected hits -> metric -> (Q,) values (fractions; tokens in model tokens)."""
    n = len(questions)
    out = {k: np.zeros(n, dtype=np.float64) for k in METRIC_KEYS}
    for i, (hits, q) in enumerate(zip(hits_per_q, questions, strict=True)):
        s = score_spans(((h[0], h[1], h[2]) for h in hits), q.corpus_id, q.evidence)
        out["precision"][i], out["recall"][i], out["iou"][i], out["f1"][i] = s.precision, s.recall, s.iou, s.f1
        out["tokens"][i] = sum(h[3] for h in hits)
        out["retrieved_chars"][i], out["overlap_chars"][i] = s.retrieved_chars, s.overlap_chars
    return out


def apply_selector(ranked: Sequence[Sequence[Hit]], selector: str, cutter: TokenCutter | None) -> list[list[Hit]]:
    kind, value = selector.split("=")
    if kind == "budget":
        return [within_budget(h, int(value), cutter) for h in ranked]
    return [Q.select(h, selector) for h in ranked]


def add_candidates(run: MethodRun, base: str, ranked: list[list[Hit]], selectors: Sequence[str],
                   questions: Sequence[Question], cutter: TokenCutter) -> None:
    run.ranked[base] = ranked
    for sel in selectors:
        run.candidates[f"{base}|{sel}"] = score_hits(apply_selector(ranked, sel, cutter), questions)


def summarize(per_q: dict[str, np.ndarray], mask: np.ndarray | None = None, n_boot: int = 1000,
              seed: int = 0) -> dict:
    """metric arrays (Q,) -> means and 95% bootstrap intervals in percent, tokens, density (pooled)."""
    m = np.ones(len(per_q["f1"]), dtype=bool) if mask is None else mask
    out: dict = {"n": int(m.sum())}
    for name in ("precision", "recall", "iou", "f1"):
        v = per_q[name][m] * 100
        lo, hi = bootstrap_ci(v, n_boot, seed)
        out[name] = {"mean": float(v.mean()) if v.size else float("nan"), "lo": lo, "hi": hi}
    out["tokens"] = float(per_q["tokens"][m].mean()) if m.any() else float("nan")
    ret = per_q["retrieved_chars"][m].sum()
    out["density"] = float(100 * per_q["overlap_chars"][m].sum() / ret) if ret else 0.0
    return out


# ------------------------------------------------------------------------------------------------ methods

_SIZED = {"fixed-": "fixed", "semchunk-": "semchunk", "recursive-": "recursive"}  # name prefix -> kind of <N>


def parse_method(name: str) -> tuple[str, float | None]:
    """A `--methods` name -> (kind, size): ("fixed", 64), ("recursive-c", 400), ("recursive-t", 200),
    ("semchunk", 128), ("semantic", 95.0), ("peer" | "sentences" | "qasc" | "llm-ppl" | "llm-agentic", None);
    QascError for a name `qasc eval` does not know (checked before any work, and by make_chunkers)."""
    if PM.is_peer(name):  # the peers' own code (peers.py, pipelines.py, hybrid.py)
        return "peer", None
    if name in ("sentences", "qasc", "llm-ppl", "llm-agentic"):
        return name, None
    if name == "semantic":
        return "semantic", 95.0
    for prefix, kind in _SIZED.items():
        if name.startswith(prefix):
            digits, unit = name[len(prefix):], ""
            if kind == "recursive":
                digits, unit = digits[:-1], digits[-1:]
            if digits.isdigit() and int(digits) > 0 and unit in (("c", "t") if kind == "recursive" else ("",)):
                return (f"recursive-{unit}" if unit else kind), int(digits)
    if name.startswith("semantic-p"):
        with contextlib.suppress(ValueError):
            pct = float(name[len("semantic-p"):])
            if 0 < pct < 100:
                return "semantic", pct
    from qasc.jobs.eval import hybrid, pipelines

    raise QascError(f"unknown method {name!r}; known: {', '.join(B.DEFAULT_METHODS)}, recursive-<N>t, "
                    f"semantic-p<P>, {pipelines.PATTERN}, {hybrid.PATTERN}")


def check_methods(names: Sequence[str]) -> None:
    """QascError naming the first method `qasc eval` does not know."""
    for name in names:
        parse_method(name)


def make_chunkers(names: Sequence[str], embedder, sentence_source, cfg: EvalConfig, log) -> list[B.Chunker]:
    out: list[B.Chunker] = []
    tok = embedder.tokenizer
    for name in names:
        kind, size = parse_method(name)
        if kind == "fixed":
            out.append(B.FixedTokenChunker(int(size), tok))
        elif kind == "recursive-c":
            out.append(B.RecursiveCharChunker(int(size)))
        elif kind == "recursive-t":
            out.append(B.RecursiveTokenChunker(int(size)))
        elif kind == "sentences":
            out.append(B.SentenceChunker(tok))
        elif kind == "semantic":
            out.append(B.SemanticChunker(sentence_source, float(size)))
        elif kind in ("peer", "semchunk"):
            out.append(PM.make_peer(name, embedder))
        elif kind == "llm-agentic":
            if not cfg.llm_url:
                log("llm-agentic skipped: it needs --llm-url")
                continue
            from qasc.jobs.eval.llm import ChatClient

            out.append(B.AgenticChunker(ChatClient(cfg.llm_url, cfg.llm_model), tok))
        # qasc runs through the engine; llm-ppl (the stand-in) runs on its subset
    return out


def baseline_run(chunks: ChunkSet, chunker: B.Chunker, query_emb: np.ndarray, questions: Sequence[Question],
                 cfg: EvalConfig, cutter: TokenCutter, context: tuple | None = None) -> MethodRun:
    """One baseline's candidates; context = (corpora, engine, embedder, cache, weight, residual, alpha): ranked
    with QASC's scoring model instead (heading context, residual, lexical term; jobs/eval/context.py), named
    `<name> + same context`."""
    t0 = time.perf_counter()
    small = float(np.percentile(chunks.n_tokens, 10)) if len(chunks) else 1.0
    depth = min(len(chunks), max(max(cfg.ks), min(RANK_DEPTH_MAX, int(max(cfg.budgets) / max(small, 1.0)) + 4)))
    name, note = chunker.name, chunker.note
    own = getattr(chunker, "rank", None)  # hybrid retrievers rank with their own signals (pipelines.py, hybrid.py)
    if not len(chunks):
        ranked = [[] for _ in questions]
    elif own is not None:
        ranked = own(chunks, query_emb, questions, cutter.texts, max(depth, 1))
    elif context is not None:
        corpora, engine, embedder, cache, weight, residual, alpha = context
        paths, path = C.chunk_paths(chunks, corpora)
        lexical = None
        if alpha > 0:
            texts = [corpora[d][a:b] for d, a, b in zip(chunks.doc_ids, chunks.starts.tolist(), chunks.ends.tolist(),
                                                        strict=True)]
            lexical = C.Lexical(alpha, [q.text for q in questions], texts, paths)
        ranked = C.context_ranked(chunks, query_emb, path, C.path_vectors(paths, engine, embedder, cache), weight,
                                  max(depth, 1), residual, lexical)
        name = name + C.SUFFIX
        note = f"{note}; ranked by cos + QASC's heading context (w={weight:g}, residual {residual:g})" + (
            f" and lexical term (alpha {alpha:g})" if alpha > 0 else "")
    else:
        ranked = ranked_hits(chunks, query_emb, max(depth, 1))
    run = MethodRun(name, chunker.family, note, {}, {})
    sels = [f"k={k}" for k in cfg.ks] + [f"budget={b}" for b in cfg.budgets]
    # retrieval recipes (LlamaIndex sentence window, auto-merging) turn ranked nodes into what they return
    recipe = getattr(chunker, "retrieval_views", None)
    for base, hits, base_sels in (recipe(chunks, ranked, sels, cutter) if recipe else [("chunks", ranked, sels)]):
        add_candidates(run, base, hits, base_sels, questions, cutter)
    run.stats = {"n_chunks": len(chunks), "mean_chunk_tokens": float(chunks.n_tokens.mean()) if len(chunks) else 0.0,
                 "mean_chunk_chars": float((chunks.ends - chunks.starts).mean()) if len(chunks) else 0.0,
                 "chunk_seconds": round(chunks.seconds_chunk, 2), "embed_seconds": round(chunks.seconds_embed, 2),
                 "score_seconds": round(time.perf_counter() - t0, 2)}
    return run


def qasc_run(engine, query_emb, questions: Sequence[Question], grid: Sequence[Q.Setting], cfg: EvalConfig,
             cutter: TokenCutter, log) -> MethodRun:
    import torch

    qemb = torch.as_tensor(np.asarray(query_emb, dtype=np.float32))
    run = MethodRun("qasc", "qasc", "query-time chunking through engine.query (store + FAISS + kernels)", {}, {})
    sels = Q.selectors(cfg.ks)
    t_engine = t_score = 0.0
    texts = [q.text for q in questions]
    fill = Q.BudgetFill(engine)  # the token budgets: the engine's budget fill after the chunks
    for i, s in enumerate(grid):
        t0 = time.perf_counter()
        units: list = []
        ranked = Q.run_setting(engine, qemb, s, texts, units)
        t1 = time.perf_counter()
        add_candidates(run, s.key(), ranked, sels, questions, cutter)
        for b in cfg.budgets:
            run.candidates[f"{s.key()}|budget={b}"] = score_hits(
                fill.hits(ranked, units, b, cutter, s.params.fill_diversity), questions)
        run.settings[s.key()] = s
        t_engine += t1 - t0
        t_score += time.perf_counter() - t1
        if (i + 1) % 20 == 0 or i + 1 == len(grid):
            log(f"  qasc grid {i + 1}/{len(grid)} (engine {t_engine:.1f} s, scoring {t_score:.1f} s)")
    run.stats = {"grid_size": len(grid), "engine_seconds": round(t_engine, 2), "score_seconds": round(t_score, 2),
                 "engine_ms_per_setting": round(1000 * t_engine / max(len(grid), 1), 1)}
    return run


def extra_setting(run: MethodRun, engine, query_emb, questions, s: Q.Setting, cfg: EvalConfig,
                  cutter: TokenCutter) -> None:
    """Run one more setting (an ablation variant) unless it was already run."""
    import torch

    if s.key() in run.settings:
        return
    ranked = Q.run_setting(engine, torch.as_tensor(np.asarray(query_emb, dtype=np.float32)), s,
                           [q.text for q in questions])
    add_candidates(run, s.key(), ranked, Q.selectors(cfg.ks), questions, cutter)
    run.settings[s.key()] = s


# ------------------------------------------------------------------------------------------------ engine

def resolve_eval_dtype(device: str, dtype: str) -> str:
    """'fast' -> 'bfloat16' on a CPU with native bf16 instructions (avx512_bf16 / amx), else 'auto'."""
    if dtype != "fast":
        return dtype
    from qasc.engine.cpu import cpu_has_native_bf16
    from qasc.engine.embedder import resolve_device

    if resolve_device(device).type != "cpu":
        return "auto"
    return "bfloat16" if cpu_has_native_bf16() else "auto"


def make_embedder(device: str = "cpu", dtype: str = "fast"):
    """The eval's embedder: the default model, `dtype` resolved as by --dtype, large batches."""
    from qasc.engine.embedder import Embedder

    return Embedder(device=device, dtype=resolve_eval_dtype(device, dtype), batch_tokens=EVAL_BATCH_TOKENS,
                    max_batch_size=EVAL_MAX_BATCH)


def default_engine_factory(dataset: Dataset, cache: EvalCache, out_dir: Path, device: str, dtype: str, log,
                           embedder=None):
    """Ingest the corpora into a store (reused from the cache when it exists) and open the query engine.

    `embedder` (same model and dtype as the store's config) is handed to the ingest so that it embeds with
    the eval's large batches (16384-token batches embed 2-6x faster in bf16 on this CPU than the default 32
    texts) instead of loading a second model with the engine's small CPU batches.
    """
    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.embedder import model_fingerprint, resolve_model_path
    from qasc.engine.query import Engine
    from qasc.engine.store import IngestProgress, existing_manifest, ingest

    missing = [c for c in dataset.corpora if c not in dataset.files]
    if missing:
        raise QascError(f"QASC needs the corpus files; the data set has no path for {missing}")
    fp = model_fingerprint(resolve_model_path(None))
    root = cache.root / "stores" if cache.root else out_dir / "stores"
    from qasc.engine.splitter import SplitterConfig
    from qasc.engine.store.schema import FORMAT_VERSION

    splitter = sha(json.dumps(SplitterConfig().describe(), sort_keys=True))[:8]  # a new splitter default: new store
    # a new store format (2: heading paths) is a new store too
    store_dir = root / f"{dataset.name}-{dataset.corpora_fingerprint()}-{fp}-{dtype}-{splitter}-v{FORMAT_VERSION}"
    if existing_manifest(store_dir) is None:
        log(f"building the QASC store {store_dir}")
        t0 = time.perf_counter()
        config = EngineConfig(embedder=EmbedderConfig(device=device, dtype=dtype, batch_tokens=EVAL_BATCH_TOKENS))
        ingest([dataset.files[c] for c in sorted(dataset.corpora)], str(store_dir), config, embedder=embedder,
               progress=IngestProgress(bar=False, log=log), log=log)
        log(f"  store built in {time.perf_counter() - t0:.1f} s")
    engine = Engine.open(str(store_dir), device=device)
    texts = {d.doc_id: d.text for d in engine.store.docs}
    for cid, text in dataset.corpora.items():
        if texts.get(cid) != text:
            raise QascError(f"store {store_dir}: document {cid!r} differs from the data set's corpus text")
    return engine


def seed_sentence_cache(engine, embedder, dataset: Dataset, cache: EvalCache) -> int:
    """Reuse the store's sentence embeddings for the `sentences` baseline (same spans, same model)."""
    if engine is None or getattr(engine, "store", None) is None or cache.root is None:
        return 0
    if model_key(engine.embedder) != model_key(embedder):
        return 0
    store = engine.store
    chunker = B.SentenceChunker(embedder.tokenizer)
    seeded = 0
    for d, (lo, hi) in zip(store.docs, zip(store.doc_offsets[:-1], store.doc_offsets[1:], strict=True), strict=True):
        if d.doc_id not in dataset.corpora:
            continue
        spans = list(zip(d.char_start.tolist(), d.char_end.tolist(), strict=True))
        text = dataset.corpora[d.doc_id]
        key = f"{model_key(embedder)}|{chunker.key()}|{d.doc_id}|{sha(text)}|{sha(json.dumps(spans))}"
        if cache.load_arrays("emb", key) is None:
            cache.save_arrays("emb", key, emb=store.embedding_rows(lo, hi),  # host float32 wherever the vectors live
                              n_tokens=np.asarray(d.n_tokens, dtype=np.int32))
            seeded += 1
    return seeded


# ------------------------------------------------------------------------------------------------ views

BUDGET_CRITERION = "recall"  # QASC's setting per budget: every method spends up to the same budget


def cv(cands: dict[str, dict[str, np.ndarray]], dataset: Dataset, criterion: str = "f1",
       prefer: dict[str, float] | None = None) -> CVResult:
    return leave_one_corpus_out(cands, [q.corpus_id for q in dataset.questions], criterion, prefer)


def views(runs: dict[str, MethodRun], dataset: Dataset, cfg: EvalConfig) -> dict:
    """Held-out headline (k or QASC setting chosen per fold), top-k view, budget view, breakdowns."""
    multi = np.asarray([q.multi for q in dataset.questions])
    out: dict = {"heldout": {}, "topk": {}, "budget": {}, "in_sample": {}}
    cvs: dict[str, CVResult] = {}
    for name, run in runs.items():
        kinds = ("k", "margin") if run.family == "qasc" else ("k",)
        cands = {k: run.candidates[k] for k in run.selector_keys(kinds)}
        res = cv(cands, dataset, prefer=run.preference())
        cvs[name] = res
        entry = summarize(res.heldout, None, cfg.n_boot, cfg.seed)
        entry["single"] = summarize(res.heldout, ~multi, cfg.n_boot, cfg.seed)
        entry["multi"] = summarize(res.heldout, multi, cfg.n_boot, cfg.seed)
        types = sorted({q.qtype for q in dataset.questions if q.qtype})
        if types:
            qt = np.asarray([q.qtype or "" for q in dataset.questions], dtype=object)
            entry["by_type"] = {t: summarize(res.heldout, qt == t, cfg.n_boot, cfg.seed) for t in types}
        entry["folds"] = [asdict(f) for f in res.folds]
        entry["family"], entry["note"], entry["stats"] = run.family, run.note, run.stats
        out["heldout"][name] = entry
        out["topk"][name] = {str(k): _view(run, f"k={k}", dataset, cfg) for k in cfg.ks}
        out["budget"][name] = {str(b): _view(run, f"budget={b}", dataset, cfg, BUDGET_CRITERION)
                               for b in cfg.budgets}
        best = best_in_sample(cands, "f1", run.preference())
        out["in_sample"][name] = {"candidate": best, **summarize(run.candidates[best], None, cfg.n_boot, cfg.seed)}
    return out, cvs


def _view(run: MethodRun, selector: str, dataset: Dataset, cfg: EvalConfig, criterion: str = "f1") -> dict:
    cands = run.exact(selector)
    res = cv(cands, dataset, criterion, run.preference())
    entry = summarize(res.heldout, None, cfg.n_boot, cfg.seed)
    if len(cands) > 1:
        entry["folds"] = [asdict(f) for f in res.folds]
    return entry


def heldout_hits(run: MethodRun, res: CVResult, dataset: Dataset, cutter: TokenCutter) -> list[list[Hit]]:
    """The hits each question was scored with in the held-out headline (its fold's chosen candidate)."""
    out = []
    cache: dict[str, list[list[Hit]]] = {}
    for i, _q in enumerate(dataset.questions):
        key = res.chosen[i]
        if key not in cache:
            base, sel = key.split("|", 1)
            cache[key] = apply_selector(run.ranked[base], sel, cutter)
        out.append(cache[key][i])
    return out


def ablations(qrun: MethodRun, res: CVResult, engine, query_emb, dataset: Dataset, cfg: EvalConfig,
              cutter: TokenCutter, log) -> list[dict]:
    """Each ablation applied to every fold's chosen setting (same selector), scored held-out, paired deltas."""
    corpus = np.asarray([q.corpus_id for q in dataset.questions], dtype=object)
    full = res.heldout
    rows = []
    for label, change in Q.ABLATIONS:
        per_q = {k: np.zeros(len(corpus)) for k in METRIC_KEYS}
        changed_folds = 0
        variants = []
        for f in res.folds:
            base, sel = f.chosen.split("|", 1)
            variant = change(qrun.settings[base])
            if variant is None:
                variant = qrun.settings[base]
            if variant.key() != base:
                changed_folds += 1
            extra_setting(qrun, engine, query_emb, dataset.questions, variant, cfg, cutter)
            vals = qrun.candidates[f"{variant.key()}|{sel}"]
            test = corpus == f.corpus
            for k in METRIC_KEYS:
                per_q[k][test] = vals[k][test]
            variants.append(variant.key())
        delta = (per_q["f1"] - full["f1"]) * 100
        lo, hi = bootstrap_ci(delta, cfg.n_boot, cfg.seed)
        rows.append({"ablation": label, "changed_folds": changed_folds, "variants": variants,
                     **summarize(per_q, None, cfg.n_boot, cfg.seed),
                     "delta_f1": {"mean": float(delta.mean()), "lo": lo, "hi": hi}})
        log(f"  ablation {label}: F1 {100 * per_q['f1'].mean():.1f} (delta {delta.mean():+.1f})")
    return rows


# ------------------------------------------------------------------------------------------------ main

def quick_subset(ds: Dataset) -> Dataset:
    keep = [c for c in QUICK_CORPORA if c in ds.corpora] or ds.corpus_ids[:2]
    return ds.subset(keep, QUICK_QUESTIONS)


def query_embeddings(embedder, questions: Sequence[Question], cache: EvalCache) -> np.ndarray:
    texts = [q.text for q in questions]
    key = f"{model_key(embedder)}|queries|{sha(json.dumps(texts))}"
    got = cache.load_arrays("queries", key)
    if got is not None:
        return got["emb"]
    emb = embedder.encode(texts)
    cache.save_arrays("queries", key, emb=emb)
    return emb


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
    grid = Q.qasc_grid(quick=cfg.quick or cfg.grid == "quick")
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
        "config": {**asdict(cfg), "grid_axes": _jsonable(Q.QUICK_AXES if (cfg.quick or cfg.grid == "quick")
                                                          else Q.GRID_AXES), "grid_size": len(grid)},
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
