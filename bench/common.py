"""Shared benchmark helpers: environment, device sync, repeated timing, machine facts, a table, one JSON line."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from qasc.jobs.env import set_env_defaults

set_env_defaults()
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # benchmarks use the bundled model only

REPO = Path(__file__).resolve().parents[1]
CHROMA = Path(os.environ.get("QASC_CHROMA_DIR", REPO.parent / "shared" / "data" / "chroma_general"))


def sync(device) -> None:
    """Wait for queued device work (CUDA); a no-op on CPU."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_repeats(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, device=None) -> list[float]:
    """Run fn `warmup` times untimed, then `repeats` times, synchronizing the device around each timer."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def percentile(xs: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) by linear interpolation."""
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=np.float64), p)) if len(xs) else float("nan")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device=None) -> dict:
    """Hardware and software facts recorded with every result (load average at the time of the call)."""
    import torch

    info = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if device is not None and torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def fmt(value) -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def print_table(rows: Sequence[dict], columns: Sequence[str] | None = None, title: str | None = None) -> str:
    """Print rows (dicts) as an aligned markdown table; returns the text."""
    if not rows:
        return ""
    columns = list(columns or rows[0].keys())
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) + " |" for row in cells]
    text = ("\n" + title + "\n" if title else "") + "\n".join(lines)
    print(text, flush=True)
    return text


def emit_json(record: dict) -> None:
    """The final line of every benchmark: one JSON object."""
    print(json.dumps(record, sort_keys=True, default=_jsonable), flush=True)


def _jsonable(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def chroma_corpora(corpora_dir: str | Path | None = None) -> list[Path]:
    folder = Path(corpora_dir) if corpora_dir else CHROMA / "corpora"
    files = sorted(folder.glob("*.md"))
    if not files:
        raise SystemExit(f"no *.md corpora under {folder}; set QASC_CHROMA_DIR or pass --corpora")
    return files


def chroma_sentences(n: int | None = None, seed: int = 0, corpora_dir: str | Path | None = None) -> list[str]:
    """The chroma_general sentences (engine.splitter.split_sentences), optionally n of them drawn with a seed."""
    import random

    from qasc.engine.splitter import split_sentences

    texts: list[str] = []
    for path in chroma_corpora(corpora_dir):
        texts.extend(split_sentences(path.read_text(encoding="utf-8"), doc_id=path.stem).texts())
    if n is not None and n < len(texts):
        texts = random.Random(seed).sample(texts, n)
    return texts
