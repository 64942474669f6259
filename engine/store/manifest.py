"""The manifest (what a committed store is) and the staging area (what a running ingest has finished).

`read_manifest` / `existing_manifest` read a store's manifest; `Staging` keeps the plan of the running
ingest and one record per finished shard in `_staging/`, so a rerun of the same command resumes;
`build_manifest` describes the store after a run.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from engine.config import EngineConfig
from engine.errors import QascError, first_line
from engine.store.files import atomic_write, failpoint, file_digest, read_table
from engine.store.schema import (
    DOCUMENTS_DIR,
    FORMAT,
    FORMAT_VERSION,
    LOCK,
    MANIFEST,
    SENTENCES_DIR,
    STAGING,
)


def _engine_version() -> str:
    import engine

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


def existing_doc_ids(root: Path, manifest: dict | None) -> dict[str, str]:
    if not manifest:
        return {}
    out: dict[str, str] = {}
    for shard in manifest["shards"]:
        table = read_table(root, shard["documents"], columns=["doc_id"])
        out.update((d, f"{root}/{shard['documents']}") for d in table.column(0).to_pylist())
    return out


class Staging:
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
        failpoint("shard-written")

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
    return {k: record[k] for k in ("id", "documents", "sentences", "n_documents", "n_sentences", "chars")}


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
    for name in (DOCUMENTS_DIR, SENTENCES_DIR):
        with contextlib.suppress(OSError):
            (root / name).rmdir()
    (root / LOCK).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        root.rmdir()
