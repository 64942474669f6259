"""`Store`: a committed store read into memory (documents, sentence rows, embeddings, heading paths, index).

The embeddings are held once, in the store's dtype (float32 | float16): each shard's Arrow column is copied
into one preallocated (N, dim) array (no concatenated temporary), wrapped without a copy as the tensor
`Store.vectors`; `to_device` moves it (an engine on CUDA keeps only the device copy). Flat stores do not load
their FAISS index by default: exact search runs blocked over `vectors` (`index.exact_topk`), so no second copy.
An ivf index whose lists hold IVF_SCAN_MIN_LIST_ROWS rows or more on average is searched by a torch scan, many
queries per list at once; smaller lists by FAISS itself (`Store.ivf_search`: "auto", "torch" or "faiss" forces
one). The index file is mapped, not read (faiss IO_FLAG_MMAP_IFC): its lists are paged in only where read.
`Store.ivf_source = "vectors"` (the default) scans the store's own vectors, the index's lists read as rows
(`kernels.ivf_vectors_topk`; on CPU with int8 products, each list's rows rounded to 8 bits as it is scanned), so
the embeddings are in memory once; "codes" scans an 8-bit index's codes (`kernels.ivf_sq8_topk` over views of its
lists, paged in; on CPU with 8-bit query weights, `Store.ivf_int8 = False` giving FAISS's own scores). The hits
are then re-ranked exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from qasc.engine.config import EngineConfig
from qasc.engine.cpu import cpu_has_int8_dot
from qasc.engine.errors import QascError, first_line
from qasc.engine.lexical import TermCounts
from qasc.engine.passages import Passages
from qasc.engine.store import index as faiss_index
from qasc.engine.store import lexical as saved_terms
from qasc.engine.store.files import read_row_count, read_table
from qasc.engine.store.manifest import check_sizes, read_manifest
from qasc.engine.store.schema import (
    DOCUMENTS_SCHEMA,
    STORE_DTYPES,
    embeddings_of,
    headings_schema,
    passages_schema,
    sentences_schema,
)
from qasc.engine.types import Headings, Sentences
from qasc.kernels.ivf_scan import ivf_sq8_topk, ivf_vectors_topk

# how an 8-bit ivf index is searched: "torch" (kernels.ivf_scan), "faiss" (IndexIVF.search), or "auto": the torch
# scan where the lists hold IVF_SCAN_MIN_LIST_ROWS rows or more on average (its per-list work is then amortised:
# 3-4x FAISS's search at 1M rows, 250 a list), FAISS's own search below (3.3x the scan's search rate at 20k rows,
# 39 a list; bench/RESULTS.md, "The IVF search by list size")
IVF_SEARCH = "auto"
IVF_SCAN_MIN_LIST_ROWS = 128
# the torch scan's query weights in 8 bits (int8 products) on CPU: 1.6-1.9x the float32 scan at 1M rows, the same
# recall@16 after the exact re-rank (bench/RESULTS.md), where the CPU has int8 dot-product instructions; ~25x
# slower per product on one without (AVX2 only). "auto": int8 where `engine.cpu.cpu_has_int8_dot()`; True: int8
# always; False: float32, FAISS's own scores
IVF_INT8: bool | str = "auto"
# what the torch scan of an ivf index reads: "vectors", the store's own vectors, the index's lists read as rows
# (one copy of the embeddings in memory: the codes stay in the index's mapped file, never paged in), or "codes", an
# 8-bit index's codes (paged in: 0.37 GiB more at 1M rows). At 1M rows (bench/RESULTS.md, 2026-12-04) the vectors
# scan with int8 products searched at 0.9x the codes scan (same recall@8, 0.9765), end to end 0.94x, peak RSS
# 0.34 GiB lower; with float32 products it searched at 0.3x
IVF_SOURCES = ("codes", "vectors")
IVF_SOURCE = "vectors"
# the vectors scan's products: "auto" (int8 on CPU where `ivf_int8`, each list's rows rounded to 8 bits per
# dimension as it is scanned; float16 on CUDA; else float32), or "float32", "bfloat16", "float16" (on CPU bf16
# products of the lists' varying shapes ran slower than float32 and grew RSS, each new shape a new oneDNN kernel)
IVF_SCAN_DTYPE = "auto"
COLUMN_SCALE_BLOCK_ROWS = 1 << 16  # rows read at a time for Store.column_scale
OPEN_RETRIES = 3  # Store.open: reads again from a manifest that changed while it read (an append committed)
IVF_INT8_MIN_LIST_ROWS = 128  # ... for lists of this many rows on average (smaller: float32 was faster, 20k rows)


def load_shard(root: Path, shard: dict, manifest: dict, out: np.ndarray | None = None
               ) -> tuple[list[Sentences], list[dict], list[str], np.ndarray, Headings]:
    """One shard -> (Sentences per document, metadata, sources, embeddings (n, dim) in the store's dtype, its
    headings); QascError naming the shard when its tables are damaged in a way Parquet's own checks miss
    (a flipped byte inside a string that is no longer utf-8, values of the wrong kind).

    out: the shard's rows of a preallocated (N, dim) array, filled and returned as the embeddings."""
    try:
        return _load_shard(root, shard, manifest, out)
    except QascError:
        raise
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, pa.ArrowException) as exc:
        raise QascError(f"{root / shard.get('sentences', '?')}: damaged shard ({first_line(exc)}); "
                        f"run qasc verify") from None


