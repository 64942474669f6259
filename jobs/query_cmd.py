"""`qasc query`: a batch of questions against a store -> one row per returned chunk (or a table for people)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from qasc.engine.errors import QascError
from qasc.engine.presets import PRESETS, describe
from qasc.engine.query import DEFAULT_SLICE_SIZE, MAX_QUERY_CHARS
from qasc.engine.rerank import RERANK_TOP
from qasc.jobs.devices import add_device_argument
from qasc.jobs.params_cli import (
    ADVANCED_DESCRIPTION,
    ADVANCED_TITLE,
    add_qasc_arguments,
    removed_flag_error,
    setting_from_args,
)
from qasc.jobs.query_ray import DEFAULT_WORKERS
from qasc.jobs.results import ResultWriter, print_table, rows_to_chunks


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The main group (the options) holds what most queries need; every other knob goes to the advanced group."""
    p.usage = ("%(prog)s --store STORE (--queries QUERIES | --question QUESTION) [--out OUT] "
               f"[--preset {{{','.join(PRESETS)}}}] [options]")
    p.epilog = ("Presets (--preset) set the chunking and pre-retrieval knobs of the advanced group; flags given "
                "override them. qasc query prints on stderr which preset answered.")
    p.add_argument("--store", required=True, help="store folder written by `qasc ingest`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--queries", help="questions: .csv, .jsonl or .parquet with a `question` or `query` column and "
                     "an optional `id` column; '-' reads one question per line from stdin")
    src.add_argument("--question", help="a single question; prints a table")
    p.add_argument("--out", help="results file, .jsonl or .parquet (by extension); without it, a table is printed")
    p.add_argument("--reranker", default=None, metavar="NAME_OR_PATH",
                   help="rerank stage: a cross-encoder (transformers sequence classifier, one label) scores each "
                   "query's best chunks; a model folder, or a hub name where the hub is reachable; default: off")
    advanced = p.add_argument_group(ADVANCED_TITLE, ADVANCED_DESCRIPTION)
    add_qasc_arguments(p, advanced)
    add_device_argument(p)
    p.add_argument("--batch-size", type=int, default=DEFAULT_SLICE_SIZE,
                   help=f"queries per slice: embedded, answered and written to --out together (bounds memory; "
                   f"default {DEFAULT_SLICE_SIZE})")
    p.add_argument("--ray", action="store_true", help="run as a Ray job: shards of queries on actors")
    p.add_argument("--ray-address", default=None, help="Ray cluster address ('auto' = the running cluster); "
                   "implies --ray; default: RAY_ADDRESS, else the cluster of a `ray job submit` job, else a "
                   "local Ray instance")
    p.add_argument("--workers", type=int, default=None,
                   help=f"Ray query actors (each opens the store once; default {DEFAULT_WORKERS}); for a collection, "
                   "the actors its partitions are dealt to (default one per partition); needs --ray")
    advanced.add_argument("--nprobe", type=int, default=None,
                          help="ivf stores: inverted lists probed per query (default: the store's, at least 1/16 of "
                               "its lists and 16; more = higher recall, slower); local path only")
    advanced.add_argument("--max-codes", type=int, default=None,
                          help="ivf stores: at most this many codes scanned per query, the probed lists nearest "
                               "first (FAISS's max_codes; default: none); local path only")
    advanced.add_argument("--rerank-top", type=int, default=None,
                          help=f"--reranker: the first stage's best chunks a query it scores (default {RERANK_TOP})")


def _csv_header(src: Path) -> list[str]:
    """The column names of a CSV file's first row ([] for an empty file)."""
    import csv

    with open(src, newline="", encoding="utf-8-sig", errors="replace") as f:
        return next(csv.reader(f), [])


