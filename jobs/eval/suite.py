"""The development suite: `qasc eval --data A,B,...` scores every method leave-one-dataset-out.

Each data set runs the single-set stages (its own store, every baseline's chunks, the QASC grid) and yields,
per question, the scores of every candidate: a baseline's k, QASC's setting x selector. The suite pools the
questions of all sets and holds one set out at a time: every choice (QASC's setting and selector, each
baseline's k) is the candidate with the best mean F1 over the other sets' questions, scored on the held-out
set. Tables: one per held-out set and one pooled; ratios against single-sentence retrieval, the best
fixed/recursive chunker and the best peer library; recall at 400 tokens (choices made on recall); paired
ablations of QASC's chosen setting; the extents QASC returned per set. Each set's within-set
leave-one-corpus-out headline stays as a secondary view.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace

import numpy as np

from qasc.engine.config import RetrievalConfig, budget_setting
from qasc.engine.errors import QascError
from qasc.jobs.eval import qasc as Q
from qasc.jobs.eval.config import EvalConfig, Log, grid_name
from qasc.jobs.eval.context import SUFFIX as CONTEXT_SUFFIX
from qasc.jobs.eval.crossval import CVResult, best_in_sample, leave_one_corpus_out
from qasc.jobs.eval.harness import SetRun, _environment, _jsonable, prepare_runs, start_run
from qasc.jobs.eval.metrics import bootstrap_ci
from qasc.jobs.eval.scoring import METRIC_KEYS, apply_selector, extra_setting, summarize
from qasc.jobs.eval.views import BUDGET_CRITERION, views
from qasc.kernels.params import QascParams

FIXED_FAMILIES = ("fixed", "recursive")
PEER_FAMILY = "peer"
RECALL_BUDGET = 400
TARGETS = {"sentences": 1.05, "fixed_or_recursive": 1.25, "peer": 1.10}


def _pooled_candidates(sets: Sequence[SetRun], method: str, keys: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    return {k: {m: np.concatenate([s.runs[method].candidates[k][m] for s in sets]) for m in METRIC_KEYS}
            for k in keys}


def _common_keys(sets: Sequence[SetRun], method: str, kinds: Sequence[str] | None,
                 exact: str | None = None) -> list[str]:
    first = sets[0].runs[method]
    keys = [k for k in first.candidates if (exact is None or k.split("|", 1)[1] == exact)]
    if kinds is not None:
        keys = [k for k in keys if k in set(first.selector_keys(kinds))]
    return [k for k in keys if all(k in s.runs[method].candidates for s in sets)]


def leave_one_dataset_out(sets: Sequence[SetRun], method: str, kinds: Sequence[str] | None = None,
                          exact: str | None = None, criterion: str = "f1") -> CVResult:
    """The candidates of `method` shared by every set, pooled; each set held out in turn (CVResult folds are
    data sets)."""
    keys = _common_keys(sets, method, kinds, exact)
    if not keys:
        raise QascError(f"{method}: no candidate shared by every data set")
    set_of = np.concatenate([[s.dataset.name] * len(s.dataset.questions) for s in sets])
    return leave_one_corpus_out(_pooled_candidates(sets, method, keys), set_of.tolist(), criterion,
                                sets[0].runs[method].preference())


def is_budget_profile(s: Q.Setting) -> bool:
    """Whether a grid setting is the engine's budget profile (engine.config.budget_setting on the shipped defaults)
    up to the selection knobs the harness leaves neutral (its budget view applies the shipped ones)."""
    shipped, shipped_retrieval, _ = budget_setting(QascParams(budget_tokens=RECALL_BUDGET), RetrievalConfig())
    neutral = {k: getattr(shipped, k) for k in Q.NEUTRAL}
    return s.params.replace(**neutral) == shipped and s.retrieval == shipped_retrieval


def _chosen_on_all_sets(sets: Sequence[SetRun], kinds: Sequence[str] | None, exact: str | None,
                        criterion: str) -> tuple[str, Q.Setting]:
    """QASC's best candidate (key, its setting) on the questions of every set together, as each fold chooses."""
    keys = _common_keys(sets, "qasc", kinds, exact)
    key = best_in_sample(_pooled_candidates(sets, "qasc", keys), criterion, sets[0].runs["qasc"].preference())
    return key, sets[0].runs["qasc"].settings[key.split("|", 1)[0]]


def _masks(sets: Sequence[SetRun]) -> dict[str, np.ndarray]:
    set_of = np.concatenate([[s.dataset.name] * len(s.dataset.questions) for s in sets])
    return {s.dataset.name: set_of == s.dataset.name for s in sets}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def set_hits(sets: Sequence[SetRun], method: str, res: CVResult) -> dict[str, list[list]]:
    """Per set, the hits each question was scored with in the held-out headline (its fold's choice)."""
    out = {}
    for s in sets:
        base, sel = res.chosen_for(s.dataset.name).split("|", 1)
        out[s.dataset.name] = apply_selector(s.runs[method].ranked[base], sel, s.cutter)
    return out


