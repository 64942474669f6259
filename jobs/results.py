"""Query results, one row per returned chunk: the columns and Arrow schema (engine/columns.py), rows <-> Chunk,
rows/chunks -> Arrow table, the streaming atomic .jsonl / .parquet writer and the table printed for people.

The local and the Ray paths of `qasc query` and the Ray Data stage (jobs/ray_data.py) all go through here,
so their rows are the same.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from qasc.engine.columns import RERANK_COLUMNS, RESULT_COLUMNS, results_schema
from qasc.engine.errors import QascError
from qasc.engine.types import Chunk

OUT_SUFFIXES = (".jsonl", ".parquet")
ROW_GROUP_ROWS = 16384  # a Parquet row group holds at least this many rows (except the last)


def chunk_row(qid: str, rank: int, c: Chunk) -> dict:
    return {"query_id": qid, "rank": rank, "doc_id": c.doc_id, "char_start": c.char_start, "char_end": c.char_end,
            "score": c.score, "text": c.text, "n_tokens": c.n_tokens, "seed_ids": list(c.seed_ids),
            "sentence_start": c.sentence_start, "sentence_end": c.sentence_end}


def result_rows(ids: Sequence[str], results: Sequence[Sequence[Chunk]]) -> list[dict]:
    """Per query its chunks in rank order -> rows (query order, then rank)."""
    return [chunk_row(qid, rank, c) for qid, chunks in zip(ids, results, strict=True) for rank, c in enumerate(chunks)]


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


def rows_to_chunks(ids: Sequence[str], rows: Sequence[dict]) -> list[list[Chunk]]:
    """Rows -> per query id (in `ids` order), its Chunks in rank order."""
    results: list[list[Chunk]] = [[] for _ in ids]
    pos = {qid: i for i, qid in enumerate(ids)}
    for r in rows:
        results[pos[r["query_id"]]].append(Chunk(r["doc_id"], r["char_start"], r["char_end"], r["text"], r["score"],
                                                 tuple(r["seed_ids"]), r["n_tokens"], r["sentence_start"],
                                                 r["sentence_end"]))
    return results


def check_out(out: str) -> Path:
    """--out -> its Path, or QascError before any work when its extension or folder is wrong."""
    target = Path(out)
    if target.suffix not in OUT_SUFFIXES:
        raise QascError(f"--out must end in .jsonl or .parquet, got {out!r}")
    if not target.parent.exists():
        raise QascError(f"output folder does not exist: {target.parent}")
    if target.is_dir():
        raise QascError(f"--out is a folder: {out}")
    return target


class ResultWriter:
    """Streams result batches (RecordBatch or Table in results_schema()) to a .parquet or .jsonl file:

        with ResultWriter("answers.parquet") as w:
            for batch in engine.query_batches(emb, ids):
                w.write(batch)

    Rows go to a temp file beside the target as they come (Parquet: row groups of at least `row_group_rows`
    rows, so memory holds one row group at most; JSONL: one line per row); on a clean exit the file is
    fsynced and renamed over the target, on any error it is removed, so a failed run leaves a previous file
    untouched. `rows` counts the rows written. reranked: the batches carry the rerank stage's columns too
    (engine.columns.RERANK_COLUMNS)."""

    def __init__(self, out: str | os.PathLike, row_group_rows: int = ROW_GROUP_ROWS, reranked: bool = False) -> None:
        self.target = check_out(str(out))
        self.reranked = reranked
        self.columns = RESULT_COLUMNS + (RERANK_COLUMNS if reranked else ())
        self.row_group_rows = max(1, row_group_rows)
        self.tmp = self.target.with_name(f".{self.target.name}.tmp-{os.getpid()}")
        self.rows = 0
        self._fh = None
        self._parquet = None
        self._pending: list = []
        self._pending_rows = 0

    def __enter__(self) -> ResultWriter:
        self._fh = open(self.tmp, "wb")  # noqa: SIM115 (closed in __exit__)
        if self.target.suffix == ".parquet":
            import pyarrow.parquet as pq

            self._parquet = pq.ParquetWriter(self._fh, results_schema(self.reranked), compression="zstd")
        return self

    def write(self, batch) -> None:
        """batch: a pyarrow RecordBatch or Table with the columns of results_schema()."""
        if self._fh is None:
            raise QascError("ResultWriter.write outside its `with` block")
        if tuple(batch.schema.names) != self.columns:
            raise QascError(f"result batch has columns {batch.schema.names}, expected {list(self.columns)}")
        if batch.num_rows == 0:
            return
        self.rows += batch.num_rows
        if self._parquet is None:
            lines = (json.dumps(row, ensure_ascii=False) + "\n" for row in batch.to_pylist())
            self._fh.write("".join(lines).encode("utf-8"))
            return
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        if self._pending_rows >= self.row_group_rows:
            self._flush()

    def write_all(self, batches: Iterable) -> int:
        """Writes every batch of an iterable as it comes -> rows written so far."""
        for batch in batches:
            self.write(batch)
        return self.rows

    def _flush(self) -> None:
        import pyarrow as pa

        if self._pending:
            table = pa.Table.from_batches([b for p in self._pending for b in _batches(p)],
                                          schema=results_schema(self.reranked))
            self._parquet.write_table(table, row_group_size=max(table.num_rows, 1))
            self._pending, self._pending_rows = [], 0

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                if self._parquet is not None:
                    self._flush()
                    self._parquet.close()
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()
                os.replace(self.tmp, self.target)
                _fsync_dir(self.target.parent)
        finally:
            if self._parquet is not None and exc_type is not None:
                try:
                    self._parquet.close()
                except Exception:  # noqa: BLE001 - the error being raised is the one to report
                    pass
            if self._fh is not None and not self._fh.closed:
                self._fh.close()
            self._fh = None
            if self.tmp.exists():
                self.tmp.unlink()


def _batches(batch_or_table) -> list:
    return batch_or_table.to_batches() if hasattr(batch_or_table, "to_batches") else [batch_or_table]


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def print_table(ids: Sequence[str], questions: Sequence[str], results: Sequence[Sequence[Chunk]],
                stream=None) -> None:
    stream = stream or sys.stdout
    for qid, question, chunks in zip(ids, questions, results, strict=True):
        print(f"\n[{qid}] {question}", file=stream)
        if not chunks:
            print("    (no chunk: none passed the score thresholds, or none fits --budget-tokens)", file=stream)
        for rank, c in enumerate(chunks):
            text = " ".join(c.text.split())
            text = text if len(text) <= 240 else text[:237] + "..."
            print(f"  #{rank + 1} score {c.score:.3f}  {c.doc_id} [{c.char_start}:{c.char_end}] "
                  f"{c.n_tokens} tok", file=stream)
            print(f"      {text}", file=stream)
