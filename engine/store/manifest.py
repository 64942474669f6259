"""The manifest (what a committed store is) and the staging area (what a running ingest has finished).

`read_manifest` / `existing_manifest` read a store's manifest; `Staging` keeps the plan of the running
ingest, the shard files the workers wrote, one record per finished shard and one marker per finished read
unit in `_staging/`, so a rerun of the same command resumes, and moves the shards into the store at commit;
`DocIdSet` / `store_doc_ids` hold doc_ids as 8-byte hashes for the uniqueness checks; `build_manifest`
describes the store after a run.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from qasc.engine.config import EngineConfig
from qasc.engine.errors import QascError, first_line
from qasc.engine.store.files import atomic_write, failpoint, file_digest, read_table
from qasc.engine.store.schema import (
    DOCUMENTS_DIR,
    FORMAT,
    FORMAT_VERSION,
    HEADINGS_DIR,
    LEXICAL_DIR,
    LOCK,
    MANIFEST,
    PASSAGE_LEXICAL_DIR,
    PASSAGES_DIR,
    SENTENCES_DIR,
    STAGED_DOCUMENTS,
    STAGED_HEADINGS,
    STAGED_LEXICAL,
    STAGED_PASSAGE_LEXICAL,
    STAGED_PASSAGES,
    STAGED_SENTENCES,
    STAGING,
    shard_name,
)


def _engine_version() -> str:
    from qasc import engine

    return str(getattr(engine, "__version__", "unknown"))


def now() -> str:
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
        raise QascError(f"{mpath}: corrupt manifest ({first_line(exc)})") from None
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


def check_sizes(root: Path, manifest: dict) -> None:
    """QascError naming the first file of the manifest that is missing or not its recorded size."""
    for rel, digest in manifest["checksums"].items():
        path = root / rel
        if not path.exists():
            raise QascError(f"{path}: missing store file")
        if path.stat().st_size != digest["bytes"]:
            raise QascError(f"{path}: {path.stat().st_size} bytes, the manifest says {digest['bytes']} "
                            f"(truncated or replaced)")


def existing_manifest(path: str | Path) -> dict | None:
    """The manifest of an existing store, None for a new (absent or empty, or never finished) folder."""
    root = Path(path).expanduser()
    if not root.exists():
        return None
    if not root.is_dir():
        raise QascError(f"--store {root}: exists and is a file, not a store folder")
    if (root / MANIFEST).exists():
        return read_manifest(root)
    ours = {STAGING, LOCK, *SHARD_DIRS}
    strangers = [p.name for p in root.iterdir() if p.name not in ours and not p.name.startswith(".")
                 and not re.fullmatch(r"index-\d+\.faiss|mapped-\d+", p.name)]  # an ingest killed before its manifest
    if strangers:
        raise QascError(f"--store {root}: folder exists and is not a QASC store (no {MANIFEST}; holds "
                        f"{', '.join(sorted(strangers)[:3])}); use a new or empty folder")
    if not (root / STAGING).exists():  # no ingest to resume: store files without a manifest are a damaged store
        held = [p for p in root.iterdir() if re.fullmatch(r"index-\d+\.faiss", p.name)]
        held += [f for d in SHARD_DIRS if (root / d).is_dir()
                 for f in (root / d).iterdir()]
        if held:
            raise QascError(f"--store {root}: holds store files ({held[0].relative_to(root)}, ...) but no {MANIFEST} "
                            f"and no unfinished ingest: a damaged store, left as it is; restore its {MANIFEST} or "
                            f"use a new or empty folder")
    return None


def id_hashes(ids: Sequence[str]) -> np.ndarray:
    """doc_ids -> (n,) uint64: the first 8 bytes of each id's blake2b (a match is confirmed against the files)."""
    return np.array([int.from_bytes(hashlib.blake2b(i.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                    "little") for i in ids], dtype=np.uint64)


class DocIdSet:
    """A set of doc_id hashes in 8 bytes a document: sorted levels merged like a log-structured tree, so
    `add` and `hits` cost O(log n) per id and the driver never holds the ids themselves."""

    def __init__(self) -> None:
        self.levels: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(level) for level in self.levels)

    def hits(self, hashes: np.ndarray) -> np.ndarray:
        """(n,) uint64 -> (n,) bool: which are (probably) in the set."""
        out = np.zeros(len(hashes), bool)
        for level in self.levels:
            pos = np.minimum(np.searchsorted(level, hashes), len(level) - 1)
            out |= level[pos] == hashes
        return out

    def add(self, hashes: np.ndarray) -> None:
        arr = np.sort(hashes)
        while self.levels and len(self.levels[-1]) <= len(arr):
            arr = np.sort(np.concatenate([self.levels.pop(), arr]))
        if len(arr):
            self.levels.append(arr)


