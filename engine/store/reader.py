"""`Store`: a committed store read into memory (documents, sentence rows, embeddings, heading paths, index)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import EngineConfig
from engine.errors import QascError
from engine.store import index as faiss_index
from engine.store.files import read_table
from engine.store.manifest import read_manifest
from engine.store.schema import DOCUMENTS_SCHEMA, embeddings_of, headings_schema, sentences_schema
from engine.types import Headings, Sentences


def load_shard(root: Path, shard: dict, manifest: dict) -> tuple[list[Sentences], list[dict], list[str],
                                                                   np.ndarray, Headings]:
    """One shard -> (Sentences per document, metadata, sources, embeddings (N, dim) float32, its headings)."""
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
    return (docs, metadata, dt.column("source").to_pylist(), embeddings_of(st, dim, str(where)),
            _load_headings(root, shard, st, dim, dtype) if has_headings else
            Headings([], np.full(st.num_rows, -1, np.int64), np.zeros((0, dim), np.float32)))


def _load_headings(root: Path, shard: dict, st: pa.Table, dim: int, dtype: str) -> Headings:
    ht = read_table(root, shard["headings"])
    where = root / shard["headings"]
    if ht.schema.names != headings_schema(dim, dtype).names:
        raise QascError(f"{where}: unexpected columns {ht.schema.names}")
    rows = st.column("heading").to_numpy().astype(np.int64)
    if len(rows) and (rows.min() < -1 or rows.max() >= ht.num_rows):
        raise QascError(f"{root / shard['sentences']}: heading ids outside [-1, {ht.num_rows}) of {where}")
    return Headings(ht.column("path").to_pylist(), rows, embeddings_of(ht, dim, str(where)))


def merge_headings(heads: list[Headings], dim: int) -> Headings:
    """Per-shard headings -> the store's: one id per distinct path text (the same text embeds the same),
    rows (N,) int64 global ids."""
    ids: dict[str, int] = {}
    vecs: list[np.ndarray] = []
    rows = []
    for h in heads:
        remap = np.empty(len(h.paths) + 1, np.int64)
        remap[-1] = -1
        for i, p in enumerate(h.paths):
            if p not in ids:
                ids[p] = len(ids)
                vecs.append(h.emb[i])
            remap[i] = ids[p]
        rows.append(remap[h.rows])
    emb = np.stack(vecs).astype(np.float32) if vecs else np.zeros((0, dim), np.float32)
    return Headings(list(ids), np.concatenate(rows) if rows else np.zeros(0, np.int64), emb)


def check_sizes(root: Path, manifest: dict) -> None:
    for rel, digest in manifest["checksums"].items():
        path = root / rel
        if not path.exists():
            raise QascError(f"{path}: missing store file")
        if path.stat().st_size != digest["bytes"]:
            raise QascError(f"{path}: {path.stat().st_size} bytes, the manifest says {digest['bytes']} "
                            f"(truncated or replaced)")


class Store:
    """A committed store in memory: documents, sentence rows, embeddings (N, dim) float32, heading paths and the
    index. heading_paths (H) distinct texts over the whole store, heading_emb (H, dim) float32, row_heading (N,)
    int64 each row's path (-1: none; every row of a format-1 store)."""

    def __init__(self, path: Path, manifest: dict, docs: list[Sentences], metadata: list[dict],
                 sources: list[str], embeddings: np.ndarray, index, headings: Headings | None = None) -> None:
        self.path = path
        self.manifest = manifest
        self.docs = docs
        self.doc_ids = [d.doc_id for d in docs]
        self.metadata = metadata
        self.sources = sources
        self.embeddings = embeddings
        self.doc_offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
        self.row_doc = np.repeat(np.arange(len(docs), dtype=np.int64), np.diff(self.doc_offsets))  # (N,)
        self.index = index
        if headings is None:
            headings = Headings([], np.full(len(embeddings), -1, np.int64),
                                     np.zeros((0, embeddings.shape[1]), np.float32))
        self.heading_paths, self.row_heading, self.heading_emb = headings

    @classmethod
    def open(cls, path: str | Path, *, load_index: bool = True, device="cpu") -> Store:
        """Reads a committed store; QascError if missing, incomplete (no complete manifest) or corrupt.

        device: where the FAISS index lives (a cuda device moves it to that GPU when faiss has GPU support)."""
        root = Path(path).expanduser().absolute()
        manifest = read_manifest(root)
        check_sizes(root, manifest)
        docs: list[Sentences] = []
        metadata: list[dict] = []
        sources: list[str] = []
        embs: list[np.ndarray] = []
        heads: list[Headings] = []
        for shard in manifest["shards"]:
            d, m, s, e, h = load_shard(root, shard, manifest)
            docs.extend(d)
            metadata.extend(m)
            sources.extend(s)
            embs.append(e)
            heads.append(h)
        dim = int(manifest["dim"])
        emb = np.concatenate(embs) if embs else np.zeros((0, dim), np.float32)
        if len(emb) != manifest["counts"]["sentences"] or len(docs) != manifest["counts"]["documents"]:
            raise QascError(f"{root}: {len(docs)} documents / {len(emb)} sentences, the manifest says "
                            f"{manifest['counts']['documents']} / {manifest['counts']['sentences']}")
        index = None
        if load_index:
            index = faiss_index.to_device(faiss_index.load_index(root, manifest), manifest["index"]["kind"], device)
        return cls(root, manifest, docs, metadata, sources, emb, index, merge_headings(heads, dim))

    @property
    def config(self) -> EngineConfig:
        return EngineConfig.from_dict(self.manifest["config"])

    def __len__(self) -> int:
        return len(self.embeddings)

    def check_embedder(self, described: dict) -> None:
        """described: Embedder.describe(); QascError when its model or dimension differs from the store's."""
        m = self.manifest
        if described.get("fingerprint") != m["fingerprint"] or int(described.get("dim", -1)) != int(m["dim"]):
            raise QascError(f"store {self.path} was built with model {m['model']!r} (fingerprint {m['fingerprint']}, "
                            f"dim {m['dim']}); the query model is {described.get('model')!r} (fingerprint "
                            f"{described.get('fingerprint')}, dim {described.get('dim')})")

    def search(self, query_emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """query_emb (Q, dim) float32, k -> scores (Q, k) float32 (-inf where missing), rows (Q, k) int64 (-1).

        Through the FAISS index; exact numpy inner products when the store was opened with load_index=False.
        """
        if self.index is not None:
            return faiss_index.search(self.index, query_emb, k)
        return faiss_index.exact_search(self.embeddings, query_emb, k)
