"""One input record -> a Document: decoding, the id and text fields, validation; in-memory tables and records.

Every check a document needs from its content lives here (binary data, the encoding, JSON, the id and text
fields, empty documents), so that a worker reading a unit (engine/store/inputs.py, `read_unit`) and the driver
validating an in-memory input (`plan_memory`) say the same thing in the same words.

In-memory inputs become the same Documents as files: table rows those of a .parquet file (source
`LABEL#rowN`, 0-based), records those of a .jsonl file (source `LABEL:N`, 1-based); the metadata is every
other column / key.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from qasc.engine.errors import QascError, first_line

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
class Document:
    doc_id: str
    text: str
    metadata: dict
    source: str


def read_bytes(path: str | Path) -> bytes:
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


def check_doc_id(value: object, where: str, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise QascError(f"{where}: {field!r} must be a string or an integer, got {type(value).__name__}")
    doc_id = str(value)
    if not doc_id.strip():
        raise QascError(f"{where}: empty {field!r}")
    return doc_id


def check_text(value: object, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise QascError(f"{where}: {field!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise QascError(f"{where}: empty document (no text)")
    return value


def parse_json_line(line: bytes, where: str, opts: ReadOptions) -> dict:
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


def parquet_file(data_or_path: bytes | str, where: str) -> pq.ParquetFile:
    try:
        source = pa.BufferReader(data_or_path) if isinstance(data_or_path, bytes) else data_or_path
        return pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as exc:
        raise QascError(f"{where}: not a readable Parquet file ({first_line(exc)})") from None


def memory_table(data: object, label: str) -> pa.Table | None:
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


def table_documents(table: pa.Table, label: str, opts: ReadOptions) -> list[Document]:
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
        text = check_text(record[opts.text_field], where, opts.text_field)
        docs.append(Document(check_doc_id(record[opts.id_field], where, opts.id_field), text, metadata_of(record, opts),
                             where))
    return docs


def record_documents(records: Iterable, label: str, opts: ReadOptions) -> list[Document]:
    """Mappings -> Documents, exactly as the lines of a .jsonl file holding these objects."""
    docs = []
    for lineno, record in enumerate(records, start=1):
        where = f"{label}:{lineno}"
        record = _check_record(record, where, opts, "a mapping", "set ReadOptions(id_field=..., text_field=...)")
        text = check_text(record[opts.text_field], where, opts.text_field)
        docs.append(Document(check_doc_id(record[opts.id_field], where, opts.id_field), text, metadata_of(record, opts),
                             where))
    return docs


def metadata_of(record: dict, opts: ReadOptions) -> dict:
    return {k: v for k, v in record.items() if k not in (opts.id_field, opts.text_field)}
