"""A collection opened as one store: its partitions read in turn and laid out in the collection's global order.

`open_collection(path)` returns an engine.store.Store whose documents, rows, vectors, heading paths and passages
are those one store of the same documents in the same order holds: global row ids are that store's (so every
"lower row first" tie breaks the same way), heading path ids are numbered by first appearance over the documents
in order as ingest numbers them (engine.store.stages.shard_heading_paths, then merge_headings), passages are in
row order, the BM25 statistics (document frequencies, lengths) are the whole collection's (the lexical indexes are
built from the texts: LexicalIndex.build, equal to the one a store's saved term counts give), and the search is
exact over all rows (a flat store's). The engine then runs unchanged, so the answers equal that store's bit for bit
when the rows' vectors are the same (docs/collections.md, "Where it is exact").

`open_collection(path, vectors=False)` is the same view without the vectors (the rows' and passages' vectors stay
with the partitions): what Engine.open uses, with engine.partition serving them (`Store.layout` says where each
row, heading path and passage lives).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from qasc.engine.errors import QascError, first_line
from qasc.engine.passages import Passages
from qasc.engine.store.collection import partition_paths, read_collection, read_order
from qasc.engine.store.reader import Store
from qasc.engine.types import Headings


def open_partitions(root: Path, manifest: dict, order: np.ndarray, device="cpu") -> list[Store | None]:
    """Each partition opened (None for one with no documents); QascError naming the first that cannot be opened
    or that does not hold the documents the order gives it."""
    counts = np.bincount(order, minlength=len(manifest["partitions"]))
    parts: list[Store | None] = []
    for path, n in zip(partition_paths(root, manifest), counts.tolist(), strict=True):
        if n == 0:
            parts.append(None)
            continue
        try:
            part = Store.open(path, load_index=False, device=device)
        except QascError as exc:
            raise QascError(f"collection {root}: partition {path} cannot be opened: {first_line(exc)}") from None
        if len(part.docs) != n:
            raise QascError(f"collection {root}: partition {path} holds {len(part.docs)} documents, the collection "
                            f"lists {n} (an ingest did not finish? run it again)")
        parts.append(part)
    models = {(p.manifest.get("fingerprint"), p.manifest["dim"], p.manifest["dtype"]) for p in parts if p}
    if len(models) > 1:
        raise QascError(f"collection {root}: partitions hold vectors of different models or dtypes")
    return parts


class CollectionLayout(NamedTuple):
    """Where a collection's rows, heading paths and passages live: per partition (None entries for a partition
    with no documents), its folder, its local row i's global row (part_rows[p][i], increasing), its local heading
    path's global id and its local passage's global id."""

    paths: list[Path]
    part_rows: list[np.ndarray]  # (N_p,) int64
    path_ids: list[np.ndarray]  # (H_p,) int64
    passage_ids: list[np.ndarray]  # (P_p,) int64
    held: list[bool]  # the partitions that hold documents


def global_headings(docs, parts: list[Store | None], row_part: np.ndarray, part_rows: list[np.ndarray],
                    doc_part: np.ndarray, dim: int) -> tuple[Headings, list[np.ndarray]]:
    """The heading paths numbered as one store numbers them: by first appearance over the documents in global
    order (each document's own paths in order of appearance); each path's vector from the partition of the
    document where it first appears; rows (N,) int32 global path ids. Also each partition's local path ids ->
    global ids (empty for a partition without documents)."""
    from qasc.engine.splitter import heading_paths

    ids: dict[str, int] = {}
    first_part: list[int] = []
    for d, doc in enumerate(docs):
        for path in heading_paths(doc.text, doc.char_start)[0]:
            if path not in ids:
                ids[path] = len(ids)
                first_part.append(int(doc_part[d]))
    emb = np.zeros((len(ids), dim), np.float32)
    rows = np.full(len(row_part), -1, np.int32)
    remaps = []
    for p, part in enumerate(parts):
        if part is None:
            remaps.append(np.zeros(0, np.int64))
            continue
        remap = np.asarray([ids[t] for t in part.heading_paths] + [-1], np.int32)
        remaps.append(remap[:-1].astype(np.int64))
        rows[part_rows[p]] = remap[part.row_heading]
        for local, text in enumerate(part.heading_paths):
            if first_part[ids[text]] == p:
                emb[ids[text]] = part.heading_emb[local]
    return Headings(list(ids), rows, emb), remaps


def global_passages(parts: list[Store | None], part_rows: list[np.ndarray], dim: int, dtype: str,
                    vectors: bool = True) -> tuple[Passages, list[np.ndarray]]:
    """Every partition's passages with global first rows, in row order (as one store lists them), and each
    partition's local passage ids -> global ids. vectors False: the passages' vectors are left with the
    partitions (a zero-stride (P, dim) placeholder)."""
    got = [(p, part.passages, part_rows[p]) for p, part in enumerate(parts) if part is not None]
    got = [(p, ps, rows) for p, ps, rows in got if len(ps.first)]
    ids = [np.zeros(0, np.int64) for _ in parts]
    if not got:
        return Passages.empty(dim), ids
    first = np.concatenate([rows[ps.first] for _, ps, rows in got]).astype(np.int64)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    at = 0
    for p, ps, _ in got:
        ids[p] = rank[at : at + len(ps.first)].astype(np.int64)
        at += len(ps.first)
    emb = (np.concatenate([np.asarray(ps.emb).astype(dtype, copy=False) for _, ps, _ in got])[order] if vectors
           else np.broadcast_to(np.zeros(dim, np.dtype(dtype)), (len(order), dim)))
    return Passages(first[order], np.concatenate([ps.count for _, ps, _ in got])[order],
                    np.concatenate([ps.n_tokens for _, ps, _ in got])[order], emb), ids


def open_collection(path: str | Path, device="cpu", vectors: bool = True) -> Store:
    """A collection folder -> one Store of all its partitions in global order (module docstring). The FAISS
    indexes of the partitions are not loaded: this store is searched exactly. vectors False: the rows' and
    passages' vectors are left with the partitions (zero-stride placeholders; engine.partition serves them) and
    the store's `layout` (CollectionLayout) says where each row, heading path and passage lives."""
    root = Path(path).expanduser().absolute()
    manifest = read_collection(root)
    order = read_order(root, manifest)
    parts = open_partitions(root, manifest, order, device)
    first = next(p for p in parts if p is not None)
    dim, dtype = int(first.manifest["dim"]), first.manifest["dtype"]
    local = np.zeros(len(order), np.int64)  # each document's index in its partition
    for p in range(len(parts)):
        mine = order == p
        local[mine] = np.arange(int(mine.sum()))
    docs = [parts[p].docs[k] for p, k in zip(order.tolist(), local.tolist(), strict=True)]
    metadata = [parts[p].metadata[k] for p, k in zip(order.tolist(), local.tolist(), strict=True)]
    sources = [parts[p].sources[k] for p, k in zip(order.tolist(), local.tolist(), strict=True)]
    row_part = np.repeat(order, [len(d) for d in docs])  # (N,) each global row's partition
    part_rows = [np.flatnonzero(row_part == p) for p in range(len(parts))]  # partition p's local row i: its i-th
    if vectors:
        emb = np.empty((len(row_part), dim), np.dtype(dtype))
        for p, part in enumerate(parts):
            if part is not None:
                emb[part_rows[p]] = part.embeddings
    else:
        emb = torch.zeros((1, dim), dtype=getattr(torch, dtype)).expand(len(row_part), dim)
    headings, path_ids = global_headings(docs, parts, row_part, part_rows, order, dim)
    passages, passage_ids = global_passages(parts, part_rows, dim, dtype, vectors)
    view = {**first.manifest, "shards": [], "index": {"kind": "flat"}, "collection": str(root),
            "counts": {"documents": len(docs), "sentences": int(len(row_part))}}
    held = [p is not None for p in parts]
    del parts
    store = Store(root, view, docs, metadata, sources, emb, None, headings, passages)
    store.layout = CollectionLayout(partition_paths(root, manifest), part_rows, path_ids, passage_ids, held)
    return store
