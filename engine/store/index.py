"""FAISS index over the store's sentence embeddings: inner product on L2-normalised vectors.

Kinds: `flat` (exact, IndexFlatIP), `ivf` (IndexIVFFlat, inverted lists trained by k-means) and `hnsw`
(IndexHNSWFlat). `auto` picks flat below AUTO_FLAT_MAX rows and ivf above. Ids are always global sentence
rows (vectors are added in row order). The index is built and serialised on CPU; `to_device` moves it to
the engine's CUDA device (`gpu_for`: only when that device is cuda, faiss was built with GPU support and
sees that GPU; HNSW stays on CPU: faiss has no GPU HNSW). A cpu device never puts the index on a GPU.
`build_index` builds a store's index from its shards; `load_index` reads it back; `exact_search` is the
numpy top-k used when a store is opened without its index.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.errors import QascError
from engine.store.files import read_table
from engine.store.schema import embeddings_of

KINDS = ("auto", "flat", "ivf", "hnsw")
AUTO_FLAT_MAX = 200_000  # rows; exact search over more than this is slower than an IVF probe
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128
IVF_TRAIN_PER_LIST = 64  # k-means training points per inverted list
IVF_SEED = 1234


def _faiss():
    try:
        import faiss
    except ImportError:  # still an ImportError (callers that fall back to exact search catch that)
        raise ModuleNotFoundError('faiss is not installed: pip install -e ".[cpu]" (faiss-cpu), or ".[gpu]" '
                                  "(faiss-gpu) on a CUDA machine", name="faiss") from None
    return faiss


def choose_kind(n_rows: int, kind: str = "auto") -> str:
    """n_rows, requested kind -> the concrete kind (flat | ivf | hnsw)."""
    if kind not in KINDS:
        raise QascError(f"unknown index kind {kind!r}; use one of {', '.join(KINDS)}")
    if kind != "auto":
        return kind
    return "flat" if n_rows <= AUTO_FLAT_MAX else "ivf"


def ivf_lists(n_rows: int) -> int:
    """Number of inverted lists for n_rows vectors: about 4 sqrt(N), at least 1, at most N / 39."""
    return max(1, min(int(4 * math.sqrt(max(n_rows, 1))), n_rows // 39 or 1))


def default_params(kind: str, n_rows: int) -> dict:
    if kind == "ivf":
        nlist = ivf_lists(n_rows)
        return {"nlist": nlist, "nprobe": min(nlist, max(16, nlist // 16))}
    if kind == "hnsw":
        return {"M": HNSW_M, "efConstruction": HNSW_EF_CONSTRUCTION, "efSearch": HNSW_EF_SEARCH}
    return {}


def new_index(kind: str, dim: int, params: dict):
    """An empty CPU index of that kind (ivf still needs `train`)."""
    faiss = _faiss()
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "ivf":
        index = faiss.index_factory(dim, f"IVF{int(params['nlist'])},Flat", faiss.METRIC_INNER_PRODUCT)
        index.nprobe = int(params["nprobe"])
        return index
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, int(params["M"]), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(params["efConstruction"])
        index.hnsw.efSearch = int(params["efSearch"])
        return index
    raise QascError(f"unknown index kind {kind!r}")


def train(index, sample: np.ndarray) -> None:
    """sample (S, dim) float32 -> trains an ivf index's k-means (deterministic seed); no-op for others."""
    if index.is_trained:
        return
    faiss = _faiss()
    ivf = faiss.extract_index_ivf(index)
    ivf.cp.seed = IVF_SEED
    index.train(np.ascontiguousarray(sample, dtype=np.float32))


def training_sample(n_rows: int, nlist: int) -> np.ndarray:
    """Which rows (sorted int64) train an ivf index: evenly spaced, IVF_TRAIN_PER_LIST per list."""
    want = min(n_rows, max(nlist * IVF_TRAIN_PER_LIST, nlist))
    return np.unique(np.linspace(0, n_rows - 1, num=want).astype(np.int64)) if n_rows else np.zeros(0, np.int64)


