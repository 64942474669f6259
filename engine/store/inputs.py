"""Inputs of an ingest: discover files, decode and validate them, plan the shards, read a shard back.

Every input is read and validated by `plan_inputs` (files) or `plan_memory` (an Arrow table, a pandas
DataFrame or an iterable of records) before the first byte is written (a bad input is one QascError naming
where it is); `read_shard` reads a planned shard again in a worker and checks it against the plan.

In-memory inputs become the same Documents as files: table rows those of a .parquet file (source
`LABEL#rowN`, 0-based), records those of a .jsonl file (source `LABEL:N`, 1-based); the metadata is every
other column / key. So a store built from memory with `source=` the file's path is byte-identical to the
store built from that file.
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import QascError, first_line

TEXT_EXTENSIONS = (".md", ".markdown", ".txt", ".text", ".rst")
TABLE_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
MEMORY_KINDS = ("table", "records")  # in-memory inputs: Arrow table / pandas DataFrame, iterable of mappings
ENCODING_ERRORS = ("strict", "replace", "ignore", "backslashreplace")
BINARY_SNIFF = 8192  # bytes inspected for NUL


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
    path: str  # absolute; in-memory inputs: the source label
    kind: str  # text | jsonl | parquet | table | records
    row: int  # jsonl, records: line/record number (1-based); parquet, table: row (0-based); text: 0
    offset: int  # jsonl: byte offset of the line; table, records: position in the in-memory documents
    length: int  # jsonl: bytes of the line
    chars: int  # characters of the decoded text

    def where(self) -> str:
        line = f"{self.path}:{self.row}"
        return {"text": self.path, "jsonl": line, "records": line}.get(self.kind, f"{self.path}#row{self.row}")


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
    return _check_record(record, where, opts, "a JSON object", "pass --id-field/--text-field")


def _check_record(record: object, where: str, opts: ReadOptions, expected: str, hint: str) -> dict:
    """A .jsonl line's object or an in-memory record: a mapping holding the id and the text fields."""
    if not isinstance(record, Mapping):
        raise QascError(f"{where}: expected {expected} with {opts.id_field!r} and {opts.text_field!r}, "
                        f"got {type(record).__name__}")
    for field in (opts.id_field, opts.text_field):
        if field not in record:
            raise QascError(f"{where}: no {field!r} field (fields: {', '.join(map(str, record)) or 'none'}); {hint}")
    return dict(record)


def _parquet_file(data_or_path: bytes | str, where: str) -> pq.ParquetFile:
    try:
        source = pa.BufferReader(data_or_path) if isinstance(data_or_path, bytes) else data_or_path
        return pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as exc:
        raise QascError(f"{where}: not a readable Parquet file ({first_line(exc)})") from None


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
        raise QascError(f"{path}: corrupt Parquet file ({first_line(exc)})") from None


def _check_unique(refs: Sequence[DocRef], existing: dict[str, str], seen: dict[str, str]) -> None:
    """QascError for a doc_id already in the store or seen before (seen: doc_id -> where, updated)."""
    for ref in refs:
        if ref.doc_id in existing:
            raise QascError(f"duplicate doc_id {ref.doc_id!r}: {ref.where()} is already in the store "
                            f"({existing[ref.doc_id]})")
        if ref.doc_id in seen:
            raise QascError(f"duplicate doc_id {ref.doc_id!r}: {seen[ref.doc_id]} and {ref.where()}")
        seen[ref.doc_id] = ref.where()


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
        _check_unique(new, existing, seen)
        refs.extend(new)
    return refs, sources, skipped


