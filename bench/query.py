"""End-to-end Engine.query on a chroma_general store: single-query latency, batch throughput, stage split.

Measures, on one opened Engine:
  single   a loop of Engine.query([q]) (query embedding included): p50/p95 latency, and its queries/s;
  batch    Engine.query(Q questions) at --batch (questions.csv repeated): queries/s and the ratio to the loop;
  kernels  the same without the model: Engine.query_embedded on pre-embedded queries (batch, and single p50);
  stages   the batch split into embed / FAISS search / candidates+sims+QASC / assemble.
With --synthetic N the store is N random unit vectors with synthetic sentence metadata (no text embedding),
searched by torch top-k or FAISS (GPU when faiss has it): the GPU run of bench/gpu_check.sh.

    python -m bench.query                                   # /tmp/cg, else /tmp/qasc-bench-store (built once)
    python -m bench.query --quick
    python -m bench.query --synthetic 1000000 --device cuda --batch 100000 --single 200
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from bench.common import CHROMA, emit_json, machine_info, median, percentile, print_table, sync, time_repeats
from qasc.engine.query import DEFAULT_SLICE_SIZE

DEFAULT_STORES = ("/tmp/cg", "/tmp/qasc-bench-store")


def load_questions(n: int, path: Path | None = None) -> list[str]:
    """The questions of questions.csv, repeated (in order) to n."""
    with open(path or CHROMA / "questions.csv", encoding="utf-8", newline="") as fh:
        base = [row["question"] for row in csv.DictReader(fh)]
    return [base[i % len(base)] for i in range(n)]


def find_or_build_store(store: str | None, corpora: str | None = None) -> str:
    """An existing committed store (manifest.json present), or one built from chroma_general (local, no Ray)."""
    candidates = [store] if store else list(DEFAULT_STORES)
    for c in candidates:
        if (Path(c) / "manifest.json").is_file():
            return c
    target = store or DEFAULT_STORES[-1]
    from qasc.engine.store import IngestProgress, ingest

    print(f"building {target} from {corpora or CHROMA / 'corpora'} (local ingest) ...", flush=True)
    ingest([str(corpora or CHROMA / "corpora")], target, progress=IngestProgress(bar=False))
    return target


# --------------------------------------------------------------------------------------------- synthetic store


class TorchStore:
    """Sentences of documents and their unit vectors, searched by exact top-k (a matmul on `device`, chunked over
    queries) or FAISS; quacks like engine.store.Store for Engine: docs, doc_offsets, embeddings, manifest, search().
    search: "torch" = exact top-k on `device`, "faiss" = IndexFlatIP (moved to the GPU when faiss has GPU support).
    """

    def __init__(self, docs: list, embeddings: np.ndarray, device: str = "cpu", search: str = "torch") -> None:
        import torch

        self.device = torch.device(device)
        self.docs = docs
        self.doc_offsets = np.concatenate([[0], np.cumsum([len(x) for x in docs])]).astype(np.int64)
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        dim = self.embeddings.shape[1]
        self._emb_dev = torch.as_tensor(self.embeddings, device=self.device)
        self.manifest = {"dim": dim, "config": {}}
        self.search_kind = search
        self.index = None
        if search == "faiss":
            from qasc.engine.store import index as faiss_index

            idx = faiss_index.new_index("flat", dim, {})
            faiss_index.add(idx, self.embeddings)
            self.index = faiss_index.to_device(idx, "flat", self.device)
            self.search_kind = "faiss-cpu" if self.index is idx else "faiss-gpu"

    def search(self, query_emb: np.ndarray, k: int, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
        """query_emb (Q, dim) -> scores (Q, k) float32, rows (Q, k) int64."""
        import torch

        if self.index is not None:
            from qasc.engine.store import index as faiss_index

            return faiss_index.search(self.index, np.ascontiguousarray(query_emb, dtype=np.float32), k)
        q = torch.as_tensor(query_emb, dtype=torch.float32, device=self.device)
        scores, rows = [], []
        for lo in range(0, len(q), chunk):
            s, r = (q[lo : lo + chunk] @ self._emb_dev.T).topk(k, dim=1)
            scores.append(s)
            rows.append(r)
        return torch.cat(scores).cpu().numpy(), torch.cat(rows).cpu().numpy()


class SyntheticStore(TorchStore):
    """N random L2-normalised vectors in docs of `doc_len` sentences with synthetic text and block ids."""

    def __init__(self, n: int, dim: int = 384, doc_len: int = 100, seed: int = 0, device: str = "cpu",
                 search: str = "torch") -> None:
        import torch

        from qasc.engine.types import Sentences

        g = torch.Generator(device="cpu").manual_seed(seed)
        emb = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
        rng = np.random.default_rng(seed)
        docs = []
        word = "lorem "
        for d, lo in enumerate(range(0, n, doc_len)):
            m = min(doc_len, n - lo)
            n_words = rng.integers(3, 30, size=m)  # sentence lengths in words
            lens = n_words * len(word)
            ends = np.cumsum(lens + 1) - 1  # one space between sentences
            starts = ends - lens
            text = " ".join(word * int(k) for k in n_words)
            paragraph = np.cumsum(rng.random(m) < 1 / 4).astype(np.int32)
            section = np.cumsum(rng.random(m) < 1 / 20).astype(np.int32)
            docs.append(Sentences(f"doc{d}", text, starts.astype(np.int64), (ends - 1).astype(np.int64),
                                  paragraph, section, (n_words * 1.3 + 2).astype(np.int32)))
        super().__init__(docs, emb.numpy(), device, search)


def synthetic_engine(n: int, device: str, search: str, with_model: bool, model: str | None = None):
    """An Engine over a SyntheticStore of n sentences (embedder None unless with_model; `model`: its folder)."""
    from qasc.engine.config import EngineConfig
    from qasc.engine.embedder import Embedder, resolve_device
    from qasc.engine.query import Engine

    dev = resolve_device(device)
    store = SyntheticStore(n, device=str(dev), search=search)
    embedder = Embedder(model, device=str(dev)) if with_model else None
    return Engine(store, embedder, EngineConfig(), dev)


# --------------------------------------------------------------------------------------------- measurement


def _ms(xs):
    return [1e3 * x for x in xs]


def single_latencies(fn, items, device, warmup: int = 3) -> list[float]:
    for it in items[:warmup]:
        fn(it)
    out = []
    for it in items:
        sync(device)
        t0 = time.perf_counter()
        fn(it)
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=None, help=f"store folder (default: first of {', '.join(DEFAULT_STORES)} that "
                   "exists, else the last one is built from chroma_general)")
    p.add_argument("--corpora", default=None, help="folder ingested when the store has to be built (default: "
                   "chroma_general corpora)")
    p.add_argument("--synthetic", type=int, default=0, help="N > 0: a synthetic store of N random sentences instead")
    p.add_argument("--search", default="auto", help="synthetic store search: torch | faiss | auto (faiss on GPU "
                   "builds, else torch)")
    p.add_argument("--params", default="default", choices=("default", "stored"),
                   help="QASC parameters and retrieval: the current code defaults, or those saved in the store")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--dtype", default=None, help="query embedder dtype (default: the store's config, auto = fp32 on "
                   "CPU); e.g. bfloat16 on CPUs with avx512_bf16/AMX")
    p.add_argument("--batch", type=int, default=1000, help="queries in the batch run (questions.csv repeated)")
    p.add_argument("--single", type=int, default=100, help="queries in the loop of single queries")
    p.add_argument("--slice", type=int, default=DEFAULT_SLICE_SIZE,
                   help="queries per kernel slice (Engine.query_embedded)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of the batch runs (median)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-model", action="store_true", help="skip everything that embeds text (kernels only)")
    p.add_argument("--model", default=None, help="synthetic store: the query model's folder (default: the package's)")
    p.add_argument("--profile", type=int, default=0, help="print the top-N cProfile entries of one batch and one "
                   "single query")
    p.add_argument("--quick", action="store_true", help="tiny run: batch 64, 10 singles, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.single, args.repeats = min(args.batch, 64), min(args.single, 10), 1
    return args


def _profile(fn, top: int, title: str) -> str:
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    text = f"\n--- cProfile: {title} (by own time) ---\n" + "\n".join(buf.getvalue().splitlines()[4:])
    print(text, flush=True)
    return text


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from qasc.engine.embedder import resolve_device
    from qasc.engine.query import Engine

    device = resolve_device(args.device)
    with_model = not args.no_model
    t0 = time.perf_counter()
    if args.synthetic:
        search = args.search
        if search == "auto":
            from qasc.engine.store import index as faiss_index

            try:
                search = "faiss" if faiss_index.gpu_available() else "torch"
            except ImportError:  # no faiss (the bare GPU machine): exact torch top-k
                search = "torch"
        engine = synthetic_engine(args.synthetic, str(device), search, with_model, args.model)
        source = f"synthetic {args.synthetic:,} sentences ({engine.store.search_kind} search)"
    else:
        store = find_or_build_store(args.store, args.corpora)
        engine = Engine.open(store, device=str(device))
        source = f"{store} ({engine.n_total:,} sentences, index {engine.store.manifest['index']['kind']})"
    if args.dtype and with_model:
        from qasc.engine.embedder import Embedder

        old = engine.embedder
        engine.embedder = Embedder(old.name, str(device), args.dtype, old.max_length, old.batch_tokens,
                                   old.max_batch_size)
    open_s = time.perf_counter() - t0
    if args.params == "default":
        from qasc.engine.config import RetrievalConfig
        from qasc.kernels.params import QascParams

        params, retrieval = QascParams(), RetrievalConfig()
    else:
        params, retrieval = engine.config.qasc, engine.config.retrieval
    questions = load_questions(max(args.batch, args.single)) if with_model else []
    batch_q, single_q = questions[: args.batch], questions[: args.single]
    rows, record = [], {"bench": "query", "device": str(device), "source": source, "threads": torch.get_num_threads(),
                        "dtype": str(engine.embedder.dtype) if with_model else None, "batch": args.batch,
                        "single": args.single, "repeats": args.repeats, "open_s": open_s,
                        "params": params.to_dict(), "retrieval": {"depth": retrieval.depth,
                                                                  "neighbourhood": retrieval.neighbourhood}}

    # pre-embedded queries (kernels only): no model in the timed region
    if with_model:
        emb = engine.embed_queries(batch_q)
    else:
        g = torch.Generator().manual_seed(0)
        emb = torch.nn.functional.normalize(torch.randn(args.batch, engine.embeddings.shape[1], generator=g), dim=1)
        emb = emb.to(device)
    lat_k = single_latencies(lambda i: engine.query_embedded(emb[i : i + 1], params, retrieval),
                             list(range(args.single)), device)
    t_kb = median(time_repeats(lambda: engine.query_embedded(emb, params, retrieval, slice_size=args.slice),
                               args.repeats, warmup=1, device=device))
    loop_k = len(lat_k) / sum(lat_k)
    rows.append({"run": "kernels single (pre-embedded)", "queries": args.single, "p50 ms": 1e3 * median(lat_k),
                 "p95 ms": 1e3 * percentile(lat_k, 95), "queries/s": loop_k, "vs loop": 1.0})
    rows.append({"run": "kernels batch (pre-embedded)", "queries": args.batch, "p50 ms": float("nan"),
                 "p95 ms": float("nan"), "queries/s": args.batch / t_kb, "vs loop": args.batch / t_kb / loop_k})
    record.update({"kernels_single_p50_ms": 1e3 * median(lat_k), "kernels_single_p95_ms": 1e3 * percentile(lat_k, 95),
                   "kernels_batch_qps": args.batch / t_kb, "kernels_batch_vs_loop": args.batch / t_kb / loop_k})

    if with_model:
        lat = single_latencies(lambda q: engine.query([q], params, retrieval), single_q, device)
        loop = len(lat) / sum(lat)
        batch_fn = (lambda: engine.query(batch_q, params, retrieval)) if args.slice == DEFAULT_SLICE_SIZE else (
            lambda: engine.query_embedded(engine.embed_queries(batch_q), params, retrieval, slice_size=args.slice))
        t_b = median(time_repeats(batch_fn, args.repeats, warmup=1, device=device))
        rows.append({"run": "end-to-end single", "queries": args.single, "p50 ms": 1e3 * median(lat),
                     "p95 ms": 1e3 * percentile(lat, 95), "queries/s": loop, "vs loop": 1.0})
        rows.append({"run": "end-to-end batch", "queries": args.batch, "p50 ms": float("nan"), "p95 ms": float("nan"),
                     "queries/s": args.batch / t_b, "vs loop": args.batch / t_b / loop})
        record.update({"single_p50_ms": 1e3 * median(lat), "single_p95_ms": 1e3 * percentile(lat, 95),
                       "loop_qps": loop, "batch_qps": args.batch / t_b, "batch_vs_loop": args.batch / t_b / loop})

    # stage split of the batch (separately timed calls; the sum is close to the batch time)
    depth = min(retrieval.depth, max(engine.n_total, 1))
    stages = {}
    if with_model:
        stages["embed"] = median(time_repeats(lambda: engine.embed_queries(batch_q), args.repeats, 0, device))
    sl = emb[: args.slice]  # one slice, as Engine.query_embedded runs them; scaled to the batch
    scale = args.batch / len(sl)
    search = engine.retrieval.search
    stages["search"] = scale * median(time_repeats(lambda: search(sl, depth), args.repeats, 1, device))
    run_b = scale * median(time_repeats(lambda: engine.run_batch(sl, params, retrieval), args.repeats, 1, device))
    stages["candidates+sims+qasc"] = max(run_b - stages["search"], 0.0)
    stages["assemble"] = max(t_kb - run_b, 0.0)
    total = sum(stages.values())
    stage_rows = [{"stage": k, "ms": 1e3 * v, "us/query": 1e6 * v / args.batch, "share": v / total}
                  for k, v in stages.items()]
    record["stages_ms"] = {k: 1e3 * v for k, v in stages.items()}

    info = machine_info(device)
    record["machine"] = info
    if with_model:
        print(f"\nquery embedder dtype {engine.embedder.dtype}", end="")
    print(f"\n{source}; device {device}; torch threads {torch.get_num_threads()}; QASC {args.params} "
          f"(top_k={params.top_k}, max_extent={params.max_extent}), depth {retrieval.depth}, "
          f"neighbourhood "
          f"{retrieval.neighbourhood}; batch median of {args.repeats}; load avg {info['load_avg']}")
    print_table(rows, ["run", "queries", "p50 ms", "p95 ms", "queries/s", "vs loop"])
    print_table(stage_rows, ["stage", "ms", "us/query", "share"], title=f"batch of {args.batch}, by stage")
    if args.profile:
        _profile(lambda: engine.query(batch_q, params, retrieval) if with_model else
                 engine.query_embedded(emb, params, retrieval), args.profile, f"batch of {args.batch}")
        _profile(lambda: engine.query(single_q[:1], params, retrieval) if with_model else
                 engine.query_embedded(emb[:1], params, retrieval), args.profile, "one single query")
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
