"""One `qasc query --question` command end to end, warm and cold, on a store opened through its mapped arrays and
the same store opened the old way (a view of it whose manifest has no mapped arrays, as a store written before
them): wall time, peak RSS, the same answers; and where the time goes, step by step in a fresh process (torch's
import, the other imports, the model load, Store.open, the engine and its first query: keys `<step>_s`, `<step>_cpu_s`;
cold with --cold).

    python -m bench.one_question --store DIR [--question TEXT] [--repeats 3] [--cold]

--cold evicts the store's files and the model's from the page cache before each run (posix_fadvise DONTNEED on each
file: the rest of the system's cache is left alone; Python's libraries stay cached). Runs alternate between the two
opens. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import emit_json, machine_info, median, print_table
from bench.memory import GiB, run_child

QUESTION = "Which wind patterns shape the harbour's old stone lighthouse?"
LOAD_PROBE = """
import json, time, sys
cpu = lambda: time.process_time()
marks = [("start", time.perf_counter(), cpu())]
mark = lambda name: marks.append((name, time.perf_counter(), cpu()))
import torch  # noqa
mark("torch_import")
import faiss, pyarrow  # noqa
import qasc.jobs.query_cmd  # noqa  (what `qasc query` imports: the engine, the store, the writers)
from qasc.engine.config import EngineConfig
from qasc.engine.embedder import Embedder
from qasc.engine.query import Engine
from qasc.engine.store.reader import Store
mark("other_imports")
m = json.load(open(sys.argv[1]))
e = m["config"]["embedder"]
emb = Embedder(e.get("model"), "cpu", None, e["max_length"], e["batch_tokens"])
mark("model_load")
store = Store.open(sys.argv[2])
mark("store_open")
engine = Engine(store, emb, EngineConfig.from_dict(m["config"]), torch.device("cpu"))
engine.query([sys.argv[3]])
mark("first_query")
out = {f"{b[0]}_s": b[1] - a[1] for a, b in zip(marks, marks[1:])}
out.update({f"{b[0]}_cpu_s": b[2] - a[2] for a, b in zip(marks, marks[1:])})
out["imports_s"] = out["torch_import_s"] + out["other_imports_s"]
out["imports_cpu_s"] = out["torch_import_cpu_s"] + out["other_imports_cpu_s"]
print(json.dumps(out))
"""


def old_view(store: Path, at: Path) -> Path:
    """A folder of links to the store's files with a manifest without its mapped arrays: the store as an engine
    opens one written before them (nothing copied)."""
    shutil.rmtree(at, ignore_errors=True)
    at.mkdir(parents=True)
    for entry in store.iterdir():
        if entry.name != "manifest.json" and not entry.name.startswith(("mapped-", "_", ".")):
            (at / entry.name).symlink_to(entry)
    m = json.loads((store / "manifest.json").read_text())
    m.pop("mapped", None)
    m["checksums"] = {k: v for k, v in m["checksums"].items() if not k.startswith("mapped-")}
    (at / "manifest.json").write_text(json.dumps(m))
    return at


def evict(paths: list[Path]) -> int:
    """Drops the files under paths from the page cache (posix_fadvise DONTNEED) -> files evicted."""
    n = 0
    for root in paths:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                n += 1
    return n


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True, help="a store written with mapped arrays")
    p.add_argument("--question", default=QUESTION)
    p.add_argument("--repeats", type=int, default=3, help="runs per open (alternated; default 3)")
    p.add_argument("--cold", action="store_true", help="evict the store's and the model's files before each run")
    args = p.parse_args(argv)
    from qasc.engine.embedder import resolve_model_path

    store = Path(args.store).expanduser().absolute()
    manifest = json.loads((store / "manifest.json").read_text())
    if not manifest.get("mapped"):
        raise SystemExit(f"{store}: no mapped arrays (written before them): ingest it again, or append to it")
    model = Path(resolve_model_path(manifest["config"]["embedder"].get("model")))
    qasc = str(Path(sys.executable).with_name("qasc"))
    with tempfile.TemporaryDirectory(prefix="qasc-1q-") as tmp:
        tmp = Path(tmp)
        stores = {"mapped": store, "old": old_view(store, tmp / "old")}
        times: dict[str, list[float]] = {k: [] for k in stores}
        peaks: dict[str, list[float]] = {k: [] for k in stores}
        cpu: dict[str, list[float]] = {k: [] for k in stores}  # user + system seconds: less load-bound than wall
        outputs: dict[str, str] = {}
        for _ in range(args.repeats):
            for name, path in stores.items():
                if args.cold:
                    evict([store, model])
                out = tmp / f"{name}.jsonl"
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                wall, peak = run_child([qasc, "query", "--store", str(path), "--question", args.question, "--out",
                                        str(out)], tmp / f"{name}.log")
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                times[name].append(wall)
                peaks[name].append(peak / GiB)
                outputs[name] = out.read_text()
        if args.cold:  # the probe below starts cold too
            evict([model, store])
        probe = json.loads(subprocess.run([sys.executable, "-c", LOAD_PROBE, str(store / "manifest.json"), str(store),
                                           args.question], capture_output=True, text=True, check=True).stdout)
    rows = [{"open": name, "median_s": median(times[name]), "runs_s": " / ".join(f"{t:.2f}" for t in times[name]),
             "cpu_s": median(cpu[name]), "peak_rss_gb": max(peaks[name])} for name in stores]
    cache = "cold" if args.cold else "warm"
    print_table(rows, title=f"one question, {cache} page cache, {manifest['counts']['sentences']:,} sentences")
    print("in a fresh process, step by step: " + ", ".join(
        f"{step} {probe[step + '_s']:.2f} s ({probe[step + '_cpu_s']:.2f} CPU)"
        for step in ("torch_import", "other_imports", "model_load", "store_open", "first_query")))
    record = {"bench": "one_question", "store": str(store), "sentences": manifest["counts"]["sentences"],
               "cold": args.cold, "mapped_s": median(times["mapped"]), "old_s": median(times["old"]),
               "mapped_runs_s": times["mapped"], "old_runs_s": times["old"], "mapped_cpu_s": median(cpu["mapped"]),
               "old_cpu_s": median(cpu["old"]),
               "mapped_peak_rss_gb": max(peaks["mapped"]), "old_peak_rss_gb": max(peaks["old"]),
               "same_answers": outputs["mapped"] == outputs["old"], **probe, "finished": time.strftime("%F %T"),
               **machine_info()}
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
