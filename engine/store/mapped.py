"""Mapped arrays: what a query reads of a store besides the documents' texts, saved at ingest as .npy files and
memory-mapped at open (docs/store.md, "Mapped arrays").

One folder per ingest generation, `mapped-GGGG/` (N rows, dim, H heading paths), written by the ingest that commits
the generation (engine.store.mapped_write) and named by the manifest's "mapped" entry:

  vectors.npy                      (N, dim) store dtype: the embeddings, rows in store order
  char_start.npy, char_end.npy     (N,) int64 the rows' spans in their documents
  paragraph.npy, section.npy, n_tokens.npy, row_heading.npy   (N,) int32 (row_heading: the store's path id, -1 none)
  heading_emb.npy                  (H, dim) float32; heading_paths.json: the H path texts
  tables/*.npy (+ .json)           the query engine's per-store tables (engine.tables.StoreTables: neighbour dots,
                                   block stats and bounds, heading CSR, the BM25 index, ...) for the store's own
                                   setting and each preset, keyed as the engine keys them

`Store.open` maps these (numpy mmap_mode "c": file-backed clean pages, paged in where read, private if written) and
reads only the documents' tables of the shards, so neither the sentences' Parquet files nor the term counts are read;
`StoreTables` starts from the saved tables (`saved_tables`). The tables depend on the code that computed them: they
are used only where the manifest's `tables_fingerprint` equals `tables_fingerprint()` (this engine's table code,
torch and numpy versions) and the engine runs on the CPU; otherwise they are built on first use as before (with a
warning where the code differs: `qasc refresh` saves them again, engine.store.mapped_write.refresh_tables, into
`mapped-GGGG/<fingerprint>/`, the entry's "tables_folder"). A store without the entry (written before it) opens the
old way, reading every shard.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import torch

from qasc.engine.errors import QascError
from qasc.engine.store.manifest import shard_files
from qasc.engine.types import Headings

ROW_ARRAYS = {"char_start": np.int64, "char_end": np.int64, "paragraph": np.int32, "section": np.int32,
              "n_tokens": np.int32, "row_heading": np.int32}
TABLES = "tables"
# the code the saved tables are computed by: a change to any of these files makes them stale
TABLE_SOURCES = ("engine/tables.py", "engine/lexical.py", "engine/signals.py", "engine/retrieval.py",
                 "engine/splitter.py", "kernels")


def check_inside(root: Path, rel: str) -> None:
    """QascError when a path the manifest names points outside the store (a hand-edited manifest); the mapped open
    checks the shard files it does not read too."""
    if ".." in Path(rel).parts or Path(rel).is_absolute():
        raise QascError(f"{root}: the manifest points at {rel!r}, outside the store")


def folder_name(generation: int) -> str:
    return f"mapped-{generation:04d}"


def tables_fingerprint() -> str:
    """The code that computes the engine's tables (TABLE_SOURCES, kernels/ without its reference twins), torch's and
    numpy's versions, hashed: saved tables are used only by an engine with the same fingerprint."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(f"{torch.__version__} {np.__version__}".encode())
    for rel in TABLE_SOURCES:
        path = root / rel
        for file in sorted(path.glob("*.py")) if path.is_dir() else [path] if path.is_file() else []:
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return "tables-" + digest.hexdigest()[:16]


def map_array(path: Path) -> np.ndarray:
    """An .npy file memory-mapped copy-on-write (clean file-backed pages; writes stay private); read whole where
    numpy cannot map it (an empty array)."""
    try:
        return np.load(path, mmap_mode="c", allow_pickle=False)
    except ValueError:
        return np.load(path, allow_pickle=False)


