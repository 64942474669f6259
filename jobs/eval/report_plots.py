"""The plots of `qasc eval` (matplotlib Agg): recall against tokens, F1 by method, ablations; and the methods'
table order the plots and report.md share."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _order(results: dict) -> list[str]:
    """Methods in table order: qasc first, then by held-out F1."""
    held = results["heldout"]
    return sorted(held, key=lambda n: (n != "qasc", -held[n]["f1"]["mean"]))


# ------------------------------------------------------------------------------------------------ plots

def plot_all(out_dir: Path, results: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    names = _order(results)
    colors = {n: plt.cm.tab20(i % 20) for i, n in enumerate(names)}

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for n in names:
        topk = results["topk"][n]
        xs = [topk[k]["tokens"] for k in topk]
        ys = [topk[k]["recall"]["mean"] for k in topk]
        axes[0].plot(xs, ys, marker="o", ms=3, lw=2.2 if n == "qasc" else 1.2, color=colors[n], label=n)
        bud = results["budget"][n]
        xb = [bud[b]["tokens"] for b in bud]
        yb = [bud[b]["recall"]["mean"] for b in bud]
        axes[1].plot(xb, yb, marker="s", ms=4, lw=2.2 if n == "qasc" else 1.2, color=colors[n], label=n)
    axes[0].set_title("top-k view (k = 1..10)")
    axes[1].set_title("token-budget view (" + ", ".join(results["budget"][names[0]].keys()) + " tokens)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("mean retrieved tokens per question (model word-pieces)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("recall (%)")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Recall vs retrieved tokens, {results['dataset']['name']} (QASC: held-out CV choice per fold)")
    fig.tight_layout()
    fig.savefig(out_dir / "recall_vs_tokens.png", dpi=110)
    plt.close(fig)
    written.append("recall_vs_tokens.png")

    held = results["heldout"]
    written.append(_interval_bars(plt, out_dir / "f1_by_method.png", names, [held[n]["f1"] for n in names],
                                  [colors[n] for n in names], "F1 (%), held-out folds, 95% bootstrap interval",
                                  "F1 per method (leave-one-corpus-out)", width=8, row=0.35))

    abl = results.get("ablations") or []
    if abl:
        labels = ["QASC (chosen per fold)"] + [a["ablation"] for a in abl]
        vals = [held["qasc"]["f1"]] + [a["f1"] for a in abl]
        written.append(_interval_bars(plt, out_dir / "ablations.png", labels, vals,
                                      ["tab:red"] + ["tab:gray"] * len(abl), "F1 (%), held-out folds",
                                      "Ablations of the per-fold chosen QASC setting", width=9, row=0.4))

    hist = results.get("granularity")
    if hist:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(list(hist.keys()), list(hist.values()), color="tab:red")
        ax.set_xlabel("returned chunk length (sentences)")
        ax.set_ylabel("chunks")
        ax.set_title("QASC granularity actually chosen (held-out selections)")
        fig.tight_layout()
        fig.savefig(out_dir / "granularity.png", dpi=110)
        plt.close(fig)
        written.append("granularity.png")
    return written


def _interval_bars(plt, path: Path, labels: list[str], vals: list[dict], colors: list, xlabel: str, title: str,
                   width: float, row: float) -> str:
    """Horizontal bars of {mean, lo, hi} values (first label on top) with interval whiskers -> file name."""
    fig, ax = plt.subplots(figsize=(width, row * len(labels) + 1.5))
    ys = np.arange(len(labels))[::-1]
    err = np.array([[v["mean"] - v["lo"] for v in vals], [v["hi"] - v["mean"] for v in vals]])
    ax.barh(ys, [v["mean"] for v in vals], xerr=err, color=colors, capsize=3)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name
