"""`qasc query`: a batch of questions against a store -> one row per returned chunk (or a table for people)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from engine.errors import QascError
from jobs.params_cli import add_qasc_arguments, params_from_args

RESULT_COLUMNS = ("query_id", "rank", "doc_id", "char_start", "char_end", "score", "text", "n_tokens",
                  "seed_ids", "sentence_start", "sentence_end")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="store folder written by `qasc ingest`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--queries", help="questions: .csv, .jsonl or .parquet with a `question` or `query` column and "
                     "an optional `id` column; '-' reads one question per line from stdin")
    src.add_argument("--question", help="a single question; prints a table")
    p.add_argument("--out", help="results file, .jsonl or .parquet (by extension); without it, a table is printed")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] for the model and the kernels")
    p.add_argument("--batch-size", type=int, default=2048, help="queries per kernel slice (bounds memory)")
    p.add_argument("--ray", action="store_true", help="run as a Ray job: shards of queries on actors")
    p.add_argument("--ray-address", default=None, help="Ray cluster address ('auto' = the running cluster); "
                   "implies --ray; default: a local Ray instance")
    p.add_argument("--workers", type=int, default=2, help="Ray query actors (each opens the store once)")
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


def result_rows(ids: list[str], results) -> list[dict]:
    rows = []
    for qid, chunks in zip(ids, results, strict=True):
        for rank, c in enumerate(chunks):
            rows.append({"query_id": qid, "rank": rank, "doc_id": c.doc_id, "char_start": c.char_start,
                         "char_end": c.char_end, "score": c.score, "text": c.text, "n_tokens": c.n_tokens,
                         "seed_ids": list(c.seed_ids), "sentence_start": c.sentence_start,
                         "sentence_end": c.sentence_end})
    return rows


def write_results(rows: list[dict], out: str) -> None:
    """Write atomically: a temp file beside the target, then rename."""
    target = Path(out)
    if target.suffix not in (".jsonl", ".parquet"):
        raise QascError(f"--out must end in .jsonl or .parquet, got {out!r}")
    if not target.parent.exists():
        raise QascError(f"output folder does not exist: {target.parent}")
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        if target.suffix == ".jsonl":
            with open(tmp, "w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pylist(rows, schema=RESULTS_SCHEMA()) if rows else RESULTS_SCHEMA().empty_table()
            pq.write_table(table, tmp)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def RESULTS_SCHEMA():  # noqa: N802 - a constant, built lazily so that pyarrow loads only when needed
    import pyarrow as pa

    return pa.schema([
        ("query_id", pa.string()), ("rank", pa.int32()), ("doc_id", pa.string()), ("char_start", pa.int64()),
        ("char_end", pa.int64()), ("score", pa.float32()), ("text", pa.large_string()), ("n_tokens", pa.int32()),
        ("seed_ids", pa.list_(pa.int32())), ("sentence_start", pa.int32()), ("sentence_end", pa.int32()),
    ])


def print_table(ids: list[str], questions: list[str], results, stream=None) -> None:
    stream = stream or sys.stdout
    for qid, question, chunks in zip(ids, questions, results, strict=True):
        print(f"\n[{qid}] {question}", file=stream)
        if not chunks:
            print("    (no chunk above the thresholds)", file=stream)
        for rank, c in enumerate(chunks):
            text = " ".join(c.text.split())
            text = text if len(text) <= 240 else text[:237] + "..."
            print(f"  #{rank + 1} score {c.score:.3f}  {c.doc_id} [{c.char_start}:{c.char_end}] "
                  f"{c.n_tokens} tok", file=stream)
            print(f"      {text}", file=stream)


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
    started = time.perf_counter()
    if args.ray or args.ray_address:
        from engine.config import EngineConfig
        from engine.store import Store
        from jobs.query_ray import run_query_job

        stored = EngineConfig.from_dict(Store.open(args.store, load_index=False).manifest.get("config", {}))
        params, retrieval = params_from_args(args, stored.qasc, stored.retrieval)
        rows = run_query_job(args.store, ids, questions, params, retrieval, workers=args.workers,
                             ray_address=args.ray_address, device=args.device)
        results = None
    else:
        engine = Engine.open(args.store, device=args.device)
        params, retrieval = params_from_args(args, engine.config.qasc, engine.config.retrieval)
        emb = engine.embed_queries(questions)
        results = engine.query_embedded(emb, params, retrieval, slice_size=args.batch_size)
        rows = result_rows(ids, results)
    seconds = time.perf_counter() - started
    if args.out:
        write_results(rows, args.out)
        print(f"queries {len(questions)}, chunks {len(rows)}, {seconds:.2f} s, "
              f"{len(questions) / max(seconds, 1e-9):.1f} queries/s -> {args.out}", file=sys.stderr)
    else:
        if results is None:
            from engine.types import Chunk

            results = [[] for _ in ids]
            pos = {qid: i for i, qid in enumerate(ids)}
            for r in rows:
                results[pos[r["query_id"]]].append(Chunk(r["doc_id"], r["char_start"], r["char_end"], r["text"],
                                                         r["score"], tuple(r["seed_ids"]), r["n_tokens"],
                                                         r["sentence_start"], r["sentence_end"]))
        print_table(ids, questions, results)
    return 0
