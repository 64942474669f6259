"""`qasc eval`: QASC against chunk-then-retrieve baselines on a Chroma-format data set -> report, JSON, plots."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from qasc.engine.errors import QascError
from qasc.jobs.devices import add_device_argument
from qasc.jobs.eval.baselines import DEFAULT_METHODS
from qasc.jobs.eval.config import DEFAULT_CACHE_DIR, QUICK_CORPORA, EvalConfig

DATA_ENV = "QASC_EVAL_DATA"


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help="Chroma-format folder (corpora/*.md + questions.csv), or several "
                   "separated by commas: the development suite, scored leave-one-dataset-out (every choice made on "
                   f"the other sets); required unless ${DATA_ENV} names one (or several)")
    p.add_argument("--out", required=True, help="output folder: report.md, results.json, *.png, spans.jsonl")
    p.add_argument("--methods", type=_names, default=DEFAULT_METHODS,
                   help="comma-separated methods (default: all): " + ", ".join(DEFAULT_METHODS)
                   + "; also recursive-<N>t (Chroma's cl100k recursive splitter) and semantic-p<P>")
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR,
                   help="embedding/spans/store cache shared by runs and methods (env QASC_EVAL_CACHE); "
                   "'none' disables it")
    p.add_argument("--llm-url", default=None, help="OpenAI-compatible API base (e.g. http://127.0.0.1:8000/v1): "
                   "enables the agentic chunker and the generate-and-judge faithfulness score")
    p.add_argument("--llm-model", default="default", help="model name sent to --llm-url")
    p.add_argument("--judge-questions", type=int, default=40, help="questions sampled for generate-and-judge")
    p.add_argument("--quick", action="store_true", help=f"tiny subset ({', '.join(QUICK_CORPORA)}, 12 questions "
                   "each) and a 4-setting QASC grid: a smoke run, not a result")
    p.add_argument("--grid", choices=("full", "quick", "presets"), default="full",
                   help="QASC grid to cross-validate over; presets: the shipped presets (answers: F1 and top-k, "
                   "context: the token budgets), no setting chosen on the data")
    p.add_argument("--no-baseline-context", dest="baseline_context", action="store_false",
                   help="do not also rank each baseline with QASC's heading context ('<method> + same context' rows)")
    p.add_argument("--ks", type=_ints, default=tuple(range(1, 11)), help="top-k values (default 1..10)")
    p.add_argument("--budgets", type=_ints, default=(100, 200, 400, 800), help="token budgets (model tokens)")
    p.add_argument("--ppl-corpora", type=_names, default=QUICK_CORPORA,
                   help="corpora the offline perplexity stand-in runs on (it is slow on CPU)")
    add_device_argument(p)
    p.add_argument("--dtype", default="fast", help="embedder precision: fast (bf16 on CPUs with native bf16, "
                   "else auto) | auto | float32 | bfloat16 | float16")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the 95%% intervals")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and the judge sample")


OUR_OUTPUTS = ("report.md", "results.json")


def check_out_dir(out: str) -> None:
    """--out must be a new folder, an empty one, or one a previous `qasc eval` wrote (its results.json says so):
    never a file, and never a folder whose report.md / results.json someone else wrote."""
    path = Path(out).expanduser()
    if not path.exists():
        return
    if not path.is_dir():
        raise QascError(f"--out {out}: exists and is a file, not a folder")
    found = [n for n in OUR_OUTPUTS if (path / n).exists()]
    if not found:
        return
    try:
        previous = json.loads((path / "results.json").read_text(encoding="utf-8"))
        ours = isinstance(previous, dict) and {"config", "environment", "timings"} <= set(previous)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        ours = False
    if not ours:
        raise QascError(f"--out {out}: holds {' and '.join(found)} that `qasc eval` did not write; they would be "
                        f"overwritten: use a new or empty folder")


def run(args: argparse.Namespace) -> int:
    data = args.data or os.environ.get(DATA_ENV)
    if not data:
        raise QascError(f"--data is required (a Chroma-format folder), or set ${DATA_ENV}")
    dirs = _names(data)
    if not dirs:
        raise QascError(f"--data names no folder: {data!r}")
    names = [Path(d).name for d in dirs]
    if len(set(names)) != len(names):
        raise QascError(f"data sets must have distinct folder names, got {names}")
    from qasc.jobs.eval.data import load_dataset
    from qasc.jobs.eval.harness import run_eval  # here, not at the top: every qasc command builds this parser
    from qasc.jobs.eval.methods import check_methods

    for d in dirs:  # every set read and checked (files, utf-8, rows, offsets) before the first one's work starts
        load_dataset(d)
    if not args.methods:
        raise QascError("--methods names no method")
    check_methods(args.methods)
    if args.bootstrap < 1:
        raise QascError(f"--bootstrap must be >= 1, got {args.bootstrap}")
    if args.judge_questions < 1:
        raise QascError(f"--judge-questions must be >= 1, got {args.judge_questions}")
    check_out_dir(args.out)
    data = dirs[0] if len(dirs) == 1 else data
    cfg = EvalConfig(
        data_dir=data, out_dir=args.out,
        cache_dir=None if str(args.cache_dir).lower() == "none" else args.cache_dir,
        methods=tuple(args.methods), llm_url=args.llm_url, llm_model=args.llm_model, quick=args.quick,
        ks=tuple(args.ks), budgets=tuple(args.budgets), ppl_corpora=tuple(args.ppl_corpora),
        judge_questions=args.judge_questions, n_boot=args.bootstrap, seed=args.seed, device=args.device,
        dtype=args.dtype, grid=args.grid, baseline_context=args.baseline_context,
    )
    if len(dirs) > 1:
        from qasc.jobs.eval.suite import run_suite

        results = run_suite(cfg, dirs)
        held, sets = results["heldout"], list(results["sets"])
        print(f"{'method':<24} " + " ".join(f"{s[:14]:>14}" for s in sets) + f" {'pooled':>7}")
        for name in sorted(held, key=lambda n: -held[n]["pooled"]["f1"]["mean"]):
            e = held[name]
            print(f"{name:<24} " + " ".join(f"{e['sets'][s]['f1']['mean']:14.1f}" for s in sets)
                  + f" {e['pooled']['f1']['mean']:7.1f}")
        print(f"held-out F1 (leave-one-dataset-out); report: {args.out}/report.md")
        return 0
    results = run_eval(cfg)
    held = results["heldout"]
    print(f"{'method':<30} {'F1':>6} {'P':>6} {'R':>6} {'tokens':>7}")
    for name in sorted(held, key=lambda n: -held[n]["f1"]["mean"]):
        e = held[name]
        print(f"{name:<30} {e['f1']['mean']:6.1f} {e['precision']['mean']:6.1f} {e['recall']['mean']:6.1f} "
              f"{e['tokens']:7.0f}")
    print(f"report: {args.out}/report.md")
    return 0
