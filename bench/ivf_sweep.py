"""IVF recall@depth and search time vs nprobe and the re-rank factor, on one committed ivf store.

Opens the store once (vectors + FAISS index), makes --queries noisy copies of stored rows (bench.scale's
queries: same seed, same noise, so the first 2,000 are bench.scale's exact queries), takes their exact top-depth
hits (blocked torch top-k, or --exact-hits from a bench.scale run), then for each nprobe x rerank searches them
through engine.store.search.FaissSearcher (FAISS over the SQ8 codes, rerank x depth hits re-scored exactly) and reports
recall@depth vs exact and the search time scaled to 10k queries. Ends with one JSON line.

    python -m bench.ivf_sweep --store /tmp/qasc-scale/store-1000000-s0-ivf-float16-table \\
        --exact-hits /tmp/qasc-scale/store-1000000-s0-ivf-float16-table.query-exact.hits.npy
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from bench.common import emit_json, machine_info, median, print_table


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True, help="a committed ivf store")
    p.add_argument("--queries", type=int, default=2000, help="queries searched per setting (default 2000)")
    p.add_argument("--pool", type=int, default=10_000, help="bench.scale's query pool (seeds the queries)")
    p.add_argument("--noise", type=float, default=1.0, help="query noise, in units of the store's spread")
    p.add_argument("--seed", type=int, default=7, help="query seed (bench.scale: --seed + 7)")
    p.add_argument("--depth", type=int, default=0, help="hits per query (0: the store's retrieval depth)")
    p.add_argument("--nprobes", default="16,32,64,128,256", help="comma-separated nprobe values")
    p.add_argument("--reranks", default="1,2,4", help="comma-separated re-rank factors (hits x depth re-scored)")
    p.add_argument("--exact-hits", default=None, help=".npy (Q, depth) exact hits of the same queries (else computed)")
    p.add_argument("--repeats", type=int, default=1, help="timed searches per setting (median; default 1)")
    p.add_argument("--threads", type=int, default=0, help="torch / faiss threads (0: their defaults)")
    p.add_argument("--hnsw", default=None, help="also an HNSW-SQ8 alternative: M,efConstruction (e.g. 16,64), built "
                   "over the store's vectors (cached at --hnsw-file) and swept over --ef-search")
    p.add_argument("--hnsw-file", default=None, help="where the HNSW-SQ8 index is cached (default: beside the store)")
    p.add_argument("--ef-search", default="32,64,128,256", help="comma-separated HNSW efSearch values")
    return p.parse_args(argv)


def hnsw_index(store, args):
    """The store's vectors in an IndexHNSWSQ (8-bit codes, inner product), built once and cached at --hnsw-file."""
    import torch

    from qasc.engine.store import index as faiss_index

    faiss = faiss_index._faiss()
    path = Path(args.hnsw_file or f"{str(store.path).rstrip('/')}.hnsw-sq8-{args.hnsw.replace(',', '-')}.faiss")
    if path.exists():
        return faiss.read_index(str(path)), {"file": str(path), "build_s": None}
    m, ef_c = (int(x) for x in args.hnsw.split(","))
    index = faiss.IndexHNSWSQ(store.vectors.shape[1], faiss.ScalarQuantizer.QT_8bit, m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = ef_c
    t0 = time.perf_counter()
    sample = faiss_index.training_sample(len(store), 4000)
    index.train(store.vectors[torch.from_numpy(sample)].float().numpy())
    for lo in range(0, len(store), 65536):
        index.add(store.vectors[lo : lo + 65536].float().numpy())
        print(f"hnsw: {index.ntotal:,} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    build_s = time.perf_counter() - t0
    faiss.write_index(index, str(path))
    return index, {"file": str(path), "build_s": build_s}


def hnsw_rows(store, queries, exact: np.ndarray, depth: int, args) -> list[dict]:
    """HNSW-SQ8 over the same queries: per efSearch, 2 x depth hits re-scored exactly (as the ivf path does)."""
    import torch

    from qasc.engine.store import index as faiss_index

    index, info = hnsw_index(store, args)
    print(f"hnsw: {info}", flush=True)
    out = []
    for ef in [int(x) for x in args.ef_search.split(",") if x]:
        index.hnsw.efSearch = ef
        times, hits = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            _, wide = faiss_index.search(index, queries.numpy(), 2 * depth)
            hits = faiss_index.rerank(store.vectors, queries, torch.from_numpy(wide), depth)[1].numpy()
            times.append(time.perf_counter() - t0)
        rec = {"nprobe": f"hnsw ef {ef}", "share_of_lists": None, "rerank": 2,
               "recall": faiss_index.recall_at_depth(hits, exact),
               "search_s_per_10k": median(times) * 1e4 / len(queries), "load": round(os.getloadavg()[0], 2),
               "hnsw_build_s": info["build_s"]}
        out.append(rec)
        print(rec, flush=True)
    return out


def main(argv=None) -> dict:
    import torch

    from bench.synthetic import noisy_queries, spread
    from qasc.engine.store import index as faiss_index
    from qasc.engine.store.reader import Store
    from qasc.engine.store.search import FaissSearcher, IvfSettings

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        faiss_index._faiss().omp_set_num_threads(args.threads)
    t0 = time.perf_counter()
    store = Store.open(args.store, load_index=True)
    open_s = time.perf_counter() - t0
    params = store.manifest["index"].get("params", {})
    depth = args.depth or min(store.config.retrieval.depth, len(store))
    queries, _ = noisy_queries(store.vectors, args.pool, args.noise, args.seed, spread(store.vectors))
    queries = queries[: args.queries]
    if args.exact_hits:
        exact = np.load(args.exact_hits)[: len(queries)]
        queries = queries[: len(exact)]
    else:
        t0 = time.perf_counter()
        exact = faiss_index.exact_topk(store.vectors, queries, depth)[1].numpy()
        print(f"exact: {len(queries)} queries in {time.perf_counter() - t0:.1f} s", flush=True)
    n = len(queries)
    nlist = int(params.get("nlist", 0))
    rows = []
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    for rerank in ints(args.reranks):
        for nprobe in ints(args.nprobes):
            searcher = FaissSearcher(store.index, store.vectors, rerank,
                                     IvfSettings(faiss_index.set_nprobe(params, nprobe)))
            searcher.search(queries[:64], depth)  # warm-up
            times, hits = [], None
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                hits = searcher.search(queries, depth)[1].numpy()
                times.append(time.perf_counter() - t0)
            rec = {"nprobe": nprobe, "share_of_lists": nprobe / max(nlist, 1), "rerank": rerank,
                   "recall": faiss_index.recall_at_depth(hits, exact), "search_s_per_10k": median(times) * 1e4 / n,
                   "load": round(os.getloadavg()[0], 2)}
            rows.append(rec)
            print(rec, flush=True)
    if args.hnsw:
        rows += hnsw_rows(store, queries, exact, depth, args)
    print_table(rows, title=f"IVF sweep: {len(store):,} rows, nlist {nlist}, codes {params.get('codes', 'Flat')}, "
                            f"depth {depth}, {n} queries (open {open_s:.1f} s)")
    record = {"bench": "ivf_sweep", "store": args.store, "rows_in_store": len(store), "nlist": nlist,
              "codes": params.get("codes", "Flat"), "depth": depth, "queries": n, "open_s": open_s, "rows": rows,
              "torch_threads": torch.get_num_threads(),
              "faiss_threads": faiss_index._faiss().omp_get_max_threads(), "host": machine_info()}
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
