"""Every method's candidates: ranked hits -> per-question scores of every selection (k, margin, token budget),
for a baseline's chunks and for each setting of QASC's grid; the means and intervals of a set of scores."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from qasc.jobs.eval import baselines as B
from qasc.jobs.eval import context as C
from qasc.jobs.eval import qasc as Q
from qasc.jobs.eval.config import EvalConfig
from qasc.jobs.eval.data import Question
from qasc.jobs.eval.metrics import bootstrap_ci, score_spans
from qasc.jobs.eval.retrieval import ChunkSet, Hit, TokenCutter, ranked_hits, within_budget

RANK_DEPTH_MAX = 200  # baselines: ranked chunks kept per question (enough to fill the largest budget)
METRIC_KEYS = ("precision", "recall", "iou", "f1", "tokens", "retrieved_chars", "overlap_chars")


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
    headline: tuple[str, ...] = ("k",)  # selector kinds the F1 headline chooses among

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
    run.headline = ("k", "margin")
    views_of: dict[str, Sequence[str]] = {}
    if cfg.grid == "presets":  # answers: top-k and its shipped selection (the headline); context: the budgets
        sels, run.headline = [f"k={k}" for k in cfg.ks] + [Q.SHIPPED_SELECTOR], ("margin",)
        views_of = dict(zip((s.key() for s in grid), Q.PRESET_VIEWS.values(), strict=True))
    t_engine = t_score = 0.0
    texts = [q.text for q in questions]
    fill = Q.BudgetFill(engine)  # the token budgets: the engine's budget fill after the chunks
    for i, s in enumerate(grid):
        t0 = time.perf_counter()
        units: list = []
        ranked = Q.run_setting(engine, qemb, s, texts, units)
        t1 = time.perf_counter()
        kinds = views_of.get(s.key(), ("k", "margin", "budget"))
        add_candidates(run, s.key(), ranked, [x for x in sels if x.split("=")[0] in kinds], questions, cutter)
        for b in cfg.budgets if "budget" in kinds else ():
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