def _load_shard(root: Path, shard: dict, manifest: dict, out: np.ndarray | None = None
                ) -> tuple[list[Sentences], list[dict], list[str], np.ndarray, Headings]:
    dim, dtype = manifest["dim"], manifest["dtype"]
    dt = read_table(root, shard["documents"])
    st = read_table(root, shard["sentences"])
    where = root / shard["sentences"]
    has_headings = "headings" in shard
    if dt.schema.names != DOCUMENTS_SCHEMA.names:
        raise QascError(f"{root / shard['documents']}: unexpected columns {dt.schema.names}")
    if st.schema.names != sentences_schema(dim, dtype, has_headings).names:
        raise QascError(f"{where}: unexpected columns {st.schema.names}")
    if st.schema.field("embedding").type != sentences_schema(dim, dtype).field("embedding").type:
        raise QascError(f"{where}: embedding column is {st.schema.field('embedding').type}, the manifest says "
                        f"{dtype}[{dim}]")
    if dt.num_rows != shard["n_documents"] or st.num_rows != shard["n_sentences"]:
        raise QascError(f"{where}: {dt.num_rows} documents / {st.num_rows} sentences, the manifest says "
                        f"{shard['n_documents']} / {shard['n_sentences']}")
    doc_ids = dt.column("doc_id").to_pylist()
    texts = dt.column("text").to_pylist()
    counts = dt.column("n_sentences").to_numpy().astype(np.int64)
    if int(counts.sum()) != st.num_rows:
        raise QascError(f"{where}: documents list {int(counts.sum())} sentences, the table holds {st.num_rows}")
    owner = pc.index_in(st.column("doc_id"), value_set=pa.array(doc_ids, pa.string())).to_numpy(
        zero_copy_only=False)
    expected = np.repeat(np.arange(len(doc_ids)), counts)
    starts = np.concatenate([[0], np.cumsum(counts)])
    position = np.arange(st.num_rows) - np.repeat(starts[:-1], counts)
    if not np.array_equal(owner, expected) or not np.array_equal(st.column("sentence").to_numpy(), position):
        raise QascError(f"{where}: sentence rows are not grouped by document in order")
    cols = {c: st.column(c).to_numpy() for c in ("char_start", "char_end", "paragraph", "section", "n_tokens")}
    docs = []
    for d, (doc_id, text) in enumerate(zip(doc_ids, texts, strict=True)):
        a, b = starts[d], starts[d + 1]
        try:
            docs.append(Sentences(doc_id, text, cols["char_start"][a:b], cols["char_end"][a:b],
                                  cols["paragraph"][a:b], cols["section"][a:b], cols["n_tokens"][a:b]))
        except ValueError as exc:
            raise QascError(f"{where}: {exc}") from None
    metadata = []
    for raw in dt.column("metadata").to_pylist():
        try:
            metadata.append(json.loads(raw))
        except ValueError:
            raise QascError(f"{root / shard['documents']}: corrupt metadata JSON") from None
    return (docs, metadata, dt.column("source").to_pylist(), embeddings_of(st, dim, str(where), None, out),
            _load_headings(root, shard, st, dim, dtype) if has_headings else
            Headings([], np.full(st.num_rows, -1, np.int32), np.zeros((0, dim), np.float32)))


