"""Arrow/Parquet sentence store: schemas, sharded resumable ingest, manifest, `Store` reader, `verify_store`.

A store is one folder (README, "Store format"):
    manifest.json                  written last, atomically; lists every file with its sha256 and size
    documents/part-NNNNNN.parquet  DOCUMENTS_SCHEMA: doc_id, text, metadata (JSON), source, n_sentences
    sentences/part-NNNNNN.parquet  sentences_schema(dim, dtype): doc_id, sentence, paragraph, section,
                                   char_start, char_end, n_tokens, embedding fixed_size_list<float32|float16>[dim]
    index-GGGG.faiss               FAISS index over every sentence row (id = global row), generation GGGG
    _staging/                      only while an ingest runs or after it crashed: plan.json, shards/NNNNNN.json

Ingest stages: plan (read and validate every input, assign documents to shards; nothing is written before
it passes) -> per shard: read -> split (sentences, token cap) -> embed -> write (atomic, recorded in
_staging) -> index -> manifest. A rerun of the same command skips the recorded shards. The same stage
functions run in-process (`local=True`) and inside the Ray Data pipeline of `jobs/ingest_ray.py`.
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import datetime
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine import index as faiss_index
from engine.config import EngineConfig
from engine.errors import QascError
from engine.splitter import SplitterConfig, split_sentences, trim_span
from engine.types import Sentences

FORMAT = "qasc-store"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STAGING = "_staging"
LOCK = ".lock"
DOCUMENTS_DIR = "documents"
SENTENCES_DIR = "sentences"
TEXT_EXTENSIONS = (".md", ".markdown", ".txt", ".text", ".rst")
TABLE_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
STORE_DTYPES = ("float32", "float16")
ENCODING_ERRORS = ("strict", "replace", "ignore", "backslashreplace")
DEFAULT_SHARD_CHARS = 524_288  # characters of input text per shard (the unit of work and of resume)
DEFAULT_MAX_SENTENCE_TOKENS = 128
SENTENCE_ROW_GROUP = 8192
DOCUMENT_ROW_GROUP = 256
BINARY_SNIFF = 8192  # bytes inspected for NUL
LOG_EVERY_S = 5.0

DOCUMENTS_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("text", pa.large_string(), nullable=False),
    pa.field("metadata", pa.string(), nullable=False),  # JSON object: the input's extra columns ({} for files)
    pa.field("source", pa.string(), nullable=False),  # path, path:line (jsonl) or path#row (parquet)
    pa.field("n_sentences", pa.int32(), nullable=False),
])
SENTENCE_COLUMNS = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("sentence", pa.int32(), nullable=False),  # index within its document, 0..n-1
    pa.field("paragraph", pa.int32(), nullable=False),
    pa.field("section", pa.int32(), nullable=False),
    pa.field("char_start", pa.int64(), nullable=False),  # text[char_start:char_end] is the sentence
    pa.field("char_end", pa.int64(), nullable=False),
    pa.field("n_tokens", pa.int32(), nullable=False),  # model tokens without specials, <= max_sentence_tokens
])
EMBEDDING_TYPES = {"float32": pa.float32(), "float16": pa.float16()}


def sentences_schema(dim: int, dtype: str = "float32") -> pa.Schema:
    """SENTENCE_COLUMNS + embedding fixed_size_list<dtype>[dim]."""
    return SENTENCE_COLUMNS.append(pa.field("embedding", pa.list_(EMBEDDING_TYPES[dtype], dim), nullable=False))


class ResumableError(QascError):
    """The run stopped for a reason outside the inputs (disk, cluster): finished shards are kept for a rerun."""


# ----------------------------------------------------------------------------------------------- file helpers

def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _publish(tmp: Path, path: Path) -> None:
    """fsync tmp, rename it over path, fsync the folder: path is either the old or the new file, never half."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write(path: Path, data: bytes) -> None:
    tmp = _tmp_name(path)
    with open(tmp, "wb") as fh:
        fh.write(data)
    _publish(tmp, path)


def _atomic_parquet(table: pa.Table, path: Path, row_group_size: int) -> None:
    tmp = _tmp_name(path)
    pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd", write_page_checksum=True)
    _publish(tmp, path)


