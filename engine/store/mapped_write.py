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
    (folder / TABLES).mkdir(parents=True)
    np.save(folder / "vectors.npy", store.embeddings, allow_pickle=False)
    cat = (lambda attr: np.concatenate([getattr(d, attr) for d in store.docs])) if store.docs else (
        lambda attr: np.zeros(0))
    for key, dtype in ROW_ARRAYS.items():
        values = store.row_heading if key == "row_heading" else cat(key)
        np.save(folder / f"{key}.npy", np.asarray(values, dtype=dtype), allow_pickle=False)
    (folder / "heading_paths.json").write_text(json.dumps(store.heading_paths, ensure_ascii=False), encoding="utf-8")
    np.save(folder / "heading_emb.npy", np.asarray(store.heading_emb, np.float32).reshape(-1, int(manifest["dim"])),
            allow_pickle=False)
    tables = []
    for i, (key, value) in enumerate(sorted(warm_tables(store).items(), key=lambda kv: repr(kv[0]))):
        spec = save_value(value, folder / TABLES, f"{i:02d}-{key[0].strip('_')}")
        if spec is not None:
            tables.append({"key": list(key), "value": spec})
    files = {str(p.relative_to(root)): file_digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}
    entry = {"folder": name, "tables_fingerprint": tables_fingerprint(), "tables": tables}
    return {"entry": entry, "files": files}


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
