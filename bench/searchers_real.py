"""IVF search on real MiniLM vectors: FAISS's own batched paths against the engine's torch scan, at equal nprobe.

The six development sets' stores (the eval cache's, all-MiniLM-L6-v2) give the rows (their sentence vectors
together) and the queries (their questions' vectors; repeated to `--queries`). One IVF is trained on the rows
(`--nlist` lists, FAISS k-means); every searcher probes the same lists and returns the top `--k`:

    faiss-flat           IndexIVFFlat.search (exact scores in the probed lists), FAISS's threads
    faiss-sq8            IndexIVFScalarQuantizer (8-bit, as `qasc ingest --index ivf` builds) .search
    faiss-sq8-preassign  the same lists searched through search_preassigned, fed the torch assignment
    faiss-big-batch      faiss.contrib.big_batch_search over the flat IVF (list by list, all queries of a list at once)
    torch-float32        kernels.ivf_scan.ivf_vectors_topk over the rows (float32 products)
    torch-int8           the same with int8 products (the engine's CPU path on VNNI / AMX CPUs), re-ranked exactly

Recall@k against the exact top k (blocked matmul) and the search time per 10k queries (median of `--repeats`) for
each nprobe. Table, then one JSON line. `python -m bench.searchers_real --nprobes 8,16,32`.
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


def timed(fn, repeats: int) -> tuple[float, np.ndarray]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main(argv=None) -> int:
    import faiss
    from faiss.contrib.big_batch_search import big_batch_search

    from qasc.kernels.ivf_scan import ivf_vectors_topk

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nlist", type=int, default=256)
    ap.add_argument("--nprobes", default="8,16,32")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--queries", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default=os.environ.get("QASC_EVAL_CACHE", str(Path.home() / ".cache/qasc/eval")))
    args = ap.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    sets = load_sets(list(SETS), args.cache_dir, log)
    rows = torch.cat([eng.embeddings.float() for _, eng, _ in sets.values()])  # (N, D) unit vectors
    qs = np.concatenate([q for _, _, q in sets.values()])
    qs = np.resize(qs, (args.queries, qs.shape[1])).astype(np.float32)
    n, d = rows.shape
    x = rows.numpy()
    exact = torch.as_tensor(qs).mm(rows.T).topk(args.k, dim=1).indices.numpy()
    quant = faiss.IndexFlatIP(d)
    flat = faiss.IndexIVFFlat(quant, d, args.nlist, faiss.METRIC_INNER_PRODUCT)
    flat.train(x)
    flat.add(x)
    sq8 = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(d), d, args.nlist, faiss.ScalarQuantizer.QT_8bit,
                                        faiss.METRIC_INNER_PRODUCT)
    sq8.train(x)
    sq8.add(x)
    # the torch scan over the same lists as the flat IVF (its centroids, its assignment of the rows)
    centroids = torch.as_tensor(flat.quantizer.reconstruct_n(0, args.nlist))
    invlists = flat.invlists
    list_rows = [torch.as_tensor(faiss.rev_swig_ptr(invlists.get_ids(c), invlists.list_size(c)).copy()
                                 if invlists.list_size(c) else np.zeros(0, np.int64)) for c in range(args.nlist)]
    scale = rows.abs().amax(0)
    out = {"rows": n, "queries": args.queries, "nlist": args.nlist, "k": args.k, "threads": torch.get_num_threads(),
           "faiss_threads": faiss.omp_get_max_threads(), "runs": []}
    print(f"{n} rows x {d}, {args.queries} queries, nlist {args.nlist}, k {args.k}")
    print(f"{'searcher':<22} {'nprobe':>6} {'recall@k':>9} {'s / 10k q':>10}")
    qt = torch.as_tensor(qs)
    for nprobe in [int(v) for v in args.nprobes.split(",")]:
        flat.nprobe = sq8.nprobe = nprobe

        def preassigned(nprobe: int = nprobe) -> np.ndarray:  # assigned by a torch product, sq8's centroids
            c = torch.as_tensor(sq8.quantizer.reconstruct_n(0, args.nlist))
            dist, assign = (qt @ c.T).topk(nprobe, dim=1)
            return sq8.search_preassigned(qs, args.k, assign.numpy().astype(np.int64), dist.numpy())[1]

        def torch_scan(int8: bool, nprobe: int = nprobe) -> np.ndarray:
            score, got = ivf_vectors_topk(qt, centroids, rows, list_rows, nprobe, 4 * args.k if int8 else args.k,
                                          int8_scale=scale if int8 else None)
            if int8:  # the engine re-ranks the int8 shortlist by exact scores
                safe = got.clamp(min=0)
                exact_scores = (rows[safe] * qt[:, None, :]).sum(-1).masked_fill(got < 0, float("-inf"))
                order = exact_scores.argsort(dim=1, descending=True, stable=True)[:, : args.k]
                got = got.gather(1, order)
            return got.numpy()

        def big_batch() -> np.ndarray:  # its progress lines go to a sink
            with contextlib.redirect_stdout(io.StringIO()):
                return big_batch_search(flat, qs, args.k, threaded=1, computation_threads=2)[1]

        searchers = {
            "faiss-flat": lambda: flat.search(qs, args.k)[1],
            "faiss-sq8": lambda: sq8.search(qs, args.k)[1],
            "faiss-sq8-preassign": preassigned,
            "faiss-big-batch": big_batch,
            "torch-float32": lambda: torch_scan(False),
            "torch-int8": lambda: torch_scan(True),
        }
        for name, fn in searchers.items():
            seconds, found = timed(fn, args.repeats)
            r = recall(np.asarray(found), exact)
            per10k = seconds * 10000 / args.queries
            out["runs"].append({"searcher": name, "nprobe": nprobe, "recall": round(r, 4),
                                "s_per_10k": round(per10k, 3)})
            print(f"{name:<22} {nprobe:>6} {r:9.4f} {per10k:10.3f}", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