def file_digest(path: Path) -> dict:
    """path -> {"sha256": hex, "bytes": size}."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
            size += len(block)
    return {"sha256": digest.hexdigest(), "bytes": size}


_FAILPOINT_HITS: collections.Counter = collections.Counter()


def _failpoint(name: str) -> None:
    """Crash-test hook: QASC_FAILPOINT=name[:n] SIGKILLs this process the n-th time `name` is reached."""
    spec = os.environ.get("QASC_FAILPOINT")
    if not spec:
        return
    want, _, nth = spec.partition(":")
    if want == name:
        _FAILPOINT_HITS[name] += 1
        if _FAILPOINT_HITS[name] >= int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class ReadOptions:
    """How input files are decoded and which fields of .jsonl/.parquet inputs hold the id and the text."""

    encoding: str = "utf-8"
    errors: str = "strict"  # strict | replace | ignore | backslashreplace
    id_field: str = "id"
    text_field: str = "text"

    def __post_init__(self) -> None:
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise QascError(f"unknown --encoding {self.encoding!r}") from None
        if self.errors not in ENCODING_ERRORS:
            raise QascError(f"--errors must be one of {', '.join(ENCODING_ERRORS)}, got {self.errors!r}")
        if not self.id_field or not self.text_field or self.id_field == self.text_field:
            raise QascError(f"--id-field and --text-field must be two different names, got "
                            f"{self.id_field!r} and {self.text_field!r}")


@dataclass(frozen=True)
class DocRef:
    """Where one input document lives; enough to read it again in a worker."""

    doc_id: str
    path: str  # absolute
    kind: str  # text | jsonl | parquet
    row: int  # jsonl: line number (1-based); parquet: row (0-based); text: 0
    offset: int  # jsonl: byte offset of the line
    length: int  # jsonl: bytes of the line
    chars: int  # characters of the decoded text

    def where(self) -> str:
        return {"text": self.path, "jsonl": f"{self.path}:{self.row}"}.get(self.kind, f"{self.path}#row{self.row}")


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    metadata: dict
    source: str


@dataclass(frozen=True)
class ShardTask:
    """One unit of work and of resume: a contiguous run of documents."""

    shard_id: int
    docs: tuple[DocRef, ...]

    @property
    def chars(self) -> int:
        return sum(d.chars for d in self.docs)


@dataclass(frozen=True)
class IngestContext:
    """Everything a worker needs to read, split and embed a shard (pickled into Ray tasks and actors)."""

    config: EngineConfig
    read: ReadOptions
    max_sentence_tokens: int


def _read_bytes(path: str | Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except IsADirectoryError:
        raise QascError(f"{path}: is a folder, expected a file") from None
    except OSError as exc:
        raise QascError(f"{path}: cannot read ({exc.strerror or exc})") from None


def decode_text(data: bytes, where: str, opts: ReadOptions) -> str:
    """bytes -> str; QascError for binary data or bytes the encoding cannot decode (under --errors strict)."""
    wide = codecs.lookup(opts.encoding).name.startswith(("utf-16", "utf-32"))
    nul = -1 if wide else data.find(b"\x00", 0, BINARY_SNIFF)
    if nul >= 0:
        raise QascError(f"{where}: looks like a binary file (NUL byte at offset {nul}); "
                        f"only text/markdown, .jsonl and .parquet inputs are read")
    try:
        return data.decode(opts.encoding, opts.errors)
    except UnicodeDecodeError as exc:
        raise QascError(f"{where}: not valid {opts.encoding} (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                        f"pass --encoding ENC or --errors replace") from None


def _doc_id(value: object, where: str, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise QascError(f"{where}: {field!r} must be a string or an integer, got {type(value).__name__}")
    doc_id = str(value)
    if not doc_id.strip():
        raise QascError(f"{where}: empty {field!r}")
    return doc_id


def _check_text(value: object, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise QascError(f"{where}: {field!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise QascError(f"{where}: empty document (no text)")
    return value


def discover(paths: Sequence[str | Path], exclude: Path | None = None) -> tuple[list[tuple[Path, str, str | None]],
                                                                                    list[str]]:
    """PATHs -> ([(file, kind, doc_id or None)], skipped notes). Folders: text files, doc_id = relative path."""
    if not paths:
        raise QascError("no input paths given")
    found: list[tuple[Path, str, str | None]] = []
    skipped: list[str] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.exists():
            raise QascError(f"{raw}: no such file or directory")
        p = p.absolute()
        if p.is_dir():
            inside: list[tuple[str, Path]] = []

            def walk_error(exc: OSError) -> None:
                raise QascError(f"{exc.filename}: cannot read ({exc.strerror or exc})")

            for dirpath, dirnames, filenames in os.walk(p, onerror=walk_error):
                here = Path(dirpath)
                dirnames[:] = sorted(d for d in dirnames
                                     if not d.startswith(".") and (exclude is None or here / d != exclude))
                for name in filenames:
                    f = here / name
                    if name.startswith("."):
                        continue
                    if f.suffix.lower() not in TEXT_EXTENSIONS:
                        skipped.append(str(f))
                        continue
                    inside.append((f.relative_to(p).with_suffix("").as_posix(), f))
            if not inside:
                raise QascError(f"{raw}: empty collection: no text/markdown files ({', '.join(TEXT_EXTENSIONS)}) "
                                f"in this folder")
            found.extend((f, "text", rel) for rel, f in sorted(inside))
        elif p.is_file():
            kind = TABLE_KINDS.get(p.suffix.lower(), "text")
            found.append((p, kind, p.stem if kind == "text" else None))
        else:
            raise QascError(f"{raw}: not a regular file or folder")
    return found, skipped


def _jsonl_records(data: bytes, path: Path, opts: ReadOptions) -> Iterator[tuple[int, int, int, dict]]:
    """jsonl bytes -> (line number, byte offset, byte length, record) for every non-blank line."""
    offset = 0
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        start, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        record = _parse_json_line(line, where, opts)
        yield lineno, start, len(line), record


def _parse_json_line(line: bytes, where: str, opts: ReadOptions) -> dict:
    try:
        record = json.loads(decode_text(line, where, opts))
    except json.JSONDecodeError as exc:
        raise QascError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise QascError(f"{where}: expected a JSON object with {opts.id_field!r} and {opts.text_field!r}, "
                        f"got {type(record).__name__}")
    for field in (opts.id_field, opts.text_field):
        if field not in record:
            raise QascError(f"{where}: no {field!r} field (fields: {', '.join(map(str, record)) or 'none'}); "
                            f"pass --id-field/--text-field")
    return record


def _parquet_file(data_or_path: bytes | str, where: str) -> pq.ParquetFile:
    try:
        source = pa.BufferReader(data_or_path) if isinstance(data_or_path, bytes) else data_or_path
        return pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as exc:
        raise QascError(f"{where}: not a readable Parquet file ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _parquet_refs(data: bytes, path: Path, opts: ReadOptions) -> Iterator[DocRef]:
    pf = _parquet_file(data, str(path))
    names = pf.schema_arrow.names
    for field in (opts.id_field, opts.text_field):
        if field not in names:
            raise QascError(f"{path}: no {field!r} column (columns: {', '.join(names)}); pass --id-field/--text-field")
    text_type = pf.schema_arrow.field(opts.text_field).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise QascError(f"{path}: column {opts.text_field!r} must hold strings, got {text_type}")
    row = 0
    try:
        for batch in pf.iter_batches(columns=[opts.id_field, opts.text_field], batch_size=4096):
            for doc_id, text in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                where = f"{path}#row{row}"
                if doc_id is None:
                    raise QascError(f"{where}: missing {opts.id_field!r}")
                text = _check_text(text, where, opts.text_field)
                yield DocRef(_doc_id(doc_id, where, opts.id_field), str(path), "parquet", row, 0, 0, len(text))
                row += 1
    except pa.ArrowException as exc:
        raise QascError(f"{path}: corrupt Parquet file ({_first_line(exc)})") from None


def plan_inputs(paths: Sequence[str | Path], opts: ReadOptions, existing: dict[str, str] | None = None,
                exclude: Path | None = None) -> tuple[list[DocRef], list[dict], list[str]]:
    """Read and validate every input; -> (documents in store order, sources with sha256, skipped files).

    Raises QascError for the first bad input (missing, unreadable, binary, undecodable, empty, duplicate id).
    """
    existing = existing or {}
    files, skipped = discover(paths, exclude)
    refs: list[DocRef] = []
    sources: list[dict] = []
    seen: dict[str, str] = {}
    for path, kind, doc_id in files:
        data = _read_bytes(path)
        sources.append({"path": str(path), "kind": kind, **{"sha256": hashlib.sha256(data).hexdigest(),
                                                            "bytes": len(data)}})
        if kind == "text":
            text = decode_text(data, str(path), opts)
            if not text.strip():
                raise QascError(f"{path}: empty file (no text)")
            new = [DocRef(doc_id, str(path), "text", 0, 0, 0, len(text))]
        elif kind == "jsonl":
            new = []
            for lineno, offset, length, record in _jsonl_records(data, path, opts):
                where = f"{path}:{lineno}"
                text = _check_text(record[opts.text_field], where, opts.text_field)
                new.append(DocRef(_doc_id(record[opts.id_field], where, opts.id_field), str(path), "jsonl",
                                  lineno, offset, length, len(text)))
        else:
            new = list(_parquet_refs(data, path, opts))
        if not new:
            raise QascError(f"{path}: empty collection (no records)")
        for ref in new:
            if ref.doc_id in existing:
                raise QascError(f"duplicate doc_id {ref.doc_id!r}: {ref.where()} is already in the store "
                                f"({existing[ref.doc_id]})")
            if ref.doc_id in seen:
                raise QascError(f"duplicate doc_id {ref.doc_id!r}: {seen[ref.doc_id]} and {ref.where()}")
            seen[ref.doc_id] = ref.where()
        refs.extend(new)
    return refs, sources, skipped


def assign_shards(refs: Sequence[DocRef], shard_chars: int, first_id: int = 0) -> list[ShardTask]:
    """Documents in order -> shards of about shard_chars characters (a larger document is a shard alone)."""
    shards: list[ShardTask] = []
    cur: list[DocRef] = []
    size = 0
    for ref in refs:
        cur.append(ref)
        size += ref.chars
        if size >= shard_chars:
            shards.append(ShardTask(first_id + len(shards), tuple(cur)))
            cur, size = [], 0
    if cur:
        shards.append(ShardTask(first_id + len(shards), tuple(cur)))
    return shards


# ---------------------------------------------------------------------------------------- stage: read

def _parquet_rows(path: str, first: int, last: int) -> pa.Table:
    """Rows first..last (inclusive) of a Parquet file, reading only the row groups that hold them."""
    pf = _parquet_file(path, path)
    groups, start, offset = [], 0, None
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if start + n > first and start <= last:
            groups.append(g)
            offset = start if offset is None else offset
        start += n
    table = pf.read_row_groups(groups)
    return table.slice(first - (offset or 0), last - first + 1)


def _metadata(record: dict, opts: ReadOptions) -> dict:
    return {k: v for k, v in record.items() if k not in (opts.id_field, opts.text_field)}


def read_shard(refs: Sequence[DocRef], opts: ReadOptions) -> list[Document]:
    """Stage read: DocRefs -> Documents (text, metadata, source), checked against the plan."""
    docs: list[Document] = []
    for path, group in itertools.groupby(refs, key=lambda r: r.path):
        group = list(group)
        kind = group[0].kind
        if kind == "text":
            for ref in group:
                docs.append(Document(ref.doc_id, decode_text(_read_bytes(path), path, opts), {}, path))
        elif kind == "jsonl":
            try:
                with open(path, "rb") as fh:
                    for ref in group:
                        fh.seek(ref.offset)
                        record = _parse_json_line(fh.read(ref.length), ref.where(), opts)
                        docs.append(Document(str(record[opts.id_field]), record[opts.text_field],
                                             _metadata(record, opts), ref.where()))
            except OSError as exc:
                raise QascError(f"{path}: cannot read ({exc.strerror or exc})") from None
        else:
            table = _parquet_rows(path, group[0].row, group[-1].row)
            for ref, record in zip(group, table.to_pylist(), strict=False):
                docs.append(Document(str(record[opts.id_field]), record[opts.text_field], _metadata(record, opts),
                                     ref.where()))
    if len(docs) != len(refs):
        raise QascError(f"{refs[-1].where()}: changed while the ingest was running; run it again")
    for ref, doc in zip(refs, docs, strict=True):
        if doc.doc_id != ref.doc_id or not isinstance(doc.text, str) or len(doc.text) != ref.chars:
            raise QascError(f"{ref.where()}: changed while the ingest was running; run it again")
    return docs


# --------------------------------------------------------------------------------------- stage: split

@lru_cache(maxsize=4)
def load_tokenizer(model: str | None):
    """The embedding model's fast tokenizer (offset mappings are needed to cut long sentences exactly)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from engine.embedder import resolve_model_path

    hf_logging.set_verbosity_error()  # "sequence longer than max length" is expected: we count, then cut
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    except (OSError, ValueError) as exc:
        raise QascError(f"cannot load the tokenizer of model {model!r}: {_first_line(exc)}") from None
    if not tokenizer.is_fast:
        raise QascError(f"model {model!r} has no fast tokenizer; offsets for cutting long sentences need one")
    return tokenizer