def extent_histogram(hits: Sequence[Sequence]) -> dict[str, float]:
    """Held-out hits -> shares of returned chunks by sentences (1, 2, 3, 4-7, 8+) and chunks per question."""
    sizes = [int(h[5]) for row in hits for h in row]
    bins = {"1": 0, "2": 0, "3": 0, "4-7": 0, "8+": 0}
    for n in sizes:
        bins["1" if n <= 1 else "2" if n == 2 else "3" if n == 3 else "4-7" if n < 8 else "8+"] += 1
    total = max(len(sizes), 1)
    out = {k: v / total for k, v in bins.items()}
    out["chunks_per_question"] = len(sizes) / max(len(hits), 1)
    out["multi_document_questions"] = sum(len({h[0] for h in row}) > 1 for row in hits) / max(len(hits), 1)
    return out


def suite_ablations(sets: Sequence[SetRun], res: CVResult, cfg: EvalConfig, log) -> list[dict]:
    """Each of QASC's ablations applied to every fold's chosen setting (same selector), scored on the held-out
    set: per-set and pooled F1 with paired deltas against the headline."""
    masks = _masks(sets)
    full = res.heldout["f1"]
    rows = []
    for label, change in Q.ABLATIONS:
        f1 = np.zeros_like(full)
        changed = 0
        for s in sets:
            name = s.dataset.name
            base, sel = res.chosen_for(name).split("|", 1)
            run = s.runs["qasc"]
            variant = change(run.settings[base]) or run.settings[base]
            changed += variant.key() != base
            extra_setting(run, s.engine, s.query_emb, s.dataset.questions, variant, cfg, s.cutter)
            f1[masks[name]] = run.candidates[f"{variant.key()}|{sel}"]["f1"]
        delta = (f1 - full) * 100
        lo, hi = bootstrap_ci(delta, cfg.n_boot, cfg.seed)
        rows.append({"ablation": label, "changed_folds": changed, "f1": float(100 * f1.mean()),
                     "delta_f1": {"mean": float(delta.mean()), "lo": lo, "hi": hi},
                     "sets": {n: {"f1": float(100 * f1[m].mean()), "delta": float(delta[m].mean())}
                              for n, m in masks.items()}})
        log(f"  ablation {label}: F1 {100 * f1.mean():.1f} (delta {delta.mean():+.1f})")
    return rows


def suite_targets(heldout: dict, recall400: dict, set_names: Sequence[str]) -> dict:
    """Per set: QASC's held-out F1 against sentences, the best fixed/recursive chunker and the best peer (each
    group's best, with or without the same heading context)."""
    out: dict = {}
    if "qasc" not in heldout:
        return out
    for name in set_names:
        q = heldout["qasc"]["sets"][name]["f1"]["mean"]
        row: dict = {}
        groups = {"sentences": ["sentences", "sentences" + CONTEXT_SUFFIX],  # with QASC's heading context too
                  "fixed_or_recursive": [n for n, e in heldout.items() if e["family"] in FIXED_FAMILIES],
                  "peer": [n for n, e in heldout.items() if e["family"] == PEER_FAMILY]}
        for group, members in groups.items():
            members = [m for m in members if m in heldout]
            if not members:
                continue
            best = max(members, key=lambda n: heldout[n]["sets"][name]["f1"]["mean"])
            ratio = _ratio(q, heldout[best]["sets"][name]["f1"]["mean"])
            row[group] = {"baseline": best, "ratio": ratio, "target": TARGETS[group], "met": ratio >= TARGETS[group]}
        if "qasc" in recall400:
            others = {n: v[name] for n, v in recall400.items() if n != "qasc"}
            if others:
                best = max(others, key=others.get)
                row["recall_at_400"] = {"baseline": best, "qasc": recall400["qasc"][name],
                                        "best_baseline": others[best],
                                        "met": recall400["qasc"][name] >= others[best]}
        out[name] = row
    return out


