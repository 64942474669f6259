"""Ingest stages of one read unit: read (validate) -> cut into shards -> split (sentences, token cap) -> embed
-> write (atomic, into _staging/), and the in-process runner. Each shard also gets its heading paths (the
splitter's markdown / wikitext headings in force at each sentence) and its passages (engine.passages: sentence
runs within a paragraph up to the store's passage_tokens), embedded with the same model, and the term counts of
its sentences and passages for the BM25 index (engine.store.lexical).

A worker does all of it for the units it is given and hands back only small records (file names, digests,
counts, doc_ids): the driver never holds a shard's text or embeddings. `LocalRunner` runs the stages in this
process, freeing each shard once it is written; the Ray Data pipeline of `jobs/ingest_ray.py` is another
runner with the same `run` and calls the same stage functions on its workers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa

from qasc.engine.config import EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.lexical import count_terms, term_rule
from qasc.engine.passages import Passages, pack_passages
from qasc.engine.splitter import SplitterConfig, heading_paths, split_sentences
from qasc.engine.store import index_child
from qasc.engine.store.files import ResumableError, atomic_parquet, file_digest
from qasc.engine.store.index_build import build_index_file
from qasc.engine.store.inputs import InputUnit, read_unit
from qasc.engine.store.lexical import PASSAGES, ROWS, passage_texts, row_texts, terms_table
from qasc.engine.store.progress import PhaseClock
from qasc.engine.store.records import Document, ReadOptions
from qasc.engine.store.schema import (
    DOCUMENT_ROW_GROUP,
    DOCUMENTS_SCHEMA,
    HEADING_ROW_GROUP,
    PASSAGE_ROW_GROUP,
    SENTENCE_ROW_GROUP,
    STAGED_DOCUMENTS,
    STAGED_HEADINGS,
    STAGED_LEXICAL,
    STAGED_PASSAGE_LEXICAL,
    STAGED_PASSAGES,
    STAGED_SENTENCES,
    TERMS_ROW_GROUP,
    headings_schema,
    passages_schema,
    sentences_schema,
    staged_name,
)
from qasc.engine.tokencap import cap_tokens
from qasc.engine.types import Headings, Sentences

OnRecord = Callable[[dict], None]


@dataclass(frozen=True)
class IngestContext:
    """Everything a worker needs to read, split, embed and write a unit's shards (pickled into Ray tasks and
    actors). root: the store folder (workers write into its _staging/; on a cluster, a path every node sees)."""

    config: EngineConfig
    read: ReadOptions
    max_sentence_tokens: int
    root: str
    dtype: str  # store dtype of the embeddings
    shard_chars: int
    first_shard: int  # global id of unit 0's first shard (the store's shard count before this ingest)
    # in-memory inputs (engine.store.ingest_table): their Documents by source label; empty for files
    memory: Mapping[str, Sequence[Document]] = field(default_factory=dict, compare=False, repr=False)
    passage_tokens: int = 0  # passages packed up to this many tokens (engine.passages); 0: none (older stores)


def unit_shards(unit: InputUnit, ctx: IngestContext, counts: dict[str, int] | None = None
                ) -> Iterator[tuple[int, list[Document]]]:
    """Stage read + cut: a unit's documents -> (k, documents of its k-th shard); a shard closes once it holds
    ctx.shard_chars characters (a larger document is a shard alone)."""
    cur: list[Document] = []
    size = k = 0
    for doc in read_unit(unit, ctx.read, ctx.memory, counts):
        cur.append(doc)
        size += len(doc.text)
        if size >= ctx.shard_chars:
            yield k, cur
            cur, size, k = [], 0, k + 1
    if cur:
        yield k, cur


def shard_label(ctx: IngestContext, unit_id: int, k: int) -> str:
    """How messages name a shard: its store id where that is known before the earlier units finish (unit 0)."""
    return str(ctx.first_shard + k) if unit_id == 0 else f"{k} of unit {unit_id}"


def split_document(doc: Document, splitter: SplitterConfig, tokenizer, max_tokens: int) -> Sentences:
    """Stage split for one document: Punkt sentences, then the token cap; n_tokens filled."""
    sents = split_sentences(doc.text, doc.doc_id, splitter)
    if len(sents) == 0:
        raise QascError(f"{doc.source}: no sentences found (document {doc.doc_id!r} is only whitespace)")
    return cap_tokens(sents, tokenizer, max_tokens)


def split_shard(docs: Sequence[Document], ctx: IngestContext, tokenizer) -> list[Sentences]:
    return [split_document(d, ctx.config.splitter, tokenizer, ctx.max_sentence_tokens) for d in docs]


def embed_shard(sents: Sequence[Sentences], embedder, label: str,
                progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Stage embed: every sentence of a shard in one length-sorted encode -> (N, dim) float32, finite."""
    texts = [t for s in sents for t in s.texts()]
    where = f"shard {label} (documents {sents[0].doc_id!r} .. {sents[-1].doc_id!r})"
    try:
        emb = embedder.encode(texts, progress=progress)
    except ValueError as exc:
        raise QascError(f"{where}: {exc}") from None
    if not np.isfinite(emb).all():
        raise QascError(f"{where}: the embedding model produced NaN/inf vectors; refusing to store them")
    return emb


