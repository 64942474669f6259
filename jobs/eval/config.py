"""`qasc eval`'s run settings: the configuration one run depends on, its defaults, and its progress log."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from qasc.jobs.eval import baselines as B

DEFAULT_CACHE_DIR = os.environ.get("QASC_EVAL_CACHE", str(Path.home() / ".cache" / "qasc" / "eval"))
QUICK_CORPORA = ("chatlogs", "state_of_the_union")
QUICK_QUESTIONS = 12  # per corpus


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
    grid: str = "full"  # full | quick | presets (QASC's candidates: the shipped presets, nothing chosen)
    baseline_context: bool = True  # also rank every baseline with QASC's heading context ("<name> + same context")


class Log:
    def __init__(self, quiet: bool = False) -> None:
        self.t0 = time.perf_counter()
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def grid_name(cfg: EvalConfig) -> str:
    """The QASC grid a run uses: presets, quick (--grid quick or --quick) or full."""
    return "presets" if cfg.grid == "presets" else "quick" if cfg.quick or cfg.grid == "quick" else "full"