def run_suite(cfg: EvalConfig, data_dirs: Sequence[str], engine_factory: Callable | None = None, embedder=None,
              log=None) -> dict:
    """Every data set's stages, then the leave-one-dataset-out views -> results (report.md, results.json and
    plots in cfg.out_dir; each set's own single-set report under cfg.out_dir/<set>/)."""
    from transformers.utils import logging as hf_logging

    from qasc.jobs.eval import suite_report

    hf_logging.set_verbosity_error()
    log = log or Log()
    t_start = time.perf_counter()
    out_dir, cache, embedder = start_run(cfg, embedder, log)
    sets: list[SetRun] = []
    for d in data_dirs:
        sets.append(prepare_runs(replace(cfg, data_dir=d), embedder, cache, log, engine_factory, out_dir))
    names = [s.dataset.name for s in sets]
    if len(set(names)) != len(names):
        raise QascError(f"data sets must have distinct folder names, got {names}")
    if len(sets) < 2:
        raise QascError("leave-one-dataset-out needs at least two data sets")
    methods = [m for m in sets[0].runs if all(m in s.runs for s in sets)]
    masks = _masks(sets)

    t0 = time.perf_counter()
    heldout: dict = {}
    cvs: dict[str, CVResult] = {}
    recall400: dict[str, dict[str, float]] = {}
    recall_folds: list[dict] = []
    for m in methods:
        run = sets[0].runs[m]
        res = leave_one_dataset_out(sets, m, run.headline)
        cvs[m] = res
        entry = {"family": run.family, "note": run.note, "pooled": summarize(res.heldout, None, cfg.n_boot, cfg.seed),
                 "sets": {n: summarize(res.heldout, mk, cfg.n_boot, cfg.seed) for n, mk in masks.items()},
                 "folds": [asdict(f) for f in res.folds]}
        heldout[m] = entry
        try:
            rb = leave_one_dataset_out(sets, m, None, exact=f"budget={RECALL_BUDGET}", criterion=BUDGET_CRITERION)
        except QascError:  # no run at this budget (--budgets without it)
            continue
        recall400[m] = {n: float(100 * rb.heldout["recall"][mk].mean()) for n, mk in masks.items()}
        if m == "qasc":
            recall_folds = [asdict(f) for f in rb.folds]
    timings = {"crossval": time.perf_counter() - t0}

    within = {}
    # chosen before the ablations, which add their variants as candidates
    for s in sets:  # secondary view: each set's own leave-one-corpus-out headline
        v, _ = views(s.runs, s.dataset, cfg)
        within[s.dataset.name] = {m: {"f1": e["f1"]["mean"], "folds": [f["chosen"] for f in e["folds"]]}
                                  for m, e in v["heldout"].items()}

    default = budget_default = None
    if "qasc" in recall400:  # the same on recall at the budget: what `--budget-tokens` on the defaults should answer
        key, chosen = _chosen_on_all_sets(sets, None, f"budget={RECALL_BUDGET}", BUDGET_CRITERION)
        budget_default = {"candidate": key, "folds": recall_folds, "is_budget_profile": is_budget_profile(chosen),
                          **chosen.describe()}
    if "qasc" in cvs:  # the setting every fold would get with all sets to learn from: the shipped default
        key, chosen = _chosen_on_all_sets(sets, sets[0].runs["qasc"].headline, None, "f1")
        default = {"candidate": key, "selector": key.split("|", 1)[1], **chosen.describe()}

    ablation_rows: list[dict] = []
    extents: dict[str, dict] = {}
    if "qasc" in cvs:
        t0 = time.perf_counter()
        log("ablations (leave-one-dataset-out)")
        ablation_rows = suite_ablations(sets, cvs["qasc"], cfg, log)
        timings["ablations"] = time.perf_counter() - t0
        extents = {n: extent_histogram(h) for n, h in set_hits(sets, "qasc", cvs["qasc"]).items()}

    timings["total"] = time.perf_counter() - t_start
    results = {
        "protocol": "leave-one-dataset-out",
        "sets": {s.dataset.name: {"root": s.dataset.root, "fingerprint": s.dataset.fingerprint(),
                                  "corpora": len(s.dataset.corpora), "questions": len(s.dataset.questions),
                                  "multi_reference": int(sum(q.multi for q in s.dataset.questions)),
                                  "timings": {k: round(v, 2) for k, v in s.timings.items()}} for s in sets},
        "heldout": heldout,
        "recall_at_400": recall400,
        "targets": suite_targets(heldout, recall400, names),
        "ablations": ablation_rows,
        "extents": extents,
        "chosen_on_all_sets": default,
        "budget_chosen_on_all_sets": budget_default,
        "within_set": within,
        "config": {**asdict(cfg), "data_dirs": list(data_dirs), "grid_size": len(sets[0].grid),
                   "grid_axes": _jsonable(Q.grid_axes(grid_name(cfg)))},
        "environment": _environment(embedder),
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "unit": "percent (precision, recall, iou, f1); model tokens (tokens)",
    }
    suite_report.write_all(out_dir, results)
    log(f"wrote {out_dir}/report.md, results.json and plots in {timings['total']:.0f} s")
    return results


def dumps(results: dict) -> str:
    return json.dumps(results, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))
