"""The mapped arrays (engine.store.mapped) written at ingest, for the generation about to be committed.

`write_mapped(root, manifest, log)` runs after the index is built and before the manifest is written: it opens the
store from that manifest the old way (every shard read, engine.store.reader), writes the vectors, the per-row
arrays and the heading paths to `mapped-GGGG/`, then has `engine.tables.StoreTables` build the per-store tables the
query path asks for with the store's own setting and each preset (`warm_tables`; not the budget fill's passages)
and saves them with the fingerprint of the code that built them. The same class computes them as a query process
would, so a store opened from them answers exactly as one that builds them. From MAPPED_CHILD_MIN_ROWS rows on
this runs in a child process (the ingest driver never holds the store; the child's memory is a query process's),
as the index does (engine.store.index_child).
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from qasc.engine.store.files import file_digest
from qasc.engine.store.index_child import CHILD, INDEX_CHILD_MIN_ROWS, child_main, run_in_child
from qasc.engine.store.mapped import ROW_ARRAYS, TABLES, folder_name, save_value, tables_fingerprint

MAPPED_CHILD_MIN_ROWS = INDEX_CHILD_MIN_ROWS
CHILD_MAIN = [*CHILD[:2], CHILD[2].replace("index_child", "mapped_write")]


def warm_tables(store) -> dict:
    """The per-store tables a CPU query engine (engine.tables.StoreTables) builds for the store's own setting and
    each preset, built by that class itself and keyed as it caches them: {(method, *args): value}. The arguments
    are the query path's (engine.query.run_batch: block bounds by the setting's block kinds and token cap, block
    stats per kind, neighbour dots of its max extent; the heading tables, titled rows, the BM25 index and the
    heading paths' terms), so that a query of any of these settings finds every table it needs."""
    from qasc.engine import presets
    from qasc.engine.tables import StoreTables

    config = store.config
    tables = StoreTables(store, torch.device("cpu"))
    if tables.n_total == 0:
        return {}
    for params in [config.qasc] + [presets.apply(name, config.qasc, config.retrieval)[0] for name in presets.PRESETS]:
        tables.block_bounds(params.block_kinds, params.max_tokens)
        for kind in params.block_kinds:
            tables.block_stats(kind)
        tables.neighbour_dots(params.max_extent)
    tables.titled_rows()
    tables.lexical_index()
    if tables.heading_tensors() is not None:
        tables.heading_low()
        tables.heading_row_dots()
        tables.heading_terms()
    return dict(tables._tables)


def build_mapped(root: Path, manifest: dict) -> dict:
    """Writes mapped-GGGG/ for `manifest` (complete, not yet committed) -> the manifest's "mapped" entry (folder,
    tables, fingerprint) and "files" {relative path: digest}."""
    from qasc.engine.store.reader import Store
    from qasc.engine.store.search import IvfSettings

    store = Store._open(root, manifest, False, "cpu", IvfSettings(None))
    name = folder_name(int(manifest["generation"]))
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)  # a crashed earlier try's
    folder.mkdir(parents=True)
    np.save(folder / "vectors.npy", store.embeddings, allow_pickle=False)
    for key, dtype in ROW_ARRAYS.items():
        values = store.row_heading if key == "row_heading" else store.row_array(key)
        np.save(folder / f"{key}.npy", np.asarray(values, dtype=dtype), allow_pickle=False)
    (folder / "heading_paths.json").write_text(json.dumps(store.heading_paths, ensure_ascii=False), encoding="utf-8")
    np.save(folder / "heading_emb.npy", np.asarray(store.heading_emb, np.float32).reshape(-1, int(manifest["dim"])),
            allow_pickle=False)
    tables = save_tables(store, folder / TABLES)
    files = folder_digests(root, folder)
    entry = {"folder": name, "tables_fingerprint": tables_fingerprint(), "tables": tables}
    return {"entry": entry, "files": files}


