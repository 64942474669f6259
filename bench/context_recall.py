"""Recall within a token budget of the `context` preset on the six development sets: `qasc query --preset context`.

Per set, the eval cache's store and question vectors (bench.scoring_lodo.load_sets); each variant is one engine
pass (`Engine.query_embedded` with `engine.presets.apply("context", ...)`, the budget fill included), scored by
the harness's character metric (jobs.eval.scoring.score_hits): mean recall and mean tokens per question.

    python -m bench.context_recall --variants context --budget 400

Prints one line per set and variant, each later variant's pooled paired recall delta against the first (points, 95%
bootstrap interval, bench.scoring_lodo.paired_delta) with its per-set deltas, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench.scoring_lodo import SETS, load_sets, paired_delta


def context(**changes):
    """The context preset over the shipped defaults, with `changes` (QascParams fields) on top."""
    from qasc.engine.config import RetrievalConfig
    from qasc.engine.presets import apply
    from qasc.kernels.params import QascParams

    def build(budget: int):
        params, retrieval = apply("context", QascParams(), RetrievalConfig())
        return params.replace(budget_tokens=budget, **changes), retrieval

    return build


VARIANTS = {
    "context": context(),
    # the knob the preset sets against the `answers` value: every pick its own chunk, picked within the margin
    "no-merge": context(merge_picks=False),
    # no budget fill: what a store without passages answers (`qasc ingest --passage-tokens 0` skips the passages'
    # model pass, ~45% of an ingest's model time): what the second pass buys (issue 52)
    "no-fill": context(budget_fill=False),
    # the fill from single sentences alone (the pre-retrieval's best rows, no passage ranked): what a fill without
    # the passages' model pass could still do
    "rows-fill": context(),
}
ROWS_ONLY = {"rows-fill"}  # variants whose passage tier ranks no passage


def no_passages(tier, query, *args, **kwargs):
    """PassageTier.rank stand-in: no passage for any query -> ids, scores (Q, 0)."""
    import torch

    empty = torch.zeros((query.shape[0], 0), dtype=torch.long, device=query.device)
    return empty, empty.float()


def main(argv=None) -> int:
    global RANK
    from qasc.engine.fill import PassageTier

    RANK = PassageTier.rank
    from qasc.jobs.eval.qasc import chunks_to_hits, torch_threads
    from qasc.jobs.eval.scoring import score_hits

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--variants", default="context")
    ap.add_argument("--budget", type=int, default=400)
    ap.add_argument("--cache-dir", default=os.environ.get("QASC_EVAL_CACHE", str(Path.home() / ".cache/qasc/eval")))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    log = lambda m: print(f"[{time.perf_counter() - t0:7.1f}s] {m}", file=sys.stderr, flush=True)  # noqa: E731
    sets = load_sets(args.sets.split(","), args.cache_dir, log)
    out: dict[str, dict[str, list[float]]] = {}
    recall: dict[str, dict[str, np.ndarray]] = {}
    names = args.variants.split(",")
    from qasc.engine.fill import PassageTier

    for v in names:
        params, retrieval = VARIANTS[v](args.budget)
        PassageTier.rank = no_passages if v in ROWS_ONLY else RANK
        out[v], recall[v] = {}, {}
        for name, (ds, engine, qemb) in sets.items():
            with torch_threads(1):
                res = engine.query_embedded(qemb, params, retrieval, questions=[q.text for q in ds.questions])
            s = score_hits(chunks_to_hits(res), ds.questions)
            recall[v][name] = np.asarray(s["recall"], dtype=np.float64)
            out[v][name] = [round(100 * float(s["recall"].mean()), 1), round(float(s["tokens"].mean()), 1)]
            print(f"{v:<12} {name:<18} recall {out[v][name][0]:5.1f}  tokens {out[v][name][1]:6.1f}", flush=True)
    PassageTier.rank = RANK
    first = names[0]
    for v in names[1:]:
        mean, lo, hi = paired_delta(np.concatenate([recall[first][s] for s in sets]),
                                    np.concatenate([recall[v][s] for s in sets]))
        per_set = " ".join(f"{s[:6]} {100 * (recall[v][s].mean() - recall[first][s].mean()):+.1f}" for s in sets)
        print(f"{v} vs {first} (recall points): pooled {100 * mean:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]"
              f" | {per_set}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
