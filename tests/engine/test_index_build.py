"""Building a store's index from its shards in bounded memory (issue 14): the training sample capped in bytes and
gathered shard by shard, the ivf lists filled in two passes with exact capacities; the result is the index that
the plain in-memory build (train on the same rows, `index.add` of every row) gives, bytes for bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qasc.engine.errors import QascError
from qasc.engine.store import index as faiss_index
from qasc.engine.store import index_build


def clustered(n: int, dim: int, seed: int, centres: int = 12) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, dim)).astype(np.float32)
    x = c[rng.integers(0, centres, n)] + 0.4 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_shards(root, emb: np.ndarray, sizes: list[int], dtype: str) -> list[dict]:
    """emb (N, dim) cut into shards of `sizes` rows, each a sentences file holding only the embedding column ->
    the shard records build_index reads (the stored vectors: emb cast to dtype)."""
    (root / "sentences").mkdir(parents=True, exist_ok=True)
    shards, lo = [], 0
    for i, n in enumerate(sizes):
        flat = pa.array(np.ascontiguousarray(emb[lo : lo + n], dtype=dtype).reshape(-1))
        col = pa.FixedSizeListArray.from_arrays(flat, emb.shape[1])
        rel = f"sentences/part-{i:06d}.parquet"
        pq.write_table(pa.table({"embedding": col}), root / rel)
        shards.append({"id": i, "sentences": rel, "n_sentences": n})
        lo += n
    return shards


def in_memory(kind: str, stored: np.ndarray, train_bytes: int) -> bytes:
    """The plain build: the whole array in memory, train on training_sample's rows, one index.add."""
    params = faiss_index.default_params(kind, len(stored))
    index = faiss_index.new_index(kind, stored.shape[1], params)
    if kind == "ivf":
        rows = faiss_index.training_sample(len(stored), params["nlist"], stored.shape[1], train_bytes)
        faiss_index.train(index, stored[rows].astype(np.float32))
    faiss_index.add(index, stored.astype(np.float32))
    return faiss_index.serialize(index)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("kind", ["ivf", "flat"])
def test_build_from_shards_equals_the_in_memory_build(tmp_path, kind, dtype):
    """Ragged shards (one of a single row) and a training cap that binds: the same index bytes for bytes."""
    dim = 16
    emb = clustered(3000, dim, seed=1)
    cap = 700 * 4 * dim  # 700 rows < 64 x 76 lists
    sizes = [1, 999, 640, 1, 1359]
    shards = write_shards(tmp_path, emb, sizes, dtype)
    index, entry = index_build.build_index(tmp_path, shards, None, kind, dim, lambda line: None, train_bytes=cap)
    assert entry["kind"] == kind and entry["ntotal"] == len(emb) == index.ntotal
    assert faiss_index.serialize(index) == in_memory(kind, emb.astype(dtype), cap)


def test_append_fills_the_old_lists_like_one_build(tmp_path):
    """A store grown by a second ingest reuses the old index (same lists) and adds only the new shards: the same
    index as adding every row to that trained index at once."""
    dim = 16
    emb = clustered(2600, dim, seed=2)
    shards = write_shards(tmp_path, emb, [800, 1, 799, 1000], "float16")
    first, entry = index_build.build_index(tmp_path, shards[:2], None, "ivf", dim, lambda line: None)
    (tmp_path / "index-0001.faiss").write_bytes(faiss_index.serialize(first))
    old = {"index": {**entry, "file": "index-0001.faiss"}, "counts": {"shards": 2},
           "checksums": {"index-0001.faiss": {"sha256": faiss_index.sha256(faiss_index.serialize(first))}}}
    grown, grown_entry = index_build.build_index(tmp_path, shards, old, "ivf", dim, lambda line: None)
    assert grown_entry["params"] == entry["params"] and grown.ntotal == len(emb)
    faiss_index.add(first, emb[801:].astype(np.float16).astype(np.float32))
    assert faiss_index.serialize(grown) == faiss_index.serialize(first)


def test_append_outside_the_codes_range_retrains(tmp_path):
    """SQ8 codes clamp each dimension to the range seen in training: a store first ingested with a few rows and
    then grown would hold vectors far from its embeddings (verify fails). build_index retrains over every row
    instead (the parameters a fresh build of that size gets), and says so; rows inside the range reuse the index."""
    dim = 16
    emb = clustered(3000, dim, seed=4)
    shards = write_shards(tmp_path, emb, [12, 1500, 1488], "float16")
    first, entry = index_build.build_index(tmp_path, shards[:1], None, "ivf", dim, lambda line: None)
    data = faiss_index.serialize(first)
    (tmp_path / "index-0001.faiss").write_bytes(data)
    old = {"index": {**entry, "file": "index-0001.faiss"}, "counts": {"shards": 1},
           "checksums": {"index-0001.faiss": {"sha256": faiss_index.sha256(data)}}}
    lines: list[str] = []
    grown, grown_entry = index_build.build_index(tmp_path, shards, old, "ivf", dim, lines.append)
    assert any("retraining the index over all 3000 sentences" in line for line in lines)
    assert grown_entry["params"] == faiss_index.default_params("ivf", 3000) != entry["params"]
    stored = emb.astype(np.float16)
    rows = np.arange(len(emb))
    assert faiss_index.reconstruct_matches(grown_entry, faiss_index.reconstruct(grown, rows), stored)
    # the same append to an index trained on enough rows keeps its lists (no retraining)
    base, base_entry = index_build.build_index(tmp_path, shards[:2], None, "ivf", dim, lambda line: None)
    data = faiss_index.serialize(base)
    (tmp_path / "index-0002.faiss").write_bytes(data)
    old = {"index": {**base_entry, "file": "index-0002.faiss"}, "counts": {"shards": 2},
           "checksums": {"index-0002.faiss": {"sha256": faiss_index.sha256(data)}}}
    lines.clear()
    kept, kept_entry = index_build.build_index(tmp_path, shards, old, "ivf", dim, lines.append)
    assert not lines and kept_entry["params"] == base_entry["params"] and kept.ntotal == 3000


def test_a_shard_shorter_than_its_record_is_refused(tmp_path):
    emb = clustered(200, 8, seed=3)
    shards = write_shards(tmp_path, emb, [100, 100], "float32")
    shards[1]["n_sentences"] = 120
    with pytest.raises(QascError, match="100 embeddings, the manifest says 120"):
        index_build.build_index(tmp_path, shards, None, "flat", 8, lambda line: None)


@pytest.mark.parametrize("n", [0, 1, 39, 5000, 150_000, 1_000_000, 10_000_000])
@pytest.mark.parametrize("dim", [16, 384, 1024])
def test_training_sample_is_bounded_in_bytes(n, dim):
    """Sorted distinct rows, IVF_TRAIN_PER_LIST per list while that fits in IVF_TRAIN_BYTES, never more than the
    cap (but at least one per list: k-means needs nlist points), never more than the store's rows."""
    nlist = faiss_index.ivf_lists(n)
    rows = faiss_index.training_sample(n, nlist, dim)
    cap = faiss_index.IVF_TRAIN_BYTES // (4 * dim)
    assert len(rows) == min(n, max(nlist, min(nlist * faiss_index.IVF_TRAIN_PER_LIST, cap)))
    assert len(rows) * 4 * dim <= max(faiss_index.IVF_TRAIN_BYTES, nlist * 4 * dim)
    assert (np.diff(rows) > 0).all() and (len(rows) == 0 or (rows[0] >= 0 and rows[-1] < n))
