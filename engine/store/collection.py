"""Partitioned collections: a manifest over N self-contained partition stores, answering as one store.

A collection folder holds `collection.json` (the commit point, written last) and `order.parquet`: one row per
document of the collection in its global order, the partition that holds it. Partition p's k-th document is the
k-th document of the order that names p, so a document's global row ids are those of one store holding the same
documents in the same order. `ingest_partitions` (`qasc ingest --partitions N`) assigns each document by a stable
hash of its doc_id (`partition_of`: an append goes to the partition that holds the document) and writes
partitions `part-0000`... inside the folder; `assemble` (`qasc collection`) lists existing stores in order.
engine.store.collection_reader opens a collection as one store; `verify_collection` checks it and every partition.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from qasc.engine.errors import QascError, first_line
from qasc.engine.store.files import atomic_parquet, atomic_write, file_digest
from qasc.engine.store.manifest import now, read_manifest
from qasc.engine.store.schema import MANIFEST

COLLECTION = "collection.json"
ORDER = "order.parquet"
FORMAT = 1
MAX_PARTITIONS = 4096


def is_collection(path: str | Path) -> bool:
    return (Path(path).expanduser() / COLLECTION).is_file()


def partition_of(doc_id: str, n: int) -> int:
    """A document's partition of n: the first 8 bytes of sha256(doc_id) modulo n (stable across processes and
    runs, unlike Python's hash)."""
    digest = hashlib.sha256(doc_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % n


def partition_name(i: int) -> str:
    return f"part-{i:04d}"


def read_collection(path: str | Path) -> dict:
    """The collection's manifest; QascError (one line) when missing or corrupt."""
    root = Path(path).expanduser().absolute()
    try:
        manifest = json.loads((root / COLLECTION).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise QascError(f"{root}: not a QASC collection (no {COLLECTION})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise QascError(f"{root / COLLECTION}: corrupt collection manifest ({first_line(exc)})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(
            manifest.get("partitions"), list) or not manifest["partitions"]:
        raise QascError(f"{root / COLLECTION}: not a format-{FORMAT} collection manifest")
    return manifest


def partition_paths(root: Path, manifest: dict) -> list[Path]:
    """The partitions' folders: names relative to the collection folder, or absolute paths (assembled)."""
    return [(root / p["path"]) if not Path(p["path"]).is_absolute() else Path(p["path"])
            for p in manifest["partitions"]]


def read_order(root: Path, manifest: dict) -> np.ndarray:
    """(D,) int32 the partition of each document of the collection in global order; QascError when the file is
    missing, damaged or not the one the manifest lists."""
    path = root / ORDER
    try:
        if file_digest(path) != manifest["order"]:
            raise QascError(f"{path}: does not match the digest in {COLLECTION}; run qasc verify")
        order = pq.read_table(path).column("partition").to_numpy().astype(np.int32)
    except QascError:
        raise
    except (OSError, KeyError, pa.ArrowException) as exc:
        raise QascError(f"{path}: unreadable document order ({first_line(exc)})") from None
    if len(order) and (order.min() < 0 or order.max() >= len(manifest["partitions"])):
        raise QascError(f"{path}: partitions outside [0, {len(manifest['partitions'])})")
    return order


def write_collection(root: Path, partitions: Sequence[str], order: np.ndarray, assignment: str) -> dict:
    """Writes order.parquet, then collection.json (the commit point), atomically. partitions: the folders (relative
    to root, or absolute); assignment: "hash" (ingest_partitions) or "assembled"."""
    root.mkdir(parents=True, exist_ok=True)
    atomic_parquet(pa.table({"partition": pa.array(order, pa.int32())}), root / ORDER, 1 << 20)
    counts = np.bincount(order, minlength=len(partitions))
    manifest = {"format": FORMAT, "kind": "collection", "assignment": assignment, "written": now(),
                "documents": int(len(order)), "order": file_digest(root / ORDER),
                "partitions": [{"path": str(p), "documents": int(c)} for p, c in zip(partitions, counts, strict=True)]}
    atomic_write(root / COLLECTION, json.dumps(manifest, indent=1).encode())
    return manifest


def stored_doc_ids(path: Path) -> list[str]:
    """A committed store's doc_ids in store order ([] when there is no store yet)."""
    if not (path / MANIFEST).exists():
        return []
    manifest = read_manifest(path)
    return [d for shard in manifest["shards"]
            for d in pq.read_table(path / shard["documents"], columns=["doc_id"]).column("doc_id").to_pylist()]


def ingest_partitions(paths: Sequence[str | Path], store: str | Path, n: int, config=None, settings=None, *,
                      embedder=None, runner=None, progress=None, log: Callable[[str], None] | None = None) -> dict:
    """`ingest()` into a collection of n partitions: the inputs are read once here (in input order: the global
    order), each document goes to partition `partition_of(doc_id, n)`, each partition's documents are ingested
    (`ingest_table`, same config and settings) into `part-XXXX`, and the order is committed last. An existing
    collection (made by this function, with n partitions) is appended to. A run that stopped part way is run again
    as it was: partitions that already hold their documents are skipped, the others resume."""
    from qasc.engine.store.ingest import IngestConfig, ingest_table
    from qasc.engine.store.inputs import pack_units, plan_files, read_unit

    root = Path(store).expanduser().absolute()
    if not 1 <= n <= MAX_PARTITIONS:
        raise QascError(f"--partitions must be in 1..{MAX_PARTITIONS}, got {n}")
    old = np.zeros(0, np.int32)
    if is_collection(root):
        manifest = read_collection(root)
        if manifest.get("assignment") != "hash" or len(manifest["partitions"]) != n:
            raise QascError(f"{root}: a collection of {len(manifest['partitions'])} partitions "
                            f"({manifest.get('assignment')}); appends need --partitions "
                            f"{len(manifest['partitions'])} and a collection written by qasc ingest --partitions")
        old = read_order(root, manifest)
    elif root.exists() and any(not p.name.startswith("part-") for p in root.iterdir()):
        raise QascError(f"--store {root}: folder exists and is not a QASC collection")
    settings = settings or IngestConfig()
    opts = settings.read
    segments, _, _ = plan_files(paths, opts, settings.unit_bytes, exclude=root)
    records: list[list[dict]] = [[] for _ in range(n)]
    seen: set[str] = set()
    order: list[int] = []
    for unit in pack_units(segments, settings.unit_bytes):
        for doc in read_unit(unit, opts):
            if doc.doc_id in seen:
                raise QascError(f"duplicate doc_id {doc.doc_id!r} ({doc.source})")
            seen.add(doc.doc_id)
            p = partition_of(doc.doc_id, n)
            records[p].append({**doc.metadata, opts.id_field: doc.doc_id, opts.text_field: doc.text})
            order.append(p)
    if not order:
        raise QascError("no documents to ingest")
    summary = {"documents": 0, "sentences": 0}
    for p, recs in enumerate(records):
        part = root / partition_name(p)
        held = stored_doc_ids(part)
        if recs and {r[opts.id_field] for r in recs} <= set(held[len(held) - len(recs):]):
            continue  # committed by an earlier run of this command that stopped before the collection's commit
        if recs:
            done = ingest_table(recs, part, config, settings, source=partition_name(p), embedder=embedder,
                                runner=runner, progress=progress, log=log)
            summary["documents"] += done.get("documents", 0)
            summary["sentences"] += done.get("sentences", 0)
    write_collection(root, [partition_name(p) for p in range(n)], np.concatenate([old, np.asarray(order, np.int32)]),
                     "hash")
    return summary


def assemble(root: str | Path, stores: Sequence[str | Path]) -> dict:
    """A collection over existing stores, in the order given (global order: the first store's documents, then
    the second's, ...); the stores stay where they are (absolute paths in the manifest). QascError when one is not
    a store, their models differ, or a doc_id is held twice."""
    root = Path(root).expanduser().absolute()
    if root.exists() and any(root.iterdir()):
        raise QascError(f"--out {root}: folder exists and is not empty")
    paths = [Path(s).expanduser().absolute() for s in stores]
    if not paths:
        raise QascError("assemble: no stores given")
    fingerprints, order, seen = set(), [], {}
    for i, path in enumerate(paths):
        manifest = read_manifest(path)
        fingerprints.add((manifest.get("fingerprint"), manifest["dim"], manifest["dtype"]))
        for doc_id in stored_doc_ids(path):
            if doc_id in seen:
                raise QascError(f"doc_id {doc_id!r} is in both {seen[doc_id]} and {path}")
            seen[doc_id] = path
        order.extend([i] * int(manifest["counts"]["documents"]))
    if len(fingerprints) > 1:
        raise QascError(f"the stores hold vectors of different models or dtypes: {sorted(map(str, fingerprints))}")
    try:
        return write_collection(root, [str(p) for p in paths], np.asarray(order, np.int32), "assembled")
    except OSError:
        shutil.rmtree(root, ignore_errors=True)
        raise


def store_manifest(path: str | Path) -> dict:
    """The manifest `Engine.open` and `qasc query` read settings from: a store's own, or for a collection its first
    non-empty partition's with the collection's view of the index (kind flat: the view itself holds none; each
    partition searches with its own, engine.partition)."""
    root = Path(path).expanduser().absolute()
    if not is_collection(root):
        return read_manifest(root)
    manifest = read_collection(root)
    first = next((p for p, part in zip(partition_paths(root, manifest), manifest["partitions"], strict=True)
                  if part["documents"]), None)
    if first is None:
        raise QascError(f"collection {root}: no partition holds documents")
    return {**read_manifest(first), "index": {"kind": "flat"}, "collection": str(root)}


def check_collection(path: str | Path) -> None:
    """A light check before a job starts (no vectors read): the collection's manifest and order, and each
    partition's manifest and file sizes; QascError (one line) naming the first partition that cannot be opened."""
    from qasc.engine.store.manifest import check_sizes

    root = Path(path).expanduser().absolute()
    manifest = read_collection(root)
    counts = np.bincount(read_order(root, manifest), minlength=len(manifest["partitions"]))
    for part, n in zip(partition_paths(root, manifest), counts.tolist(), strict=True):
        if n == 0:
            continue
        try:
            held = read_manifest(part)
            check_sizes(part, held)
        except QascError as exc:
            raise QascError(f"collection {root}: partition {part} cannot be opened: {first_line(exc)}") from None
        if int(held["counts"]["documents"]) != n:
            raise QascError(f"collection {root}: partition {part} holds {held['counts']['documents']} documents, "
                            f"the collection lists {n} (an ingest did not finish? run it again)")


def verify_collection(path: str | Path, *, sample: int = 2000) -> list[tuple[str, bool, str]]:
    """`qasc verify` of a collection -> [(check, ok, detail)]: its manifest and order, every partition's checks
    (engine.store.verify_store, named "part-XXXX/check"), each partition's document count against the order, doc
    ids unique across partitions, the same model in every partition and, for a hashed collection, every document
    in the partition its doc_id hashes to."""
    from qasc.engine.store.verify import verify_store

    root = Path(path).expanduser().absolute()
    manifest = read_collection(root)
    order = read_order(root, manifest)
    out: list[tuple[str, bool, str]] = [("order", True, f"{len(order)} documents in {len(manifest['partitions'])} "
                                                          f"partitions")]
    counts = np.bincount(order, minlength=len(manifest["partitions"]))
    seen: dict[str, str] = {}
    problems: list[str] = []
    models = set()
    for i, (part, n) in enumerate(zip(partition_paths(root, manifest), counts.tolist(), strict=True)):
        if n == 0 and not part.exists():
            continue
        name = Path(manifest["partitions"][i]["path"]).name
        try:
            results = verify_store(part, sample=sample)
            held = read_manifest(part)
        except QascError as exc:
            out.append((f"{name}/open", False, first_line(exc)))
            continue
        out.extend((f"{name}/{check}", ok, detail) for check, ok, detail in results)
        models.add((held.get("fingerprint"), held["dim"], held["dtype"]))
        ids = stored_doc_ids(part)
        if len(ids) != n:
            problems.append(f"{name} holds {len(ids)} documents, the order lists {n}")
        for doc_id in ids:
            if doc_id in seen:
                problems.append(f"doc_id {doc_id!r} in {seen[doc_id]} and {name}")
            seen[doc_id] = name
            if manifest.get("assignment") == "hash" and partition_of(doc_id, len(counts)) != i:
                want = partition_name(partition_of(doc_id, len(counts)))
                problems.append(f"doc_id {doc_id!r} in {name}, its hash gives {want}")
    if len(models) > 1:
        problems.append(f"partitions hold vectors of different models or dtypes: {sorted(map(str, models))}")
    out.append(("partitions", not problems, "; ".join(problems[:5]) or f"{len(seen)} documents, doc ids unique, "
                                                                     f"one model"))
    return out