def _load_headings(root: Path, shard: dict, st: pa.Table, dim: int, dtype: str) -> Headings:
    ht = read_table(root, shard["headings"])
    where = root / shard["headings"]
    if ht.schema.names != headings_schema(dim, dtype).names:
        raise QascError(f"{where}: unexpected columns {ht.schema.names}")
    rows = st.column("heading").to_numpy().astype(np.int32)
    if len(rows) and (rows.min() < -1 or rows.max() >= ht.num_rows):
        raise QascError(f"{root / shard['sentences']}: heading ids outside [-1, {ht.num_rows}) of {where}")
    return Headings(ht.column("path").to_pylist(), rows, embeddings_of(ht, dim, str(where)))


def merge_headings(heads: list[Headings], dim: int) -> Headings:
    """Per-shard headings -> the store's: one id per distinct path text (the same text embeds the same),
    rows (N,) int32 global ids."""
    ids: dict[str, int] = {}
    vecs: list[np.ndarray] = []
    rows = []
    for h in heads:
        remap = np.empty(len(h.paths) + 1, np.int32)
        remap[-1] = -1
        for i, p in enumerate(h.paths):
            if p not in ids:
                ids[p] = len(ids)
                vecs.append(h.emb[i])
            remap[i] = ids[p]
        rows.append(remap[h.rows])
    emb = np.stack(vecs).astype(np.float32) if vecs else np.zeros((0, dim), np.float32)
    return Headings(list(ids), np.concatenate(rows) if rows else np.zeros(0, np.int32), emb)


def load_passages(root: Path, shard: dict, manifest: dict, row_start: int) -> Passages:
    """A shard's passages (engine.passages), `first` made global (+ row_start, the shard's first row); empty for
    a shard without a passages file. QascError when the table is damaged or its runs do not tile the shard's
    rows in order."""
    dim, dtype = int(manifest["dim"]), manifest["dtype"]
    if "passages" not in shard:
        return Passages.empty(dim)
    where = root / shard["passages"]
    try:
        pt = read_table(root, shard["passages"])
        if pt.schema.names != passages_schema(dim, dtype).names:
            raise QascError(f"{where}: unexpected columns {pt.schema.names}")
        first = pt.column("first").to_numpy().astype(np.int64)
        count = pt.column("count").to_numpy().astype(np.int32)
        tokens = pt.column("n_tokens").to_numpy().astype(np.int32)
        emb = embeddings_of(pt, dim, str(where), None)
    except (ValueError, TypeError, pa.ArrowException) as exc:
        raise QascError(f"{where}: damaged passages ({first_line(exc)}); run qasc verify") from None
    n = int(shard["n_sentences"])
    tiles = len(first) == 0 or (first[0] == 0 and bool(np.all(count > 0))
                                and bool(np.all(first[1:] == first[:-1] + count[:-1])))
    if not tiles or int(count.sum()) != n or bool(np.any(tokens < 0)):
        raise QascError(f"{where}: passages do not tile the shard's {n} sentence rows in order")
    if not np.isfinite(emb).all():
        raise QascError(f"{where}: NaN/inf passage vectors")
    return Passages(first + row_start, count, tokens, emb)