def shard_heading_paths(sents: Sequence[Sentences]) -> tuple[list[str], np.ndarray]:
    """A shard's Sentences -> (distinct heading paths of the shard, (N,) int32 path per sentence row, -1: none)."""
    paths: dict[str, int] = {}
    ids = []
    for s in sents:
        local_paths, local = heading_paths(s.text, s.char_start)
        remap = np.array([paths.setdefault(p, len(paths)) for p in local_paths] + [-1], dtype=np.int32)
        ids.append(remap[local])  # local -1 picks the trailing -1
    return list(paths), (np.concatenate(ids) if ids else np.zeros(0, np.int32)).astype(np.int32)


def embed_headings(sents: Sequence[Sentences], embedder, label: str) -> Headings:
    """Stage embed, headings: the shard's distinct heading paths in one encode (apart from the sentences, so
    the sentence vectors are the same as without headings)."""
    paths, rows = shard_heading_paths(sents)
    if not paths:
        return Headings([], rows, np.zeros((0, embedder.dim), np.float32))
    return Headings(paths, rows, _encode_checked(embedder, paths, label, "heading"))


def _encode_checked(embedder, texts: list[str], label: str, what: str) -> np.ndarray:
    """texts -> (n, dim) float32 from one encode; QascError naming the shard for a model error or NaN/inf."""
    try:
        emb = embedder.encode(texts)
    except ValueError as exc:
        raise QascError(f"shard {label} {what}s: {exc}") from None
    if not np.isfinite(emb).all():
        raise QascError(f"shard {label}: the embedding model produced NaN/inf {what} vectors; refusing to store")
    return emb


def embed_passages(sents: Sequence[Sentences], embedder, label: str, max_tokens: int) -> Passages | None:
    """Stage embed, passages: the shard's sentence runs (engine.passages.pack_passages, first = shard-local row)
    in one length-sorted encode; None when max_tokens is 0 (a store without passages)."""
    if max_tokens <= 0:
        return None
    firsts, counts, texts = [], [], []
    base = 0
    for s in sents:
        first, count = pack_passages(s.paragraph, s.n_tokens, max_tokens)
        ends = first + count - 1
        texts.extend(s.text[a:b] for a, b in zip(s.char_start[first].tolist(), s.char_end[ends].tolist(), strict=True))
        firsts.append(first + base)
        counts.append(count)
        base += len(s)
    first = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
    count = np.concatenate(counts) if counts else np.zeros(0, np.int32)
    row_tokens = np.concatenate([s.n_tokens for s in sents]).astype(np.int64) if sents else np.zeros(0, np.int64)
    cum = np.concatenate([[0], np.cumsum(row_tokens)])
    n_tokens = (cum[first + count] - cum[first]).astype(np.int32)
    if not texts:
        return Passages(first, count, n_tokens, np.zeros((0, embedder.dim), np.float32))
    return Passages(first, count, n_tokens, _encode_checked(embedder, texts, label, "passage"))


def passage_table(passages: Passages, dim: int, dtype: str) -> pa.Table:
    return pa.Table.from_arrays([
        pa.array(np.asarray(passages.first, np.int32)), pa.array(np.asarray(passages.count, np.int32)),
        pa.array(np.asarray(passages.n_tokens, np.int32)),
        _fixed_list(np.asarray(passages.emb, np.float32).reshape(-1, dim), dtype),
    ], schema=passages_schema(dim, dtype))


def _fixed_list(emb: np.ndarray, dtype: str) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(emb, dtype=np.dtype(dtype)).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, emb.shape[1])


