"""Inputs of an ingest: discover files, plan read units from their sizes, read and validate a unit in a worker.

The plan (`plan_files` for files, `plan_memory` for an Arrow table, a pandas DataFrame or an iterable of
records) reads no document: it lists the inputs with their byte sizes (text, .jsonl) or row counts and row
group sizes (.parquet, from the footer) and cuts them into `Segment`s packed into `InputUnit`s of about
`unit_bytes` input bytes. A .jsonl file larger than a unit is cut at line starts (one pass counting newlines,
so each segment knows its first line number); a .parquet file at row ranges (from its row groups' sizes).
What needs the content (decoding, JSON, fields, ids, empty documents, duplicate ids within a unit) is checked
by `read_unit` in the worker that reads the unit, before any of its shards is written; ids across units and
against the store are checked by the driver (engine/store/ingest.py) before the manifest is written.

In-memory inputs become the same Documents as files: table rows those of a .parquet file (source
`LABEL#rowN`, 0-based), records those of a .jsonl file (source `LABEL:N`, 1-based); the metadata is every
other column / key. So a store built from memory with `source=` the file's path is byte-identical to the
store built from that file while the input fits one unit (the shards are cut inside a unit).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from qasc.engine.errors import QascError, first_line

TEXT_EXTENSIONS = (".md", ".markdown", ".txt", ".text", ".rst")
TABLE_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
MEMORY_KINDS = ("table", "records")  # in-memory inputs: Arrow table / pandas DataFrame, iterable of mappings
ENCODING_ERRORS = ("strict", "replace", "ignore", "backslashreplace")
BINARY_SNIFF = 8192  # bytes inspected for NUL
SCAN_BLOCK = 1 << 22  # bytes read at a time when a large .jsonl file is cut at line starts
PARQUET_BATCH = 1024  # rows a worker decodes at a time


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
class Document:
    doc_id: str
    text: str
    metadata: dict
    source: str

@dataclass(frozen=True)
class Segment:
    """A contiguous piece of one input, enough for a worker to read it: a whole text file (doc_id from its
    path), the lines of a .jsonl file that start in bytes [start, end) (the first one is line `row`), rows
    [start, end) of a .parquet file or of an in-memory input (label = path)."""

    path: str  # absolute; in-memory inputs: the source label
    kind: str  # text | jsonl | parquet | table | records
    start: int
    end: int
    row: int  # jsonl: number (1-based) of the line at byte `start`; otherwise 0
    size: int  # input bytes (in-memory inputs: characters): the planning weight
    whole: bool  # the segment is the whole input (an input without records is an error)
    doc_id: str | None = None  # text files
    file_bytes: int = 0  # files: size and mtime when planned (a worker refuses a file that changed since)
    mtime_ns: int = 0


@dataclass(frozen=True)
class InputUnit:
    """One unit of planning and of parallel reading: segments in store order. A worker reads it and cuts it
    into shards of about shard_chars characters (the unit of writing and of resume)."""

    unit_id: int
    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)


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
    if table.num_rows == 0:  # an empty DataFrame's columns are float64: say what is wrong, not the type
        raise QascError(f"{label}: empty collection (no records)")
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


def _metadata(record: dict, opts: ReadOptions) -> dict:
    return {k: v for k, v in record.items() if k not in (opts.id_field, opts.text_field)}


def _stat(path: Path | str) -> os.stat_result:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise QascError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not os.path.isfile(path):
        raise QascError(f"{path}: is a folder, expected a file")
    return st


def _jsonl_segments(path: Path, st: os.stat_result, unit_bytes: int) -> list[Segment]:
    """A .jsonl file -> segments of about unit_bytes cut at line starts (one streaming pass over a file larger
    than a unit, counting newlines; a smaller file is one segment and is not read here)."""
    common = dict(file_bytes=st.st_size, mtime_ns=st.st_mtime_ns)
    size = st.st_size
    if size <= unit_bytes:
        return [Segment(str(path), "jsonl", 0, size, 1, size, True, **common)]
    cuts: list[tuple[int, int]] = []  # (byte offset, line number) of each segment start after the first
    start, pos, newlines = 0, 0, 0
    try:
        with open(path, "rb") as fh:
            while block := fh.read(SCAN_BLOCK):
                while (target := start + unit_bytes) <= pos + len(block):
                    nl = block.find(b"\n", max(target - 1 - pos, 0))
                    if nl < 0:
                        break
                    start = pos + nl + 1
                    cuts.append((start, newlines + block.count(b"\n", 0, nl + 1) + 1))
                newlines += block.count(b"\n")
                pos += len(block)
    except OSError as exc:
        raise QascError(f"{path}: cannot read ({exc.strerror or exc})") from None
    bounds = [(0, 1), *[c for c in cuts if c[0] < pos]]
    ends = [b for b, _ in bounds[1:]] + [pos]
    return [Segment(str(path), "jsonl", b, e, line, e - b, len(bounds) == 1, **common)
            for (b, line), e in zip(bounds, ends, strict=True)]


def _parquet_segments(path: Path, st: os.stat_result, opts: ReadOptions, unit_bytes: int) -> list[Segment]:
    """A .parquet file -> segments of about unit_bytes (uncompressed) by row ranges, from the footer only."""
    pf = _parquet_file(str(path), str(path))
    names = pf.schema_arrow.names
    for field in (opts.id_field, opts.text_field):
        if field not in names:
            raise QascError(f"{path}: no {field!r} column (columns: {', '.join(names)}); pass --id-field/--text-field")
    text_type = pf.schema_arrow.field(opts.text_field).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise QascError(f"{path}: column {opts.text_field!r} must hold strings, got {text_type}")
    md = pf.metadata
    if md.num_rows == 0:
        raise QascError(f"{path}: empty collection (no records)")
    bounds: list[tuple[int, int, float]] = []  # (first row, end row, bytes)
    first = row = 0
    acc = 0.0
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        per_row = max(md.row_group(g).total_byte_size, 1) / max(n, 1)
        left = n
        while left:
            take = min(left, max(1, math.ceil((unit_bytes - acc) / per_row)))
            acc += take * per_row
            row += take
            left -= take
            if acc >= unit_bytes:
                bounds.append((first, row, acc))
                first, acc = row, 0.0
    if first < row:
        bounds.append((first, row, acc))
    return [Segment(str(path), "parquet", a, b, 0, max(int(size), 1), len(bounds) == 1, file_bytes=st.st_size,
                    mtime_ns=st.st_mtime_ns) for a, b, size in bounds]


def plan_files(paths: Sequence[str | Path], opts: ReadOptions, unit_bytes: int, exclude: Path | None = None
               ) -> tuple[list[Segment], list[dict], list[str]]:
    """Discover the inputs and cut them into segments from their sizes -> (segments in store order, sources
    (path, kind, bytes, mtime_ns), skipped files). Reads no document (only .parquet footers, and the newlines
    of .jsonl files larger than a unit). Raises QascError for a missing, unreadable or empty input, a Parquet
    file without the id/text columns, and duplicate doc_ids among text files (their ids are their paths)."""
    files, skipped = discover(paths, exclude)
    segments: list[Segment] = []
    sources: list[dict] = []
    text_ids: dict[str, str] = {}
    for path, kind, doc_id in files:
        st = _stat(path)
        sources.append({"path": str(path), "kind": kind, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns})
        if kind == "text":
            if st.st_size == 0:
                raise QascError(f"{path}: empty file (no text)")
            if doc_id in text_ids:
                raise QascError(f"duplicate doc_id {doc_id!r}: {text_ids[doc_id]} and {path}")
            text_ids[doc_id] = str(path)
            segments.append(Segment(str(path), "text", 0, st.st_size, 0, st.st_size, True, doc_id, st.st_size,
                                    st.st_mtime_ns))
        elif kind == "jsonl":
            segments.extend(_jsonl_segments(path, st, unit_bytes))
        else:
            segments.extend(_parquet_segments(path, st, opts, unit_bytes))
    return segments, sources, skipped


def pack_units(segments: Sequence[Segment], unit_bytes: int) -> list[InputUnit]:
    """Segments in order -> units of about unit_bytes (a unit closes once it reaches unit_bytes)."""
    units: list[InputUnit] = []
    cur: list[Segment] = []
    size = 0
    for seg in segments:
        cur.append(seg)
        size += seg.size
        if size >= unit_bytes:
            units.append(InputUnit(len(units), tuple(cur)))
            cur, size = [], 0
    if cur:
        units.append(InputUnit(len(units), tuple(cur)))
    return units


def plan_memory(data: object, opts: ReadOptions, source: str | None = None
                ) -> tuple[list[Segment], list[dict], dict[str, list[Document]]]:
    """Validate an in-memory input (it is in memory already) -> (segments of one document each, its source
    entry, {label: Documents}).

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
    seen: dict[str, str] = {}
    for doc in docs:
        if doc.doc_id in seen:
            raise QascError(f"duplicate doc_id {doc.doc_id!r}: {seen[doc.doc_id]} and {doc.source}")
        seen[doc.doc_id] = doc.source
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(json.dumps([doc.doc_id, doc.text, doc.metadata], ensure_ascii=False, sort_keys=True,
                                 default=str).encode() + b"\n")
    source_entry = {"path": label, "kind": kind, "sha256": digest.hexdigest(),
                    "bytes": sum(len(d.text.encode("utf-8", "surrogatepass")) for d in docs)}
    segments = [Segment(label, kind, pos, pos + 1, 0, len(doc.text), False) for pos, doc in enumerate(docs)]
    return segments, [source_entry], {label: docs}


