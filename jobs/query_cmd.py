"""`qasc query`: a batch of questions against a store -> one row per returned chunk (or a table for people)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from engine.errors import QascError
from engine.query import DEFAULT_SLICE_SIZE
from jobs.devices import add_device_argument
from jobs.params_cli import add_qasc_arguments, params_from_args
from jobs.query_ray import DEFAULT_WORKERS
from jobs.results import ResultWriter, print_table, rows_to_chunks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="store folder written by `qasc ingest`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--queries", help="questions: .csv, .jsonl or .parquet with a `question` or `query` column and "
                     "an optional `id` column; '-' reads one question per line from stdin")
    src.add_argument("--question", help="a single question; prints a table")
    p.add_argument("--out", help="results file, .jsonl or .parquet (by extension); without it, a table is printed")
    add_device_argument(p)
    p.add_argument("--batch-size", type=int, default=DEFAULT_SLICE_SIZE,
                   help=f"queries per slice: embedded, answered and written to --out together (bounds memory; "
                   f"default {DEFAULT_SLICE_SIZE})")
    p.add_argument("--nprobe", type=int, default=None,
                   help="ivf stores: inverted lists probed per query (default: the store's, 16 for new stores; "
                        "more = higher recall, slower); local path only")
    p.add_argument("--ray", action="store_true", help="run as a Ray job: shards of queries on actors")
    p.add_argument("--ray-address", default=None, help="Ray cluster address ('auto' = the running cluster); "
                   "implies --ray; default: RAY_ADDRESS, else the cluster of a `ray job submit` job, else a "
                   "local Ray instance")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"Ray query actors (each opens the store once; default {DEFAULT_WORKERS})")
    add_qasc_arguments(p)


def read_queries(path: str) -> tuple[list[str], list[str]]:
    """A queries file (or '-' for stdin lines) -> (ids, questions)."""
    if path == "-":
        questions = [line.rstrip("\n") for line in sys.stdin if line.strip()]
        return [str(i) for i in range(len(questions))], questions
    src = Path(path)
    if not src.is_file():
        raise QascError(f"queries file not found: {path}")
    try:
        if src.suffix == ".csv":
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(src)
        elif src.suffix == ".jsonl":
            import pyarrow.json as pajson

            table = pajson.read_json(src)
        elif src.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(src)
        else:
            raise QascError(f"{path}: unsupported queries format {src.suffix!r}; use .csv, .jsonl or .parquet")
    except QascError:
        raise
    except Exception as exc:  # pyarrow raises several types for malformed files
        raise QascError(f"{path}: cannot read queries: {str(exc).splitlines()[0]}") from exc
    column = "question" if "question" in table.column_names else "query" if "query" in table.column_names else None
    if column is None:
        raise QascError(f"{path}: no `question` or `query` column (columns: {', '.join(table.column_names)})")
    questions = table.column(column).to_pylist()
    for i, q in enumerate(questions):
        if not isinstance(q, str) or not q.strip():
            raise QascError(f"{path}: row {i} has an empty question")
    if "id" in table.column_names:
        ids = [str(x) for x in table.column("id").to_pylist()]
        if len(set(ids)) != len(ids):
            raise QascError(f"{path}: duplicate values in the `id` column")
    else:
        ids = [str(i) for i in range(len(questions))]
    if not questions:
        raise QascError(f"{path}: no questions")
    return ids, questions


def run(args: argparse.Namespace) -> int:
    from engine.query import Engine

    if args.question is not None:
        if not args.question.strip():
            raise QascError("--question is empty")
        ids, questions = ["0"], [args.question]
    else:
        ids, questions = read_queries(args.queries)
    if args.batch_size < 1:
        raise QascError(f"--batch-size must be >= 1, got {args.batch_size}")
    writer = ResultWriter(args.out) if args.out else None  # checks --out before any work
    started = time.perf_counter()
    if (args.ray or args.ray_address) and args.nprobe is not None:
        raise QascError("--nprobe applies to the local path only (Ray actors open the store with its own nprobe)")
    if args.ray or args.ray_address:
        from engine.config import EngineConfig
        from engine.store import read_manifest
        from jobs.query_ray import run_query_job

        stored = EngineConfig.from_dict(read_manifest(args.store).get("config", {}))  # the actors open the store
        params, retrieval = params_from_args(args, stored.qasc, stored.retrieval)
        batches = run_query_job(args.store, ids, questions, params, retrieval, workers=args.workers,
                                ray_address=args.ray_address, device=args.device, slice_size=args.batch_size)
    else:
        engine = Engine.open(args.store, device=args.device, nprobe=args.nprobe)
        params, retrieval = params_from_args(args, engine.config.qasc, engine.config.retrieval)
        batches = engine.query_stream(questions, ids, params, retrieval, slice_size=args.batch_size)
    if writer is not None:  # results go to the file slice by slice: memory does not grow with the queries
        with writer:
            writer.write_all(batches)
        seconds = time.perf_counter() - started
        print(f"queries {len(questions)}, chunks {writer.rows}, {seconds:.2f} s, "
              f"{len(questions) / max(seconds, 1e-9):.1f} queries/s -> {args.out}", file=sys.stderr)
    else:
        rows = [row for batch in batches for row in batch.to_pylist()]
        print_table(ids, questions, rows_to_chunks(ids, rows))
    return 0