def add(index, emb: np.ndarray) -> None:
    """emb (N, dim) float32 appended; their ids are index.ntotal .. index.ntotal + N - 1."""
    if len(emb):
        index.add(np.ascontiguousarray(emb, dtype=np.float32))


def serialize(index) -> bytes:
    faiss = _faiss()
    return faiss.serialize_index(index).tobytes()


def deserialize(data: bytes, where: str):
    """bytes -> CPU index; QascError naming `where` when faiss cannot read it."""
    faiss = _faiss()
    try:
        return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    except Exception as exc:  # faiss raises RuntimeError with a C++ message
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QascError(f"{where}: corrupt or truncated FAISS index ({first[:200]})") from exc


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def gpu_available() -> bool:
    faiss = _faiss()
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def gpu_for(kind: str, device, faiss_gpus: int) -> int | None:
    """Index kind, the engine's torch device (or its name), GPUs faiss sees -> the GPU to put the index on,
    or None for CPU. Only a cuda device moves it, onto that device's index (cuda = cuda:0)."""
    name = str(device) if device is not None else "cpu"
    if not name.startswith("cuda") or kind == "hnsw" or faiss_gpus < 1:
        return None
    gpu = int(name.split(":", 1)[1]) if ":" in name else 0
    return gpu if gpu < faiss_gpus else None


def to_device(index, kind: str, device):
    """Moves flat / ivf indexes to the GPU of `device` (see `gpu_for`); else the CPU index unchanged."""
    faiss = _faiss()
    gpu = gpu_for(kind, device, faiss.get_num_gpus() if gpu_available() else 0)
    if gpu is None:
        return index
    res = faiss.StandardGpuResources()
    moved = faiss.index_cpu_to_gpu(res, gpu, index)
    moved.qasc_resources = res  # keep the resources alive as long as the index
    return moved


def reconstruct(index, rows: np.ndarray) -> np.ndarray:
    """rows (R,) int64 -> stored vectors (R, dim) float32 (CPU indexes; ivf gets a direct map)."""
    faiss = _faiss()
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.make_direct_map()
    return np.stack([index.reconstruct(int(r)) for r in rows]) if len(rows) else np.zeros((0, index.d), np.float32)


