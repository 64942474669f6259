"""Building a store's FAISS index from its committed shards (engine.store.index holds the index's kinds, settings,
file format and search).

`build_index` trains (ivf: k-means on a sample of at most IVF_TRAIN_BYTES, drawn across the shards) and adds every
shard's vectors in row order, reusing the old index when the appended rows fit its codes; `build_index_file` writes
it beside the store and returns the manifest entry. Both run in process, in a child process
(engine.store.index_child) or as a Ray task (jobs.ingest_ray), the same call.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from qasc.engine.errors import QascError
from qasc.engine.store.files import ResumableError, atomic_write_with, read_table
from qasc.engine.store.index import (
    FIT_BLOCK_ROWS,
    IVF_TRAIN_BYTES,
    _faiss,
    add,
    choose_kind,
    default_params,
    new_index,
    read_index_file,
    reconstruct_matches,
    train,
    training_sample,
    write_index_file,
)
from qasc.engine.store.schema import embeddings_of


def _shard_vectors(root: Path, shard: dict, dim: int) -> np.ndarray:
    """A shard record -> its sentences' vectors (n, dim) in the stored dtype (a read-only view of the Arrow
    buffer, float16 for float16 stores); QascError when the file holds another number of rows than the record."""
    emb = embeddings_of(read_table(root, shard["sentences"], ["embedding"]), dim, shard["sentences"], dtype=None)
    if len(emb) != shard["n_sentences"]:
        raise QascError(f"{root / shard['sentences']}: {len(emb)} embeddings, the manifest says {shard['n_sentences']}")
    return emb


def _shard_float32(root: Path, shard: dict, dim: int) -> np.ndarray:
    """`_shard_vectors` cast to one contiguous float32 array (n, dim): what faiss's encode / add calls take."""
    return np.ascontiguousarray(_shard_vectors(root, shard, dim), dtype=np.float32)


def _train_from_shards(index, root: Path, shards: list[dict], n: int, nlist: int, dim: int, max_bytes: int) -> None:
    """Trains an ivf index on `training_sample` rows gathered shard by shard into one preallocated float32
    array (the sample is the only copy: no per-shard parts, no concatenation)."""
    rows = training_sample(n, nlist, dim, max_bytes)
    sample = np.empty((len(rows), dim), np.float32)
    base = 0
    for s in shards:
        lo, hi = np.searchsorted(rows, [base, base + s["n_sentences"]])
        if hi > lo:
            sample[lo:hi] = _shard_vectors(root, s, dim)[rows[lo:hi] - base]
        base += s["n_sentences"]
    train(index, sample)


def _codes_fit(index, entry: dict, root: Path, shards: list[dict], dim: int) -> bool:
    """Whether an index's quantised codes (ivf SQ8) hold the shards' vectors as `verify` requires
    (`reconstruct_matches`): each dimension's range was fixed when the index was trained, and values outside it
    clamp. Appending rows far outside it (a store first ingested with a few rows) would store vectors that no
    longer match their embeddings, so the caller retrains instead. Full vectors (flat, IVF,Flat, HNSW) always fit."""
    if entry.get("kind") != "ivf" or entry.get("params", {}).get("codes", "Flat") == "Flat":
        return True
    for s in shards:
        x = _shard_float32(root, s, dim)
        for lo in range(0, len(x), FIT_BLOCK_ROWS):
            block = x[lo : lo + FIT_BLOCK_ROWS]
            if not reconstruct_matches(entry, index.sa_decode(index.sa_encode(block)), block):
                return False
    return True


