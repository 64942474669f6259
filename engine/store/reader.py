"""`Store`: a committed store read into memory (documents, sentence rows, embeddings, heading paths, index).

The embeddings are held once, in the store's dtype (float32 | float16): each shard's Arrow column is copied
into one preallocated (N, dim) array (no concatenated temporary), wrapped without a copy as the tensor
`Store.vectors`; `to_device` moves it (an engine on CUDA keeps only the device copy). Flat stores do not load
their FAISS index by default: exact search runs blocked over `vectors` (`index.exact_topk`), so no second copy.
Other stores are searched by FAISS (the index file mapped, not read: faiss IO_FLAG_MMAP_IFC), an ivf index's
8-bit hits re-ranked exactly from the vectors. Which searcher, and an ivf index's settings, are values
(engine.store.search): `Store.open(..., ivf=IvfSettings(nprobe, max_codes))`, `Store.searcher`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from qasc.engine.config import EngineConfig
from qasc.engine.errors import QascError, first_line
from qasc.engine.heap import trim_heap
from qasc.engine.lexical import TermCounts
from qasc.engine.passages import Passages
from qasc.engine.store import index as faiss_index
from qasc.engine.store import lexical as saved_terms
from qasc.engine.store.documents import MappedDocs, open_mapped_docs
from qasc.engine.store.files import read_row_count, read_table
from qasc.engine.store.manifest import check_sizes, read_manifest
from qasc.engine.store.mapped import MappedArrays, open_mapped
from qasc.engine.store.schema import (
    DOCUMENTS_SCHEMA,
    STORE_DTYPES,
    embeddings_of,
    headings_schema,
    passages_schema,
    sentences_schema,
)
from qasc.engine.store.search import IvfSettings, Searcher, store_searcher
from qasc.engine.types import Headings, Sentences

OPEN_RETRIES = 3  # Store.open: reads again from a manifest that changed while it read (an append committed)


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
                 headings: Headings | None = None, passages: Passages | None = None,
                 ivf: IvfSettings | None = None) -> None:
        self.path = path
        self.manifest = manifest
        self.docs = docs  # a list, or a mapped store's MappedDocs (engine.store.documents: texts read on first use)
        lazy = isinstance(docs, MappedDocs)
        self.doc_ids = list(docs.doc_ids) if lazy else [d.doc_id for d in docs]
        self.doc_texts: Sequence[str] = docs.texts if lazy else [d.text for d in docs]  # (D) the documents' texts
        self.metadata = metadata
        self.sources = sources
        self.vectors = embeddings if isinstance(embeddings, torch.Tensor) else torch.from_numpy(embeddings)
        lengths = docs.lengths() if lazy else [len(d) for d in docs]
        self.doc_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.row_doc = np.repeat(np.arange(len(docs), dtype=np.int64), np.diff(self.doc_offsets))  # (N,)
        self.index = index
        self.ivf = ivf if ivf is not None else IvfSettings(getattr(index, "nprobe", None))
        if headings is None:
            headings = Headings([], np.full(len(embeddings), -1, np.int32),
                                     np.zeros((0, embeddings.shape[1]), np.float32))
        self.heading_paths, self.row_heading, self.heading_emb = headings
        self._passages = passages
        self.mapped: MappedArrays | None = None  # the store's mapped arrays (Store.open sets them where saved)

    @classmethod
    def open(cls, path: str | Path, *, load_index: bool | str = "auto", device="cpu", nprobe: int | None = None,
             ivf: IvfSettings | None = None) -> Store:
        """Reads a committed store; QascError if missing, incomplete (no complete manifest) or corrupt.

        load_index: "auto" loads the FAISS index of ivf / hnsw stores only (flat stores search exactly over
        their own vectors, no second copy), True always, False never (exact search).
        device: where the FAISS index lives (a cuda device moves it to that GPU when faiss has GPU support);
        the vectors stay on CPU until `to_device`. ivf: how an ivf index is searched (engine.store.search:
        nprobe, max_codes; default the store's); nprobe: the same as ivf=IvfSettings(nprobe) (either, not both).

        An append that commits while this reads (it replaces the manifest, then removes the files the new one no
        longer lists, such as the previous index) makes a file vanish under the reader: when loading fails and
        the manifest has changed meanwhile, the store is read again from its new manifest (OPEN_RETRIES times)."""
        if nprobe is not None and ivf is not None:
            raise QascError("Store.open: give nprobe or ivf, not both")
        ivf = ivf if ivf is not None else IvfSettings(nprobe)
        root = Path(path).expanduser().absolute()
        manifest = read_manifest(root)
        for attempt in range(OPEN_RETRIES + 1):
            try:
                return cls._open(root, manifest, load_index, device, ivf)
            except QascError:
                newer = read_manifest(root)
                if newer == manifest or attempt == OPEN_RETRIES:
                    raise
                manifest = newer
        raise AssertionError("unreachable")

    @classmethod
    def _open(cls, root: Path, manifest: dict, load_index: bool | str, device, ivf: IvfSettings) -> Store:
        check_sizes(root, manifest)
        dim, dtype = int(manifest["dim"]), manifest["dtype"]
        if dtype not in STORE_DTYPES:
            raise QascError(f"{root}: the manifest's embedding dtype {dtype!r} is not one of {', '.join(STORE_DTYPES)}")
        n = int(manifest["counts"]["sentences"])
        if sum(int(s["n_sentences"]) for s in manifest["shards"]) != n:
            raise QascError(f"{root}: its shards hold {sum(s['n_sentences'] for s in manifest['shards'])} sentences, "
                            f"the manifest says {n}")
        mapped = open_mapped(root, manifest)  # saved at ingest: the vectors and row arrays are mapped, not read
        emb = mapped.vectors if mapped else np.empty((n, dim), np.dtype(dtype))  # the one copy
        docs: list[Sentences] = []
        metadata: list[dict] = []
        sources: list[str] = []
        row = 0
        heads: list[Headings] = []
        if mapped:  # the documents' ids, counts, metadata and sources; rows mapped, texts read on first use
            docs, metadata, sources = open_mapped_docs(root, manifest["shards"], mapped.rows)
            row = int(docs.offsets[-1])
        else:  # each shard's rows written in place into the one copy
            for shard in manifest["shards"]:
                rows = int(shard["n_sentences"])
                d, m, s, _, h = load_shard(root, shard, manifest, out=emb[row : row + rows])
                heads.append(h)
                docs.extend(d)
                metadata.extend(m)
                sources.extend(s)
                row += rows
        pa.default_memory_pool().release_unused()  # the shards' Arrow buffers, else kept by the allocator
        trim_heap()  # and the pages malloc keeps of the shards' other temporaries (engine.heap)
        if len(docs) != manifest["counts"]["documents"]:
            raise QascError(f"{root}: {len(docs)} documents / {row} sentences, the manifest says "
                            f"{manifest['counts']['documents']} / {n}")
        index = None
        kind = manifest["index"]["kind"]
        if load_index is True or (load_index == "auto" and kind != "flat"):
            index = faiss_index.load_index(root, manifest, nprobe=ivf.nprobe, mmap=True)
            if kind == "ivf":  # the nprobe resolved against the lists (the store's default when None)
                ivf = IvfSettings(int(index.nprobe), ivf.max_codes)
            index = faiss_index.to_device(index, kind, device)
        store = cls(root, manifest, docs, metadata, sources, emb, index,
                    mapped.headings if mapped else merge_headings(heads, dim), ivf=ivf)
        store.mapped = mapped
        return store

    def row_array(self, name: str) -> np.ndarray:
        """(N,) one per-row array of Sentences (char_start, char_end, paragraph, section, n_tokens) over the whole
        store in row order: the mapped array where saved, else the documents' concatenated."""
        if isinstance(self.docs, MappedDocs):
            return self.docs.rows[name]
        return np.concatenate([getattr(d, name) for d in self.docs]) if self.docs else np.zeros(0, np.int64)

    def saved_tables(self, device) -> dict:
        """The query engine's per-store tables saved at ingest, for an engine on `device` (engine.store.mapped:
        empty for a store without them, another device, or tables of other code): engine.tables.StoreTables
        starts from these."""
        mapped = getattr(self, "mapped", None)
        return mapped.tables(device) if mapped is not None else {}

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

    def searcher(self, ivf: IvfSettings | None = None) -> Searcher:
        """The store's searcher (engine.store.search), chosen by its index kind: exact over `vectors` without a
        loaded index, else FAISS's search of it (an ivf index with `ivf`, default the settings it was opened
        with; hits of quantised codes re-ranked params["rerank"] x k from `vectors`)."""
        return store_searcher(self.manifest["index"]["kind"], self.index, self.vectors,
                              self.manifest["index"].get("params", {}), self.ivf if ivf is None else ivf)

    def search_tensor(self, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """query (Q, dim) float tensor, k -> scores (Q, k) float32 (-inf where missing), rows (Q, k) int64 (-1),
        on the vectors' device: `self.searcher().search`."""
        return self.searcher().search(query, k)

    def search(self, query_emb, k: int) -> tuple[np.ndarray, np.ndarray]:
        """query_emb (Q, dim) float (numpy or tensor), k -> scores (Q, k) float32 (-inf where missing), rows (Q, k)
        int64 (-1), as numpy (see `search_tensor`)."""
        q = query_emb if isinstance(query_emb, torch.Tensor) else torch.from_numpy(np.asarray(query_emb))
        scores, rows = self.search_tensor(q, k)
        return scores.cpu().numpy(), rows.cpu().numpy()