def shard_tables(docs: Sequence[Document], sents: Sequence[Sentences], emb: np.ndarray, dtype: str,
                 headings: Headings) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Documents + their Sentences + emb (N, dim) + their headings -> (documents, sentences, headings tables)."""
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
    sentences = pa.Table.from_arrays([
        pa.array([s.doc_id for s in sents for _ in range(len(s))], pa.string()),
        pa.array(np.concatenate([np.arange(c, dtype=np.int32) for c in counts]) if n else np.zeros(0, np.int32)),
        pa.array(cat("paragraph", np.int32)),
        pa.array(cat("section", np.int32)),
        pa.array(cat("char_start", np.int64)),
        pa.array(cat("char_end", np.int64)),
        pa.array(cat("n_tokens", np.int32)),
        pa.array(np.asarray(headings.rows, dtype=np.int32)),
        _fixed_list(emb, dtype),
    ], schema=sentences_schema(dim, dtype))
    heads = pa.Table.from_arrays([
        pa.array(headings.paths, pa.string()),
        _fixed_list(np.asarray(headings.emb, np.float32).reshape(-1, dim), dtype),
    ], schema=headings_schema(dim, dtype))
    return documents, sentences, heads


def term_tables(sents: Sequence[Sentences], passages: Passages | None) -> dict[str, pa.Table]:
    """A shard's Sentences (and passages, shard-local first rows) -> its term counts tables (engine.store.lexical)
    by the shard entry's key: the sentence rows' (ROWS) and the passages' (PASSAGES, with passages)."""
    out = {ROWS: terms_table(count_terms(row_texts(sents)))}
    if passages is not None:
        out[PASSAGES] = terms_table(count_terms(passage_texts(sents, passages.first, passages.count)))
    return out


def write_shard(ctx: IngestContext, unit_id: int, k: int, docs: Sequence[Document], sents: Sequence[Sentences],
                emb: np.ndarray, headings: Headings, passages: Passages | None = None,
                clock: PhaseClock | None = None) -> dict:
    """Stage write: the Parquet files of a shard into _staging/, each atomically -> the shard's record
    (names, counts, digests, doc_ids). The driver renames them into documents/, sentences/, headings/, lexical/
    (and passages/, passage_lexical/, when the store has passages) when it commits."""
    label = shard_label(ctx, unit_id, k)
    if len(emb) != sum(len(s) for s in sents):
        raise QascError(f"shard {label}: {len(emb)} embeddings for {sum(len(s) for s in sents)} sentences")
    if not np.isfinite(emb).all():
        raise QascError(f"shard {label}: NaN/inf embeddings; refusing to store them")
    root = Path(ctx.root)
    if len(headings.rows) != len(emb) or len(headings.emb) != len(headings.paths):
        raise QascError(f"shard {label}: {len(headings.rows)} heading ids for {len(emb)} sentences, "
                        f"{len(headings.emb)} heading vectors for {len(headings.paths)} paths")
    if passages is not None and (int(passages.count.sum()) != len(emb) or len(passages.emb) != len(passages.first)):
        raise QascError(f"shard {label}: passages cover {int(passages.count.sum())} of {len(emb)} sentences, "
                        f"{len(passages.emb)} passage vectors for {len(passages.first)} passages")
    clock = clock or PhaseClock()
    with clock("tables"):
        documents, sentences, heads = shard_tables(docs, sents, emb, ctx.dtype, headings)
    with clock("term counts"):
        terms = term_tables(sents, passages)
    name = staged_name(unit_id, k)
    record = {"unit": unit_id, "index": k, "documents": f"{STAGED_DOCUMENTS}/{name}",
              "sentences": f"{STAGED_SENTENCES}/{name}", "headings": f"{STAGED_HEADINGS}/{name}",
              ROWS: f"{STAGED_LEXICAL}/{name}",
              "n_documents": len(docs), "n_sentences": len(emb), "n_headings": len(headings.paths),
              "n_terms": terms[ROWS].num_rows, "term_rule": term_rule(),
              "dim": int(emb.shape[1]), "chars": sum(len(d.text) for d in docs)}
    if passages is not None:
        record["passages"] = f"{STAGED_PASSAGES}/{name}"
        record["n_passages"] = len(passages.first)
        record[PASSAGES] = f"{STAGED_PASSAGE_LEXICAL}/{name}"
        record["n_passage_terms"] = terms[PASSAGES].num_rows
    try:
        clock.start("write, checksums")
        atomic_parquet(documents, root / record["documents"], DOCUMENT_ROW_GROUP)
        atomic_parquet(sentences, root / record["sentences"], SENTENCE_ROW_GROUP)
        atomic_parquet(heads, root / record["headings"], HEADING_ROW_GROUP)
        files = [record["documents"], record["sentences"], record["headings"]]
        if passages is not None:
            atomic_parquet(passage_table(passages, int(emb.shape[1]), ctx.dtype), root / record["passages"],
                           PASSAGE_ROW_GROUP)
            files.append(record["passages"])
        for key, table in terms.items():
            atomic_parquet(table, root / record[key], TERMS_ROW_GROUP)
            files.append(record[key])
        record["checksums"] = {rel: file_digest(root / rel) for rel in files}
        clock.stop()
    except OSError as exc:
        raise ResumableError(f"cannot write shard {label} into {root}: {exc.strerror or exc}; finished shards "
                             f"are kept, run the same ingest again to resume") from None
    record["doc_ids"] = [d.doc_id for d in docs]
    return record