def folder_digests(root: Path, folder: Path) -> dict:
    """Every file under folder -> {its path relative to the store root: its digest}, for the manifest's checksums."""
    return {str(p.relative_to(root)): file_digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def save_tables(store, folder: Path) -> list[dict]:
    """The store's warm tables (`warm_tables`) saved under folder (created) -> the manifest's "tables" list."""
    folder.mkdir(parents=True)
    tables = []
    for i, (key, value) in enumerate(sorted(warm_tables(store).items(), key=lambda kv: repr(kv[0]))):
        spec = save_value(value, folder, f"{i:02d}-{key[0].strip('_')}")
        if spec is not None:
            tables.append({"key": list(key), "value": spec})
    return tables


def refresh_tables(root: Path, log: Callable[[str], None]) -> dict:
    """`qasc refresh`: the saved query tables of a committed store computed again by this engine's code, where they
    were computed by other code (an upgrade; engine.store.mapped.tables_fingerprint), so that a query finds them
    instead of building them. Under the writer's lock: the new tables go to `mapped-GGGG/<fingerprint>/`, the manifest
    (its "mapped" entry and checksums) is replaced atomically, then the old tables folder is removed; an
    interrupted refresh leaves the store as it was. Nothing else of the store changes. -> {"store", "refreshed",
    "tables", "fingerprint", "previous", "seconds"}."""
    import time

    from qasc.engine.errors import QascError
    from qasc.engine.store.files import atomic_write, locked
    from qasc.engine.store.manifest import read_manifest
    from qasc.engine.store.reader import Store
    from qasc.engine.store.schema import MANIFEST
    from qasc.engine.store.search import IvfSettings

    t0 = time.perf_counter()
    root = Path(root).expanduser().absolute()
    with locked(root):
        manifest = read_manifest(root)
        entry = manifest.get("mapped")
        if not entry:
            raise QascError(f"{root} was written before mapped arrays: it has no saved tables to refresh (an "
                            f"append with qasc ingest writes them)")
        fingerprint = tables_fingerprint()
        previous = entry.get("tables_fingerprint")
        summary = {"store": str(root), "fingerprint": fingerprint, "previous": previous}
        if previous == fingerprint:
            return {**summary, "refreshed": False, "tables": len(entry.get("tables", [])),
                    "seconds": round(time.perf_counter() - t0, 3)}
        log(f"qasc refresh: computing the query tables of {manifest['counts']['sentences']:,} sentences")
        store = Store._open(root, manifest, False, "cpu", IvfSettings(None))
        mapped = root / entry["folder"]
        old_sub = entry.get("tables_folder", TABLES)
        if old_sub == fingerprint:
            raise QascError(f"{mapped / old_sub}: the manifest's tables folder is named for this engine but "
                            f"recorded as {previous}; run qasc verify")
        shutil.rmtree(mapped / fingerprint, ignore_errors=True)  # a crashed earlier refresh's
        with warnings.catch_warnings():  # the stale tables' warning, which points here
            warnings.simplefilter("ignore", UserWarning)
            tables = save_tables(store, mapped / fingerprint)
        del store
        prefix = f"{entry['folder']}/{old_sub}/"
        checksums = {rel: d for rel, d in manifest["checksums"].items() if not rel.startswith(prefix)}
        checksums.update(folder_digests(root, mapped / fingerprint))
        new_entry = {**entry, "tables_fingerprint": fingerprint, "tables": tables, "tables_folder": fingerprint}
        atomic_write(root / MANIFEST, json.dumps({**manifest, "mapped": new_entry,
                                                  "checksums": dict(sorted(checksums.items()))}, indent=1).encode())
        shutil.rmtree(mapped / old_sub, ignore_errors=True)  # open readers keep their mappings of the old files
    return {**summary, "refreshed": True, "tables": len(tables), "seconds": round(time.perf_counter() - t0, 3)}


def write_mapped(root: Path, manifest: dict, log: Callable[[str], None]) -> dict:
    """manifest (complete, about to be written) -> the same with its "mapped" entry and the new files' checksums,
    mapped-GGGG/ written (in a child process from MAPPED_CHILD_MIN_ROWS rows). A child that dies raises
    ResumableError (the shards and index are kept: the same ingest resumes here)."""
    if int(manifest["counts"]["sentences"]) < MAPPED_CHILD_MIN_ROWS:
        out = build_mapped(root, manifest)
    else:
        log("qasc ingest: writing the mapped arrays and query tables in a child process")
        out = run_in_child(CHILD_MAIN, {"root": str(root), "manifest": manifest}, "qasc-mapped-",
                           "writing the mapped arrays failed",
                           lambda rc: f"the mapped arrays' process exited with {rc} before it finished (out of "
                                      f"memory?); the shards and index are kept: run the same ingest again to resume")
    kept = {rel: digest for rel, digest in manifest["checksums"].items() if not rel.startswith("mapped-")}
    checksums = dict(sorted({**kept, **out["files"]}.items()))  # an append's previous folder is not the store's
    return {**manifest, "mapped": out["entry"], "checksums": checksums}


def remove_previous(root: Path, old: dict | None, manifest: dict) -> None:
    """After the new manifest is committed: the previous generation's mapped folder, if it had one."""
    previous = (old or {}).get("mapped", {}).get("folder")
    if previous and previous != manifest.get("mapped", {}).get("folder"):
        shutil.rmtree(root / previous, ignore_errors=True)


def main(argv: list[str]) -> int:
    """The child: [SPEC] -> mapped-GGGG/ written, {"entry", "files"} or {"error": {"type", "message"}} in the spec's
    result file. Exit status 0 either way."""
    return child_main(argv, lambda spec: build_mapped(Path(spec["root"]), spec["manifest"]))