def _add_shards(index, root: Path, shards: list[dict], dim: int) -> None:
    """Appends the shards' vectors in row order, one shard in memory at a time (cast to float32 per shard).

    An ivf index with array inverted lists is filled in two passes: the first assigns every row to its list
    (N int64 kept), each list then gets exactly the capacity it will hold, and the second encodes the rows into
    it (`add_core` with the kept assignment: the same index, bytes for bytes, as `index.add`). Growing the lists
    by appends instead leaves them up to 2x their size, and the freed smaller copies fragment the heap; with
    exact capacities the SQ8 codes (N x dim bytes) plus N x 8 bytes of ids are all that grows with N."""
    faiss = _faiss()
    ivf = index if isinstance(index, faiss.IndexIVF) else None  # not wrapped (a transform, a GPU index)
    lists = faiss.downcast_InvertedLists(ivf.invlists) if ivf is not None else None
    if ivf is None or not isinstance(lists, faiss.ArrayInvertedLists):
        for s in shards:
            add(index, _shard_vectors(root, s, dim))
        return
    assign = np.empty(sum(s["n_sentences"] for s in shards), np.int64)  # (N,) list of each new row
    lo = 0
    for s in shards:
        x = _shard_float32(root, s, dim)
        if len(x):
            assign[lo : lo + len(x)] = ivf.quantizer.assign(x, 1)[:, 0]
        lo += len(x)
    counts = np.bincount(assign, minlength=ivf.nlist)
    for list_no in np.flatnonzero(counts).tolist():
        have = lists.list_size(list_no)
        lists.resize(list_no, have + int(counts[list_no]))  # allocates exactly the final size ...
        lists.resize(list_no, have)  # ... and keeps that capacity (std::vector shrinks without freeing)
    lo = 0
    for s in shards:
        x = _shard_float32(root, s, dim)
        if len(x):
            a = np.ascontiguousarray(assign[lo : lo + len(x)])
            index.add_core(len(x), faiss.swig_ptr(x), None, faiss.swig_ptr(a))
        lo += len(x)


def build_index(root: Path, shards: list[dict], old: dict | None, kind_requested: str, dim: int,
                 log: Callable[[str], None], train_bytes: int = IVF_TRAIN_BYTES) -> tuple[object, dict]:
    """All shard records (old + new, in order) -> (CPU index, manifest entry); write it with write_index_file.

    Memory besides the index itself: one shard's vectors at a time, the ivf training sample (at most
    train_bytes of float32, plus faiss's residuals of at most 100k of its rows) and N x 8 bytes of list
    assignments; never all rows at once (see `_add_shards`)."""
    n = sum(s["n_sentences"] for s in shards)
    kind = choose_kind(n, kind_requested)
    old_index = old["index"] if old else None
    reuse = old_index is not None and old_index["kind"] == kind and (kind_requested in ("auto", kind))
    if reuse:
        index = read_index_file(root / old_index["file"], old["checksums"][old_index["file"]]["sha256"])
        params = old_index["params"]
        start = old["counts"]["shards"]
        if not _codes_fit(index, old_index, root, shards[start:], dim):
            log(f"qasc ingest: the new sentences fall outside the range the IVF codes were trained on; "
                f"retraining the index over all {n} sentences")
            reuse, index = False, None
    if not reuse:
        params = default_params(kind, n)
        index = new_index(kind, dim, params)
        start = 0
        if kind == "ivf":
            log(f"qasc ingest: training an IVF index ({params['nlist']} lists) over {n} sentences")
            _train_from_shards(index, root, shards, n, params["nlist"], dim, train_bytes)
    _add_shards(index, root, shards[start:], dim)
    if index.ntotal != n:
        raise QascError(f"index holds {index.ntotal} vectors for {n} sentences")
    entry = {"kind": kind, "requested": kind_requested, "metric": "inner_product", "ntotal": int(index.ntotal),
             "params": params}
    return index, entry


def build_index_file(root: Path, shards: list[dict], old: dict | None, kind_requested: str, dim: int,
                     index_file: str, log: Callable[[str], None] | None = None) -> dict:
    """`build_index`, then the index written atomically (temp name, then rename) to root / index_file -> its
    manifest entry (with "file"). What a shard runner's `build_index` calls where it builds: in the ingest
    process (LocalRunner) or in a worker (jobs/ingest_ray.py), so that the Ray driver never holds an index.
    QascError when the shards disagree with their records; ResumableError when the file cannot be written."""
    index, entry = build_index(Path(root), shards, old, kind_requested, dim, log or (lambda line: None))
    path = Path(root) / index_file
    try:
        atomic_write_with(path, partial(write_index_file, index))
    except OSError as exc:
        raise ResumableError(f"cannot write {path}: {exc.strerror or exc}; run the same ingest again to "
                             f"resume") from None
    return {**entry, "file": index_file}
