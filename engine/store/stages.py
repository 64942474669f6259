"""Ingest stages of one shard: split (sentences, token cap) -> embed -> write, and the in-process runner.

`LocalRunner` runs read -> split -> embed for each shard in this process and hands the result to the
writer; the Ray Data pipeline of `jobs/ingest_ray.py` is another runner with the same `run` and calls the
same stage functions on its workers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa

from engine.config import EngineConfig
from engine.errors import QascError
from engine.splitter import SplitterConfig, split_sentences
from engine.store.files import atomic_parquet, file_digest
from engine.store.inputs import Document, ReadOptions, ShardTask, read_shard
from engine.store.schema import (
    DOCUMENT_ROW_GROUP,
    DOCUMENTS_DIR,
    DOCUMENTS_SCHEMA,
    SENTENCE_ROW_GROUP,
    SENTENCES_DIR,
    sentences_schema,
    shard_name,
)
from engine.tokencap import cap_tokens
from engine.types import Sentences

OnShard = Callable[[ShardTask, list[Document], list[Sentences], np.ndarray], None]


@dataclass(frozen=True)
class IngestContext:
    """Everything a worker needs to read, split and embed a shard (pickled into Ray tasks and actors)."""

    config: EngineConfig
    read: ReadOptions
    max_sentence_tokens: int
    # in-memory inputs (engine.store.ingest_table): their Documents by source label; empty for files
    memory: Mapping[str, Sequence[Document]] = field(default_factory=dict, compare=False, repr=False)


def split_document(doc: Document, splitter: SplitterConfig, tokenizer, max_tokens: int) -> Sentences:
    """Stage split for one document: Punkt sentences, then the token cap; n_tokens filled."""
    sents = split_sentences(doc.text, doc.doc_id, splitter)
    if len(sents) == 0:
        raise QascError(f"{doc.source}: no sentences found (document {doc.doc_id!r} is only whitespace)")
    return cap_tokens(sents, tokenizer, max_tokens)


def split_shard(docs: Sequence[Document], ctx: IngestContext, tokenizer) -> list[Sentences]:
    return [split_document(d, ctx.config.splitter, tokenizer, ctx.max_sentence_tokens) for d in docs]


def embed_shard(sents: Sequence[Sentences], embedder, shard_id: int,
                progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Stage embed: every sentence of a shard in one length-sorted encode -> (N, dim) float32, finite."""
    texts = [t for s in sents for t in s.texts()]
    where = f"shard {shard_id} (documents {sents[0].doc_id!r} .. {sents[-1].doc_id!r})"
    try:
        emb = embedder.encode(texts, progress=progress)
    except ValueError as exc:
        raise QascError(f"{where}: {exc}") from None
    if not np.isfinite(emb).all():
        raise QascError(f"{where}: the embedding model produced NaN/inf vectors; refusing to store them")
    return emb


def shard_tables(docs: Sequence[Document], sents: Sequence[Sentences], emb: np.ndarray,
                 dtype: str) -> tuple[pa.Table, pa.Table]:
    """Documents + their Sentences + emb (N, dim) -> (documents table, sentences table)."""
    counts = [len(s) for s in sents]
    documents = pa.Table.from_arrays([
        pa.array([d.doc_id for d in docs], pa.string()),
        pa.array([d.text for d in docs], pa.large_string()),
        pa.array([json.dumps(d.metadata, ensure_ascii=False, default=str) for d in docs], pa.string()),
        pa.array([d.source for d in docs], pa.string()),
        pa.array(counts, pa.int32()),
    ], schema=DOCUMENTS_SCHEMA)
    n, dim = emb.shape
    cat = (lambda name, dt: np.concatenate([getattr(s, name) for s in sents]).astype(dt)) if n else (
        lambda name, dt: np.zeros(0, dt))
    flat = pa.array(np.ascontiguousarray(emb, dtype=np.dtype(dtype)).reshape(-1))
    sentences = pa.Table.from_arrays([
        pa.array([s.doc_id for s in sents for _ in range(len(s))], pa.string()),
        pa.array(np.concatenate([np.arange(c, dtype=np.int32) for c in counts]) if n else np.zeros(0, np.int32)),
        pa.array(cat("paragraph", np.int32)),
        pa.array(cat("section", np.int32)),
        pa.array(cat("char_start", np.int64)),
        pa.array(cat("char_end", np.int64)),
        pa.array(cat("n_tokens", np.int32)),
        pa.FixedSizeListArray.from_arrays(flat, dim),
    ], schema=sentences_schema(dim, dtype))
    return documents, sentences


def write_shard(root: Path, shard_id: int, docs: Sequence[Document], sents: Sequence[Sentences],
                emb: np.ndarray, dtype: str) -> dict:
    """Stage write: both Parquet files of a shard, each atomically -> the shard's record (names, counts, sums)."""
    if len(emb) != sum(len(s) for s in sents):
        raise QascError(f"shard {shard_id}: {len(emb)} embeddings for {sum(len(s) for s in sents)} sentences")
    if not np.isfinite(emb).all():
        raise QascError(f"shard {shard_id}: NaN/inf embeddings; refusing to store them")
    documents, sentences = shard_tables(docs, sents, emb, dtype)
    record = {"id": shard_id, "documents": f"{DOCUMENTS_DIR}/{shard_name(shard_id)}",
              "sentences": f"{SENTENCES_DIR}/{shard_name(shard_id)}", "n_documents": len(docs),
              "n_sentences": len(emb), "dim": int(emb.shape[1]), "chars": sum(len(d.text) for d in docs)}
    atomic_parquet(documents, root / record["documents"], DOCUMENT_ROW_GROUP)
    atomic_parquet(sentences, root / record["sentences"], SENTENCE_ROW_GROUP)
    record["checksums"] = {rel: file_digest(root / rel) for rel in (record["documents"], record["sentences"])}
    return record


class StageProgress(Protocol):
    """What a runner reports while it works (engine.store.progress.IngestProgress is one)."""

    def split(self, chars: int, sentences: int) -> None: ...

    def advance(self, n: int) -> None: ...


class ShardRunner(Protocol):
    """Runs read -> split -> embed over shards and calls on_shard(task, docs, sents, emb (N, dim)) per shard.

    `session()` is entered before anything is written (a runner that cannot start writes nothing);
    `mode` and `workers` are recorded in the manifest's run entry.
    """

    mode: str
    workers: int

    def session(self) -> contextlib.AbstractContextManager: ...

    def run(self, tasks: Sequence[ShardTask], ctx: IngestContext, on_shard: OnShard,
            progress: StageProgress) -> None: ...


class LocalRunner:
    """The in-process runner: one embedder, shards one after the other."""

    mode = "local"
    workers = 1

    def __init__(self, embedder) -> None:
        self.embedder = embedder

    def session(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def run(self, tasks: Sequence[ShardTask], ctx: IngestContext, on_shard: OnShard,
            progress: StageProgress) -> None:
        tokenizer = self.embedder.tokenizer
        for task in tasks:
            docs = read_shard(task.docs, ctx.read, ctx.memory)
            sents = split_shard(docs, ctx, tokenizer)
            progress.split(task.chars, sum(len(s) for s in sents))
            on_shard(task, docs, sents, embed_shard(sents, self.embedder, task.shard_id, progress.advance))
