"""Scale: a store of N synthetic sentences, ingest rate and driver memory, 10k pre-embedded queries exact vs IVF.

Phases (each timed; the JSON line lists them under `phase_s`):
  corpus   N sentences of synthetic markdown (documents of 20-400 sentences, sections with headings, paragraphs of
           1-8 sentences, sentences of 8-40 words from a seeded Zipf vocabulary) under WORK, reused when present;
  model    a randomly initialised 1-layer BERT (hidden 384, 6 heads, intermediate 384, seeded) with the MiniLM
           tokenizer, so that ingest measures the pipeline rather than MiniLM on 2 cores;
  ingest   `python -m qasc.jobs.cli ingest ... --local --index ivf --dtype-store float16` in a child process:
           sentences/s and the child's peak RSS (the driver: with --local it also embeds);
  exact    a child process: Engine.query_batches (search + QASC + assembly) on --exact-queries noisy copies of
           stored vectors, exact search; its hits at the engine's depth are the ground truth for recall;
  ivf      a child process: the same on --queries queries through the store's IVF index (q/s, recall@depth vs
           exact, peak RSS and, after the runs, RSS split into anonymous and file-backed (the mapped index's
           pages); FAISS searches the index, engine.store.search), then --stream-queries queries' results
           streamed to Parquet (RSS growth);
  quality  real MiniLM (the default model) on a chroma_general store with an IVF index: share of queries whose
           top chunk is the same through IVF and exact search (skipped without ../shared).
Sizes in GiB (2^30 bytes). Targets (issue 14): IVF >= 2,000 q/s at 1M sentences, recall@depth >= 0.95, query peak
RSS <= 1.5 x stored embedding bytes + 1 GiB, RSS growth for 100k streamed queries <= 0.5 GiB, ingest driver <= 1 GiB.
This module runs the phases and reports; the corpus, model and queries are bench.synthetic's, the child processes
and their memory bench.memory's, and the query child (`--child SPEC`, handled here) bench.scale_query's.

    python -m bench.scale --quick                 # 20k sentences, 1k queries, 10k streamed: about 2 minutes
    python -m bench.scale --sentences 200000
    python -m bench.scale                         # 1M sentences, 10k queries, 100k streamed (see bench/RESULTS.md)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import CHROMA, emit_json, machine_info, median, print_table
from bench.memory import GiB, proc_status, run_child
from bench.scale_query import partitions_child, query_child
from bench.synthetic import TableEmbedder, corpus_dir, noisy_queries, tiny_model, write_corpus

KEYS = ("ingest_sentences_per_s", "driver_peak_rss_gb", "query_per_s_exact", "query_per_s_ivf",
        "ivf_recall_at_depth", "peak_rss_gb", "rss_growth_100k_queries_gb")

# --------------------------------------------------------------------------------------------- ingest


def ingest_child(spec: dict) -> dict:
    """`--embedder table`: engine.store.ingest in this process with a TableEmbedder (the ingest CLI loads a model)."""
    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.store import IngestConfig, IngestProgress, ingest

    model = Path(spec["model"])
    summary = ingest([spec["corpus"]], spec["store"], EngineConfig(embedder=EmbedderConfig(model=str(model))),
                     IngestConfig(index=spec["index"], dtype_store=spec["dtype_store"]),
                     embedder=TableEmbedder(model), progress=IngestProgress(bar=False))
    return {"summary": summary, "driver_peak_rss_bytes": proc_status("VmHWM")}


def ingest_store(corpus: Path, store: Path, model: Path, args: argparse.Namespace) -> dict:
    """`qasc ingest` of the corpus into store in a child process -> its numbers (saved beside the store, reused with
    --reuse-store)."""
    record_path = store.with_name(store.name + ".ingest.json")
    if args.reuse_store and (store / "manifest.json").is_file():
        if not record_path.is_file():  # a store whose ingest ran without this driver: kept, its record rebuilt
            record_path.write_text(json.dumps(ingest_record(store, args, None, None, "(not recorded)")))
        return {**json.loads(record_path.read_text()), "reused": True}
    shutil.rmtree(store, ignore_errors=True)
    if args.embedder == "table":
        spec_path = store.with_name(store.name + ".ingest.spec.json")
        spec_path.write_text(json.dumps({"kind": "ingest", "corpus": str(corpus / "docs"), "store": str(store),
                                         "model": str(model), "index": args.index, "dtype_store": args.dtype_store,
                                         "out": str(store.with_name(store.name + ".ingest.out.json"))}))
        cmd = [sys.executable, "-m", "bench.scale", "--child", str(spec_path)]
    else:
        cmd = [sys.executable, "-m", "qasc.jobs.cli", "ingest", str(corpus / "docs"), "--store", str(store), "--model",
               str(model), "--index", args.index, "--dtype-store", args.dtype_store, "--no-progress"]
        cmd += ["--local"] if not args.ray else ["--workers", "1"]
        if args.batch_tokens:
            cmd += ["--batch-tokens", str(args.batch_tokens)]
    wall, maxrss = run_child(cmd, store.with_name(store.name + ".ingest.log"))
    # wait4's peak covers the child's own children too (the local ingest builds large indexes in one,
    # engine.store.index_child): the driver's own peak is its VmHWM, reported by the table child
    record = ingest_record(store, args, wall, maxrss, " ".join(cmd[1:]))
    record_path.write_text(json.dumps(record))
    return {**record, "reused": False}


def ingest_record(store: Path, args: argparse.Namespace, wall: float | None, maxrss: int | None,
                  command: str) -> dict:
    """The ingest's numbers from the store's manifest and the table child's output (beside the store); wall and
    maxrss None for a store whose ingest this driver did not time."""
    out_path = store.with_name(store.name + ".ingest.out.json")
    out = json.loads(out_path.read_text()) if args.embedder == "table" and out_path.is_file() else {}
    summary = out.get("summary", {})
    driver = out.get("driver_peak_rss_bytes") or maxrss
    manifest = json.loads((store / "manifest.json").read_text())
    n = int(manifest["counts"]["sentences"])
    wall = wall if wall is not None else summary.get("seconds")
    return {"sentences": n, "documents": int(manifest["counts"]["documents"]), "wall_s": wall,
            "ingest_sentences_per_s": n / wall if wall else None,
            "driver_peak_rss_gb": driver / GiB if driver else None,
            "process_tree_peak_rss_gb": maxrss / GiB if maxrss else None,
            "index_peak_rss_gb": summary.get("index_peak_rss_gb"), "embedder": args.embedder,
            "mode": "ray" if args.ray and args.embedder == "model" else "local", "index": manifest["index"]["kind"],
            "index_params": manifest["index"]["params"], "dtype_store": manifest["dtype"],
            "dim": int(manifest["dim"]), "command": command}


# --------------------------------------------------------------------------------------------- queries


def run_query_child(mode: str, store: Path, work: Path, n_queries: int, stream: int, args,
                    queries_in: Path | None = None) -> dict:
    base = work / f"{store.parent.name if mode == 'partitions' else store.name}.query-{mode}"
    spec = {"mode": mode, "store": str(store), "queries": n_queries, "pool": args.queries, "noise": args.noise,
            "seed": args.seed + 7, "nprobe": args.nprobe, "repeats": args.repeats,
            "slice": args.slice,
            "threads": args.threads, "stream": stream, "hits": f"{base}.hits.npy", "budget_tokens": args.budget_tokens,
            "texts": args.query_texts, "stream_path": f"{base}.stream.parquet", "out": f"{base}.json",
            "partitions": args.partitions, "queries_out": f"{base}.queries.npy" if mode == "ivf" else None,
            "queries_in": str(queries_in)}
    spec_path = Path(f"{base}.spec.json")
    spec_path.write_text(json.dumps(spec))
    wall, maxrss = run_child([sys.executable, "-m", "bench.scale", "--child", str(spec_path)], Path(f"{base}.log"))
    rec = json.loads(Path(spec["out"]).read_text())
    # wait4's ru_maxrss is the high-water mark that PeakRss resets (clear_refs) before streaming: the max of all three
    peak = max(maxrss / GiB, rec.get("peak_rss_gb", 0.0), rec.get("stream_rss_peak_gb") or 0.0)
    return {**rec, "wall_s": wall, "process_peak_rss_gb": peak, "hits": spec["hits"]}


def partitioned(store: Path, work: Path, args) -> dict:
    """The store split into --partitions partition stores (bench.partitions.split_store: contiguous shard runs,
    each with its own index of the store's kind) assembled as a collection under WORK (reused with --reuse-store
    when complete), then the partitions child (bench.scale_query.partitions_child) on the ivf child's queries."""
    from bench.partitions import split_store
    from qasc.engine.store.collection import assemble, is_collection

    root = work / f"{store.name}-parts{args.partitions}"
    if not (args.reuse_store and is_collection(root / "collection")):
        if root.exists():
            shutil.rmtree(root)
        assemble(root / "collection", split_store(store, root / "parts", args.partitions, args.index))
    return run_query_child("partitions", root / "collection", work, args.queries, 0, args,
                           work / f"{store.name}.query-ivf.queries.npy")