def store_doc_ids(root: Path, manifest: dict | None) -> DocIdSet:
    """The doc_ids of a committed store as a DocIdSet (read one shard's doc_id column at a time)."""
    ids = DocIdSet()
    for shard in manifest["shards"] if manifest else []:
        ids.add(id_hashes(read_table(root, shard["documents"], columns=["doc_id"]).column(0).to_pylist()))
    return ids


def source_of(root: Path, rel: str, doc_id: str) -> str | None:
    """The source of doc_id in one documents file of the store (or of _staging), None if it is not there."""
    table = read_table(root, rel, columns=["doc_id", "source"])
    for d, source in zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True):
        if d == doc_id:
            return source
    return None


def _key(unit: int, index: int) -> str:
    return f"{unit:06d}-{index:06d}"


# the store's folders of shard files
SHARD_DIRS = (DOCUMENTS_DIR, SENTENCES_DIR, HEADINGS_DIR, PASSAGES_DIR, LEXICAL_DIR, PASSAGE_LEXICAL_DIR)
# a shard's files (headings: format 2, passages: 3; lexical, passage_lexical: term counts, engine.store.lexical)
SHARD_FILES = ("documents", "sentences", "headings", "passages", "lexical", "passage_lexical")


def shard_files(record: dict) -> list[str]:
    """The store-relative files of a shard record or manifest shard entry (no headings file before format 2, no
    passages file before format 3 or in a store without passages, no term counts in shards written before
    them)."""
    return [record[k] for k in SHARD_FILES if k in record]