def read_passages(root: Path, manifest: dict) -> Passages:
    """Every shard's passages (global first rows) -> the store's, vectors in the store's dtype, read one shard at
    a time into one preallocated (P, dim) array (P from the files' footers): memory is the result plus one
    shard's table, and Arrow's freed buffers are handed back (at 1M rows, 467k passages: concatenating every
    shard's table left 0.85 GiB resident for 0.33 GiB of vectors, bench/RESULTS.md)."""
    dim, dtype = int(manifest["dim"]), manifest["dtype"]
    shards = manifest.get("shards", [])
    sizes = [read_row_count(root, shard["passages"]) if "passages" in shard else 0 for shard in shards]
    if not sum(sizes):
        return Passages.empty(dim)
    emb = np.empty((sum(sizes), dim), np.dtype(dtype))
    firsts, counts, tokens = [], [], []
    at = row = 0
    for shard, size in zip(shards, sizes, strict=True):
        part = load_passages(root, shard, manifest, row)
        if len(part.first) != size:
            raise QascError(f"{root / shard['passages']}: {len(part.first)} passages, its footer says {size}")
        emb[at : at + size] = np.asarray(part.emb).reshape(-1, dim)
        firsts.append(part.first)
        counts.append(part.count)
        tokens.append(part.n_tokens)
        del part
        at += size
        row += int(shard["n_sentences"])
    pa.default_memory_pool().release_unused()  # the shards' Arrow buffers, else kept by the allocator
    return Passages(np.concatenate(firsts), np.concatenate(counts), np.concatenate(tokens), emb)