def _check_unchanged(seg: Segment) -> None:
    try:
        st = os.stat(seg.path)
    except OSError as exc:
        raise QascError(f"{seg.path}: cannot read ({exc.strerror or exc})") from None
    if (st.st_size, st.st_mtime_ns) != (seg.file_bytes, seg.mtime_ns):
        raise QascError(f"{seg.path}: changed since the ingest was planned; run it again")


def _jsonl_documents(seg: Segment, opts: ReadOptions) -> Iterator[Document]:
    try:
        with open(seg.path, "rb") as fh:
            fh.seek(seg.start)
            pos, lineno = seg.start, seg.row
            for line in fh:
                if pos >= seg.end:
                    break
                pos += len(line)
                body = line[:-1] if line.endswith(b"\n") else line
                if body.strip():
                    where = f"{seg.path}:{lineno}"
                    record = _parse_json_line(body, where, opts)
                    text = _check_text(record[opts.text_field], where, opts.text_field)
                    yield Document(_doc_id(record[opts.id_field], where, opts.id_field), text,
                                   _metadata(record, opts), where)
                lineno += 1
    except OSError as exc:
        raise QascError(f"{seg.path}: cannot read ({exc.strerror or exc})") from None


def _parquet_documents(seg: Segment, opts: ReadOptions) -> Iterator[Document]:
    pf = _parquet_file(seg.path, seg.path)
    groups, base, row = [], 0, None
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if base + n > seg.start and base < seg.end:
            groups.append(g)
            row = base if row is None else row
        base += n
    row = row or 0
    try:
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH, row_groups=groups):
            lo, hi = max(seg.start - row, 0), min(seg.end - row, batch.num_rows)
            if lo < hi:
                for i, record in enumerate(batch.slice(lo, hi - lo).to_pylist(), start=row + lo):
                    where = f"{seg.path}#row{i}"
                    if record[opts.id_field] is None:
                        raise QascError(f"{where}: missing {opts.id_field!r}")
                    text = _check_text(record[opts.text_field], where, opts.text_field)
                    yield Document(_doc_id(record[opts.id_field], where, opts.id_field), text,
                                   _metadata(record, opts), where)
            row += batch.num_rows
            if row >= seg.end:
                break
    except (pa.ArrowException, KeyError) as exc:
        raise QascError(f"{seg.path}: corrupt Parquet file ({first_line(exc)})") from None