class Staging:
    """_staging/: the plan of the running ingest, the shard files the workers wrote (documents/, sentences/,
    headings/, passages/, lexical/, passage_lexical/),
    one record per finished shard (shards/), one marker per finished read unit (units/), and, once every unit
    is done, commit.json (which staged file becomes which store shard). Every file is written atomically."""

    def __init__(self, root: Path, plan: dict, log: Callable[[str], None]) -> None:
        self.root = root
        self.dir = root / STAGING
        self.shards_dir = self.dir / "shards"
        self.units_dir = self.dir / "units"
        self.done: dict[tuple[int, int], dict] = {}
        self.units: dict[int, dict] = {}
        self.placed: dict[str, int] = {}  # record key -> store shard id, once commit.json is written
        old = self._load_plan()
        if old is not None and old.get("hash") != plan["hash"]:
            log(f"qasc ingest: discarding an unfinished ingest of other inputs or settings in {root}")
            self.discard()
        elif old is not None:
            self._load_records(log)
        folders = (root, *(root / d for d in SHARD_DIRS), self.dir, self.shards_dir, self.units_dir,
                   root / STAGED_DOCUMENTS, root / STAGED_SENTENCES, root / STAGED_HEADINGS, root / STAGED_PASSAGES,
                   root / STAGED_LEXICAL, root / STAGED_PASSAGE_LEXICAL)
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            for tmp in folder.glob(".*.tmp-*"):  # half-written temp files of a killed run
                tmp.unlink(missing_ok=True)
        atomic_write(self.dir / "plan.json", json.dumps(plan, indent=1).encode())

    def _load_plan(self) -> dict | None:
        try:
            return json.loads((self.dir / "plan.json").read_text())
        except (OSError, ValueError):
            return None if not self.dir.exists() else {}

    def _final(self, record: dict, gid: int) -> dict:
        """A staged record -> the same shard renamed into the store as shard gid."""
        names = {rel: f"{rel.split('/')[1]}/{shard_name(gid)}" for rel in shard_files(record)}
        return {**record, "id": gid, **{k: names[record[k]] for k in SHARD_FILES if k in record},
                "checksums": {names[rel]: digest for rel, digest in record["checksums"].items()}}

    def _intact(self, checksums: dict) -> bool:
        try:
            return all(file_digest(self.root / rel) == digest for rel, digest in checksums.items())
        except OSError:
            return False

    def _load_records(self, log: Callable[[str], None]) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.placed = json.loads((self.dir / "commit.json").read_text())
        for path in sorted(self.shards_dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
                key = _key(record["unit"], record["index"])
                ok = self._intact(record["checksums"])
                if not ok and key in self.placed:  # renamed into the store by a commit that did not finish
                    ok = self._intact(self._final(record, self.placed[key])["checksums"])
            except (OSError, ValueError, KeyError):
                ok = False
            if ok:
                self.done[(int(record["unit"]), int(record["index"]))] = record
            else:
                path.unlink(missing_ok=True)
        for path in sorted(self.units_dir.glob("*.json")):
            with contextlib.suppress(OSError, ValueError, KeyError):
                summary = json.loads(path.read_text())
                u = int(summary["unit"])
                if all((u, k) in self.done for k in range(summary["shards"])):
                    self.units[u] = summary
        if self.done:
            log(f"qasc ingest: resuming, {len(self.done)} finished shard(s) kept from an earlier run")

    def documents_file(self, record: dict) -> str:
        """Where a record's documents file is now: staged, or renamed into the store by an unfinished commit."""
        key = _key(record["unit"], record["index"])
        if not (self.root / record["documents"]).exists() and key in self.placed:
            return self._final(record, self.placed[key])["documents"]
        return record["documents"]

    def record(self, record: dict) -> None:
        atomic_write(self.shards_dir / f"{_key(record['unit'], record['index'])}.json", json.dumps(record).encode())
        self.done[(int(record["unit"]), int(record["index"]))] = record
        failpoint("shard-written")

    def unit_done(self, summary: dict) -> None:
        atomic_write(self.units_dir / f"{summary['unit']:06d}.json", json.dumps(summary).encode())
        self.units[int(summary["unit"])] = summary

    def commit(self, first_id: int) -> list[dict]:
        """Every staged shard renamed into documents/ and sentences/ as shards first_id, first_id + 1, ... in
        (unit, index) order -> their records with the store's names. commit.json is written first, so a
        rerun after a crash here finds the renamed files."""
        order = sorted(self.done)
        self.placed = {_key(*key): first_id + i for i, key in enumerate(order)}
        atomic_write(self.dir / "commit.json", json.dumps(self.placed).encode())
        out = []
        for key in order:
            record = self.done[key]
            final = self._final(record, self.placed[_key(*key)])
            for key_name in SHARD_FILES:
                rel = record.get(key_name)
                if rel is not None and (self.root / rel).exists():
                    os.replace(self.root / rel, self.root / final[key_name])
            out.append(final)
        for folder in SHARD_DIRS:
            fd = os.open(self.root / folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        failpoint("shards-placed")
        return out

    def discard(self) -> None:
        """Removes the staged shard files (also those a crashed commit had renamed into the store) and the
        staging folder; the committed store is untouched."""
        with contextlib.suppress(OSError, ValueError):
            self.placed = self.placed or json.loads((self.dir / "commit.json").read_text())
        records = list(self.done.values())
        for path in self.shards_dir.glob("*.json") if self.shards_dir.exists() else []:
            with contextlib.suppress(OSError, ValueError):
                records.append(json.loads(path.read_text()))
        for record in records:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                rels = list(record["checksums"])
                key = _key(record["unit"], record["index"])
                if key in self.placed:
                    rels += list(self._final(record, self.placed[key])["checksums"])
                for rel in rels:
                    (self.root / rel).unlink(missing_ok=True)
        self.done.clear()
        self.units.clear()
        self.placed = {}
        shutil.rmtree(self.dir, ignore_errors=True)

    def finish(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def check_compatible(manifest: dict, root: Path, name: str, fingerprint: str, splitter: dict, dtype: str) -> None:
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


def shard_entry(record: dict) -> dict:
    keys = ("id", *SHARD_FILES, "n_documents", "n_sentences", "n_headings", "n_passages", "n_terms",
            "n_passage_terms", "term_rule", "chars")
    return {k: record[k] for k in keys if k in record}


def build_manifest(old: dict | None, config: EngineConfig, name: str, fingerprint: str, dim: int, dtype: str,
              splitter: dict, shards: list[dict], records: list[dict], index_entry: dict, index_sha: str,
              index_bytes: int, generation: int, run: dict, ingest: dict) -> dict:
    """Everything about the store after this run: the one file that makes it exist (written last)."""
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
        "config": json.loads(config.to_json()), "ingest": ingest,
        "counts": {"documents": doc_start, "sentences": row_start, "shards": len(shards)},
        "shards": shards, "index": index_entry, "checksums": dict(sorted(checksums.items())),
        "runs": (old["runs"] if old else []) + [run],
    }


def remove_new_store(root: Path) -> None:
    """After a failed first ingest: remove what this run created, so nothing half-written is left."""
    for name in SHARD_DIRS:
        with contextlib.suppress(OSError):
            (root / name).rmdir()
    (root / LOCK).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        root.rmdir()