def count_tokens(tokenizer, texts: list[str]) -> np.ndarray:
    """texts -> (N,) int32 content tokens, the same count as Embedder.count_tokens."""
    if not texts:
        return np.zeros(0, dtype=np.int32)
    enc = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)
    return np.fromiter((len(ids) for ids in enc["input_ids"]), dtype=np.int32, count=len(texts))


def _cut_at_tokens(text: str, start: int, end: int, offsets: Sequence[tuple[int, int]],
                   limit: int) -> list[tuple[int, int]]:
    """[start, end) with token offsets (relative to start) -> pieces of <= limit tokens, cut before a token.

    Prefers a word start (whitespace before the token) in the second half of each window.
    """
    cuts = [start]
    i, n = 0, len(offsets)
    while n - i > limit:
        j = i + limit
        for b in range(i + limit, i + limit // 2, -1):
            if offsets[b][0] > offsets[b - 1][1]:
                j = b
                break
        cuts.append(start + offsets[j][0])
        i = j
    pieces = []
    for a, b in zip(cuts, cuts[1:] + [end], strict=True):
        a, b = trim_span(text, a, b)
        if b > a:
            pieces.append((a, b))
    return pieces


def _offsets(tokenizer, texts: list[str]) -> list[list[tuple[int, int]]]:
    """texts -> per text, the (start, end) character offsets of its content tokens (no specials)."""
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False)
    return enc["offset_mapping"]


def cap_tokens(sents: Sentences, tokenizer, max_tokens: int) -> Sentences:
    """Sentences -> Sentences with n_tokens filled, none above max_tokens: long ones are cut at token offsets.

    One tokenizer pass over every sentence (with offsets), then one over the pieces of the long ones: a
    piece's count is its own tokenization, exactly what Embedder.count_tokens gives. A piece that tokenizes
    longer on its own than inside its sentence (a cut inside a word) is cut again with a tighter limit.
    Pieces keep their sentence's paragraph and section; text[char_start:char_end] stays exact.
    """
    text = sents.text
    segs = list(zip(sents.char_start.tolist(), sents.char_end.tolist(), sents.paragraph.tolist(),
                    sents.section.tolist(), strict=True))
    offs = _offsets(tokenizer, [text[s:e] for s, e, _, _ in segs])
    counts = [len(o) for o in offs]
    limits = [max_tokens] * len(segs)
    for _ in range(64):
        over = [i for i, n in enumerate(counts) if n > max_tokens]
        if not over:
            break
        pieces: dict[int, list[tuple[int, int, int, int]]] = {}
        for i in over:
            s, e, para, sect = segs[i]
            pieces[i] = [(a, b, para, sect) for a, b in _cut_at_tokens(text, s, e, offs[i], limits[i])]
        flat = [p for i in over for p in pieces[i]]
        enc = iter(_offsets(tokenizer, [text[a:b] for a, b, _, _ in flat]))
        new_segs, new_offs, new_counts, new_limits = [], [], [], []
        for i, seg in enumerate(segs):
            if i not in pieces:
                new_segs.append(seg)
                new_offs.append(offs[i])
                new_counts.append(counts[i])
                new_limits.append(limits[i])
                continue
            for piece in pieces[i]:
                o = next(enc)
                new_segs.append(piece)
                new_offs.append(o if len(o) > max_tokens else ())
                new_counts.append(len(o))
                new_limits.append(max(1, limits[i] - max(1, len(o) - max_tokens)) if len(o) > max_tokens
                                  else max_tokens)
        segs, offs, counts, limits = new_segs, new_offs, new_counts, new_limits
    else:
        raise QascError(f"{sents.doc_id}: could not cut a sentence below {max_tokens} tokens")
    cols = np.asarray(segs, dtype=np.int64).reshape(-1, 4)
    return Sentences(sents.doc_id, text, cols[:, 0].copy(), cols[:, 1].copy(), cols[:, 2].astype(np.int32),
                     cols[:, 3].astype(np.int32), np.asarray(counts, dtype=np.int32))


def split_document(doc: Document, splitter: SplitterConfig, tokenizer, max_tokens: int) -> Sentences:
    """Stage split for one document: Punkt sentences, then the token cap; n_tokens filled."""
    sents = split_sentences(doc.text, doc.doc_id, splitter)
    if len(sents) == 0:
        raise QascError(f"{doc.source}: no sentences found (document {doc.doc_id!r} is only whitespace)")
    return cap_tokens(sents, tokenizer, max_tokens)


def split_shard(docs: Sequence[Document], ctx: IngestContext, tokenizer) -> list[Sentences]:
    return [split_document(d, ctx.config.splitter, tokenizer, ctx.max_sentence_tokens) for d in docs]


# --------------------------------------------------------------------------------------- stage: embed

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


# --------------------------------------------------------------------------------------- stage: write

def _shard_name(shard_id: int) -> str:
    return f"part-{shard_id:06d}.parquet"


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
    record = {"id": shard_id, "documents": f"{DOCUMENTS_DIR}/{_shard_name(shard_id)}",
              "sentences": f"{SENTENCES_DIR}/{_shard_name(shard_id)}", "n_documents": len(docs),
              "n_sentences": len(emb), "dim": int(emb.shape[1]), "chars": sum(len(d.text) for d in docs)}
    _atomic_parquet(documents, root / record["documents"], DOCUMENT_ROW_GROUP)
    _atomic_parquet(sentences, root / record["sentences"], SENTENCE_ROW_GROUP)
    record["checksums"] = {rel: file_digest(root / rel) for rel in (record["documents"], record["sentences"])}
    return record