def search(index, query_emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """query_emb (Q, dim) float32, k -> scores (Q, k) float32 (-inf where missing), rows (Q, k) int64 (-1)."""
    if not isinstance(k, int | np.integer) or k < 1:
        raise QascError(f"k must be a positive integer, got {k!r}")
    q = np.asarray(query_emb)
    if q.ndim != 2 or q.shape[1] != index.d:
        raise QascError(f"query embeddings must have shape (Q, {index.d}), got {tuple(q.shape)}")
    if not np.isfinite(q).all():
        raise QascError("query embeddings contain NaN or inf")
    q = np.ascontiguousarray(q, dtype=np.float32)
    if q.shape[0] == 0:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    kk = min(int(k), max(int(index.ntotal), 1))
    scores, rows = index.search(q, kk)
    scores = scores.astype(np.float32, copy=False)
    rows = rows.astype(np.int64, copy=False)
    if kk < k:  # pad to (Q, k)
        scores = np.concatenate([scores, np.full((q.shape[0], k - kk), -np.inf, np.float32)], axis=1)
        rows = np.concatenate([rows, np.full((q.shape[0], k - kk), -1, np.int64)], axis=1)
    scores[rows < 0] = -np.inf
    return scores, rows


def build_index(root: Path, shards: list[dict], old: dict | None, kind_requested: str, dim: int,
                 log: Callable[[str], None]) -> tuple[bytes, dict]:
    """All shard records (old + new, in order) -> (serialized index, manifest entry)."""
    n = sum(s["n_sentences"] for s in shards)
    kind = choose_kind(n, kind_requested)
    old_index = old["index"] if old else None
    reuse = old_index is not None and old_index["kind"] == kind and (kind_requested in ("auto", kind))
    if reuse:
        data = (root / old_index["file"]).read_bytes()
        if sha256(data) != old["checksums"][old_index["file"]]["sha256"]:
            raise QascError(f"{root / old_index['file']}: checksum mismatch (corrupt); run qasc verify")
        index = deserialize(data, str(root / old_index["file"]))
        params = old_index["params"]
        start = old["counts"]["shards"]
    else:
        params = default_params(kind, n)
        index = new_index(kind, dim, params)
        start = 0
        if kind == "ivf":
            log(f"qasc ingest: training an IVF index ({params['nlist']} lists) over {n} sentences")
            rows = training_sample(n, params["nlist"])
            sample, base = [], 0
            for s in shards:
                sel = rows[(rows >= base) & (rows < base + s["n_sentences"])] - base
                if len(sel):
                    emb = embeddings_of(read_table(root, s["sentences"], ["embedding"]), dim, s["sentences"])
                    sample.append(emb[sel])
                base += s["n_sentences"]
            train(index, np.concatenate(sample))
    for s in shards[start:]:
        add(index, embeddings_of(read_table(root, s["sentences"], ["embedding"]), dim, s["sentences"]))
    if index.ntotal != n:
        raise QascError(f"index holds {index.ntotal} vectors for {n} sentences")
    entry = {"kind": kind, "requested": kind_requested, "metric": "inner_product", "ntotal": int(index.ntotal),
             "params": params}
    return serialize(index), entry


def load_index(root: Path, manifest: dict):
    """The store's index file, checked against the manifest (sha256, ntotal, dim), search parameters set."""
    entry = manifest["index"]
    path = root / entry["file"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise QascError(f"{path}: cannot read the index ({exc.strerror or exc})") from None
    if sha256(data) != manifest["checksums"][entry["file"]]["sha256"]:
        raise QascError(f"{path}: checksum mismatch (corrupt or truncated index); run qasc verify")
    index = deserialize(data, str(path))
    if index.ntotal != manifest["counts"]["sentences"] or index.d != manifest["dim"]:
        raise QascError(f"{path}: index holds {index.ntotal} x {index.d}, the store has "
                        f"{manifest['counts']['sentences']} x {manifest['dim']}")
    params = entry.get("params", {})
    if entry["kind"] == "ivf":
        index.nprobe = int(params.get("nprobe", 1))
    elif entry["kind"] == "hnsw":
        index.hnsw.efSearch = int(params.get("efSearch", HNSW_EF_SEARCH))
    return index


def exact_search(emb: np.ndarray, query_emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """emb (N, dim), query_emb (Q, dim), k -> exact top-k (scores (Q, k) float32, rows (Q, k) int64)."""
    if not isinstance(k, int | np.integer) or k < 1:
        raise QascError(f"k must be a positive integer, got {k!r}")
    q = np.asarray(query_emb, dtype=np.float32)
    if q.ndim != 2 or q.shape[1] != emb.shape[1]:
        raise QascError(f"query embeddings must have shape (Q, {emb.shape[1]}), got {tuple(q.shape)}")
    if not np.isfinite(q).all():
        raise QascError("query embeddings contain NaN or inf")
    scores = np.full((len(q), k), -np.inf, np.float32)
    rows = np.full((len(q), k), -1, np.int64)
    kk = min(k, len(emb))
    if kk and len(q):
        sims = q @ emb.T  # (Q, N)
        top = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
        order = np.argsort(-np.take_along_axis(sims, top, 1), axis=1, kind="stable")
        rows[:, :kk] = np.take_along_axis(top, order, 1)
        scores[:, :kk] = np.take_along_axis(sims, rows[:, :kk], 1)
    return scores, rows
