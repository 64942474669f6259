"""Ingest driver memory by phase (issue 14): where the local ingest's RSS goes, and its peak.

`engine.store.ingest` runs in this process (the `--local` driver: it also embeds and builds the index) on a
bench.synthetic corpus of N sentences, with bench.synthetic's TableEmbedder (the tiny model's word-embedding
table, mean-pooled: the model's cost taken out), `--index ivf --dtype-store float16`. VmRSS is read at each phase
boundary (embedder loaded, every 10th shard written, index training start/end, adding start/end, index written)
and the peak is the process's VmHWM (tracemalloc does not see numpy, Arrow or faiss memory). The target is a
driver peak <= 1 GiB whatever N; the local path's only part that grows with N is the index's SQ8 codes, which
stores of engine.store.index_child.INDEX_CHILD_MIN_ROWS rows or more build in a child process (its peak is
reported beside the driver's; `--index-in-process` builds every index here, with RSS marks around its steps).

    python -m bench.ingest_memory --sentences 50000
    python -m bench.ingest_memory --sentences 200000 --work /tmp/qasc-scale   # reuses bench.scale's corpus there
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, emit_json, machine_info, print_table
from bench.memory import GiB, proc_status
from bench.synthetic import TableEmbedder, corpus_dir, tiny_model_path


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=50_000, help="corpus size (bench.scale's synthetic markdown)")
    ap.add_argument("--seed", type=int, default=0, help="corpus and tiny-model seed")
    ap.add_argument("--work", type=Path, default=Path("/tmp/qasc-scale"), help="corpus / model folder (reused)")
    ap.add_argument("--store", type=Path, default=None, help="store folder (default WORK/ingest-memory-N-sS; replaced)")
    ap.add_argument("--index", default="ivf", help="--index of the ingest (auto | flat | ivf | hnsw)")
    ap.add_argument("--index-in-process", action="store_true", help="build the index in this process at any size")
    args = ap.parse_args(argv)

    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.store import IngestConfig, IngestProgress, index_child, ingest
    from qasc.engine.store import index_build as faiss_index  # the build looks these steps up here

    if args.index_in_process:
        index_child.INDEX_CHILD_MIN_ROWS = 1 << 62

    t0 = time.perf_counter()
    marks: list[dict] = []

    def mark(phase: str) -> None:
        marks.append({"s": round(time.perf_counter() - t0, 1), "phase": phase, "rss_gb": proc_status("VmRSS") / GiB})

    args.work.mkdir(parents=True, exist_ok=True)
    corpus = corpus_dir(args.work, args.sentences, args.seed)
    model = tiny_model_path(args.work, args.seed)
    # corpus and model written (or found) by a child process, so that their memory is not this process's RSS
    work, n, seed = str(args.work), args.sentences, args.seed
    subprocess.run([sys.executable, "-c", "from pathlib import Path; from bench.synthetic import corpus_dir, "
                    f"tiny_model, write_corpus; write_corpus(corpus_dir(Path({work!r}), {n}, {seed}), {n}, {seed}); "
                    f"tiny_model(Path({work!r}), {seed})"], check=True, cwd=REPO)
    store = args.store or args.work / f"ingest-memory-{args.sentences}-s{args.seed}"
    shutil.rmtree(store, ignore_errors=True)
    embedder = TableEmbedder(model)
    mark("embedder loaded")

    saved = {name: getattr(faiss_index, name) for name in ("train", "_add_shards", "write_index_file")}

    def wrap(name: str, before: str, after: str) -> None:  # an RSS mark around one index-building step
        inner = saved[name]

        def marked(*a, **k):
            mark(before)
            out = inner(*a, **k)
            mark(after)
            return out

        setattr(faiss_index, name, marked)

    wrap("train", "index: training starts (sample gathered)", "index: training done")
    wrap("_add_shards", "index: adding starts", "index: adding done")
    wrap("write_index_file", "index: writing starts", "index: written")

    class Progress(IngestProgress):
        written = 0

        def shard_done(self, *a, **k) -> None:
            self.written += 1
            if self.written % 10 == 1:
                mark(f"shard {self.written} written")
            super().shard_done(*a, **k)

    try:
        summary = ingest([str(corpus / "docs")], store, EngineConfig(embedder=EmbedderConfig(model=str(model))),
                         IngestConfig(index=args.index, dtype_store="float16"), embedder=embedder,
                         progress=Progress(bar=False, log=lambda line: None), log=lambda line: None)
    finally:
        for name, fn in saved.items():
            setattr(faiss_index, name, fn)
    mark("manifest written")
    # VmHWM is updated lazily by the kernel (per-thread RSS counters are folded in batches), so a sampled VmRSS
    # mark can read a few hundred KiB above it: the peak is the larger of the two.
    peak = max([proc_status("VmHWM") / GiB] + [m["rss_gb"] for m in marks])
    print_table(marks, ["s", "phase", "rss_gb"], title=f"ingest driver RSS, {summary['sentences']} sentences")
    record = {"bench": "ingest_memory", "sentences": summary["sentences"], "documents": summary["documents"],
              "index": summary["index"], "seconds": summary["seconds"], "driver_peak_rss_gb": peak,
              "index_peak_rss_gb": summary.get("index_peak_rss_gb"),
              "phases": marks, "machine": machine_info()}
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