def _memory_table(data: object, label: str) -> pa.Table | None:
    """An Arrow table / record batch / pandas DataFrame -> pa.Table; None for anything else."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pandas"):  # pandas stays optional
        try:
            return pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            why = "; ".join(str(a).strip().splitlines()[0] for a in exc.args if str(a).strip())[:300]
            raise QascError(f"{label}: cannot convert the DataFrame to Arrow ({why or first_line(exc)})") from None
    return None


def _table_documents(table: pa.Table, label: str, opts: ReadOptions) -> list[Document]:
    """Rows of an in-memory table -> Documents, exactly as the rows of a .parquet file with these columns."""
    names = table.schema.names
    for name in (opts.id_field, opts.text_field):
        if name not in names:
            raise QascError(f"{label}: no {name!r} column (columns: {', '.join(names) or 'none'}); set "
                            f"ReadOptions(id_field=..., text_field=...)")
    if len(set(names)) != len(names):
        raise QascError(f"{label}: duplicate column names ({', '.join(names)})")
    text_type = table.schema.field(opts.text_field).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise QascError(f"{label}: column {opts.text_field!r} must hold strings, got {text_type}")
    docs = []
    for row, record in enumerate(table.to_pylist()):
        where = f"{label}#row{row}"
        if record[opts.id_field] is None:
            raise QascError(f"{where}: missing {opts.id_field!r}")
        text = _check_text(record[opts.text_field], where, opts.text_field)
        docs.append(Document(_doc_id(record[opts.id_field], where, opts.id_field), text, _metadata(record, opts),
                             where))
    return docs


def _record_documents(records: Iterable, label: str, opts: ReadOptions) -> list[Document]:
    """Mappings -> Documents, exactly as the lines of a .jsonl file holding these objects."""
    docs = []
    for lineno, record in enumerate(records, start=1):
        where = f"{label}:{lineno}"
        record = _check_record(record, where, opts, "a mapping", "set ReadOptions(id_field=..., text_field=...)")
        text = _check_text(record[opts.text_field], where, opts.text_field)
        docs.append(Document(_doc_id(record[opts.id_field], where, opts.id_field), text, _metadata(record, opts),
                             where))
    return docs


def plan_memory(data: object, opts: ReadOptions, existing: dict[str, str] | None = None,
                source: str | None = None) -> tuple[list[DocRef], list[dict], dict[str, list[Document]]]:
    """Validate an in-memory input -> (documents in store order, its source entry, {label: Documents}).

    data: a pyarrow Table or RecordBatch, a pandas DataFrame, or an iterable of mappings (records).
    source: the label stored as each document's source (default "table" or "records"). The source entry's
    sha256 digests the documents (id, text, metadata), so rerunning with the same data resumes.
    """
    if isinstance(data, str | bytes | os.PathLike):
        raise QascError(f"expected an Arrow table, a pandas DataFrame or an iterable of records, got "
                        f"{type(data).__name__}; pass files and folders to ingest()")
    table = _memory_table(data, source or "table")
    if table is not None:
        kind, label = "table", source or "table"
        docs = _table_documents(table, label, opts)
    elif isinstance(data, Iterable) and not isinstance(data, Mapping):
        kind, label = "records", source or "records"
        docs = _record_documents(data, label, opts)
    else:
        raise QascError(f"expected an Arrow table, a pandas DataFrame or an iterable of records, got "
                        f"{type(data).__name__}")
    if not docs:
        raise QascError(f"{label}: empty collection (no records)")
    refs = [DocRef(doc.doc_id, label, kind, pos + 1 if kind == "records" else pos, pos, 0, len(doc.text))
            for pos, doc in enumerate(docs)]
    _check_unique(refs, existing or {}, {})
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(json.dumps([doc.doc_id, doc.text, doc.metadata], ensure_ascii=False, sort_keys=True,
                                 default=str).encode() + b"\n")
    source_entry = {"path": label, "kind": kind, "sha256": digest.hexdigest(),
                    "bytes": sum(len(d.text.encode("utf-8", "surrogatepass")) for d in docs)}
    return refs, [source_entry], {label: docs}


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


def read_shard(refs: Sequence[DocRef], opts: ReadOptions,
               memory: Mapping[str, Sequence[Document]] | None = None) -> list[Document]:
    """Stage read: DocRefs -> Documents (text, metadata, source), checked against the plan.

    memory: the in-memory inputs' Documents by source label (what `plan_memory` returned)."""
    docs: list[Document] = []
    for path, group in itertools.groupby(refs, key=lambda r: r.path):
        group = list(group)
        kind = group[0].kind
        if kind in MEMORY_KINDS:
            held = (memory or {}).get(path)
            if held is None:
                raise QascError(f"{group[0].where()}: in-memory input {path!r} is not available here")
            docs.extend(held[ref.offset] for ref in group)
        elif kind == "text":
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