def recall_at_depth(approx: np.ndarray, exact: np.ndarray) -> float:
    """approx, exact (Q, k) int64 rows (-1 = none) -> mean share of each query's exact hits found by approx, over
    the first min(Q) queries (engine.store.index.recall_at_depth)."""
    from qasc.engine.store import index

    q = min(len(approx), len(exact))
    return index.recall_at_depth(approx[:q], exact[:q])


# --------------------------------------------------------------------------------------------- quality (MiniLM)


def quality_check(work: Path, args: argparse.Namespace) -> dict:
    """Real MiniLM on a chroma_general store with an IVF index: the top chunk through IVF vs exact search."""
    folder = Path(args.quality_corpora or CHROMA / "corpora")
    names = [n for n in args.quality_docs.split(",") if n] if args.quality_docs else None
    files = sorted(p for p in folder.glob("*.md") if names is None or p.stem in names)
    if not files:
        return {"skipped": f"no chroma_general corpora under {folder}"}
    import torch

    from qasc.engine.query import Engine
    from qasc.engine.store.reader import Store

    store = work / ("quality-" + "-".join(p.stem for p in files) + "-ivf")
    t0 = time.perf_counter()
    if not (store / "manifest.json").is_file():
        shutil.rmtree(store, ignore_errors=True)
        run_child([sys.executable, "-m", "qasc.jobs.cli", "ingest", *map(str, files), "--store", str(store), "--local",
                   "--index", "ivf", "--no-progress"], work / "quality-ingest.log")
    ingest_s = time.perf_counter() - t0
    ivf = Engine.open(str(store), device="cpu")
    plain = Store.open(store, load_index=False)
    exact = Engine(plain, None, plain.config, torch.device("cpu"))
    questions = _questions(folder.parent / "questions.csv", {p.stem for p in files})[: args.quality_queries]
    q_text = ivf.embed_queries(questions) if questions else torch.zeros((0, ivf.embeddings.shape[1]))
    n_noisy = max(0, args.quality_queries - len(questions))
    q_noisy, _ = noisy_queries(ivf.embeddings, n_noisy, args.noise, args.seed + 11)
    depth = min(ivf.config.retrieval.depth, ivf.n_total)
    params = ivf.store.manifest["index"]["params"]
    out = {"store": str(store), "sentences": ivf.n_total, "index_params": params, "ingest_s": ingest_s,
           "depth": depth, "probed_share": min(1.0, params.get("nprobe", 1) / params.get("nlist", 1))}
    for name, q in (("questions", q_text), ("noisy_sentences", q_noisy)):
        if not len(q):
            continue
        a, b = ivf.query_embedded(q), exact.query_embedded(q)
        same = [(x[0].doc_id, x[0].char_start, x[0].char_end) == (y[0].doc_id, y[0].char_start, y[0].char_end)
                if x and y else (not x and not y) for x, y in zip(a, b, strict=True)]
        out[name] = {"queries": len(q), "same_top_chunk": float(np.mean(same)),
                     "recall_at_depth": recall_at_depth(ivf.retrieval.search(q, depth).numpy(),
                                                        exact.retrieval.search(q, depth).numpy())}
    out["wall_s"] = time.perf_counter() - t0
    return out


