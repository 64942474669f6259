"""bench.scale's query child (`python -m bench.scale --child SPEC`, mode exact | ivf): an Engine over the store
without the query model, noisy copies of stored vectors as pre-embedded queries (bench.synthetic), timed end to end
through Engine.query_batches; the ivf child then streams results to Parquet through jobs.results.ResultWriter and
measures the RSS growth (bench.memory.PeakRss)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.common import median
from bench.memory import GiB, PeakRss, proc_status
from bench.synthetic import noisy_queries, spread

GROWTH_QUERIES = 100_000  # the streamed batch: RSS growth is reported for this many queries
API = "query_batches+ResultWriter"  # the query path timed (the JSON record's `api`)


class AnonPeak:
    """The process's anonymous resident memory (RssAnon), its highest value sampled every `every_s` seconds from
    now on, by a daemon thread: `.peak` in bytes."""

    def __init__(self, every_s: float = 0.02) -> None:
        self.peak, self.every_s = proc_status("RssAnon"), every_s
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, proc_status("RssAnon"))
            time.sleep(self.every_s)


def open_engine(store_dir: Path, exact: bool, nprobe: int | None = None):
    """An Engine on the CPU over the store, without the query model (queries come pre-embedded); exact: the store is
    opened without its FAISS index, so that search is exact (blocked: engine.store.index.exact_topk); nprobe:
    overrides the IVF index's (None or 0: the store's)."""
    import torch

    from qasc.engine.query import Engine
    from qasc.engine.store.reader import Store

    store = Store.open(store_dir, load_index=not exact, nprobe=nprobe if nprobe and not exact else None)
    return Engine(store, None, store.config, torch.device("cpu"))


def source_texts(engine, sources) -> list[str]:
    """sources (Q,) int64 store rows -> each row's sentence text: the question text of a query made from it."""
    out = []  # the engine's own per-row arrays: each row's document and that document's first row
    tables = engine.tables
    for r, d, first in zip(sources.tolist(), tables.doc_of_row[sources].tolist(), tables.doc_first[sources].tolist(),
                           strict=True):
        doc = engine.store.docs[d]
        out.append(doc.text[int(doc.char_start[r - first]) : int(doc.char_end[r - first])])
    return out


def answer(engine, query_emb, slice_size: int, texts: list[str] | None = None) -> int:
    """End to end (search + QASC + assembly) through Engine.query_batches (Arrow batches) -> rows returned;
    texts: the questions' texts (the gated lexical term runs; None: vectors only)."""
    return sum(b.num_rows for b in engine.query_batches(query_emb, slice_size=slice_size, questions=texts))


def stream_results(engine, query_emb, path: Path, slice_size: int, texts: list[str] | None = None) -> int:
    """Results of query_emb written to path (.parquet) -> rows written: Engine.query_batches into
    jobs.results.ResultWriter (a row group as each slice finishes)."""
    from qasc.jobs.results import ResultWriter

    n = 0
    with ResultWriter(str(path)) as writer:
        for batch in engine.query_batches(query_emb, slice_size=slice_size, questions=texts):
            writer.write(batch)
            n += batch.num_rows
    return n


