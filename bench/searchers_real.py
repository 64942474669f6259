"""IVF search: FAISS's own batched paths against the engine's torch scan, at equal nprobe, on one set of rows.

Rows and queries, two sources:
- real MiniLM vectors (default): the six development sets' stores (the eval cache's, all-MiniLM-L6-v2) give the
  rows (their sentence vectors together) and the queries (their questions' vectors; repeated to `--queries`); one
  IVF is trained on the rows (`--nlist` lists, FAISS k-means);
- `--store PATH`: a committed ivf store (bench.scale's synthetic one): its vectors are the rows, its own SQ8 index
  the lists (the flat IVF gets the same centroids), the queries bench.scale's / bench.ivf_sweep's noisy copies of
  stored rows (noise 1.0 x the store's spread, seed 7).

Every searcher probes the same lists and returns the top `--k`:

    faiss-flat           IndexIVFFlat.search (exact scores in the probed lists), FAISS's threads
    faiss-sq8            IndexIVFScalarQuantizer (8-bit, as `qasc ingest --index ivf` builds) .search
    faiss-sq8-preassign  the same lists searched through search_preassigned, fed the torch assignment
    faiss-big-batch      faiss.contrib.big_batch_search over the flat IVF (list by list, all queries of a list at once)
    faiss-sq8-big-batch  big_batch_search over the SQ8 lists, 2 x k hits re-scored exactly (the engine's re-rank)
    faiss-sq8-rerank     IVF-SQ8 .search, 2 x k hits re-scored exactly (the engine's search of a few queries)
    list-major-sq8-rerank  engine.store.search.list_major_search over the SQ8 lists (big_batch_search's list order,
                         the inner product right for residual codes), 2 x k re-scored: the engine's batch search
    list-major-flat      the same over the flat IVF
    torch-float32        kernels.ivf_scan.ivf_vectors_topk over the rows (float32 products)
    torch-int8           the same with int8 products (the engine's CPU path on VNNI / AMX CPUs), re-ranked exactly

The two torch rows need kernels/ivf_scan.py, removed after this comparison (07a380b is the last commit with it:
run the script from a checkout of it for those rows); without it they are left out.

Recall@k against the exact top k (blocked matmul) and the search time per 10k queries (median of `--repeats`,
the searchers timed in alternating rounds) for each nprobe (`--parallel-modes`: FAISS's `IndexIVF.parallel_mode`
values tried for .search; `--searchers`: a subset). Table, then one JSON line.
`python -m bench.searchers_real --nprobes 8,16,32`;
`python -m bench.searchers_real --store /tmp/qasc-scale/store-200000-s0-ivf-float16-table --nprobes 16,112`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.scoring_lodo import SETS, load_sets


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """found/exact (Q, k) row ids -> the share of the exact top k found."""
    hits = sum(len(set(f[f >= 0]) & set(e)) for f, e in zip(found, exact, strict=True))
    return hits / exact.size


def timed_alternately(fns: dict, repeats: int) -> dict[str, tuple[float, np.ndarray]]:
    """name -> search: each timed `repeats` times, one round over all of them after another (so that a change of
    the host's load falls on every searcher alike) -> name -> (median seconds, the last result)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    out: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            out[name] = fn()
            times[name].append(time.perf_counter() - t)
    return {name: (statistics.median(times[name]), out[name]) for name in fns}


def store_rows(path: str, n_queries: int, log) -> tuple[torch.Tensor, np.ndarray, object]:
    """A committed ivf store -> rows (N, D) float32, queries (n_queries, D) float32 (bench.scale's noisy copies of
    stored rows, as bench.ivf_sweep), the store (its `index`: the SQ8 index, lists mapped from the file)."""
    from bench.synthetic import noisy_queries, spread
    from qasc.engine.store.reader import Store

    t = time.perf_counter()
    store = Store.open(path, load_index=True)
    log(f"{path}: {len(store)} rows opened in {time.perf_counter() - t:.1f} s")
    if store.manifest["index"]["kind"] != "ivf":
        raise SystemExit(f"{path}: not an ivf store")
    queries, _ = noisy_queries(store.vectors, n_queries, 1.0, 7, spread(store.vectors))
    return store.vectors.float(), queries.numpy(), store


def main(argv=None) -> int:
    import faiss
    from faiss.contrib.big_batch_search import big_batch_search

    from qasc.engine.store.index import exact_topk, rerank
    from qasc.engine.store.search import list_major_search

    try:  # the torch scan the engine used until issue 44 (removed; see the docstring)
        from qasc.kernels.ivf_scan import ivf_vectors_topk
    except ImportError:
        ivf_vectors_topk = None

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", default=None, help="a committed ivf store (its vectors, its SQ8 index, noisy "
                    "queries) instead of the six sets' real vectors")
    ap.add_argument("--nlist", type=int, default=256, help="lists of the IVF trained on the six sets' rows")
    ap.add_argument("--nprobes", default="8,16,32")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--queries", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parallel-modes", default="0", help="IndexIVF.parallel_mode values tried for .search")
    ap.add_argument("--searchers", default="", help="comma-separated subset of the searchers (default: all)")
    ap.add_argument("--cache-dir", default=os.environ.get("QASC_EVAL_CACHE", str(Path.home() / ".cache/qasc/eval")))
    args = ap.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.store:
        rows, qs, store = store_rows(args.store, args.queries, log)
        sq8 = faiss.downcast_index(store.index)  # a view: `store` owns the index
        n, d = rows.shape
        x = rows.numpy()
        nlist = sq8.nlist
        quant = faiss.IndexFlatIP(d)
        quant.add(sq8.quantizer.reconstruct_n(0, nlist))
        flat = faiss.IndexIVFFlat(quant, d, nlist, faiss.METRIC_INNER_PRODUCT)
        flat.is_trained = True
        flat.add(x)
    else:
        sets = load_sets(list(SETS), args.cache_dir, log)
        rows = torch.cat([eng.embeddings.float() for _, eng, _ in sets.values()])  # (N, D) unit vectors
        qs = np.concatenate([q for _, _, q in sets.values()])
        qs = np.resize(qs, (args.queries, qs.shape[1])).astype(np.float32)
        n, d = rows.shape
        x = rows.numpy()
        nlist = args.nlist
        flat = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        flat.train(x)
        flat.add(x)
        sq8 = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(d), d, nlist, faiss.ScalarQuantizer.QT_8bit,
                                            faiss.METRIC_INNER_PRODUCT)
        sq8.train(x)
        sq8.add(x)
    qt = torch.as_tensor(qs)
    exact = exact_topk(rows, qt, args.k)[1].numpy()
    # the torch scan over the same lists as the flat IVF (its centroids, its assignment of the rows)
    centroids = torch.as_tensor(flat.quantizer.reconstruct_n(0, nlist))
    invlists = flat.invlists
    list_rows = [torch.as_tensor(faiss.rev_swig_ptr(invlists.get_ids(c), invlists.list_size(c)).copy()
                                 if invlists.list_size(c) else np.zeros(0, np.int64)) for c in range(nlist)]
    scale = rows.abs().amax(0)
    out = {"rows": n, "queries": args.queries, "nlist": nlist, "k": args.k, "threads": torch.get_num_threads(),
           "faiss_threads": faiss.omp_get_max_threads(), "store": args.store, "runs": []}
    print(f"{n} rows x {d}, {args.queries} queries, nlist {nlist}, k {args.k}, store {args.store or 'six sets'}")
    print(f"{'searcher':<22} {'nprobe':>6} {'recall@k':>9} {'s / 10k q':>10}")
    wanted = set(filter(None, args.searchers.split(",")))
    for nprobe in [int(v) for v in args.nprobes.split(",")]:
        flat.nprobe = sq8.nprobe = nprobe

        def preassigned(nprobe: int = nprobe) -> np.ndarray:  # assigned by a torch product, sq8's centroids
            c = torch.as_tensor(sq8.quantizer.reconstruct_n(0, nlist))
            dist, assign = (qt @ c.T).topk(nprobe, dim=1)
            return sq8.search_preassigned(qs, args.k, assign.numpy().astype(np.int64), dist.numpy())[1]

        def torch_scan(int8: bool, nprobe: int = nprobe) -> np.ndarray:
            score, got = ivf_vectors_topk(qt, centroids, rows, list_rows, nprobe, 4 * args.k if int8 else args.k,
                                          int8_scale=scale if int8 else None)
            return rerank(rows, qt, got, args.k)[1].numpy() if int8 else got.numpy()

        def big_batch(index, k: int) -> np.ndarray:  # its progress lines go to a sink
            with contextlib.redirect_stdout(io.StringIO()):
                return big_batch_search(index, qs, k, threaded=1, computation_threads=2)[1]

        def searched(index, mode: int, k: int) -> np.ndarray:
            index.parallel_mode = mode
            return index.search(qs, k)[1]

        searchers = {}
        for mode in [int(v) for v in args.parallel_modes.split(",")]:
            tag = "" if mode == 0 else f"-pm{mode}"
            searchers[f"faiss-flat{tag}"] = lambda mode=mode: searched(flat, mode, args.k)
            searchers[f"faiss-sq8{tag}"] = lambda mode=mode: searched(sq8, mode, args.k)
            searchers[f"faiss-sq8-rerank{tag}"] = lambda mode=mode: rerank(
                rows, qt, torch.as_tensor(searched(sq8, mode, 2 * args.k)), args.k)[1].numpy()
        sq8.parallel_mode = 0
        searchers.update({
            "faiss-sq8-preassign": preassigned,
            "faiss-big-batch": lambda: big_batch(flat, args.k),
            "list-major-sq8-rerank": lambda nprobe=nprobe: rerank(
                rows, qt, torch.as_tensor(list_major_search(sq8, qs, 2 * args.k, nprobe)[1]), args.k)[1].numpy(),
            "list-major-flat": lambda nprobe=nprobe: list_major_search(flat, qs, args.k, nprobe)[1],
            "faiss-sq8-big-batch": lambda: rerank(rows, qt, torch.as_tensor(big_batch(sq8, 2 * args.k)),
                                                  args.k)[1].numpy(),
            **({"torch-float32": lambda: torch_scan(False), "torch-int8": lambda: torch_scan(True)}
               if ivf_vectors_topk is not None else {}),
        })
        chosen = {name: fn for name, fn in searchers.items() if not wanted or name in wanted}
        for name, (seconds, found) in timed_alternately(chosen, args.repeats).items():
            r = recall(np.asarray(found), exact)
            per10k = seconds * 10000 / args.queries
            out["runs"].append({"searcher": name, "nprobe": nprobe, "recall": round(r, 4),
                                "s_per_10k": round(per10k, 3)})
            print(f"{name:<22} {nprobe:>6} {r:9.4f} {per10k:10.3f}", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