def _questions(path: Path, corpora: set[str]) -> list[str]:
    import csv

    if not path.is_file():
        return []
    with open(path, encoding="utf-8", newline="") as fh:
        return [r["question"] for r in csv.DictReader(fh) if r.get("corpus_id") in corpora]


# --------------------------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=1_000_000, help="sentences in the synthetic store (default 1M)")
    p.add_argument("--queries", type=int, default=10_000, help="pre-embedded queries timed through IVF (default 10k)")
    p.add_argument("--exact-queries", type=int, default=2000,
                   help="of those, the first N timed through exact search and used for recall (default 2000)")
    p.add_argument("--stream-queries", type=int, default=100_000,
                   help="queries whose results are streamed to Parquet for the RSS growth (default 100k; 0: skip)")
    p.add_argument("--noise", type=float, default=1.0, help="norm of the random direction added to each query's "
                   "source vector, in units of the store's spread (RMS distance from the mean), before "
                   "re-normalising (default 1.0: on MiniLM's chroma_general store the queries' best-hit cosine, 0.72, "
                   "and IVF recall@16, 0.946, match the real questions' 0.72 and 0.964)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per query mode (median; default 3)")
    p.add_argument("--slice", type=int, default=2048, help="queries per engine slice (default 2048)")
    p.add_argument("--threads", type=int, default=0, help="torch threads in the query processes (0: torch default)")
    p.add_argument("--nprobe", type=int, default=0, help="IVF lists probed per query (0: the store's setting)")
    p.add_argument("--query-texts", default=True, action=argparse.BooleanOptionalAction,
                   help="each query carries its source sentence's text as its question, as `qasc query`'s questions "
                        "do, so that the gated lexical term runs and its BM25 index (built on first use) counts in "
                        "the time and the peak RSS (default on; --no-query-texts: vectors only, the runs before "
                        "2026-12-03 18:40)")
    p.add_argument("--budget-tokens", type=int, default=0, help="a token budget on every query, so that the budget "
                   "fill runs (its passages loaded, ranked and appended), on the setting `qasc query --budget-tokens "
                   "N` answers with (the budget profile on a store of shipped settings; default 0: no budget, as "
                   "`qasc query` without --budget-tokens)")
    p.add_argument("--index", default="ivf", help="index kind of the store (default ivf)")
    p.add_argument("--dtype-store", default="float16", help="embedding storage type (default float16)")
    p.add_argument("--batch-tokens", type=int, default=0, help="ingest --batch-tokens (0: the default)")
    p.add_argument("--embedder", default="model", choices=("model", "table"),
                   help="ingest embedding: model = the 1-layer BERT through `qasc ingest` (default); table = its "
                        "word-embedding table mean-pooled, in numpy, through engine.store.ingest(embedder=...): the "
                        "pipeline without the model's cost (about 6x faster on this box), a separate store")
    p.add_argument("--ray", action="store_true", help="ingest through Ray (1 worker) instead of --local")
    p.add_argument("--seed", type=int, default=0, help="corpus, model and query seed (default 0)")
    p.add_argument("--work", default="/tmp/qasc-scale", help="work folder: corpus, model, stores (default "
                   "/tmp/qasc-scale); the corpus and model are reused when present")
    p.add_argument("--reuse-store", action="store_true", help="skip ingest when the store exists (its recorded "
                   "ingest numbers are reported, marked reused)")
    p.add_argument("--quality-queries", type=int, default=10_000,
                   help="quality check: chroma questions plus noisy copies of stored vectors (default 10k)")
    p.add_argument("--quality-docs", default="", help="quality check: comma-separated corpus names of "
                   "chroma_general (default: all)")
    p.add_argument("--quality-corpora", default=None, help="quality check: folder of *.md corpora (default "
                   "chroma_general's)")
    p.add_argument("--no-quality", action="store_true", help="skip the MiniLM quality check")
    p.add_argument("--quick", action="store_true", help="20k sentences, 1k queries (500 exact), 10k streamed, 1 "
                   "repeat, quality on state_of_the_union with 300 queries")
    p.add_argument("--partitions", type=int, default=0, help="also serve the store split into N partitions "
                   "(each with its own index) on N Ray actors of a local Ray instance, the engine in the driver: "
                   "q/s on the ivf run's queries, recall, each actor's peak RSS (0: off, the default)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.budget_tokens < 0:
        p.error(f"--budget-tokens must be >= 0, got {args.budget_tokens}")
    if args.quick:
        args.sentences, args.queries, args.exact_queries = 20_000, 1000, 500
        args.stream_queries, args.repeats, args.quality_queries = 10_000, 1, 300
        args.quality_docs = args.quality_docs or "state_of_the_union"
    args.exact_queries = min(args.exact_queries, args.queries)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        result = (ingest_child(spec) if spec.get("kind") == "ingest" else
                  partitions_child(spec) if spec["mode"] == "partitions" else query_child(spec))
        Path(spec["out"]).write_text(json.dumps(result))
        return {}
    work = Path(args.work).expanduser().absolute()
    work.mkdir(parents=True, exist_ok=True)
    phases: dict[str, float] = {}

    def phase(name, fn, *a):
        t0 = time.perf_counter()
        print(f"bench.scale: {name} ...", flush=True)
        res = fn(*a)
        phases[name] = round(time.perf_counter() - t0, 2)
        return res

    corpus = corpus_dir(work, args.sentences, args.seed)
    cinfo = phase("corpus", write_corpus, corpus, args.sentences, args.seed)
    model = phase("model", tiny_model, work, args.seed)
    table = "-table" if args.embedder == "table" else ""
    store = work / f"store-{args.sentences}-s{args.seed}-{args.index}-{args.dtype_store}{table}"
    ing = phase("ingest", ingest_store, corpus, store, model, args)
    ex = phase("exact", run_query_child, "exact", store, work, args.exact_queries, 0, args)
    iv = phase("ivf", run_query_child, "ivf", store, work, args.queries, args.stream_queries, args)
    recall = recall_at_depth(np.load(iv["hits"]), np.load(ex["hits"]))
    pt = phase("partitions", partitioned, store, work, args) if args.partitions else None
    quality = {"skipped": "--no-quality"}
    if not args.no_quality:
        quality = phase("quality", quality_check, work, args)
    emb_bytes = ing["sentences"] * ing["dim"] * (2 if ing["dtype_store"] == "float16" else 4)
    growth = iv.get("rss_growth_stream_gb", float("nan"))
    growth_100k = iv.get("rss_growth_100k_gb", float("nan"))
    record = {
        "bench": "scale",
        "ingest_sentences_per_s": ing["ingest_sentences_per_s"],
        "driver_peak_rss_gb": ing["driver_peak_rss_gb"],
        "index_peak_rss_gb": ing.get("index_peak_rss_gb"),
        "query_per_s_exact": ex["query_per_s"],
        "query_per_s_ivf": iv["query_per_s"],
        "ivf_recall_at_depth": recall,
        "peak_rss_gb": iv["peak_rss_gb"],
        "peak_anon_gb": max(iv["peak_anon_gb"], iv.get("stream_peak_anon_gb") or 0.0),  # sampled RssAnon, streaming too
        "rss_anon_gb": iv["rss_anon_gb"],  # after the timed ivf runs: anonymous memory ...
        "rss_file_gb": iv["rss_file_gb"],  # ... and mapped file pages (the index's lists), reclaimable
        "rss_growth_100k_queries_gb": growth_100k,
        "rss_growth_stream_gb": growth,
        "rss_growth_100k_method": iv.get("rss_growth_100k_method"),  # measured | slope (n/4 -> n) | linear
        "stream_queries": args.stream_queries,
        "peak_rss_exact_gb": ex["peak_rss_gb"],
        "stream_peak_rss_gb": iv.get("stream_rss_peak_gb"),
        "stored_embedding_gb": emb_bytes / GiB,
        "rss_bound_gb": 1.5 * emb_bytes / GiB + 1.0,
        "sentences": ing["sentences"], "documents": ing["documents"], "queries": args.queries,
        "exact_queries": args.exact_queries, "budget_tokens": args.budget_tokens or None, "depth": iv["depth"],
        "query_texts": args.query_texts,
        "noise": args.noise, "repeats": args.repeats,
        "nprobe": iv["nprobe"], "index": ing["index"], "index_params": ing["index_params"],
        "dtype_store": ing["dtype_store"],
        "ingest": ing, "corpus": cinfo, "query_exact": ex, "query_ivf": iv,
        "quality": quality, "phase_s": phases,
        "api": iv["api"], "command": "python -m bench.scale " + " ".join(sys.argv[1:] if argv is None else argv),
        "host": machine_info(), "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }
    record["targets"] = {
        "query_per_s_ivf>=2000": record["query_per_s_ivf"] >= 2000,
        "ivf_recall_at_depth>=0.95": recall >= 0.95,
        "peak_rss<=1.5x_emb+1GiB": record["peak_rss_gb"] <= record["rss_bound_gb"],
        "rss_growth_100k<=0.5GiB": record["rss_growth_100k_queries_gb"] <= 0.5,
        "driver_peak_rss<=1GiB": None if record["driver_peak_rss_gb"] is None else record["driver_peak_rss_gb"] <= 1.0,
    }
    print_table([
        {"phase": "ingest" + (" (reused)" if ing.get("reused") else ""), "queries": "-",
         "rate/s": ing["ingest_sentences_per_s"], "seconds": ing["wall_s"], "peak RSS GiB": ing["driver_peak_rss_gb"],
         "note": f"{ing['sentences']:,} sentences, {ing['mode']}, {ing['embedder']}, {ing['index']} "
                 f"{ing['index_params']}" + (f"; index built in a child process (peak "
                                             f"{ing['index_peak_rss_gb']:.2f} GiB)" if ing.get("index_peak_rss_gb")
                                             else "")},
        {"phase": "query exact", "queries": ex["queries"], "rate/s": ex["query_per_s"],
         "seconds": median(ex["times_s"]),
         "peak RSS GiB": ex["peak_rss_gb"], "note": f"depth {ex['depth']}, {ex['api']}"},
        {"phase": "query ivf", "queries": iv["queries"], "rate/s": iv["query_per_s"],
         "seconds": median(iv["times_s"]),
         "peak RSS GiB": iv["peak_rss_gb"],
         "note": f"recall@{iv['depth']} {recall:.4f}, nprobe {iv['nprobe']}; after the runs RSS "
                 f"{iv['rss_anon_gb']:.2f} anonymous + {iv['rss_file_gb']:.2f} file-backed GiB; anonymous peak "
                 f"{iv['peak_anon_gb']:.2f}"},
        {"phase": "stream parquet", "queries": args.stream_queries,
         "rate/s": args.stream_queries / iv["stream_s"] if args.stream_queries else float("nan"),
         "seconds": iv.get("stream_s", float("nan")), "peak RSS GiB": iv.get("stream_rss_peak_gb", float("nan")),
         "note": f"growth {growth:.3f} GiB, {iv.get('stream_rows', 0):,} rows; per 100k queries "
                 f"{growth_100k:.3f} GiB ({record['rss_growth_100k_method']})"},
    ], title=f"bench.scale: {ing['sentences']:,} sentences, stored embeddings {emb_bytes / GiB:.3f} GiB "
             f"(RSS bound {record['rss_bound_gb']:.2f} GiB); phases {phases}")
    if pt is not None:
        pt["recall_at_depth"] = recall_at_depth(np.load(pt["hits"]), np.load(ex["hits"]))
        pt["vs_one_store"] = pt["query_per_s"] / iv["query_per_s"]
        pt["actor_peak_vs_one_store"] = max(pt["actor_peak_rss_gb"]) / iv["peak_rss_gb"]
        record["query_partitions"] = pt
        record["targets"]["partitions_q/s>=0.75x_one_store"] = pt["vs_one_store"] >= 0.75
        record["targets"]["partition_actor_peak<=0.35x_one_store"] = pt["actor_peak_vs_one_store"] <= 0.35
        print_table([{"run": "one store (ivf)", "q/s": iv["query_per_s"], "recall@depth": recall,
                      "peak RSS GiB": iv["peak_rss_gb"], "note": "one process"},
                     {"run": f"{pt['partitions']} partitions on Ray", "q/s": pt["query_per_s"],
                      "recall@depth": pt["recall_at_depth"], "peak RSS GiB": max(pt["actor_peak_rss_gb"]),
                      "note": f"{pt['vs_one_store']:.2f}x the q/s; per actor peak "
                              f"{', '.join(f'{x:.2f}' for x in pt['actor_peak_rss_gb'])} GiB "
                              f"({pt['actor_peak_vs_one_store']:.2f}x one store's); coordinator "
                              f"{pt['coordinator_peak_rss_gb']:.2f} GiB"}],
                    title=f"bench.scale --partitions {args.partitions} (per-partition {args.index} indexes)")
    if "skipped" in quality:
        print(f"quality: skipped ({quality['skipped']})", flush=True)
    else:
        print_table([{"queries": k, "n": quality[k]["queries"], "same top chunk": quality[k]["same_top_chunk"],
                      "recall@depth": quality[k]["recall_at_depth"]} for k in ("questions", "noisy_sentences")
                     if k in quality], title=f"quality (MiniLM, {quality['sentences']:,} sentences, IVF "
                                             f"{quality['index_params']} vs exact; "
                                             f"{quality['probed_share']:.0%} of the lists probed)")
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
