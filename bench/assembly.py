"""Result assembly and streaming: the per-chunk loop against the vectorized columns, and memory while streaming.

  assemble  one slice of --slice pre-embedded queries over a synthetic store of --n sentences: run_batch (search +
            candidates + QASC), then the old loop (assemble_chunks_reference: a mask over L per chunk, one Chunk
            each), assemble_columns, columns -> Chunks (Engine.query_embedded) and columns -> Arrow RecordBatch
            (Engine.query_batches), each as a share of run_batch.
  stream    --stream-queries queries (embedded slice by slice, as Engine.query_stream does) through
            Engine.query_batches into a ResultWriter (.parquet) over a synthetic store of --stream-n sentences:
            RSS after the first slice and its peak over the run (sampled after every slice), rows written.
            --old-queries Q also runs the path before streaming (query_embedded -> rows -> one table) for Q
            queries, for comparison.

    python -m bench.assembly                                      # n 200000, slice 2048, 100k queries streamed
    python -m bench.assembly --stream-queries 0                   # assembly only
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.common import emit_json, machine_info, median, print_table, time_repeats

GIB = 1 << 30


def rss() -> int:
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss


def queries(engine, n: int, seed: int):
    """n unit vectors near random store rows (n, dim) float32: hits and chunks like real questions get."""
    import torch

    g = torch.Generator().manual_seed(seed)
    base = torch.as_tensor(engine.store.embeddings)[torch.randint(0, engine.n_total, (n,), generator=g)].float()
    return torch.nn.functional.normalize(base + 0.6 * torch.randn(base.shape, generator=g), dim=1)


def bench_assembly(args, record: dict) -> list[dict]:
    import pyarrow as pa
    import torch

    from bench.query import synthetic_engine
    from qasc.engine.assemble import assemble_chunks_reference, assemble_columns

    engine = synthetic_engine(args.n, "cpu", "torch", with_model=False)
    params, retrieval = engine.config.qasc, engine.config.retrieval
    emb = queries(engine, args.slice, seed=1)
    table = engine.row_table
    t_run = median(time_repeats(lambda: engine.run_batch(emb, params, retrieval), args.repeats, 1))
    batch, cand = engine.run_batch(emb, params, retrieval)
    rows = torch.where(cand.valid, cand.rows, torch.zeros_like(cand.rows))
    doc_of, sent_of = torch.as_tensor(table.doc), torch.as_tensor(table.sent)
    cols = assemble_columns(batch, rows, table)
    ids = pa.array([str(i) for i in range(args.slice)])
    timings = {
        "search+qasc (run_batch)": t_run,
        "old loop -> Chunks": median(time_repeats(
            lambda: assemble_chunks_reference(batch, engine.store.docs, doc_of[rows], sent_of[rows]), args.repeats)),
        "assemble_columns": median(time_repeats(lambda: assemble_columns(batch, rows, table), args.repeats)),
        "  + columns -> Chunks": median(time_repeats(lambda: cols.to_chunks(table.doc_ids), args.repeats)),
        "  + columns -> RecordBatch": median(time_repeats(
            lambda: cols.to_record_batch(ids, table.doc_id_array), args.repeats)),
    }
    assert assemble_chunks_reference(batch, engine.store.docs, doc_of[rows], sent_of[rows]) == cols.to_chunks(
        table.doc_ids)
    out = [{"step": k, "ms": 1e3 * v, "us/query": 1e6 * v / args.slice, "us/chunk": 1e6 * v / max(len(cols), 1),
            "vs run_batch": v / t_run} for k, v in timings.items()]
    record.update(n=args.n, slice=args.slice, chunks=len(cols), seeds=int(cols.seed_offsets[-1]),
                  assemble_ms={k.strip(" +"): 1e3 * v for k, v in timings.items()})
    new_rows = timings["assemble_columns"] + timings["  + columns -> RecordBatch"]
    record["assembly_share_of_batch"] = new_rows / (t_run + new_rows)
    record["old_assembly_share_of_batch"] = timings["old loop -> Chunks"] / (t_run + timings["old loop -> Chunks"])
    return out


def bench_stream(args, record: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.query import synthetic_engine
    from qasc.jobs.results import ResultWriter, result_rows, rows_to_table

    engine = synthetic_engine(args.stream_n, "cpu", "torch", with_model=False)
    _ = engine.row_table
    out = Path(tempfile.mkdtemp()) / "answers.parquet"
    base = rss()
    samples, first, n_rows = [], None, 0
    started = time.perf_counter()
    with ResultWriter(out) as w:
        for i, lo in enumerate(range(0, args.stream_queries, args.slice)):
            n = min(args.slice, args.stream_queries - lo)
            emb = queries(engine, n, seed=100 + i)  # embedded slice by slice, as query_stream does
            w.write_all(engine.query_batches(emb, [f"q{lo + j}" for j in range(n)], slice_size=args.slice))
            samples.append(rss())
            if first is None:
                first = samples[-1]
    seconds = time.perf_counter() - started
    n_rows = pq.ParquetFile(out).metadata.num_rows
    size = out.stat().st_size
    out.unlink()
    record.update(stream_queries=args.stream_queries, stream_n=args.stream_n, stream_rows=n_rows,
                  stream_seconds=seconds, stream_queries_per_s=args.stream_queries / seconds,
                  stream_file_mb=size / 1e6, rss_start_gb=base / GIB, rss_after_first_slice_gb=first / GIB,
                  rss_peak_gb=max(samples) / GIB, rss_growth_after_first_slice_gb=(max(samples) - first) / GIB,
                  rss_growth_gb=(max(samples) - base) / GIB)
    if args.old_queries:
        before = rss()
        emb = queries(engine, args.old_queries, seed=7)
        results = engine.query_embedded(emb, slice_size=args.slice)
        rows = result_rows([f"q{j}" for j in range(args.old_queries)], results)
        table: pa.Table = rows_to_table(rows)
        peak = rss()
        record.update(old_queries=args.old_queries, old_rows=table.num_rows, old_rss_growth_gb=(peak - before) / GIB)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=200_000, help="sentences of the synthetic store for the assembly timing")
    p.add_argument("--slice", type=int, default=2048, help="queries per slice")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median)")
    p.add_argument("--stream-queries", type=int, default=100_000, help="queries streamed to Parquet (0: skip)")
    p.add_argument("--stream-n", type=int, default=50_000, help="sentences of the synthetic store for streaming")
    p.add_argument("--old-queries", type=int, default=0, help="queries through the collect-all path (0: skip)")
    args = p.parse_args(argv)
    import torch

    record: dict = {"torch_threads": torch.get_num_threads()}
    steps = bench_assembly(args, record)
    print(f"\nsynthetic store {args.n:,} sentences, one slice of {args.slice} queries, {record['chunks']} chunks, "
          f"{record['seeds']} seeds; median of {args.repeats}")
    print_table(steps, ["step", "ms", "us/query", "us/chunk", "vs run_batch"])
    if args.stream_queries:
        bench_stream(args, record)
        print(f"\nstreamed {args.stream_queries:,} queries ({record['stream_rows']:,} rows, "
              f"{record['stream_file_mb']:.1f} MB Parquet) over {args.stream_n:,} sentences in "
              f"{record['stream_seconds']:.1f} s ({record['stream_queries_per_s']:.0f} queries/s): RSS "
              f"{record['rss_start_gb']:.2f} GiB at start, {record['rss_after_first_slice_gb']:.2f} after the first "
              f"slice, peak {record['rss_peak_gb']:.2f} (growth {record['rss_growth_gb']:.3f} GiB from start, "
              f"{record['rss_growth_after_first_slice_gb']:.3f} after the first slice)")
        if args.old_queries:
            print(f"collect-all path, {args.old_queries:,} queries ({record['old_rows']:,} rows): RSS growth "
                  f"{record['old_rss_growth_gb']:.3f} GiB")
    record["machine"] = machine_info("cpu")
    emit_json(record)


if __name__ == "__main__":
    main()