def embed_and_write(ctx: IngestContext, unit_id: int, k: int, docs: Sequence[Document], sents: Sequence[Sentences],
                    embedder, progress: Callable[[int], None] | None = None, clock: PhaseClock | None = None) -> dict:
    """Stages embed (sentences, heading paths, passages) and write of one split shard -> its record."""
    clock = clock or PhaseClock()
    label = shard_label(ctx, unit_id, k)
    with clock("embed sentences"):
        emb = embed_shard(sents, embedder, label, progress)
    with clock("embed headings"):
        heads = embed_headings(sents, embedder, label)
    with clock("embed passages"):
        passages = embed_passages(sents, embedder, label, ctx.passage_tokens)
    return write_shard(ctx, unit_id, k, docs, sents, emb, heads, passages, clock)


class StageProgress(Protocol):
    """What a runner reports while it works (engine.store.progress.IngestProgress is one)."""

    def split(self, chars: int, sentences: int) -> None: ...

    def advance(self, n: int) -> None: ...


class ShardRunner(Protocol):
    """Runs read -> split -> embed -> write over units; calls on_shard(record) per written shard (the
    record of `write_shard`: names, counts, digests, doc_ids; never text or embeddings) and on_unit(summary)
    per finished unit ({"unit", "shards", "jsonl_counts"}).

    done: unit_id -> indices of its shards already staged (skipped: read and checked, not embedded again).
    `session()` is entered before anything is written (a runner that cannot start writes nothing);
    `mode` and `workers` are recorded in the manifest's run entry. `build_index` builds and writes the store's
    index once every shard is committed (`engine.store.index_build.build_index_file`, wherever the runner runs it)
    and returns its manifest entry.
    """

    mode: str
    workers: int

    def session(self) -> contextlib.AbstractContextManager: ...

    def run(self, units: Sequence[InputUnit], ctx: IngestContext, done: Mapping[int, Collection[int]],
            on_shard: OnRecord, on_unit: OnRecord, progress: StageProgress) -> None: ...

    def build_index(self, root: str, shards: list[dict], old: dict | None, kind: str, dim: int, index_file: str,
                    log: Callable[[str], None]) -> dict: ...


class LocalRunner:
    """The in-process runner: one embedder, units and their shards one after the other, each shard freed
    once written."""

    mode = "local"
    workers = 1

    def __init__(self, embedder, clock: PhaseClock | None = None) -> None:
        self.embedder = embedder
        self.clock = clock or PhaseClock()

    def session(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    index_peak_rss_gb: float | None = None  # the index build's peak RSS when a child process built it

    def build_index(self, root: str, shards: list[dict], old: dict | None, kind: str, dim: int, index_file: str,
                    log: Callable[[str], None]) -> dict:
        """The index (an ivf index's SQ8 codes, N x dim bytes, are what grows with N) built in this process for
        small stores, in a child process (`engine.store.index_child`) from INDEX_CHILD_MIN_ROWS rows on, so that
        the driver's memory does not grow with the input."""
        if sum(int(s["n_sentences"]) for s in shards) < index_child.INDEX_CHILD_MIN_ROWS:
            return build_index_file(Path(root), shards, old, kind, dim, index_file, log)
        entry, self.index_peak_rss_gb = index_child.build_in_child(root, shards, old, kind, dim, index_file, log)
        return entry

    def run(self, units: Sequence[InputUnit], ctx: IngestContext, done: Mapping[int, Collection[int]],
            on_shard: OnRecord, on_unit: OnRecord, progress: StageProgress) -> None:
        tokenizer = self.embedder.tokenizer
        for unit in units:
            skip = done.get(unit.unit_id, ())
            counts: dict[str, int] = {}
            n = 0
            for k, docs in unit_shards(unit, ctx, counts):
                n = k + 1
                if k in skip:
                    continue
                with self.clock("split"):
                    sents = split_shard(docs, ctx, tokenizer)
                progress.split(sum(len(d.text) for d in docs), sum(len(s) for s in sents))
                on_shard(embed_and_write(ctx, unit.unit_id, k, docs, sents, self.embedder, progress.advance,
                                         self.clock))
                del docs, sents
            on_unit({"unit": unit.unit_id, "shards": n, "jsonl_counts": counts})