# ------------------------------------------------------------------------------------- manifest, staging

def _engine_version() -> str:
    import engine

    return str(getattr(engine, "__version__", "unknown"))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def read_manifest(path: str | Path) -> dict:
    """The committed manifest of a store; QascError if missing, incomplete or corrupt."""
    root = Path(path).expanduser()
    if not root.exists():
        raise QascError(f"{root}: no such store")
    if not root.is_dir():
        raise QascError(f"{root}: not a store folder (it is a file)")
    mpath = root / MANIFEST
    if not mpath.exists():
        if (root / STAGING).exists():
            raise QascError(f"{root}: incomplete store (an ingest did not finish; run the same ingest again to "
                            f"resume)")
        raise QascError(f"{root}: not a QASC store (no {MANIFEST})")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise QascError(f"{mpath}: corrupt manifest ({_first_line(exc)})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise QascError(f"{mpath}: not a QASC store manifest")
    if manifest.get("format_version", 0) > FORMAT_VERSION:
        raise QascError(f"{mpath}: store format {manifest.get('format_version')} is newer than this engine "
                        f"({FORMAT_VERSION}); upgrade qasc")
    missing = [k for k in ("model", "fingerprint", "dim", "dtype", "splitter", "config", "counts", "shards",
                           "index", "checksums") if k not in manifest]
    if missing or manifest.get("complete") is not True:
        raise QascError(f"{mpath}: incomplete manifest (missing {', '.join(missing) or 'complete flag'})")
    return manifest


def existing_manifest(path: str | Path) -> dict | None:
    """The manifest of an existing store, None for a new (absent or empty, or never finished) folder."""
    root = Path(path).expanduser()
    if not root.exists():
        return None
    if not root.is_dir():
        raise QascError(f"--store {root}: exists and is a file, not a store folder")
    if (root / MANIFEST).exists():
        return read_manifest(root)
    ours = {STAGING, LOCK, DOCUMENTS_DIR, SENTENCES_DIR}
    strangers = [p.name for p in root.iterdir() if p.name not in ours and not p.name.startswith(".")
                 and not re.fullmatch(r"index-\d+\.faiss", p.name)]
    if strangers:
        raise QascError(f"--store {root}: folder exists and is not a QASC store (no {MANIFEST}; holds "
                        f"{', '.join(sorted(strangers)[:3])}); use a new or empty folder")
    return None


def _existing_doc_ids(root: Path, manifest: dict | None) -> dict[str, str]:
    if not manifest:
        return {}
    out: dict[str, str] = {}
    for shard in manifest["shards"]:
        table = _read_table(root, shard["documents"], columns=["doc_id"])
        out.update((d, f"{root}/{shard['documents']}") for d in table.column(0).to_pylist())
    return out


class _Staging:
    """_staging/: the plan of the running ingest and one record per finished shard (each written atomically)."""

    def __init__(self, root: Path, plan: dict, log: Callable[[str], None]) -> None:
        self.root = root
        self.dir = root / STAGING
        self.shards_dir = self.dir / "shards"
        self.done: dict[int, dict] = {}
        self.resumed = False
        old = self._load_plan()
        if old is not None and old.get("hash") != plan["hash"]:
            log(f"qasc ingest: discarding an unfinished ingest of other inputs or settings in {root}")
            self.discard()
        elif old is not None:
            self._load_records(log)
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        (root / DOCUMENTS_DIR).mkdir(exist_ok=True)
        (root / SENTENCES_DIR).mkdir(exist_ok=True)
        for folder in (root, root / DOCUMENTS_DIR, root / SENTENCES_DIR, self.dir, self.shards_dir):
            for tmp in folder.glob(".*.tmp-*"):  # half-written temp files of a killed run
                tmp.unlink(missing_ok=True)
        atomic_write(self.dir / "plan.json", json.dumps(plan, indent=1).encode())

    def _load_plan(self) -> dict | None:
        try:
            return json.loads((self.dir / "plan.json").read_text())
        except (OSError, ValueError):
            return None if not self.dir.exists() else {}

    def _load_records(self, log: Callable[[str], None]) -> None:
        for path in sorted(self.shards_dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
                ok = all(file_digest(self.root / rel) == digest for rel, digest in record["checksums"].items())
            except (OSError, ValueError, KeyError):
                ok = False
            if ok:
                self.done[int(record["id"])] = record
            else:
                path.unlink(missing_ok=True)
        if self.done:
            self.resumed = True
            log(f"qasc ingest: resuming, {len(self.done)} finished shard(s) kept from an earlier run")

    def record(self, record: dict) -> None:
        atomic_write(self.shards_dir / f"{record['id']:06d}.json", json.dumps(record).encode())
        self.done[int(record["id"])] = record
        _failpoint("shard-written")

    def discard(self) -> None:
        """Removes the staged shard files and the staging folder (the committed store is untouched)."""
        for path in self.shards_dir.glob("*.json") if self.shards_dir.exists() else []:
            with contextlib.suppress(OSError, ValueError, KeyError):
                for rel in json.loads(path.read_text())["checksums"]:
                    (self.root / rel).unlink(missing_ok=True)
        for record in self.done.values():
            for rel in record["checksums"]:
                (self.root / rel).unlink(missing_ok=True)
        self.done.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def finish(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise QascError(f"--store {root}: another ingest is writing this store right now") from None
        yield
    finally:
        os.close(fd)


# -------------------------------------------------------------------------------------------- progress

class _Progress:
    """A tqdm bar (sentences, rate, ETA) on a TTY; otherwise a log line per shard, at most every few seconds."""

    def __init__(self, total_chars: int, shards: int, done_chars: int, done_shards: int, bar: bool | None,
                 log: Callable[[str], None]) -> None:
        self.total_chars, self.shards = max(total_chars, 1), shards
        self.done_chars, self.done_shards = done_chars, done_shards
        self.split_chars = self.split_sents = 0
        self.sentences = self.chars_here = 0
        self.log = log
        self.t0 = self.last = time.perf_counter()
        self.bar = None
        if bar if bar is not None else sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=self._estimate(), unit="sent", desc="qasc ingest", file=sys.stderr,
                            dynamic_ncols=True, smoothing=0.05)

    def _estimate(self) -> int:
        per_char = self.split_sents / self.split_chars if self.split_chars else 1 / 120
        return int(round((self.total_chars - self.done_chars) * per_char))

    def split(self, chars: int, sentences: int) -> None:
        self.split_chars += chars
        self.split_sents += sentences
        if self.bar is not None:
            self.bar.total = max(self._estimate(), self.bar.n)
            self.bar.refresh()

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def shard_done(self, chars: int, sentences: int, embedded_here: bool) -> None:
        self.done_shards += 1
        self.sentences += sentences
        self.chars_here += chars
        if self.bar is not None:
            if not embedded_here:
                self.bar.update(sentences)
            return
        now = time.perf_counter()
        if now - self.last >= LOG_EVERY_S or self.done_shards == self.shards:
            self.last = now
            elapsed = max(now - self.t0, 1e-9)
            eta = elapsed * (self.total_chars - self.done_chars - self.chars_here) / max(self.chars_here, 1)
            self.log(f"qasc ingest: shard {self.done_shards}/{self.shards}, {self.sentences} sentences, "
                     f"{self.sentences / elapsed:.1f} sentences/s, eta {max(eta, 0):.0f} s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- ingest

def _check_compatible(manifest: dict, root: Path, name: str, fingerprint: str, splitter: dict, dtype: str) -> None:
    if manifest["fingerprint"] != fingerprint:
        raise QascError(f"--store {root} was built with model {manifest['model']!r} (fingerprint "
                        f"{manifest['fingerprint']}); refusing to add embeddings of {name!r} (fingerprint "
                        f"{fingerprint}); use --model {manifest['model']} or a new store")
    if manifest["dtype"] != dtype:
        raise QascError(f"--store {root} stores {manifest['dtype']} embeddings; refusing --dtype-store {dtype}")
    ours = {k: v for k, v in splitter.items() if k != "version"}
    theirs = {k: v for k, v in manifest["splitter"].items() if k != "version"}
    if ours != theirs:
        keys = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        diff = ", ".join(f"store {k}={theirs.get(k)!r}, now {ours.get(k)!r}" for k in keys)
        raise QascError(f"--store {root} was split with other settings ({diff}); refusing to mix them")


def _validate(config: EngineConfig, workers: int, local: bool, shard_chars: int, max_tokens: int,
              dtype_store: str) -> None:
    from engine.embedder import resolve_device, resolve_dtype

    e = config.embedder
    if e.max_length < 8:
        raise QascError(f"--max-length must be >= 8, got {e.max_length}")
    if e.batch_tokens is not None and e.batch_tokens < e.max_length:
        raise QascError(f"--batch-tokens ({e.batch_tokens}) must be >= --max-length ({e.max_length})")
    try:
        resolve_dtype(e.dtype, resolve_device(e.device) if local else _cpu())
    except (ValueError, RuntimeError) as exc:
        raise QascError(str(exc)) from None
    if workers < 1:
        raise QascError(f"--workers must be >= 1, got {workers}")
    if local and workers > 1:
        raise QascError(f"--workers {workers} needs Ray; drop --local (the local path runs one embedder)")
    if shard_chars < 1:
        raise QascError(f"--shard-chars must be >= 1, got {shard_chars}")
    if not 1 <= max_tokens <= e.max_length - 2:
        raise QascError(f"--max-sentence-tokens must be in [1, {e.max_length - 2}] (--max-length minus the 2 "
                        f"special tokens), got {max_tokens}")
    if dtype_store not in STORE_DTYPES:
        raise QascError(f"--dtype-store must be one of {', '.join(STORE_DTYPES)}, got {dtype_store!r}")


def _cpu():
    import torch

    return torch.device("cpu")


def _read_table(root: Path, rel: str, columns: list[str] | None = None) -> pa.Table:
    try:
        return pq.read_table(root / rel, columns=columns, page_checksum_verification=True)
    except FileNotFoundError:
        raise QascError(f"{root / rel}: missing store file") from None
    except (pa.ArrowException, OSError) as exc:
        raise QascError(f"{root / rel}: corrupt or truncated Parquet file ({_first_line(exc)})") from None


def _embeddings(table: pa.Table, dim: int, where: str) -> np.ndarray:
    """sentences table -> (N, dim) float32."""
    col = table.column("embedding")
    if not pa.types.is_fixed_size_list(col.type) or col.type.list_size != dim:
        raise QascError(f"{where}: embedding column is {col.type}, expected fixed_size_list<float>[{dim}]")
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(-1, dim)


def _build_index(root: Path, shards: list[dict], old: dict | None, kind_requested: str, dim: int,
                 log: Callable[[str], None]) -> tuple[bytes, dict]:
    """All shard records (old + new, in order) -> (serialized index, manifest entry)."""
    n = sum(s["n_sentences"] for s in shards)
    kind = faiss_index.choose_kind(n, kind_requested)
    old_index = old["index"] if old else None
    reuse = old_index is not None and old_index["kind"] == kind and (kind_requested in ("auto", kind))
    if reuse:
        data = (root / old_index["file"]).read_bytes()
        if faiss_index.sha256(data) != old["checksums"][old_index["file"]]["sha256"]:
            raise QascError(f"{root / old_index['file']}: checksum mismatch (corrupt); run qasc verify")
        index = faiss_index.deserialize(data, str(root / old_index["file"]))
        params = old_index["params"]
        start = old["counts"]["shards"]
    else:
        params = faiss_index.default_params(kind, n)
        index = faiss_index.new_index(kind, dim, params)
        start = 0
        if kind == "ivf":
            log(f"qasc ingest: training an IVF index ({params['nlist']} lists) over {n} sentences")
            rows = faiss_index.training_sample(n, params["nlist"])
            sample, base = [], 0
            for s in shards:
                sel = rows[(rows >= base) & (rows < base + s["n_sentences"])] - base
                if len(sel):
                    emb = _embeddings(_read_table(root, s["sentences"], ["embedding"]), dim, s["sentences"])
                    sample.append(emb[sel])
                base += s["n_sentences"]
            faiss_index.train(index, np.concatenate(sample))
    for s in shards[start:]:
        faiss_index.add(index, _embeddings(_read_table(root, s["sentences"], ["embedding"]), dim, s["sentences"]))
    if index.ntotal != n:
        raise QascError(f"index holds {index.ntotal} vectors for {n} sentences")
    entry = {"kind": kind, "requested": kind_requested, "metric": "inner_product", "ntotal": int(index.ntotal),
             "params": params}
    return faiss_index.serialize(index), entry


@contextlib.contextmanager
def _ray_session(local: bool, ray_address: str | None) -> Iterator[None]:
    """Connects to Ray before anything is written (a bad address writes nothing); disconnects what it connected."""
    if local:
        yield
        return
    from jobs.ingest_ray import connect

    started = connect(ray_address)
    try:
        yield
    finally:
        if started:
            import ray

            ray.shutdown()


def ingest(
    paths: Sequence[str | Path],
    store: str | Path,
    config: EngineConfig | None = None,
    *,
    local: bool = True,
    ray_address: str | None = None,
    workers: int = 1,
    index_kind: str = "auto",
    progress: bool | None = None,
    dtype_store: str | None = None,
    max_sentence_tokens: int | None = None,
    shard_chars: int = DEFAULT_SHARD_CHARS,
    encoding: str = "utf-8",
    errors: str = "strict",
    id_field: str = "id",
    text_field: str = "text",
    log: Callable[[str], None] | None = None,
    **kw,
) -> dict:
    """Split, embed and index documents into a store (created, resumed, or appended to).

    Returns the summary: documents, sentences (this run), seconds, sentences_per_s, store totals.
    `local=False` runs the Ray Data pipeline (jobs/ingest_ray.py) on `ray_address` (None: RAY_ADDRESS or
    a new local instance) with `workers` embedding actors. Unset store settings (config, dtype_store,
    max_sentence_tokens) are taken from an existing store, whose model and splitter must match.
    """
    from engine.embedder import DEFAULT_MODEL, model_fingerprint, resolve_model_path

    t0 = time.perf_counter()
    unknown = set(kw) - {"fault_marker"}  # fault_marker: Ray fault-injection test hook (jobs/ingest_ray.py)
    if unknown:
        raise TypeError(f"ingest() got unexpected keyword arguments {sorted(unknown)}")
    log = log or _stderr
    root = Path(store).expanduser().absolute()
    opts = ReadOptions(encoding, errors, id_field, text_field)
    old = existing_manifest(root)
    if config is None:
        config = EngineConfig.from_dict(old["config"]) if old else EngineConfig()
    if dtype_store is None:
        dtype_store = old["dtype"] if old else "float32"
    max_tokens = max_sentence_tokens
    if max_tokens is None:
        max_tokens = old["splitter"]["max_sentence_tokens"] if old else DEFAULT_MAX_SENTENCE_TOKENS
    _validate(config, workers, local, shard_chars, max_tokens, dtype_store)
    faiss_index.choose_kind(0, index_kind)
    name = config.embedder.model or DEFAULT_MODEL
    try:
        fingerprint = model_fingerprint(resolve_model_path(config.embedder.model))
    except (ImportError, OSError) as exc:
        raise QascError(f"cannot find model {name!r}: {_first_line(exc)}") from None
    splitter_desc = {**config.splitter.describe(), "max_sentence_tokens": max_tokens}
    if old:
        _check_compatible(old, root, name, fingerprint, splitter_desc, dtype_store)

    # plan: every input read and validated before anything is written
    refs, sources, skipped = plan_inputs(paths, opts, _existing_doc_ids(root, old), exclude=root)
    if skipped:
        log(f"qasc ingest: skipped {len(skipped)} file(s) that are not text/markdown, e.g. {skipped[0]}")
    first_id = old["counts"]["shards"] if old else 0
    tasks = assign_shards(refs, shard_chars, first_id)
    ctx = IngestContext(config, opts, max_tokens)
    plan = {"base_generation": old["generation"] if old else 0, "fingerprint": fingerprint,
            "splitter": splitter_desc, "dtype": dtype_store, "read": asdict(opts), "sources": sources,
            "shards": [[asdict(r) for r in t.docs] for t in tasks], "first_shard": first_id}
    plan["hash"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()

    embedder = None
    if local:
        from engine.chunker import embedder_from

        try:
            embedder = embedder_from(config)
        except ValueError as exc:
            raise QascError(str(exc)) from None
        load_tokenizer(config.embedder.model)
    else:
        load_tokenizer(config.embedder.model)  # fail early on a bad model name, before any write
    created = old is None
    with _ray_session(local, ray_address), _locked(root):
        staging = _Staging(root, plan, log)
        todo = [t for t in tasks if t.shard_id not in staging.done]
        done_chars = sum(t.chars for t in tasks if t.shard_id in staging.done)
        prog = _Progress(sum(t.chars for t in tasks), len(tasks), done_chars, len(tasks) - len(todo), progress, log)
        embedded = 0
        try:
            def on_shard(task: ShardTask, docs: list[Document], sents: list[Sentences], emb: np.ndarray) -> None:
                nonlocal embedded
                try:
                    record = write_shard(root, task.shard_id, docs, sents, emb, dtype_store)
                    staging.record(record)
                except OSError as exc:
                    raise ResumableError(f"cannot write shard {task.shard_id} into {root}: "
                                         f"{exc.strerror or exc}; finished shards are kept, run the same "
                                         f"ingest again to resume") from None
                embedded += len(emb)
                prog.shard_done(task.chars, len(emb), embedded_here=local)

            if todo and local:
                tokenizer = embedder.tokenizer
                for task in todo:
                    docs = read_shard(task.docs, opts)
                    sents = split_shard(docs, ctx, tokenizer)
                    prog.split(task.chars, sum(len(s) for s in sents))
                    on_shard(task, docs, sents, embed_shard(sents, embedder, task.shard_id, prog.advance))
            elif todo:
                from jobs.ingest_ray import run_ray

                run_ray(todo, ctx, workers=workers, ray_address=ray_address, on_shard=on_shard,
                        on_split=prog.split, **kw)
            records = [staging.done[t.shard_id] for t in tasks]
            dims = {r["dim"] for r in records} | ({old["dim"]} if old else set())
            if len(dims) != 1:
                raise QascError(f"embedding width {sorted(dims)} disagrees with the store's; refusing to mix models")
            dim = dims.pop()
            all_shards = (old["shards"] if old else []) + [_shard_entry(r) for r in records]
            data, index_entry = _build_index(root, all_shards, old, index_kind, dim, log)
        except ResumableError:
            prog.close()
            raise
        except QascError:
            prog.close()
            staging.discard()
            if created:
                _remove_new_store(root)
            raise
        prog.close()
        generation = (old["generation"] if old else 0) + 1
        index_file = f"index-{generation:04d}.faiss"
        try:
            atomic_write(root / index_file, data)
        except OSError as exc:
            raise ResumableError(f"cannot write {root / index_file}: {exc.strerror or exc}; run the same ingest "
                                 f"again to resume") from None
        _failpoint("index-written")
        index_entry["file"] = index_file
        seconds = time.perf_counter() - t0
        run = {"finished": _now(), "documents": len(refs), "sentences": sum(r["n_sentences"] for r in records),
               "embedded_here": embedded, "seconds": round(seconds, 3), "mode": "local" if local else "ray",
               "workers": workers, "resumed_shards": len(tasks) - len(todo)}
        manifest = _manifest(old, config, name, fingerprint, dim, dtype_store, splitter_desc, all_shards, records,
                             index_entry, faiss_index.sha256(data), len(data), generation, run)
        _failpoint("before-manifest")
        atomic_write(root / MANIFEST, json.dumps(manifest, indent=1).encode())
        if old and old["index"]["file"] != index_file:
            (root / old["index"]["file"]).unlink(missing_ok=True)
        staging.finish()
    seconds = time.perf_counter() - t0
    return {"store": str(root), "documents": run["documents"], "sentences": run["sentences"],
            "seconds": round(seconds, 2), "sentences_per_s": round(embedded / max(seconds, 1e-9), 1),
            "embedded": embedded, "resumed_shards": run["resumed_shards"], "mode": run["mode"],
            "store_documents": manifest["counts"]["documents"], "store_sentences": manifest["counts"]["sentences"],
            "index": index_entry["kind"]}


def summary_line(summary: dict) -> str:
    resumed = f", {summary['resumed_shards']} shard(s) resumed" if summary.get("resumed_shards") else ""
    return (f"ingested {summary['documents']} documents, {summary['sentences']} sentences in "
            f"{summary['seconds']:.1f} s ({summary['sentences_per_s']:.1f} sentences/s{resumed}) into "
            f"{summary['store']} (store: {summary['store_documents']} documents, {summary['store_sentences']} "
            f"sentences, {summary['index']} index)")


def _shard_entry(record: dict) -> dict:
    return {k: record[k] for k in ("id", "documents", "sentences", "n_documents", "n_sentences", "chars")}


def _manifest(old: dict | None, config: EngineConfig, name: str, fingerprint: str, dim: int, dtype: str,
              splitter: dict, shards: list[dict], records: list[dict], index_entry: dict, index_sha: str,
              index_bytes: int, generation: int, run: dict) -> dict:
    checksums = dict(old["checksums"]) if old else {}
    if old:
        checksums.pop(old["index"]["file"], None)
    for r in records:
        checksums.update(r["checksums"])
    checksums[index_entry["file"]] = {"sha256": index_sha, "bytes": index_bytes}
    doc_start = row_start = 0
    for s in shards:
        s["doc_start"], s["row_start"] = doc_start, row_start
        doc_start += s["n_documents"]
        row_start += s["n_sentences"]
    e = config.embedder
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "engine_version": _engine_version(), "complete": True,
        "created": old["created"] if old else run["finished"], "updated": run["finished"], "generation": generation,
        "model": name, "fingerprint": fingerprint, "dim": dim, "normalized": True, "pooling": "mean",
        "max_length": e.max_length, "dtype": dtype, "splitter": splitter,
        "config": json.loads(config.to_json()),
        "counts": {"documents": doc_start, "sentences": row_start, "shards": len(shards)},
        "shards": shards, "index": index_entry, "checksums": dict(sorted(checksums.items())),
        "runs": (old["runs"] if old else []) + [run],
    }


def _remove_new_store(root: Path) -> None:
    """After a failed first ingest: remove what this run created, so nothing half-written is left."""
    for name in (DOCUMENTS_DIR, SENTENCES_DIR):
        with contextlib.suppress(OSError):
            (root / name).rmdir()
    (root / LOCK).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        root.rmdir()


# ---------------------------------------------------------------------------------------------- reading

def _load_shard(root: Path, shard: dict, manifest: dict) -> tuple[list[Sentences], list[dict], list[str],
                                                                   np.ndarray]:
    """One shard -> (Sentences per document, metadata, sources, embeddings (N, dim) float32)."""
    dim, dtype = manifest["dim"], manifest["dtype"]
    dt = _read_table(root, shard["documents"])
    st = _read_table(root, shard["sentences"])
    where = root / shard["sentences"]
    if dt.schema.names != DOCUMENTS_SCHEMA.names:
        raise QascError(f"{root / shard['documents']}: unexpected columns {dt.schema.names}")
    if st.schema.names != sentences_schema(dim, dtype).names:
        raise QascError(f"{where}: unexpected columns {st.schema.names}")
    if st.schema.field("embedding").type != sentences_schema(dim, dtype).field("embedding").type:
        raise QascError(f"{where}: embedding column is {st.schema.field('embedding').type}, the manifest says "
                        f"{dtype}[{dim}]")
    if dt.num_rows != shard["n_documents"] or st.num_rows != shard["n_sentences"]:
        raise QascError(f"{where}: {dt.num_rows} documents / {st.num_rows} sentences, the manifest says "
                        f"{shard['n_documents']} / {shard['n_sentences']}")
    doc_ids = dt.column("doc_id").to_pylist()
    texts = dt.column("text").to_pylist()
    counts = dt.column("n_sentences").to_numpy().astype(np.int64)
    if int(counts.sum()) != st.num_rows:
        raise QascError(f"{where}: documents list {int(counts.sum())} sentences, the table holds {st.num_rows}")
    owner = pc.index_in(st.column("doc_id"), value_set=pa.array(doc_ids, pa.string())).to_numpy(
        zero_copy_only=False)
    expected = np.repeat(np.arange(len(doc_ids)), counts)
    starts = np.concatenate([[0], np.cumsum(counts)])
    position = np.arange(st.num_rows) - np.repeat(starts[:-1], counts)
    if not np.array_equal(owner, expected) or not np.array_equal(st.column("sentence").to_numpy(), position):
        raise QascError(f"{where}: sentence rows are not grouped by document in order")
    cols = {c: st.column(c).to_numpy() for c in ("char_start", "char_end", "paragraph", "section", "n_tokens")}
    docs = []
    for d, (doc_id, text) in enumerate(zip(doc_ids, texts, strict=True)):
        a, b = starts[d], starts[d + 1]
        try:
            docs.append(Sentences(doc_id, text, cols["char_start"][a:b], cols["char_end"][a:b],
                                  cols["paragraph"][a:b], cols["section"][a:b], cols["n_tokens"][a:b]))
        except ValueError as exc:
            raise QascError(f"{where}: {exc}") from None
    metadata = []
    for raw in dt.column("metadata").to_pylist():
        try:
            metadata.append(json.loads(raw))
        except ValueError:
            raise QascError(f"{root / shard['documents']}: corrupt metadata JSON") from None
    return docs, metadata, dt.column("source").to_pylist(), _embeddings(st, dim, str(where))


def _check_sizes(root: Path, manifest: dict) -> None:
    for rel, digest in manifest["checksums"].items():
        path = root / rel
        if not path.exists():
            raise QascError(f"{path}: missing store file")
        if path.stat().st_size != digest["bytes"]:
            raise QascError(f"{path}: {path.stat().st_size} bytes, the manifest says {digest['bytes']} "
                            f"(truncated or replaced)")


def _load_index(root: Path, manifest: dict):
    entry = manifest["index"]
    path = root / entry["file"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise QascError(f"{path}: cannot read the index ({exc.strerror or exc})") from None
    if faiss_index.sha256(data) != manifest["checksums"][entry["file"]]["sha256"]:
        raise QascError(f"{path}: checksum mismatch (corrupt or truncated index); run qasc verify")
    index = faiss_index.deserialize(data, str(path))
    if index.ntotal != manifest["counts"]["sentences"] or index.d != manifest["dim"]:
        raise QascError(f"{path}: index holds {index.ntotal} x {index.d}, the store has "
                        f"{manifest['counts']['sentences']} x {manifest['dim']}")
    params = entry.get("params", {})
    if entry["kind"] == "ivf":
        index.nprobe = int(params.get("nprobe", 1))
    elif entry["kind"] == "hnsw":
        index.hnsw.efSearch = int(params.get("efSearch", faiss_index.HNSW_EF_SEARCH))
    return index


class Store:
    """A committed store in memory: documents, sentence rows, embeddings (N, dim) float32 and the index."""

    def __init__(self, path: Path, manifest: dict, docs: list[Sentences], metadata: list[dict],
                 sources: list[str], embeddings: np.ndarray, index) -> None:
        self.path = path
        self.manifest = manifest
        self.docs = docs
        self.doc_ids = [d.doc_id for d in docs]
        self.metadata = metadata
        self.sources = sources
        self.embeddings = embeddings
        self.doc_offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
        self.row_doc = np.repeat(np.arange(len(docs), dtype=np.int64), np.diff(self.doc_offsets))  # (N,)
        self.index = index

    @classmethod
    def open(cls, path: str | Path, *, load_index: bool = True) -> Store:
        """Reads a committed store; QascError if missing, incomplete (no complete manifest) or corrupt."""
        root = Path(path).expanduser().absolute()
        manifest = read_manifest(root)
        _check_sizes(root, manifest)
        docs: list[Sentences] = []
        metadata: list[dict] = []
        sources: list[str] = []
        embs: list[np.ndarray] = []
        for shard in manifest["shards"]:
            d, m, s, e = _load_shard(root, shard, manifest)
            docs.extend(d)
            metadata.extend(m)
            sources.extend(s)
            embs.append(e)
        dim = int(manifest["dim"])
        emb = np.concatenate(embs) if embs else np.zeros((0, dim), np.float32)
        if len(emb) != manifest["counts"]["sentences"] or len(docs) != manifest["counts"]["documents"]:
            raise QascError(f"{root}: {len(docs)} documents / {len(emb)} sentences, the manifest says "
                            f"{manifest['counts']['documents']} / {manifest['counts']['sentences']}")
        index = faiss_index.to_device(_load_index(root, manifest), manifest["index"]["kind"]) if load_index else None
        return cls(root, manifest, docs, metadata, sources, emb, index)

    @property
    def config(self) -> EngineConfig:
        return EngineConfig.from_dict(self.manifest["config"])

    def __len__(self) -> int:
        return len(self.embeddings)

    def check_embedder(self, described: dict) -> None:
        """described: Embedder.describe(); QascError when its model or dimension differs from the store's."""
        m = self.manifest
        if described.get("fingerprint") != m["fingerprint"] or int(described.get("dim", -1)) != int(m["dim"]):
            raise QascError(f"store {self.path} was built with model {m['model']!r} (fingerprint {m['fingerprint']}, "
                            f"dim {m['dim']}); the query model is {described.get('model')!r} (fingerprint "
                            f"{described.get('fingerprint')}, dim {described.get('dim')})")

    def search(self, query_emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """query_emb (Q, dim) float32, k -> scores (Q, k) float32 (-inf where missing), rows (Q, k) int64 (-1).

        Through the FAISS index; exact numpy inner products when the store was opened with load_index=False.
        """
        if self.index is not None:
            return faiss_index.search(self.index, query_emb, k)
        return exact_search(self.embeddings, query_emb, k)


def exact_search(emb: np.ndarray, query_emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """emb (N, dim), query_emb (Q, dim), k -> exact top-k (scores (Q, k) float32, rows (Q, k) int64)."""
    if not isinstance(k, int | np.integer) or k < 1:
        raise QascError(f"k must be a positive integer, got {k!r}")
    q = np.asarray(query_emb, dtype=np.float32)
    if q.ndim != 2 or q.shape[1] != emb.shape[1]:
        raise QascError(f"query embeddings must have shape (Q, {emb.shape[1]}), got {tuple(q.shape)}")
    if not np.isfinite(q).all():
        raise QascError("query embeddings contain NaN or inf")
    scores = np.full((len(q), k), -np.inf, np.float32)
    rows = np.full((len(q), k), -1, np.int64)
    kk = min(k, len(emb))
    if kk and len(q):
        sims = q @ emb.T  # (Q, N)
        top = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
        order = np.argsort(-np.take_along_axis(sims, top, 1), axis=1, kind="stable")
        rows[:, :kk] = np.take_along_axis(top, order, 1)
        scores[:, :kk] = np.take_along_axis(sims, rows[:, :kk], 1)
    return scores, rows


# ---------------------------------------------------------------------------------------------- verify

def verify_store(path: str | Path, *, sample: int = 2000) -> list[tuple[str, bool, str]]:
    """Every integrity check of a store -> [(check, ok, detail)]; QascError if it is not a complete store.

    Checksums and sizes of every file, Parquet readability and row counts, unique doc ids, offsets inside
    their document, token cap, finite unit-norm embeddings, index size/dim/kind and its vectors against the
    stored embeddings (a sample of rows), and the model's fingerprint/dim where the model is available.
    """
    root = Path(path).expanduser().absolute()
    manifest = read_manifest(root)
    out: list[tuple[str, bool, str]] = []

    def check(name: str, problems: list[str], ok_detail: str) -> None:
        out.append((name, not problems, "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)"
                                                                   if len(problems) > 5 else "") or ok_detail))

    problems = []
    for rel, digest in manifest["checksums"].items():
        if not (root / rel).exists():
            problems.append(f"{rel} missing")
        elif file_digest(root / rel) != digest:
            problems.append(f"{rel} differs from the manifest (sha256/size)")
    check("checksums", problems, f"{len(manifest['checksums'])} files match the manifest")

    docs: list[Sentences] = []
    embs: list[np.ndarray] = []
    problems = []
    for shard in manifest["shards"]:
        try:
            d, _, _, e = _load_shard(root, shard, manifest)
            docs.extend(d)
            embs.append(e)
        except QascError as exc:
            problems.append(str(exc))
    n_sent = sum(len(d) for d in docs)
    counts = manifest["counts"]
    if not problems and (len(docs) != counts["documents"] or n_sent != counts["sentences"]
                         or len(manifest["shards"]) != counts["shards"]):
        problems.append(f"{len(docs)} documents / {n_sent} sentences, the manifest says "
                        f"{counts['documents']} / {counts['sentences']}")
    check("tables", problems, f"{counts['shards']} shards, {counts['documents']} documents, "
                              f"{counts['sentences']} sentences readable, counts match")
    loaded = not problems

    problems = []
    ids = [d.doc_id for d in docs]
    dup = [k for k, v in collections.Counter(ids).items() if v > 1]
    if dup:
        problems.append(f"duplicate doc_ids {dup[:3]}")
    cap = manifest["splitter"].get("max_sentence_tokens", 10**9)
    for d in docs:
        if len(d) and (d.char_start.min() < 0 or d.char_end.max() > len(d.text) or np.any(d.char_end <= d.char_start)):
            problems.append(f"{d.doc_id}: sentence offsets outside the document")
        elif len(d) and int(d.n_tokens.max()) > cap:
            problems.append(f"{d.doc_id}: a sentence of {int(d.n_tokens.max())} tokens exceeds the cap {cap}")
        elif np.any(np.diff(d.paragraph) < 0) or np.any(np.diff(d.section) < 0):
            problems.append(f"{d.doc_id}: paragraph/section ids go backwards")
    rng = np.random.default_rng(0)
    for d in docs[:: max(1, len(docs) // 50)]:
        for i in rng.choice(len(d), size=min(len(d), 20), replace=False).tolist() if len(d) else []:
            s = d.text[int(d.char_start[i]):int(d.char_end[i])]
            if s != s.strip():
                problems.append(f"{d.doc_id}: sentence {i} has untrimmed offsets")
    if not loaded:
        problems.append("not checked: tables unreadable")
    check("offsets", problems, f"{n_sent} sentence spans inside their documents, token cap {cap} holds")

    dim = int(manifest["dim"])
    emb = np.concatenate(embs) if embs else np.zeros((0, dim), np.float32)
    problems = []
    if len(emb):
        if not np.isfinite(emb).all():
            problems.append(f"{int((~np.isfinite(emb)).any(1).sum())} embeddings hold NaN/inf")
        else:
            norms = np.linalg.norm(emb, axis=1)
            tol = 1e-2 if manifest["dtype"] == "float16" else 1e-3
            if np.abs(norms - 1).max() > tol:
                problems.append(f"{int((np.abs(norms - 1) > tol).sum())} embeddings are not unit-norm")
    if not loaded:
        problems.append("not checked: tables unreadable")
    check("embeddings", problems, f"{len(emb)} x {dim} {manifest['dtype']}, finite, unit norm")

    problems = []
    try:
        index = _load_index(root, manifest)
        if loaded and len(emb):
            rows = np.unique(rng.integers(0, len(emb), size=min(sample, len(emb))))
            got = faiss_index.reconstruct(index, rows)
            if not np.allclose(got, emb[rows], atol=1e-6):
                problems.append("index vectors differ from the stored embeddings")
    except QascError as exc:
        problems.append(str(exc))
    check("index", problems, f"{manifest['index']['kind']} index of {manifest['index']['ntotal']} vectors, "
                             f"dim {dim}, matches the embeddings")

    problems, detail = [], ""
    try:
        from engine.embedder import model_fingerprint, resolve_model_path

        model_path = resolve_model_path(manifest["config"]["embedder"].get("model"))
        if Path(model_path).is_dir():
            fp = model_fingerprint(model_path)
            cfg = json.loads((Path(model_path) / "config.json").read_text())
            hidden = int(cfg.get("hidden_size", cfg.get("dim", -1)))
            if fp != manifest["fingerprint"]:
                problems.append(f"model {manifest['model']!r} here has fingerprint {fp}, the store "
                                f"{manifest['fingerprint']}")
            if hidden != dim:
                problems.append(f"model {manifest['model']!r} has dim {hidden}, the store {dim}")
            detail = f"{manifest['model']} fingerprint {fp}, dim {hidden}"
        else:
            detail = f"model {manifest['model']!r} not available here; fingerprint not checked"
    except (ImportError, OSError, ValueError) as exc:
        detail = f"model {manifest['model']!r} not available here ({_first_line(exc)}); not checked"
    check("model", problems, detail)
    if (root / STAGING).exists():
        out.append(("pending", True, "an unfinished ingest is staged (_staging/); the committed store is intact"))
    return out


__all__ = [
    "DOCUMENTS_SCHEMA",
    "SENTENCE_COLUMNS",
    "Document",
    "DocRef",
    "IngestContext",
    "ReadOptions",
    "ShardTask",
    "Store",
    "exact_search",
    "ingest",
    "read_manifest",
    "sentences_schema",
    "summary_line",
    "verify_store",
]