class Store:
    """A committed store in memory: documents, sentence rows, embeddings (N, dim) in the store's dtype, heading
    paths, index.

    vectors: the one copy of the embeddings, a tensor (N, dim) float32 | float16 on the store's device;
    embeddings: the same memory as a numpy array while on CPU (the device tensor after `to_device`);
    index: the FAISS index, or None (flat stores by default: exact search over `vectors`);
    heading_paths (H) distinct texts over the whole store, heading_emb (H, dim) float32, row_heading (N,) int32
    each row's path (-1: none; every row of a format-1 store); passages (engine.passages.Passages, global first
    rows, vectors in the store's dtype; empty for a store without passages), read from the store's files on first
    use (only the budget fill needs them)."""

    def __init__(self, path: Path, manifest: dict, docs: list[Sentences], metadata: list[dict],
                 sources: list[str], embeddings: np.ndarray | torch.Tensor, index,
                 headings: Headings | None = None, passages: Passages | None = None) -> None:
        self.path = path
        self.manifest = manifest
        self.docs = docs
        self.doc_ids = [d.doc_id for d in docs]
        self.metadata = metadata
        self.sources = sources
        self.vectors = embeddings if isinstance(embeddings, torch.Tensor) else torch.from_numpy(embeddings)
        self.doc_offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
        self.row_doc = np.repeat(np.arange(len(docs), dtype=np.int64), np.diff(self.doc_offsets))  # (N,)
        self.index = index
        self.ivf_search = IVF_SEARCH
        self.ivf_int8 = cpu_has_int8_dot() if IVF_INT8 == "auto" else bool(IVF_INT8)  # int8 scan products (CPU)
        self._sq8: faiss_index.Sq8Lists | None = None
        self._sq8_of = None  # the index _sq8 was built from
        self.ivf_source = IVF_SOURCE
        self._rows: faiss_index.IvfRows | None = None
        self._rows_of = None  # (index, device) _rows was built for
        self._column_scale: torch.Tensor | None = None  # (dim,) float32, built on first use
        if headings is None:
            headings = Headings([], np.full(len(embeddings), -1, np.int32),
                                     np.zeros((0, embeddings.shape[1]), np.float32))
        self.heading_paths, self.row_heading, self.heading_emb = headings
        self._passages = passages

    @classmethod
    def open(cls, path: str | Path, *, load_index: bool | str = "auto", device="cpu", nprobe: int | None = None
             ) -> Store:
        """Reads a committed store; QascError if missing, incomplete (no complete manifest) or corrupt.

        load_index: "auto" loads the FAISS index of ivf / hnsw stores only (flat stores search exactly over
        their own vectors, no second copy), True always, False never (exact search).
        device: where the FAISS index lives (a cuda device moves it to that GPU when faiss has GPU support);
        the vectors stay on CPU until `to_device`. nprobe: overrides an ivf index's inverted lists probed.

        An append that commits while this reads (it replaces the manifest, then removes the files the new one no
        longer lists, such as the previous index) makes a file vanish under the reader: when loading fails and
        the manifest has changed meanwhile, the store is read again from its new manifest (OPEN_RETRIES times)."""
        root = Path(path).expanduser().absolute()
        manifest = read_manifest(root)
        for attempt in range(OPEN_RETRIES + 1):
            try:
                return cls._open(root, manifest, load_index, device, nprobe)
            except QascError:
                newer = read_manifest(root)
                if newer == manifest or attempt == OPEN_RETRIES:
                    raise
                manifest = newer
        raise AssertionError("unreachable")

    @classmethod
    def _open(cls, root: Path, manifest: dict, load_index: bool | str, device, nprobe: int | None) -> Store:
        check_sizes(root, manifest)
        dim, dtype = int(manifest["dim"]), manifest["dtype"]
        if dtype not in STORE_DTYPES:
            raise QascError(f"{root}: the manifest's embedding dtype {dtype!r} is not one of {', '.join(STORE_DTYPES)}")
        n = int(manifest["counts"]["sentences"])
        if sum(int(s["n_sentences"]) for s in manifest["shards"]) != n:
            raise QascError(f"{root}: its shards hold {sum(s['n_sentences'] for s in manifest['shards'])} sentences, "
                            f"the manifest says {n}")
        emb = np.empty((n, dim), np.dtype(dtype))  # the one copy: each shard's rows are written in place
        docs: list[Sentences] = []
        metadata: list[dict] = []
        sources: list[str] = []
        row = 0
        heads: list[Headings] = []
        for shard in manifest["shards"]:
            rows = int(shard["n_sentences"])
            d, m, s, _, h = load_shard(root, shard, manifest, out=emb[row : row + rows])
            heads.append(h)
            docs.extend(d)
            metadata.extend(m)
            sources.extend(s)
            row += rows
        pa.default_memory_pool().release_unused()  # the shards' Arrow buffers, else kept by the allocator
        if len(docs) != manifest["counts"]["documents"]:
            raise QascError(f"{root}: {len(docs)} documents / {row} sentences, the manifest says "
                            f"{manifest['counts']['documents']} / {n}")
        index = None
        kind = manifest["index"]["kind"]
        if load_index is True or (load_index == "auto" and kind != "flat"):
            index = faiss_index.load_index(root, manifest, nprobe=nprobe, mmap=True)
            index = faiss_index.to_device(index, kind, device)
        return cls(root, manifest, docs, metadata, sources, emb, index, merge_headings(heads, dim))

    @property
    def passages(self) -> Passages:
        if self._passages is None:
            self._passages = read_passages(self.path, self.manifest)
        return self._passages

    def row_term_counts(self) -> Iterator[TermCounts] | None:
        """The sentence rows' term counts per shard for `LexicalIndex.from_counts` (engine.store.lexical: saved at
        ingest, or counted from the texts of a shard written before them); None for a store with none saved
        (`LexicalIndex.build` over the texts then, as before)."""
        if not saved_terms.has_saved(self.manifest, saved_terms.ROWS):
            return None
        return saved_terms.row_counts(self.path, self.manifest, self.docs)

    def passage_term_counts(self) -> Iterator[TermCounts] | None:
        """The passages' term counts per shard, as `row_term_counts` (None: none saved)."""
        if not saved_terms.has_saved(self.manifest, saved_terms.PASSAGES):
            return None
        return saved_terms.passage_counts(self.path, self.manifest, self.docs, self.passages)

    @property
    def config(self) -> EngineConfig:
        return EngineConfig.from_dict(self.manifest["config"])

    @property
    def embeddings(self) -> np.ndarray | torch.Tensor:
        """(N, dim) float32 | float16: a numpy view of `vectors` on CPU (no copy); the tensor itself elsewhere."""
        return self.vectors.numpy() if self.vectors.device.type == "cpu" else self.vectors

    def embedding_rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows lo..hi-1 as a host (hi - lo, dim) float32 array (a copy), wherever the vectors live."""
        return self.vectors[lo:hi].to("cpu", torch.float32).numpy()

    def to_device(self, device) -> torch.Tensor:
        """Moves the vectors to `device` in the store's dtype; the host copy is dropped (unless someone else
        holds it). Returns `vectors`."""
        device = torch.device(device)
        if self.vectors.device != device:
            self.vectors = self.vectors.to(device)
        return self.vectors

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def check_embedder(self, described: dict) -> None:
        """described: Embedder.describe(); QascError when its model or dimension differs from the store's."""
        m = self.manifest
        if described.get("fingerprint") != m["fingerprint"] or int(described.get("dim", -1)) != int(m["dim"]):
            raise QascError(f"store {self.path} was built with model {m['model']!r} (fingerprint {m['fingerprint']}, "
                            f"dim {m['dim']}); the query model is {described.get('model')!r} (fingerprint "
                            f"{described.get('fingerprint')}, dim {described.get('dim')})")

    def search_tensor(self, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """query (Q, dim) float tensor, k -> scores (Q, k) float32 (-inf where missing), rows (Q, k) int64 (-1),
        on the vectors' device: exact (`exact_topk` over `vectors`) without an index, else FAISS; an ivf index
        of quantised codes gives params["rerank"] x k hits, re-scored exactly from `vectors` (`rerank`)."""
        faiss_index.check_queries(query, int(self.manifest["dim"]), k)
        if self.index is None:
            return faiss_index.exact_topk(self.vectors, query, int(k))
        params = self.manifest["index"].get("params", {})
        wide = int(k) * max(1, int(params.get("rerank", 1))) if self.manifest["index"]["kind"] == "ivf" else int(k)
        budget = int(getattr(self.index, "max_codes", 0) or 0)
        scan = self.ivf_scan()
        if scan == "vectors":  # the torch scan of the store's own vectors, the index's lists as rows
            lists = self.ivf_rows()
            scores, rows = ivf_vectors_topk(query.detach(), lists.centroids, self.vectors, lists.rows,
                                            int(self.index.nprobe), wide, dtype=self.scan_dtype(), max_codes=budget,
                                            int8_scale=self.column_scale() if self.vectors_int8() else None)
        elif scan == "codes":  # the batched torch scan of the index's own codes (kernels.ivf_scan)
            lists = self.sq8_lists()
            scores, rows = (t.to(self.vectors.device) for t in ivf_sq8_topk(
                query.detach().to("cpu", torch.float32), lists.centroids, lists.codes, lists.rows, lists.vmin,
                lists.vdiff, int(self.index.nprobe), wide, lists.by_residual,
                int8=self.ivf_int8 and lists.centroids.device.type == "cpu"
                and len(self.vectors) >= IVF_INT8_MIN_LIST_ROWS * len(lists.codes), max_codes=budget))
        else:
            host = query.detach().to("cpu", torch.float32).numpy()
            scores, rows = (torch.from_numpy(a).to(self.vectors.device)
                            for a in faiss_index.search(self.index, host, wide))
        if wide == k:
            return scores, rows
        return faiss_index.rerank(self.vectors, query, rows, int(k))

    def ivf_scan(self) -> str | None:
        """How `search_tensor` searches the ivf index: "vectors" (`kernels.ivf_vectors_topk` over the store's own
        vectors, the index's lists read as rows: the default), "codes" (`kernels.ivf_sq8_topk` over an 8-bit
        index's codes; `ivf_source` picks, see IVF_SOURCE), or None (FAISS's own search): the torch scans when
        `ivf_search` is "torch", or "auto" with lists of at least IVF_SCAN_MIN_LIST_ROWS rows on average."""
        if self.ivf_search == "faiss" or self.index is None or self.manifest["index"]["kind"] != "ivf":
            return None
        if self.ivf_search == "auto" and len(self.vectors) < IVF_SCAN_MIN_LIST_ROWS * max(1, int(
                getattr(self.index, "nlist", 1))):
            return None
        source = self.ivf_source
        if source == "vectors":
            return "vectors" if self.ivf_rows() is not None else None
        if source != "codes":
            raise QascError(f"ivf_source must be one of {', '.join(IVF_SOURCES)}, got {source!r}")
        return "codes" if self.sq8_lists() is not None else None

    def ivf_rows(self) -> faiss_index.IvfRows | None:
        """The ivf index's centroids and list rows on the vectors' device (built on first use, and again when the
        index or the vectors' device changed), or None for an index that is not a CPU IVF."""
        key = (self.index, self.vectors.device)
        if self._rows_of != key:
            lists = faiss_index.ivf_rows(self.index)
            if lists is not None:
                dev = self.vectors.device
                lists = faiss_index.IvfRows(lists.centroids.to(dev), [r.to(dev) for r in lists.rows])
            self._rows, self._rows_of = lists, key
        return self._rows

    def vectors_int8(self) -> bool:
        """The vectors scan's products in int8 (`ivf_vectors_topk`'s int8_scale): on CPU where `ivf_int8` (int8
        dot-product instructions), as the codes scan; IVF_SCAN_DTYPE other than "auto" turns it off."""
        return IVF_SCAN_DTYPE == "auto" and self.vectors.device.type == "cpu" and bool(self.ivf_int8)

    def column_scale(self) -> torch.Tensor:
        """(dim,) float32 each dimension's largest |x| over the vectors, computed once a block of rows at a time
        (the 8-bit steps of the int8 vectors scan)."""
        if self._column_scale is None or self._column_scale.device != self.vectors.device:
            scale = torch.zeros(self.vectors.shape[1], dtype=torch.float32, device=self.vectors.device)
            for lo in range(0, len(self.vectors), COLUMN_SCALE_BLOCK_ROWS):
                block = self.vectors[lo : lo + COLUMN_SCALE_BLOCK_ROWS]
                scale = torch.maximum(scale, block.abs().amax(0).to(torch.float32))
            self._column_scale = scale
        return self._column_scale

    def scan_dtype(self) -> torch.dtype:
        """The vectors scan's product precision where it is not int8 (`vectors_int8`): float16 on CUDA, else
        float32 (`IVF_SCAN_DTYPE` forces one); the hits of an ivf store are re-ranked exactly from the vectors."""
        if IVF_SCAN_DTYPE != "auto":
            return getattr(torch, IVF_SCAN_DTYPE)
        return torch.float16 if self.vectors.device.type == "cuda" else torch.float32

    def sq8_lists(self) -> faiss_index.Sq8Lists | None:
        """Views of an 8-bit ivf index's lists (built on first use; they read the index's codes, paged in from
        its mapped file), or None for any other index."""
        if self.index is None:
            return None
        if self._sq8_of is not self.index:  # first use, or the index was replaced (moved to a device)
            self._sq8, self._sq8_of = faiss_index.sq8_lists(self.index), self.index
        return self._sq8

    def search(self, query_emb, k: int) -> tuple[np.ndarray, np.ndarray]:
        """query_emb (Q, dim) float (numpy or tensor), k -> scores (Q, k) float32 (-inf where missing), rows (Q, k)
        int64 (-1), as numpy (see `search_tensor`)."""
        q = query_emb if isinstance(query_emb, torch.Tensor) else torch.from_numpy(np.asarray(query_emb))
        scores, rows = self.search_tensor(q, k)
        return scores.cpu().numpy(), rows.cpu().numpy()
