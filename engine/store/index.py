"""FAISS index over the store's sentence embeddings: inner product on L2-normalised vectors.

Kinds: `flat` (exact, IndexFlatIP), `ivf` (inverted lists trained by k-means, holding 8-bit scalar-quantised
codes since the measurement in README "Indexes"; older stores hold full vectors, params without "codes") and
`hnsw` (IndexHNSWFlat). `auto` picks flat below AUTO_FLAT_MAX rows and ivf above. Ids are always global sentence
rows (vectors are added in row order). The index is built and serialised on CPU; `to_device` moves it to
the engine's CUDA device (`gpu_for`: only when that device is cuda, faiss was built with GPU support and
sees that GPU; HNSW stays on CPU: faiss has no GPU HNSW). A cpu device never puts the index on a GPU.
`load_index` reads a store's index back (engine.store.index_build builds it from the shards); `exact_topk` is the
blocked torch top-k that flat stores (and stores opened without their index) search with; `rerank` re-scores the
hits of quantised codes exactly; `recall_at_depth` compares approximate hits with exact ones.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import torch

from qasc.engine.errors import QascError
from qasc.engine.store.files import file_digest
from qasc.kernels.gather import gathered_dots
from qasc.kernels.quantize import row_top_k

KINDS = ("auto", "flat", "ivf", "hnsw")
AUTO_FLAT_MAX = 200_000  # rows; exact search over more than this is slower than an IVF probe
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128
IVF_TRAIN_PER_LIST = 64  # k-means training points per inverted list ...
IVF_TRAIN_BYTES = 1 << 27  # ... up to this many bytes of float32 sample (87,381 vectors at dim 384; README "Indexes")
FIT_BLOCK_ROWS = 1 << 14  # rows encoded and decoded at a time when checking appended rows against SQ8 codes
IVF_SEED = 1234
IVF_NITER = 10  # k-means iterations (faiss's default 25 costs 2.5x the training time for no measured recall)
IVF_CODES = ("Flat", "SQfp16", "SQ8")  # what an inverted list holds per vector: float32, float16, 8-bit codes
IVF_DEFAULT_CODES = "SQ8"  # 1/4 the bytes of Flat, faster scans; hits re-scored exactly (IVF_RERANK)
IVF_NPROBE = 16  # the fewest lists probed by default (fewer when the index has fewer lists)
IVF_PROBE_SHARE = 1 / 16  # default lists probed: this share of nlist (at least IVF_NPROBE); README "Indexes"
IVF_RERANK = 2  # quantised codes: take IVF_RERANK x k hits, re-score them from the store's vectors, keep k


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


def default_nprobe(nlist: int) -> int:
    """Inverted lists -> the lists probed by default: IVF_PROBE_SHARE of them, at least IVF_NPROBE, at most nlist.
    A fixed count does not carry across sizes: at 1M rows (3,998 lists) nprobe 16 found 0.70 of the exact top 16
    on text-like vectors, 250 (1/16) found 0.97 (bench/RESULTS.md, IVF recall vs nprobe)."""
    return max(1, min(int(nlist), max(IVF_NPROBE, math.ceil(int(nlist) * IVF_PROBE_SHARE))))


def default_params(kind: str, n_rows: int) -> dict:
    if kind == "ivf":
        nlist = ivf_lists(n_rows)
        return {"nlist": nlist, "nprobe": default_nprobe(nlist), "codes": IVF_DEFAULT_CODES, "rerank": IVF_RERANK}
    if kind == "hnsw":
        return {"M": HNSW_M, "efConstruction": HNSW_EF_CONSTRUCTION, "efSearch": HNSW_EF_SEARCH}
    return {}


def set_nprobe(params: dict, nprobe: int | None) -> int:
    """An ivf index's params, an override or None -> the inverted lists to probe (QascError unless 1..nlist).

    None: the larger of the manifest's nprobe and `default_nprobe(nlist)`, so stores written while the default
    was a fixed 16 lists probe the share of their lists that the rule gives today."""
    if nprobe is None:
        stored = int(params.get("nprobe", 1))
        return max(stored, default_nprobe(int(params["nlist"]))) if "nlist" in params else stored
    nlist = int(params.get("nlist", nprobe))
    if isinstance(nprobe, bool) or not isinstance(nprobe, int | np.integer) or not 1 <= nprobe <= nlist:
        raise QascError(f"nprobe must be an integer from 1 to the index's {nlist} lists, got {nprobe!r}")
    return int(nprobe)


def reconstruct_matches(entry: dict, got: np.ndarray, want: np.ndarray) -> bool:
    """An index's manifest entry, reconstructed (R, dim) and stored (R, dim) vectors -> whether the index holds
    the stored vectors: equal (1e-6) for full vectors; for quantised codes (SQ8 steps are 1/255 of each
    dimension's trained range, values outside it clamp) every row's cosine with its stored vector >= 0.95 and
    99% of them >= 0.99 (a row just outside the trained range loses a little; a row of another vector, or rows
    far outside the range, lose far more)."""
    codes = entry.get("params", {}).get("codes", "Flat") if entry.get("kind") == "ivf" else "Flat"
    want = want.astype(np.float32, copy=False)
    if codes == "Flat":
        return bool(np.allclose(got, want, atol=1e-6))
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    cos = (got * want).sum(1) / np.where(norms > 0, norms, 1)
    return bool(len(cos) == 0 or (cos.min() >= 0.95 and (cos >= 0.99).mean() >= 0.99))


def new_index(kind: str, dim: int, params: dict):
    """An empty CPU index of that kind (ivf still needs `train`)."""
    faiss = _faiss()
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "ivf":
        codes = params.get("codes", "Flat")  # stores before the codes param hold full vectors
        if codes not in IVF_CODES:
            raise QascError(f"unknown ivf codes {codes!r}; use one of {', '.join(IVF_CODES)}")
        index = faiss.index_factory(dim, f"IVF{int(params['nlist'])},{codes}", faiss.METRIC_INNER_PRODUCT)
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
    ivf.cp.niter = IVF_NITER
    # a capped sample (training_sample) gives fewer points per list than faiss's advice of 39; say it once in
    # the README rather than on every ingest's stderr (the value only gates that warning)
    ivf.cp.min_points_per_centroid = max(1, min(int(ivf.cp.min_points_per_centroid), len(sample) // ivf.nlist))
    index.train(np.ascontiguousarray(sample, dtype=np.float32))


def training_sample(n_rows: int, nlist: int, dim: int, max_bytes: int = IVF_TRAIN_BYTES) -> np.ndarray:
    """Which rows (sorted int64) train an ivf index of nlist lists over dim-wide vectors: evenly spaced,
    IVF_TRAIN_PER_LIST per list, at most max_bytes of float32 (and at least one per list): the training memory
    stays bounded whatever the store's size (above ~150k rows at dim 384 the lists get fewer than 64)."""
    cap = max(nlist, max_bytes // (4 * max(dim, 1)))
    want = min(n_rows, max(min(nlist * IVF_TRAIN_PER_LIST, cap), nlist))
    return np.unique(np.linspace(0, n_rows - 1, num=want).astype(np.int64)) if n_rows else np.zeros(0, np.int64)


def add(index, emb: np.ndarray) -> None:
    """emb (N, dim) float32 appended; their ids are index.ntotal .. index.ntotal + N - 1."""
    if len(emb):
        index.add(np.ascontiguousarray(emb, dtype=np.float32))


def write_index_file(index, path: Path) -> None:
    """Write the index to path (straight from faiss: no serialized copy in memory)."""
    _faiss().write_index(index, str(path))


def read_index_file(path: Path, sha: str, mmap: bool = False):
    """path, expected sha256 -> CPU index, read straight from the file; QascError when unreadable or corrupt.
    mmap: the index's arrays are views of the file mapped read-only (faiss IO_FLAG_MMAP_IFC), paged in only
    where read (FAISS pages in the lists a search probes; pages are shared with other processes reading it).
    A file read whole is checked against its sha256 first; a mapped one is not (hashing would read all of it,
    0.4 s warm and the whole file from disk cold at 1M sentences): its size is checked at open
    (engine.store.manifest.check_sizes) and its checksum by `qasc verify`."""
    faiss = _faiss()
    mapped = mmap and hasattr(faiss, "IO_FLAG_MMAP_IFC")
    if not mapped:
        try:
            digest = file_digest(path)["sha256"]
        except OSError as exc:
            raise QascError(f"{path}: cannot read the index ({exc.strerror or exc})") from None
        if digest != sha:
            raise QascError(f"{path}: checksum mismatch (corrupt or truncated index); run qasc verify")
    try:
        if mapped:
            return faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
        return faiss.read_index(str(path))
    except Exception as exc:  # faiss raises RuntimeError with a C++ message
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QascError(f"{path}: corrupt or truncated FAISS index ({first[:200]})") from exc


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


def search(index, query_emb: np.ndarray, k: int, params=None) -> tuple[np.ndarray, np.ndarray]:
    """query_emb (Q, dim) float32, k -> scores (Q, k) float32 (-inf where missing), rows (Q, k) int64 (-1), by
    FAISS's own `index.search`; params: FAISS SearchParameters for this search (None: the index's own)."""
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
    scores, rows = index.search(q, kk) if params is None else index.search(q, kk, params=params)
    return padded_hits(scores, rows, int(k))


def padded_hits(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """FAISS's hits (Q, kk <= k) -> scores (Q, k) float32 (-inf where missing), rows (Q, k) int64 (-1 there)."""
    scores = scores.astype(np.float32, copy=False)
    rows = rows.astype(np.int64, copy=False)
    if rows.shape[1] < k:
        scores = np.concatenate([scores, np.full((rows.shape[0], k - rows.shape[1]), -np.inf, np.float32)], axis=1)
        rows = np.concatenate([rows, np.full((rows.shape[0], k - rows.shape[1]), -1, np.int64)], axis=1)
    scores[rows < 0] = -np.inf
    return scores, rows


def load_index(root: Path, manifest: dict, nprobe: int | None = None, mmap: bool = False):
    """The store's index file, checked against the manifest (sha256, ntotal, dim), search parameters set
    (nprobe: overrides the manifest's for an ivf index); mmap: an ivf index's file mapped, not read
    (`read_index_file`)."""
    entry = manifest["index"]
    path = root / entry["file"]
    if entry["file"] not in manifest["checksums"]:
        raise QascError(f"{path}: the index has no checksum in the manifest; run qasc verify")
    index = read_index_file(path, manifest["checksums"][entry["file"]]["sha256"], mmap=mmap and entry["kind"] == "ivf")
    if index.ntotal != manifest["counts"]["sentences"] or index.d != manifest["dim"]:
        raise QascError(f"{path}: index holds {index.ntotal} x {index.d}, the store has "
                        f"{manifest['counts']['sentences']} x {manifest['dim']}")
    params = entry.get("params", {})
    if entry["kind"] == "ivf":
        index.nprobe = set_nprobe(params, nprobe)
    elif entry["kind"] == "hnsw":
        index.hnsw.efSearch = int(params.get("efSearch", HNSW_EF_SEARCH))
    return index


EXACT_BLOCK_ELEMENTS = 1 << 24  # query x row similarities per block of the exact search (64 MiB of float32)


def _block_topk(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """sims (B, R) float32, k <= R -> values (B, k), columns (B, k) int64: the k largest per row, equal values at
    the cut resolved to the lower columns (`kernels.quantize.row_top_k`), ordered by column."""
    vals, idx = row_top_k(sims, k)
    order = idx.argsort(dim=1)
    return vals.gather(1, order), idx.gather(1, order)


def sort_top(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (Q, K) float32, ids (Q, K) int64 (-1: missing) -> both ordered by score descending, equal scores
    lower id first, missing ones last (-inf / -1)."""
    missing = ids < 0
    key = torch.where(missing, torch.full_like(ids, torch.iinfo(torch.long).max), ids)
    scores = torch.where(missing, torch.full_like(scores, float("-inf")), scores)
    by_id = key.sort(dim=1, stable=True).indices
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    by_score = scores.sort(dim=1, descending=True, stable=True).indices
    return scores.gather(1, by_score), ids.gather(1, by_score)


def exact_topk(vectors: torch.Tensor, query: torch.Tensor, k: int,
               block_elements: int = EXACT_BLOCK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """vectors (N, dim) float32|float16, query (Q, dim) float, k -> scores (Q, k) float32 (-inf where the store
    has fewer rows), rows (Q, k) int64 (-1 there): exact inner products on vectors' device.

    Row blocks (cast to float32 once each) x query blocks, each block's top-k merged into a running top-k, so
    the temporary memory is about `block_elements` floats plus one row block, whatever Q and N are: never a
    dense (Q, N) matrix nor a second copy of the vectors. Scores equal FAISS IndexFlatIP's; rows are ordered by
    score descending, equal scores lower row first, and among equal scores at the cut the lower rows are kept
    (deterministic whatever the blocks; FAISS keeps the same scores but picks among equal ones its own way)."""
    n = vectors.shape[0]
    q = query.to(device=vectors.device, dtype=torch.float32)
    scores = torch.full((q.shape[0], k), float("-inf"), dtype=torch.float32, device=vectors.device)
    rows = torch.full((q.shape[0], k), -1, dtype=torch.long, device=vectors.device)
    if n == 0 or q.shape[0] == 0:
        return scores, rows
    q_step = max(1, min(q.shape[0], 1024))
    r_step = min(n, max(k, block_elements // q_step))
    for r0 in range(0, n, r_step):
        block = vectors[r0 : r0 + r_step].to(torch.float32)  # (R, dim); a view when already float32
        kb = min(k, block.shape[0])
        for q0 in range(0, q.shape[0], q_step):
            q1 = min(q0 + q_step, q.shape[0])
            bv, bi = _block_topk(q[q0:q1] @ block.T, kb)  # (B, kb), block columns ascending
            cand_s = torch.cat([scores[q0:q1], bv], dim=1)  # running rows (all lower) first, then this block's
            cand_r = torch.cat([rows[q0:q1], bi + r0], dim=1)
            order = torch.sort(cand_s, dim=1, descending=True, stable=True).indices[:, :k]
            scores[q0:q1] = cand_s.gather(1, order)
            rows[q0:q1] = cand_r.gather(1, order)
    return scores, rows


def rerank(vectors: torch.Tensor, query: torch.Tensor, rows: torch.Tensor, k: int,
           block_elements: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """vectors (N, dim), query (Q, dim), rows (Q, K >= k) int64 hits (-1 = none) -> the k best of them by exact
    inner product: scores (Q, k) float32 (-inf where missing), rows (Q, k) int64 (-1); equal scores lower row
    first. Fixes the order (and, taking K > k hits, most of the recall) that quantised codes lose. The hits'
    vectors are gathered (and cast to float32) about `block_elements` floats at a time (`gathered_dots`; None: its
    default for the device), so the temporary memory does not grow with Q (10k queries x 32 hits x 384 would be
    0.7 GiB at once)."""
    q = query.to(device=vectors.device, dtype=torch.float32)
    rows = rows.to(vectors.device)
    ok = rows >= 0
    got = gathered_dots(vectors, q, rows.clamp(min=0), ok, block_elements)  # (Q, K): only the hits are gathered
    got = torch.where(ok, got, torch.full_like(got, float("-inf")))
    keyed = torch.where(ok, rows, torch.full_like(rows, vectors.shape[0]))
    by_row = keyed.argsort(dim=1)  # then a stable sort by score: equal scores keep row order
    got, rows = got.gather(1, by_row), rows.gather(1, by_row)
    order = torch.sort(got, dim=1, descending=True, stable=True).indices[:, :k]
    out_s, out_r = got.gather(1, order), rows.gather(1, order)
    return out_s, torch.where(torch.isfinite(out_s), out_r, torch.full_like(out_r, -1))


def check_queries(query_emb, dim: int, k) -> None:
    """QascError unless k is a positive integer and query_emb a finite (Q, dim) array or tensor."""
    if not isinstance(k, int | np.integer) or isinstance(k, bool) or k < 1:
        raise QascError(f"k must be a positive integer, got {k!r}")
    if query_emb.ndim != 2 or query_emb.shape[1] != dim:
        raise QascError(f"query embeddings must have shape (Q, {dim}), got {tuple(query_emb.shape)}")
    finite = torch.isfinite(query_emb).all() if isinstance(query_emb, torch.Tensor) else np.isfinite(query_emb).all()
    if not bool(finite):
        raise QascError("query embeddings contain NaN or inf")


def exact_search(emb, query_emb, k: int) -> tuple[np.ndarray, np.ndarray]:
    """emb (N, dim) float32|float16 (numpy or tensor), query_emb (Q, dim), k -> exact top-k (scores (Q, k)
    float32, rows (Q, k) int64), through `exact_topk` (blocked, no dense (Q, N) matrix)."""
    vectors = emb if isinstance(emb, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(emb))
    q = query_emb if isinstance(query_emb, torch.Tensor) else torch.from_numpy(np.asarray(query_emb, np.float32))
    check_queries(q, vectors.shape[1], k)
    scores, rows = exact_topk(vectors, q, int(k))
    return scores.cpu().numpy(), rows.cpu().numpy()


def recall_at_depth(hits, exact_hits) -> float:
    """hits, exact_hits (Q, depth) int rows (-1 = none; numpy or tensor) -> the mean over queries of the share
    of each query's exact rows that `hits` also holds (1.0 when no query has an exact row)."""
    h = np.asarray(hits.cpu() if isinstance(hits, torch.Tensor) else hits, dtype=np.int64)
    e = np.asarray(exact_hits.cpu() if isinstance(exact_hits, torch.Tensor) else exact_hits, dtype=np.int64)
    if h.ndim != 2 or e.ndim != 2 or h.shape[0] != e.shape[0]:
        raise QascError(f"hits {h.shape} and exact hits {e.shape} must be (Q, depth) of the same Q")
    found = ((e[:, :, None] == h[:, None, :]) & (e[:, :, None] >= 0)).any(2).sum(1)  # (Q,)
    wanted = (e >= 0).sum(1)
    some = wanted > 0
    return float((found[some] / wanted[some]).mean()) if some.any() else 1.0