class MappedArrays:
    """A store's `mapped-GGGG/` folder opened: vectors (N, dim), rows {name: (N,) array}, headings (Headings),
    entry (the manifest's "mapped" entry). QascError naming the file when one is missing or of the wrong shape."""

    def __init__(self, root: Path, manifest: dict) -> None:
        self.entry = manifest["mapped"]
        for rel in [self.entry["folder"], *(r for shard in manifest["shards"] for r in shard_files(shard))]:
            check_inside(root, rel)
        self.folder = root / self.entry["folder"]
        n, dim = int(manifest["counts"]["sentences"]), int(manifest["dim"])
        self.vectors = self._array("vectors.npy", (n, dim), np.dtype(manifest["dtype"]))
        self.rows = {name: self._array(f"{name}.npy", (n,), np.dtype(dt)) for name, dt in ROW_ARRAYS.items()}
        paths = json.loads((self.folder / "heading_paths.json").read_text(encoding="utf-8"))
        emb = self._array("heading_emb.npy", (len(paths), dim), np.dtype(np.float32))
        self.headings = Headings(paths, self.rows["row_heading"], emb)

    def _array(self, name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
        path = self.folder / name
        try:
            arr = map_array(path)
        except (OSError, ValueError) as exc:
            raise QascError(f"{path}: unreadable mapped array ({exc}); run qasc verify") from None
        if arr.shape != shape or arr.dtype != dtype:
            raise QascError(f"{path}: {arr.dtype}{list(arr.shape)}, the store needs {dtype}{list(shape)}")
        return arr

    def tables(self, device: torch.device) -> dict:
        """The saved tables {(method, *args): value} for an engine on `device`: empty unless it is the CPU and the
        tables were computed by this engine's code (`tables_fingerprint`)."""
        if torch.device(device).type != "cpu":
            return {}
        if self.entry.get("tables_fingerprint") != tables_fingerprint():
            store = self.folder.parent
            warnings.warn(f"{store}: its saved query tables were computed by other engine code; this engine builds "
                          f"them at first use (seconds at 1M sentences): `qasc refresh --store {store}` saves them "
                          f"again", stacklevel=2)
            return {}
        out = {}
        for item in self.entry.get("tables", []):
            out[_key(item["key"])] = load_value(item["value"], self.folder / self.entry.get("tables_folder", TABLES))
        return out


def _key(raw: list) -> tuple:
    """A table key from JSON (lists back to tuples)."""
    return tuple(_key(k) if isinstance(k, list) else k for k in raw)


def save_value(value, folder: Path, stem: str) -> dict | None:
    """One table's value -> its files under folder (stem-*.npy / .json) and their description; None for a value of a
    kind not saved (it is then built on first use as before)."""
    from qasc.engine.lexical import LexicalIndex

    def array(arr: np.ndarray, kind: str) -> dict:
        np.save(folder / f"{stem}.npy", np.ascontiguousarray(arr), allow_pickle=False)
        return {kind: f"{stem}.npy"}

    if value is None:
        return {"none": True}
    if isinstance(value, torch.Tensor):
        return None if value.dtype == torch.bfloat16 else array(value.detach().cpu().numpy(), "tensor")
    if isinstance(value, np.ndarray):
        return None if value.dtype == object else array(value, "array")
    if isinstance(value, tuple):
        parts = [save_value(v, folder, f"{stem}-{i}") for i, v in enumerate(value)]
        return None if any(p is None for p in parts) else {"tuple": parts}
    if isinstance(value, LexicalIndex):
        (folder / f"{stem}-vocab.json").write_text(json.dumps(list(value.vocab), ensure_ascii=False), encoding="utf-8")
        arrays = {"idf": value.idf, "row_ptr": value.row_ptr, "row_terms": value.row_terms,
                  "row_weights": value.row_weights}
        return {"lexical": {"vocab": f"{stem}-vocab.json", **{
            name: save_value(arr, folder, f"{stem}-{name}")["tensor" if isinstance(arr, torch.Tensor) else "array"]
            for name, arr in arrays.items()}}}
    return None


def load_value(spec: dict, folder: Path):
    """`save_value`'s description -> the value, arrays memory-mapped (tensors share the mapping)."""
    from qasc.engine.lexical import LexicalIndex

    if "none" in spec:
        return None
    if "tensor" in spec:
        return torch.from_numpy(map_array(folder / spec["tensor"]))
    if "array" in spec:
        return map_array(folder / spec["array"])
    if "tuple" in spec:
        return tuple(load_value(part, folder) for part in spec["tuple"])
    lex = spec["lexical"]
    vocab = json.loads((folder / lex["vocab"]).read_text(encoding="utf-8"))
    return LexicalIndex(dict(zip(vocab, range(len(vocab)), strict=True)), map_array(folder / lex["idf"]),
                        *(map_array(folder / lex[name]) for name in ("row_ptr", "row_terms", "row_weights")))


def open_mapped(root: Path, manifest: dict) -> MappedArrays | None:
    """The store's mapped arrays, or None for a store written without them (it opens by reading its shards)."""
    return MappedArrays(root, manifest) if manifest.get("mapped") else None


def mapped_problems(root: Path, manifest: dict, docs: list, emb: np.ndarray, headings: Headings) -> list[str]:
    """`qasc verify` of the mapped arrays against what the shards hold (docs: the store's Sentences, emb (N, dim)
    its vectors, headings: the merged heading paths, all read from the shards) -> problems (empty: none, or a store
    without mapped arrays)."""
    if not manifest.get("mapped"):
        return []
    try:
        mapped = MappedArrays(root, manifest)
    except (QascError, OSError, ValueError) as exc:
        return [str(exc)]
    problems = []
    if not np.array_equal(mapped.vectors, emb):
        problems.append("vectors.npy differs from the shards' embeddings")
    for name in ROW_ARRAYS:
        shards = headings.rows if name == "row_heading" else (
            np.concatenate([getattr(d, name) for d in docs]) if docs else np.zeros(0))
        if not np.array_equal(mapped.rows[name], np.asarray(shards)):
            problems.append(f"{name}.npy differs from the shards' sentence rows")
    if mapped.headings.paths != list(headings.paths) or not np.array_equal(mapped.headings.emb, headings.emb):
        problems.append("heading_paths.json / heading_emb.npy differ from the shards' heading paths")
    return [f"{mapped.entry['folder']}: {p}" for p in problems]
