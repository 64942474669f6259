"""`qasc eval`'s views of the scores: the held-out headline (leave-one-corpus-out), top-k and budget views,
in-sample bests, the hits each question was scored with, and the paired ablations."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from qasc.jobs.eval import qasc as Q
from qasc.jobs.eval.config import EvalConfig
from qasc.jobs.eval.crossval import CVResult, best_in_sample, leave_one_corpus_out
from qasc.jobs.eval.data import Dataset
from qasc.jobs.eval.metrics import bootstrap_ci
from qasc.jobs.eval.retrieval import Hit, TokenCutter
from qasc.jobs.eval.scoring import METRIC_KEYS, MethodRun, apply_selector, extra_setting, summarize

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
        cands = {k: run.candidates[k] for k in run.selector_keys(run.headline)}
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
