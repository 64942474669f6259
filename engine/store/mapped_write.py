"""The mapped arrays (engine.store.mapped) written at ingest, for the generation about to be committed.

`write_mapped(root, manifest, log)` runs after the index is built and before the manifest is written: it opens the
store from that manifest the old way (every shard read, engine.store.reader), writes the vectors, the per-row
arrays and the heading paths to `mapped-GGGG/`, then answers a few queries for the store's own setting and each
preset (without a token budget: the fill's passages are not saved) through the query engine without a model, and
saves every per-store table the engine built on the way, with the fingerprint of the code that built them. The
same engine code computes them as a query process would, so a store opened from them answers exactly as one that
builds them. From MAPPED_CHILD_MIN_ROWS rows on this runs in a child process (the ingest driver never holds the
store; the child's memory is a query process's), as the index does (engine.store.index_child).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from qasc.engine.errors import QascError
from qasc.engine.store.files import ResumableError, file_digest
from qasc.engine.store.index_child import CHILD, ERRORS, INDEX_CHILD_MIN_ROWS, _child_env
from qasc.engine.store.mapped import ROW_ARRAYS, TABLES, folder_name, save_value, tables_fingerprint

MAPPED_CHILD_MIN_ROWS = INDEX_CHILD_MIN_ROWS
WARM_QUERIES = 4  # queries per setting that make the engine build its tables
CHILD_MAIN = [*CHILD[:2], CHILD[2].replace("index_child", "mapped_write")]


def warm_tables(store) -> dict:
    """The per-store tables the query engine builds for the store's own setting and each preset (no budget):
    {(method, *args): value}, from WARM_QUERIES queries (the first rows' vectors, their texts as questions)."""
    from qasc.engine import presets
    from qasc.engine.query import Engine

    config = store.config
    engine = Engine(store, None, config, torch.device("cpu"))
    n = min(WARM_QUERIES, len(store))
    if n == 0:
        return {}
    rows = store.embedding_rows(0, n)
    texts = [d.text[int(a):int(b)] for d in store.docs[:n] for a, b in zip(d.char_start[:1], d.char_end[:1],
                                                                           strict=True)]
    texts = (texts * n)[:n]
    settings = [(config.qasc, config.retrieval)] + [presets.apply(name, config.qasc, config.retrieval)
                                                    for name in presets.PRESETS]
    for params, retrieval in settings:
        list(engine.query_columns(torch.from_numpy(rows), params.replace(budget_tokens=None), retrieval,
                                  questions=texts))
    return dict(engine._tables)


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
        with tempfile.TemporaryDirectory(prefix="qasc-mapped-") as tmp:
            spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
            spec.write_text(json.dumps({"root": str(root), "manifest": manifest, "result": str(result)}))
            proc = subprocess.run([*CHILD_MAIN, str(spec)], env=_child_env(), stdin=subprocess.DEVNULL, check=False)
            out = json.loads(result.read_text()) if result.exists() else {}
        if "error" in out:
            err = out["error"]
            raise ERRORS.get(err["type"], QascError)(err["message"] if err["type"] in ERRORS else
                                                     f"writing the mapped arrays failed: {err['type']}: "
                                                     f"{err['message']}")
        if "entry" not in out:
            raise ResumableError(f"the mapped arrays' process exited with {proc.returncode} before it finished (out "
                                 f"of memory?); the shards and index are kept: run the same ingest again to resume")
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
    spec = json.loads(Path(argv[0]).read_text())
    try:
        out = build_mapped(Path(spec["root"]), spec["manifest"])
    except Exception as exc:  # reported to the driver, which raises it there
        out = {"error": {"type": type(exc).__name__, "message": str(exc)}}
    Path(spec["result"]).write_text(json.dumps(out))
    return 0
