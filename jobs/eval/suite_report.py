"""Outputs of the development suite: report.md (leave-one-dataset-out tables), results.json, PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

from qasc.jobs.eval.report import _ci, _f

EXTENT_BINS = ("1", "2", "3", "4-7", "8+")


def _order(heldout: dict) -> list[str]:
    return sorted(heldout, key=lambda n: (n != "qasc", -heldout[n]["pooled"]["f1"]["mean"]))


def render(results: dict) -> str:
    held, sets = results["heldout"], list(results["sets"])
    names = _order(held)
    L: list[str] = ["# QASC development suite: leave-one-dataset-out", ""]
    listing = ", ".join(f"{n} ({v['questions']} q)" for n, v in results["sets"].items())
    L.append(f"Sets: {listing}. Model for "
             f"every method: {results['environment']['model']}, exact inner-product search; Chroma's "
             "character-level metric. **Every number is held out by data set**: QASC's setting and selector and "
             "each baseline's k are chosen on the other sets' questions (best mean F1) and scored on the "
             f"held-out set. Run time {results['timings']['total']:.0f} s on {results['environment']['cpus']} "
             "CPU(s).")
    L.append("")
    L.append("## F1 per held-out set [95% bootstrap CI]")
    L.append("")
    L.append("| method | family | " + " | ".join(sets) + " | pooled |")
    L.append("|---|---|" + "---|" * (len(sets) + 1))
    for n in names:
        e = held[n]
        L.append(f"| {n} | {e['family']} | " + " | ".join(_ci(e["sets"][s]["f1"]) for s in sets)
                 + f" | {_ci(e['pooled']['f1'])} |")
    L.append("")
    L.append("Precision / recall / tokens per question, per held-out set:")
    L.append("")
    L.append("| method | " + " | ".join(sets) + " |")
    L.append("|---|" + "---|" * len(sets))
    for n in names:
        e = held[n]["sets"]
        L.append(f"| {n} | " + " | ".join(f"{_f(e[s]['precision']['mean'])} / {_f(e[s]['recall']['mean'])} / "
                                         f"{_f(e[s]['tokens'], 0)}" for s in sets) + " |")
    L.append("")
    if "qasc" in held:
        L.append("QASC's choice per fold (held-out set: setting | selector):")
        L.append("")
        for f in held["qasc"]["folds"]:
            L.append(f"- {f['corpus']} ({f['n_questions']} q): `{f['chosen']}` — train F1 "
                     f"{100 * f['train_score']:.1f}, held-out F1 {100 * f['heldout_score']:.1f}")
        L.append("")
    chosen = results.get("chosen_on_all_sets")
    if chosen:
        L.append(f"Chosen on all sets together (the shipped default): `{chosen['candidate']}`.")
        L.append("")
    tg = results.get("targets") or {}
    if tg:
        L.append("## Targets per held-out set")
        L.append("")
        L.append("| set | vs sentences (>= 1.05x) | vs best fixed/recursive (>= 1.25x) | vs best peer (>= 1.10x) | "
                 "recall@400 >= every baseline |")
        L.append("|---|---|---|---|---|")
        for s, row in tg.items():
            cells = []
            for g in ("sentences", "fixed_or_recursive", "peer"):
                v = row.get(g)
                cells.append("n/a" if v is None else f"{v['ratio']:.2f}x vs {v['baseline']} "
                             f"{'(met)' if v['met'] else '(NOT met)'}")
            r = row.get("recall_at_400")
            cells.append("n/a" if r is None else f"{_f(r['qasc'])} vs {r['baseline']} {_f(r['best_baseline'])} "
                         f"{'(met)' if r['met'] else '(NOT met)'}")
            L.append(f"| {s} | " + " | ".join(cells) + " |")
        L.append("")
    rec = results.get("recall_at_400") or {}
    if rec:
        L.append(f"## Recall at {400} tokens per held-out set (choices made on recall)")
        L.append("")
        L.append("Every method's ranked chunks while within the budget, the overflowing one cut at it; for QASC the "
                 "chunks `--budget-tokens` keeps (the shipped top-k within its score margin of the best), then the "
                 "engine's budget fill (passages and single sentences by score, a section already answered counting "
                 "`--fill-diversity` less; stores with passages, `--budget-fill`). The engine's own `--budget-tokens` "
                 "drops an overflowing chunk instead of cutting it.")
        L.append("")
        L.append("| method | " + " | ".join(sets) + " |")
        L.append("|---|" + "---|" * len(sets))
        for n in sorted(rec, key=lambda n: (n != "qasc", -sum(rec[n].values()))):
            L.append(f"| {n} | " + " | ".join(_f(rec[n][s]) for s in sets) + " |")
        L.append("")
        bd = results.get("budget_chosen_on_all_sets")
        if bd:
            L.append("QASC's choice per fold on recall at 400 (held-out set: setting | selector):")
            L.append("")
            for f in bd["folds"]:
                L.append(f"- {f['corpus']} ({f['n_questions']} q): `{f['chosen']}` — train recall "
                         f"{100 * f['train_score']:.1f}, held-out recall {100 * f['heldout_score']:.1f}")
            L.append("")
            L.append(f"Chosen on all sets together: `{bd['candidate']}`; "
                     + ("the engine's budget profile, what `qasc query --budget-tokens N` answers with on the "
                        "defaults." if bd["is_budget_profile"] else "**not** the engine's budget profile "
                        "(engine.config.BUDGET_PROFILE): `qasc query --budget-tokens N` on the defaults answers "
                        "with another setting."))
            L.append("")
    ab = results.get("ablations") or []
    if ab:
        L.append("## Ablations of QASC's chosen setting (held out per set; paired delta F1 [95% CI], pooled)")
        L.append("")
        L.append("| ablation | folds changed | " + " | ".join(sets) + " | pooled F1 | delta |")
        L.append("|---|---|" + "---|" * (len(sets) + 2))
        for r in ab:
            L.append(f"| {r['ablation']} | {r['changed_folds']} | "
                     + " | ".join(f"{_f(r['sets'][s]['f1'])} ({r['sets'][s]['delta']:+.1f})" for s in sets)
                     + f" | {_f(r['f1'])} | {_ci(r['delta_f1'])} |")
        L.append("")
    ex = results.get("extents") or {}
    if ex:
        L.append("## Extents QASC returned (held out; share of chunks by sentences)")
        L.append("")
        L.append("| set | " + " | ".join(EXTENT_BINS) + " | chunks/question | questions with 2+ documents |")
        L.append("|---|" + "---|" * (len(EXTENT_BINS) + 2))
        for s, v in ex.items():
            L.append(f"| {s} | " + " | ".join(f"{100 * v[b]:.0f}%" for b in EXTENT_BINS)
                     + f" | {v['chunks_per_question']:.2f} | {100 * v['multi_document_questions']:.0f}% |")
        L.append("")
        L.append("![extents per set](extents.png)")
        L.append("")
    within = results.get("within_set") or {}
    if within:
        L.append("## Secondary view: each set's own leave-one-corpus-out F1")
        L.append("")
        L.append("| method | " + " | ".join(within) + " |")
        L.append("|---|" + "---|" * len(within))
        for n in names:
            L.append(f"| {n} | " + " | ".join(_f(within[s].get(n, {}).get("f1")) for s in within) + " |")
        L.append("")
    cfg = results["config"]
    L.append(f"Command: `qasc eval --data {','.join(cfg['data_dirs'])} --out {cfg['out_dir']}`")
    L.append("")
    return "\n".join(L)


def plot_extents(path: Path, extents: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.6 * len(extents) + 1.5))
    names = list(extents)
    left = [0.0] * len(names)
    for b in EXTENT_BINS:
        vals = [100 * extents[n][b] for n in names]
        ax.barh(names, vals, left=left, label=f"{b} sentence(s)")
        left = [a + v for a, v in zip(left, vals, strict=True)]
    ax.set_xlabel("share of returned chunks (%)")
    ax.set_title("Extents QASC chose per held-out set")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(out_dir: Path, results: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.md").write_text(render(results), encoding="utf-8")
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=_default), encoding="utf-8")
    if results.get("extents"):
        plot_extents(out_dir / "extents.png", results["extents"])


def _default(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
