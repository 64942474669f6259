"""Query results, one row per returned chunk: the columns, their Arrow schema, rows <-> Chunk, rows/chunks
-> Arrow table, columns for Ray batches, the atomic .jsonl / .parquet writer and the table printed for people.

The local and the Ray paths of `qasc query` and the Ray Data stage (jobs/ray_data.py) all go through here,
so their rows are the same.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.errors import QascError
from engine.types import Chunk

RESULT_COLUMNS = ("query_id", "rank", "doc_id", "char_start", "char_end", "score", "text", "n_tokens",
                  "seed_ids", "sentence_start", "sentence_end")
OUT_SUFFIXES = (".jsonl", ".parquet")


def results_schema():
    """The Arrow schema of RESULT_COLUMNS (built on call, so that pyarrow loads only when needed)."""
    import pyarrow as pa

    return pa.schema([
        ("query_id", pa.string()), ("rank", pa.int32()), ("doc_id", pa.string()), ("char_start", pa.int64()),
        ("char_end", pa.int64()), ("score", pa.float32()), ("text", pa.large_string()), ("n_tokens", pa.int32()),
        ("seed_ids", pa.list_(pa.int32())), ("sentence_start", pa.int32()), ("sentence_end", pa.int32()),
    ])


def chunk_row(qid: str, rank: int, c: Chunk) -> dict:
    return {"query_id": qid, "rank": rank, "doc_id": c.doc_id, "char_start": c.char_start, "char_end": c.char_end,
            "score": c.score, "text": c.text, "n_tokens": c.n_tokens, "seed_ids": list(c.seed_ids),
            "sentence_start": c.sentence_start, "sentence_end": c.sentence_end}


def result_rows(ids: Sequence[str], results: Sequence[Sequence[Chunk]]) -> list[dict]:
    """Per query its chunks in rank order -> rows (query order, then rank)."""
    return [chunk_row(qid, rank, c) for qid, chunks in zip(ids, results, strict=True) for rank, c in enumerate(chunks)]


def row_from_record(r: dict) -> dict:
    """A row that went through Arrow/numpy (a Ray batch) -> plain Python types, as result_rows gives."""
    return {"query_id": str(r["query_id"]), "rank": int(r["rank"]), "doc_id": str(r["doc_id"]),
            "char_start": int(r["char_start"]), "char_end": int(r["char_end"]), "score": float(r["score"]),
            "text": str(r["text"]), "n_tokens": int(r["n_tokens"]), "seed_ids": [int(x) for x in r["seed_ids"]],
            "sentence_start": int(r["sentence_start"]), "sentence_end": int(r["sentence_end"])}


def rows_to_table(rows: Sequence[dict]):
    """Rows -> a pyarrow Table with results_schema() (the columns of `qasc query --out X.parquet`)."""
    import pyarrow as pa

    schema = results_schema()
    return pa.Table.from_pylist(list(rows), schema=schema) if rows else schema.empty_table()


def to_table(results: Sequence[Sequence[Chunk]], ids: Sequence[str] | None = None):
    """Engine.query's answer -> a pyarrow Table, one row per chunk (query order, then rank), results_schema().

    ids: one query id per question (default "0", "1", ... as `qasc query` numbers a file without ids)."""
    ids = [str(i) for i in range(len(results))] if ids is None else [str(i) for i in ids]
    if len(ids) != len(results):
        raise QascError(f"{len(ids)} query ids for {len(results)} results")
    return rows_to_table(result_rows(ids, results))


def rows_to_columns(rows: Sequence[dict]) -> dict[str, list]:
    """Rows -> {column: values}, the batch format of Ray Data."""
    return {name: [r[name] for r in rows] for name in RESULT_COLUMNS}


def rows_to_chunks(ids: Sequence[str], rows: Sequence[dict]) -> list[list[Chunk]]:
    """Rows -> per query id (in `ids` order), its Chunks in rank order."""
    results: list[list[Chunk]] = [[] for _ in ids]
    pos = {qid: i for i, qid in enumerate(ids)}
    for r in rows:
        results[pos[r["query_id"]]].append(Chunk(r["doc_id"], r["char_start"], r["char_end"], r["text"], r["score"],
                                                 tuple(r["seed_ids"]), r["n_tokens"], r["sentence_start"],
                                                 r["sentence_end"]))
    return results


def write_results(rows: list[dict], out: str) -> None:
    """Write atomically: a temp file beside the target, then rename."""
    target = Path(out)
    if target.suffix not in OUT_SUFFIXES:
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
            import pyarrow.parquet as pq

            pq.write_table(rows_to_table(rows), tmp)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def print_table(ids: Sequence[str], questions: Sequence[str], results: Sequence[Sequence[Chunk]],
                stream=None) -> None:
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