def read_segment(seg: Segment, opts: ReadOptions,
                 memory: Mapping[str, Sequence[Document]] | None = None) -> Iterator[Document]:
    """Stage read of one segment: its Documents (text, metadata, source), each validated, streamed.

    memory: the in-memory inputs' Documents by source label (what `plan_memory` returned)."""
    if seg.kind in MEMORY_KINDS:
        held = (memory or {}).get(seg.path)
        if held is None:
            raise QascError(f"{seg.path}: in-memory input is not available here")
        yield from held[seg.start:seg.end]
        return
    _check_unchanged(seg)
    if seg.kind == "text":
        text = decode_text(_read_bytes(seg.path), seg.path, opts)
        if not text.strip():
            raise QascError(f"{seg.path}: empty file (no text)")
        yield Document(seg.doc_id, text, {}, seg.path)
        return
    count = 0
    for doc in _jsonl_documents(seg, opts) if seg.kind == "jsonl" else _parquet_documents(seg, opts):
        count += 1
        yield doc
    if count == 0 and seg.whole:
        raise QascError(f"{seg.path}: empty collection (no records)")


def read_unit(unit: InputUnit, opts: ReadOptions, memory: Mapping[str, Sequence[Document]] | None = None,
              counts: dict[str, int] | None = None) -> Iterator[Document]:
    """Stage read of a unit: its Documents in order, validated, doc_ids unique within the unit.

    counts: filled with the documents of each partial .jsonl segment (path -> n; the driver checks that a
    .jsonl file cut into several segments is not empty as a whole)."""
    seen: dict[str, str] = {}
    for seg in unit.segments:
        n = 0
        for doc in read_segment(seg, opts, memory):
            if doc.doc_id in seen:
                raise QascError(f"duplicate doc_id {doc.doc_id!r}: {seen[doc.doc_id]} and {doc.source}")
            seen[doc.doc_id] = doc.source
            n += 1
            yield doc
        if counts is not None and seg.kind == "jsonl" and not seg.whole:
            counts[seg.path] = counts.get(seg.path, 0) + n