def query_child(spec: dict) -> dict:
    """One query process (mode exact | ivf): open, warm up, time --repeats runs, save hits; ivf also streams."""
    import torch

    from qasc.engine.config import budget_setting

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    exact = spec["mode"] == "exact"
    anon = AnonPeak()  # the anonymous part of the peak (VmHWM counts mapped file pages too), sampled
    t0 = time.perf_counter()
    engine = open_engine(Path(spec["store"]), exact, spec.get("nprobe"))
    if spec.get("budget_tokens"):  # every query with a token budget: the budget fill (passages) runs too, on the
        # setting `qasc query --budget-tokens N` answers with (the budget profile on the store's shipped setting)
        qasc, retrieval, _ = budget_setting(engine.config.qasc.replace(budget_tokens=spec["budget_tokens"]),
                                            engine.config.retrieval)
        engine.config = replace(engine.config, qasc=qasc, retrieval=retrieval)
    out = {"mode": spec["mode"], "open_s": time.perf_counter() - t0, "rss_open_gb": proc_status("VmRSS") / GiB,
           "api": API, "nprobe": int(getattr(engine.store.index, "nprobe", 0) or 0)}
    depth = min(engine.config.retrieval.depth, engine.n_total)
    scale = spread(engine.embeddings)
    queries, sources = noisy_queries(engine.embeddings, spec["pool"], spec["noise"], spec["seed"], scale)
    queries, sources = queries[: spec["queries"]], sources[: spec["queries"]]  # exact: the first of the same pool
    src_vec = engine.embeddings[sources].float()
    out.update(depth=depth, spread=scale, query_source_cos=float(
        (queries * src_vec / src_vec.norm(dim=1, keepdim=True)).sum(1).mean()))
    del src_vec  # (Q, dim) float32: not part of the engine's memory
    t0 = time.perf_counter()
    hits = engine.retrieval.search(queries, depth).cpu().numpy()
    out["search_s"] = time.perf_counter() - t0
    out["search_per_s"] = len(queries) / max(out["search_s"], 1e-9)
    np.save(spec["hits"], hits)
    out["source_in_hits"] = float((hits == sources.numpy()[:, None]).any(1).mean())
    texts = source_texts(engine, sources) if spec.get("texts") else None
    out["query_texts"] = texts is not None
    if spec.get("queries_out"):  # the same queries for the partitioned collection's child (`partitions_child`)
        np.save(spec["queries_out"], queries.numpy())
        Path(spec["queries_out"]).with_suffix(".json").write_text(json.dumps(texts))
    # warm-up: per-store dots and block stats; with texts the lexical BM25 index too (its build counts in the peak)
    answer(engine, queries[: min(len(queries), 256)], spec["slice"], texts and texts[:256])
    times, rows = [], 0
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        rows = answer(engine, queries, spec["slice"], texts)
        times.append(time.perf_counter() - t0)
    # the resident memory after the timed runs, split: anonymous (the store's vectors, the engine's tables, the
    # lexical index) and file-backed (pages of mapped files: the FAISS index's lists, read where probed)
    out.update(queries=len(queries), times_s=times, rows=rows, query_per_s=len(queries) / median(times),
               peak_rss_gb=proc_status("VmHWM") / GiB, rss_anon_gb=proc_status("RssAnon") / GiB,
               rss_file_gb=proc_status("RssFile") / GiB, peak_anon_gb=anon.peak / GiB)
    if spec["stream"]:
        stream_q, stream_src = noisy_queries(engine.embeddings, spec["stream"], spec["noise"], spec["seed"] + 1, scale)
        st = source_texts(engine, stream_src) if texts is not None else None
        path = Path(spec["stream_path"])
        stream_results(engine, stream_q[: spec["slice"]], path, spec["slice"], st and st[: spec["slice"]])  # not growth
        path.unlink()
        n, sl = spec["stream"], spec["slice"]
        # below GROWTH_QUERIES a first point at n/4 queries (>= 2 slices: one slice's working memory is the same
        # at any Q) gives the slope; with fewer than 4 slices, the growth is scaled linearly (an upper bound)
        small = max(n // 4, 2 * sl) if 4 * sl <= n < GROWTH_QUERIES else 0
        method = "measured" if n >= GROWTH_QUERIES else "slope" if small else "linear"
        if small:
            with PeakRss() as mem:
                stream_results(engine, stream_q[:small], path, spec["slice"], st and st[:small])
            path.unlink()
            base, growth_small = mem.before, mem.peak - mem.before
        t0 = time.perf_counter()
        with PeakRss() as mem:
            n_rows = stream_results(engine, stream_q, path, spec["slice"], st)
        growth = mem.peak - (base if small else mem.before)  # against the first baseline: retained memory counts
        if method == "slope":
            at_target = growth + max(0, growth - growth_small) / (n - small) * (GROWTH_QUERIES - n)
        else:
            at_target = growth * GROWTH_QUERIES / n if method == "linear" else growth
        out.update(stream_queries=n, stream_rows=n_rows, stream_s=time.perf_counter() - t0,
                   stream_file_gb=path.stat().st_size / GiB, stream_rss_before_gb=mem.before / GiB,
                   stream_rss_peak_gb=mem.peak / GiB, stream_peak_anon_gb=anon.peak / GiB,
                   rss_growth_stream_gb=growth / GiB,
                   rss_growth_after_gb=(mem.after - mem.before) / GiB, stream_hwm_reset=mem.hwm_reset,
                   stream_small_queries=small, rss_growth_small_gb=growth_small / GiB if small else None,
                   rss_growth_100k_gb=at_target / GiB, rss_growth_100k_method=method)
        path.unlink()
    return out


def partitions_child(spec: dict) -> dict:
    """The collection of the store's rows in spec["partitions"] partitions (bench.partitions.split_store), served by
    as many Ray actors in a local Ray instance of this machine's cores (jobs.query_partitions), the engine here
    without the query model: the ivf child's queries and texts (spec["queries_in"]) timed end to end through
    Engine.query_batches as that child times them; the search's hits (recall), each actor's peak RSS (VmHWM) and
    this process's (the coordinator's)."""
    import ray
    import torch

    from qasc.engine.query import Engine
    from qasc.engine.store.collection_reader import open_collection
    from qasc.jobs.query_partitions import ray_partitions
    from qasc.jobs.ray_session import connect

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    queries = torch.from_numpy(np.load(spec["queries_in"]))
    texts = json.loads(Path(spec["queries_in"]).with_suffix(".json").read_text())
    connect(None, num_cpus=os.cpu_count())
    anon = AnonPeak()
    t0 = time.perf_counter()
    store = open_collection(spec["store"], vectors=False)
    actors: list = []
    parts = ray_partitions(actors_out=actors)(store, torch.device("cpu"))
    engine = Engine(store, None, store.config, torch.device("cpu"), partitions=parts)
    out = {"mode": "partitions", "partitions": len(actors), "open_s": time.perf_counter() - t0,
           "rss_open_gb": proc_status("VmRSS") / GiB, "api": API}
    depth = min(engine.config.retrieval.depth, engine.n_total)
    t0 = time.perf_counter()
    hits = engine.retrieval.search(queries, depth).cpu().numpy()
    out["search_s"] = time.perf_counter() - t0
    np.save(spec["hits"], hits)
    answer(engine, queries[: min(len(queries), 256)], spec["slice"], texts and texts[:256])  # warm-up, as the ivf child
    times, rows = [], 0
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        rows = answer(engine, queries, spec["slice"], texts)
        times.append(time.perf_counter() - t0)
    actor_peaks = [int(x) for x in parts.peak_rss()]
    out.update(queries=len(queries), depth=depth, times_s=times, rows=rows, query_per_s=len(queries) / median(times),
               actor_peak_rss_gb=[x / GiB for x in actor_peaks], coordinator_peak_rss_gb=proc_status("VmHWM") / GiB,
               coordinator_peak_anon_gb=anon.peak / GiB, rss_anon_gb=proc_status("RssAnon") / GiB)
    ray.shutdown()
    return out
