"""Files of a store: atomic writes (temp name, fsync, rename), sha256 digests, the writer's lock, Parquet
reads that name the file in their errors, and the crash-test failpoints.

Failpoints are for tests only and are not parameters: `QASC_FAILPOINT=name[:n]` SIGKILLs the process the
n-th time `name` is reached; `QASC_FAILPOINT=name:n:enospc` raises "No space left on device" there instead.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import hashlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from qasc.engine.errors import QascError, first_line
from qasc.engine.store.schema import LOCK


class ResumableError(QascError):
    """The run stopped for a reason outside the inputs (disk, cluster): finished shards are kept for a rerun."""


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


def atomic_write_with(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) fills a temp file beside path, which is then published atomically (for writers that take a
    path, such as faiss.write_index: no bytes copy of the content in memory); the temp file is removed on error."""
    tmp = _tmp_name(path)
    try:
        write(tmp)
        _publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_parquet(table: pa.Table, path: Path, row_group_size: int) -> None:
    """zstd Parquet with page checksums, written atomically; vectors without a dictionary (`dictionary_columns`)."""
    failpoint("parquet-write")
    tmp = _tmp_name(path)
    pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd", write_page_checksum=True,
                   use_dictionary=dictionary_columns(table.schema))
    _publish(tmp, path)


def is_vector_type(kind: pa.DataType) -> bool:
    """A (fixed-size) list of floats: an embedding column."""
    return (pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind)) and pa.types.is_floating(kind.value_type)


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns Parquet should dictionary-encode: all but the vectors. A float16 embedding's 65,536 possible
    values made every page a dictionary plus indices, read 4x slower than plain values (and larger): store open at
    1M rows spent ~11 s there (bench/RESULTS.md, "store open")."""
    return [f.name for f in schema if not is_vector_type(f.type)]


def file_digest(path: Path) -> dict:
    """path -> {"sha256": hex, "bytes": size}."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
            size += len(block)
    return {"sha256": digest.hexdigest(), "bytes": size}


def _read_parquet(root: Path, rel: str, read: Callable[[Path], object]):
    """read(root / rel) for one Parquet file of the store; QascError naming the file when it is missing or bad,
    or when rel points outside the store (a hand-edited manifest)."""
    if ".." in Path(rel).parts or Path(rel).is_absolute():
        raise QascError(f"{root}: the manifest points at {rel!r}, outside the store")
    try:
        return read(root / rel)
    except FileNotFoundError:
        raise QascError(f"{root / rel}: missing store file") from None
    except (pa.ArrowException, OSError) as exc:
        raise QascError(f"{root / rel}: corrupt or truncated Parquet file ({first_line(exc)})") from None


def read_table(root: Path, rel: str, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file of the store, page checksums verified (errors as `_read_parquet`)."""
    return _read_parquet(root, rel, lambda path: _read_file(path, columns))


def _read_file(path: Path, columns: list[str] | None) -> pa.Table:
    """One Parquet file -> its table; through ParquetFile rather than pq.read_table, which imports pyarrow.dataset
    and pandas (~0.9 s of CPU in a fresh `qasc query` process) for the same table."""
    with pq.ParquetFile(path, page_checksum_verification=True) as f:
        return f.read(columns=columns)


def read_row_count(root: Path, rel: str) -> int:
    """The rows of one Parquet file of the store, from its footer alone (errors as `_read_parquet`)."""
    return int(_read_parquet(root, rel, lambda path: pq.read_metadata(path).num_rows))


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Holds the store's writer lock (one ingest at a time); QascError when another ingest holds it."""
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


_FAILPOINT_HITS: collections.Counter = collections.Counter()


def failpoint(name: str) -> None:
    """Crash-test hook, off unless QASC_FAILPOINT names this point (see the module docstring)."""
    spec = os.environ.get("QASC_FAILPOINT")
    if not spec:
        return
    want, _, rest = spec.partition(":")
    if want != name:
        return
    nth, _, action = rest.partition(":")
    _FAILPOINT_HITS[name] += 1
    if action == "enospc":
        if _FAILPOINT_HITS[name] == int(nth or 1):
            _FAILPOINT_HITS[name] = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
    elif _FAILPOINT_HITS[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
