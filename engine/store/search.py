"""Searchers: a store's top-k search as one value, chosen by the store's index kind (README "Indexes").

    searcher.search(queries (Q, dim) float tensor, k) -> scores (Q, k) float32 (-inf where missing),
                                                        rows (Q, k) int64 (-1 there), on the vectors' device

- `ExactSearcher`: the blocked exact top-k over the store's own vectors (`index.exact_topk`): flat stores, and
  any store opened without its index.
- `FaissSearcher`: FAISS's own search of the store's index: ivf (the lists probed and the codes budget from an
  `IvfSettings` value, passed per search as FAISS's SearchParametersIVF, so the index is never reconfigured),
  hnsw, a flat index loaded on purpose, an index moved to a GPU (same call: the faiss GPU build's). An index of
  quantised codes (ivf SQ8) gives `rerank` x k hits, re-scored exactly from the vectors (`index.rerank`). A CPU ivf
  search of many queries (each probed list visited by LIST_MAJOR_MIN_VISITS queries or more on average) goes list
  by list instead (`list_major_search`): the same hits, 1.5-3.4x faster (bench/RESULTS.md, "List-major search").

Which one, and its settings, are values the caller passes (`Store.open(..., ivf=IvfSettings(...))`,
`Engine.open(..., ivf=...)`, `qasc query --nprobe / --max-codes`); no module state picks a path. FAISS's own
search replaced a batched torch scan of the lists (kernels.ivf_scan, removed): on an idle host, equal recall, the
scan beat FAISS's best batched path (`faiss.contrib.big_batch_search` over IVFFlat) by only 1.1-1.5x, but the path
usable on the store's SQ8 indexes was `.search` + re-rank, 1.65-4.1x slower than the scan, until the list-major
path (1.2-2.7x slower than the scan's times, bench/RESULTS.md, "List-major search").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from qasc.engine.errors import QascError
from qasc.engine.store import index as faiss_index

# A CPU ivf search goes list by list when its queries' probes visit each list this often on average (Q x nprobe >=
# this x nlist). Measured crossover on bench.scale's 200k store (1,788 lists): 27 visits at nprobe 16, 44 at 112;
# below it FAISS's query-by-query search is faster (8x at one query).
LIST_MAJOR_MIN_VISITS = 32

@dataclass(frozen=True)
class IvfSettings:
    """How an ivf index is searched. nprobe: inverted lists probed per query (None: the store's default,
    `index.set_nprobe`); max_codes: at most this many codes scanned per query, the probed lists nearest first, the
    one that crosses the budget cut short (FAISS's `IndexIVF.max_codes`; 0: no budget; CPU indexes only)."""

    nprobe: int | None = None
    max_codes: int = 0

    def __post_init__(self) -> None:
        if self.nprobe is not None and (isinstance(self.nprobe, bool) or not isinstance(self.nprobe, int | np.integer)
                                        or self.nprobe < 1):
            raise QascError(f"nprobe must be a positive integer, got {self.nprobe!r}")
        if isinstance(self.max_codes, bool) or not isinstance(self.max_codes, int | np.integer) or self.max_codes < 0:
            raise QascError(f"max_codes must be >= 0 (0: no budget), got {self.max_codes!r}")


class Searcher(Protocol):
    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """queries (Q, dim) float, k -> scores (Q, k) float32 (-inf where missing), rows (Q, k) int64 (-1)."""
        ...


@dataclass(frozen=True)
class ExactSearcher:
    """Exact inner products over `vectors` (N, dim) float32 | float16, on their device (`index.exact_topk`: equal
    scores lower row first, the lower rows kept at the cut)."""

    vectors: torch.Tensor

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        faiss_index.check_queries(queries, int(self.vectors.shape[1]), k)
        return faiss_index.exact_topk(self.vectors, queries, int(k))


@dataclass(frozen=True)
class FaissSearcher:
    """FAISS's search of `index` (CPU or GPU), hits re-scored exactly from `vectors` (N, dim) when rerank > 1:
    rerank x k hits taken, the k best kept by exact score (equal scores lower row first). settings: an ivf index's
    nprobe and max_codes (already resolved against its lists; other indexes ignore them)."""

    index: object
    vectors: torch.Tensor
    rerank: int = 1
    settings: IvfSettings = IvfSettings()

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        faiss_index.check_queries(queries, int(self.vectors.shape[1]), k)
        wide = int(k) * max(1, int(self.rerank))
        host = queries.detach().to("cpu", torch.float32).numpy()
        params = ivf_params(self.index, self.settings)
        if goes_list_major(self.index, params, host.shape[0]):
            found = list_major_search(self.index, host, wide, params.nprobe)
        else:
            found = faiss_index.search(self.index, host, wide, params)
        scores, rows = (torch.from_numpy(a).to(self.vectors.device) for a in found)
        if wide == int(k):
            return scores, rows
        return faiss_index.rerank(self.vectors, queries, rows, int(k))


def ivf_params(index, settings: IvfSettings):
    """A CPU ivf index and its settings -> FAISS's SearchParametersIVF for one search; None for other indexes (a
    GPU ivf index probes its own `nprobe`, set when it was loaded); QascError for a codes budget on an index that
    has none (flat, hnsw, GPU), and for another nprobe than a GPU index's own (it would be ignored)."""
    faiss = faiss_index._faiss()
    ivf = faiss.downcast_index(index)
    if not isinstance(ivf, faiss.IndexIVF):
        if settings.max_codes:
            raise QascError("max_codes applies to an ivf index searched on the CPU")
        own = getattr(index, "nprobe", None)
        if settings.nprobe is not None and own is not None and int(own) != int(settings.nprobe):
            raise QascError(f"this index probes the {own} lists it was loaded with; open the store with nprobe "
                            f"{settings.nprobe} instead")
        return None
    return faiss.SearchParametersIVF(nprobe=int(settings.nprobe or ivf.nprobe), max_codes=int(settings.max_codes))


def goes_list_major(index, params, n_queries: int) -> bool:
    """Whether a search of n_queries with these SearchParametersIVF (None: not a CPU ivf index) goes list by list:
    an IVF,Flat or SQ index by inner product, no codes budget (FAISS applies it per query), and at least
    LIST_MAJOR_MIN_VISITS queries per list on average."""
    if params is None or params.max_codes:
        return False
    ivf = _inner_product_ivf(index)
    return ivf is not None and n_queries * params.nprobe >= LIST_MAJOR_MIN_VISITS * ivf.nlist


def _inner_product_ivf(index):
    """The IVF,Flat or SQ index inside `index` when it scores by inner product (what the list-major search
    takes), else None."""
    faiss = faiss_index._faiss()
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    ok = isinstance(ivf, faiss.IndexIVFFlat | faiss.IndexIVFScalarQuantizer)
    return ivf if ok and ivf.metric_type == faiss.METRIC_INNER_PRODUCT else None


def list_major_search(index, queries: np.ndarray, k: int, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
    """A CPU ivf index (IVF,Flat or SQ8, by inner product), queries (Q, dim) float32, k, nprobe -> scores (Q, k)
    float32 (-inf where missing), rows (Q, k) int64 (-1 there): the hits of `index.search` with that nprobe, searched
    list by list as `faiss.contrib.big_batch_search` does (every query assigned to its nprobe nearest lists, the
    (query, list) pairs bucketed by list, each list's codes decoded once and scored against all of its queries with
    `faiss.knn`, one FAISS result heap), which reads each list once per batch instead of once per query.
    big_batch_search itself subtracts the centroid from the queries of a list of residual codes: right for L2, wrong
    for the inner product (recall@8 0.137 on the store's SQ8 lists); here the centroid is added to the decoded
    residuals instead, <q, c + r>, so the scores are FAISS's own up to float rounding."""
    faiss = faiss_index._faiss()
    ivf = _inner_product_ivf(index)
    if ivf is None:
        raise QascError("the list-major search takes an IVF,Flat or SQ index scored by inner product")
    from faiss.contrib.inspect_tools import get_invlist

    n_queries, nprobe = queries.shape[0], min(int(nprobe), ivf.nlist)
    kk = min(int(k), max(int(ivf.ntotal), 1))
    if n_queries == 0:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    _, assign = ivf.quantizer.search(np.ascontiguousarray(queries, np.float32), nprobe)  # (Q, nprobe), -1: none
    pairs = np.argsort(assign.ravel(), kind="stable")  # (query, probe) pairs bucketed by list
    query_of = pairs // nprobe
    bounds = np.searchsorted(assign.ravel()[pairs], np.arange(ivf.nlist + 1))  # list l: pairs[bounds[l]:bounds[l+1]]
    sq = ivf.sq if isinstance(ivf, faiss.IndexIVFScalarQuantizer) else None
    heap = faiss.ResultHeap(n_queries, kk, keep_max=True)
    for lst in range(ivf.nlist):
        size = ivf.invlists.list_size(lst)
        if bounds[lst + 1] == bounds[lst] or size == 0:
            continue
        ids, codes = get_invlist(ivf.invlists, lst)
        vectors = sq.decode(codes).reshape(size, ivf.d) if sq is not None else codes.view(np.float32).reshape(size, -1)
        if sq is not None and ivf.by_residual:
            vectors += ivf.quantizer.reconstruct(lst)
        subset = query_of[bounds[lst]:bounds[lst + 1]]
        scores, local = faiss.knn(queries[subset], vectors, min(kk, size), metric=faiss.METRIC_INNER_PRODUCT)
        heap.add_result_subset(subset, scores, ids[local])
    heap.finalize()
    return faiss_index.padded_hits(heap.D, heap.I, int(k))


def store_searcher(kind: str, index, vectors: torch.Tensor, params: dict, settings: IvfSettings) -> Searcher:
    """A store's index kind (flat | ivf | hnsw), its FAISS index (None: not loaded), vectors, the manifest's index
    params and the ivf settings (nprobe resolved) -> the searcher: exact without an index, else FAISS's, an ivf
    index's hits re-ranked params["rerank"] x k (stores before SQ8: 1)."""
    if index is None:
        return ExactSearcher(vectors)
    rerank = max(1, int(params.get("rerank", 1))) if kind == "ivf" else 1
    if kind == "ivf":
        ivf_params(index, settings)  # a codes budget on a GPU index is refused here, before any search
    return FaissSearcher(index, vectors, rerank, settings if kind == "ivf" else IvfSettings())