def _read_jsonl(src: Path, path: str) -> tuple[dict[str, list], list[str]]:
    """One JSON object per line (blank lines skipped) -> (the values of its id / question / query keys, as
    written: ids of mixed types are fine, each is turned into text by `_id_text`; every key seen)."""
    import json

    columns: dict[str, list] = {}
    seen: dict[str, None] = {}
    n = 0
    with open(src, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise QascError(f"{path}: line {line_no} is not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise QascError(f"{path}: line {line_no} is not a JSON object")
            seen.update(dict.fromkeys(obj))
            for key in ("id", "question", "query"):
                if key in obj:
                    columns.setdefault(key, [None] * n).append(obj[key])
            n += 1
            for values in columns.values():
                values.extend([None] * (n - len(values)))
    return columns, list(seen)


def _id_text(value: object, path: str, row: int) -> str:
    """An `id` value as text: strings verbatim, integers in decimal, JSON true/false/null refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        raise QascError(f"{path}: row {row} has no usable id ({value!r}); ids are text or integers")
    return str(value)


def read_queries(path: str) -> tuple[list[str], list[str]]:
    """A queries file (or '-' for stdin lines) -> (ids, questions)."""
    if path == "-":
        questions = [line.rstrip("\n") for line in sys.stdin if line.strip()]
        if not questions:
            raise QascError("stdin (--queries -): no questions")
        return [str(i) for i in range(len(questions))], questions
    src = Path(path)
    if not src.is_file():
        raise QascError(f"queries file not found: {path}")
    try:
        if src.suffix == ".csv":
            import pyarrow as pa
            import pyarrow.csv as pacsv

            # ids and questions as written: no type inference ("007" stays "007", "NA" stays "NA")
            found = _csv_header(src)
            text = {c: pa.string() for c in ("id", "question", "query") if c in found}
            table = pacsv.read_csv(src, convert_options=pacsv.ConvertOptions(column_types=text,
                                                                            strings_can_be_null=False))
            columns = {c: table.column(c).to_pylist() for c in text}
        elif src.suffix == ".jsonl":
            columns, found = _read_jsonl(src, path)
        elif src.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(src)
            found = table.column_names
            columns = {c: table.column(c).to_pylist() for c in ("id", "question", "query") if c in found}
        else:
            raise QascError(f"{path}: unsupported queries format {src.suffix!r}; use .csv, .jsonl or .parquet")
    except QascError:
        raise
    except Exception as exc:  # pyarrow raises several types for malformed files
        raise QascError(f"{path}: cannot read queries: {str(exc).splitlines()[0]}") from exc
    column = "question" if "question" in columns else "query" if "query" in columns else None
    if column is None:
        raise QascError(f"{path}: no `question` or `query` column (columns: {', '.join(found) or 'none'})")
    questions = columns[column]
    if "id" in columns:
        ids = [_id_text(x, path, i) for i, x in enumerate(columns["id"])]
        first: dict[str, int] = {}
        for i, x in enumerate(ids):
            if x in first:
                raise QascError(f"{path}: duplicate id {x!r} in rows {first[x]} and {i}")
            first[x] = i
    else:
        ids = [str(i) for i in range(len(questions))]
    for i, q in enumerate(questions):
        where = f"{path}: row {i} (id {ids[i]!r})"
        if q is not None and not isinstance(q, str):
            raise QascError(f"{where}: the {column} is a {type(q).__name__} ({q!r}), not text")
        if not q or not q.strip():
            raise QascError(f"{where} has an empty {column}")
        if len(q) > MAX_QUERY_CHARS:
            raise QascError(f"{where}: the {column} has {len(q):,} characters; the limit is {MAX_QUERY_CHARS:,}")
    if not questions:
        raise QascError(f"{path}: no questions")
    return ids, questions


def run(args: argparse.Namespace) -> int:
    from qasc.engine.config import EngineConfig
    from qasc.engine.embedder import resolve_device
    from qasc.engine.query import Engine
    from qasc.engine.store.collection import check_collection, is_collection, store_manifest
    from qasc.engine.store.search import IvfSettings

    if getattr(args, "removed_flag", None):  # before anything else: the flag names a setting that is gone
        raise removed_flag_error(args.removed_flag)

    if args.question is not None:
        if not args.question.strip():
            raise QascError("--question is empty")
        ids, questions = ["0"], [args.question]
    else:
        ids, questions = read_queries(args.queries)
    if args.batch_size < 1:
        raise QascError(f"--batch-size must be >= 1, got {args.batch_size}")
    ray = bool(args.ray or args.ray_address)
    if ray and args.nprobe is not None:
        raise QascError("--nprobe applies to the local path only (Ray actors open the store with its own nprobe)")
    if args.max_codes is not None and args.max_codes < 0:
        raise QascError(f"--max-codes must be >= 0 (0: no budget), got {args.max_codes}")
    if ray and args.max_codes is not None:
        raise QascError("--max-codes applies to the local path only (Ray actors open the store with its own index)")
    if args.workers is not None and args.workers < 1:
        raise QascError(f"--workers must be >= 1, got {args.workers}")
    if args.workers is not None and not ray:
        raise QascError(f"--workers {args.workers} needs --ray (the local path answers in this process)")
    workers = DEFAULT_WORKERS if args.workers is None else args.workers
    if not ray:  # a Ray job's actors resolve --device on their own nodes (the driver may have no GPU)
        try:
            resolve_device(args.device)
        except ValueError as exc:
            raise QascError(f"--device: {exc}") from None
    # every flag checked against the store's settings before the model loads or anything is written
    manifest = store_manifest(args.store)  # a collection's: its partitions' settings
    if is_collection(args.store):
        check_collection(args.store)  # a partition that cannot be opened: one line, before any work
        if args.nprobe is not None or args.max_codes is not None:
            raise QascError(f"{args.store} is a collection: each partition is searched with its own index's "
                            f"settings; --nprobe / --max-codes do not apply")
    kind = manifest.get("index", {}).get("kind")
    if args.nprobe is not None and kind != "ivf":
        raise QascError(f"--nprobe applies to ivf stores; {args.store} has a {kind} index")
    if args.max_codes is not None and kind != "ivf":
        raise QascError(f"--max-codes applies to ivf stores; {args.store} has a {kind} index")
    stored = EngineConfig.from_dict(manifest.get("config", {}))
    params, retrieval, preset = setting_from_args(args, stored.qasc, stored.retrieval)
    rerank_top = RERANK_TOP if args.rerank_top is None else args.rerank_top
    if args.rerank_top is not None and args.reranker is None:
        raise QascError("--rerank-top needs --reranker")
    if rerank_top < 1:
        raise QascError(f"--rerank-top must be >= 1, got {rerank_top}")
    if args.reranker is not None:
        from qasc.engine.rerank import resolve_reranker

        resolve_reranker(args.reranker)  # its config only: a bad one fails before the store or any output
    # checks --out before any work
    writer = ResultWriter(args.out, reranked=args.reranker is not None) if args.out else None
    print(f"qasc query: {describe(preset, params, retrieval)}", file=sys.stderr)
    started = time.perf_counter()
    if ray and is_collection(args.store):  # its partitions on actors, the engine in this process
        from qasc.jobs.query_partitions import run_collection_job

        batches = run_collection_job(args.store, ids, questions, params, retrieval, workers=args.workers,
                                     ray_address=args.ray_address, device=args.device, slice_size=args.batch_size,
                                     reranker=args.reranker, rerank_top=rerank_top)
    elif ray:
        from qasc.jobs.query_ray import run_query_job

        batches = run_query_job(args.store, ids, questions, params, retrieval, workers=workers,
                                ray_address=args.ray_address, device=args.device, slice_size=args.batch_size,
                                reranker=args.reranker, rerank_top=rerank_top)
    else:
        ivf = IvfSettings(args.nprobe, args.max_codes or 0)  # the flags as one value (engine.store.search)
        engine = Engine.open(args.store, device=args.device, ivf=ivf, reranker=args.reranker, rerank_top=rerank_top)
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
