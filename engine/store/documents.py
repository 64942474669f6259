"""A mapped store's documents (engine.store.mapped): opened without their texts, each text read on first use.

`Store.open` of a store with mapped arrays reads each shard's documents table without its `text` column
(`read_documents`: ids, sentence counts, metadata, sources); the rows' spans and block ids are the mapped arrays.
`MappedDocs` is the store's `docs`: a sequence of `Sentences` made on access, whose text is read with the rest of its
shard's texts the first time one of them is needed (`DocumentTexts`: the documents' `text` column, kept once read).
So a query reads the texts of the shards its chunks come from, not the corpus (at 1M sentences the texts are 189 MB
of Parquet, 0.6 s of a 1.3 s open, read at every open before).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from qasc.engine.errors import QascError, first_line
from qasc.engine.store.files import read_table
from qasc.engine.types import Sentences

ROW_COLUMNS = ("char_start", "char_end", "paragraph", "section", "n_tokens")  # a document's Sentences arrays
HEADER_COLUMNS = ["doc_id", "n_sentences", "metadata", "source"]  # what the open reads of a documents table


def _damaged(where: Path, exc: Exception) -> QascError:
    return QascError(f"{where}: damaged shard ({first_line(exc)}); run qasc verify")


def read_documents(root: Path, shard: dict) -> tuple[list[str], np.ndarray, list[dict], list[str]]:
    """One shard's documents table without its texts -> (doc ids, (D,) int64 sentence counts, metadata, sources);
    QascError naming the file when it is damaged or disagrees with the manifest."""
    where = root / shard["documents"]
    try:
        dt = read_table(root, shard["documents"], HEADER_COLUMNS)
        counts = np.asarray(dt.column("n_sentences").to_pylist(), np.int64)
        if dt.num_rows != shard["n_documents"] or int(counts.sum()) != int(shard["n_sentences"]):
            raise QascError(f"{where}: {dt.num_rows} documents of {int(counts.sum())} sentences, the manifest says "
                            f"{shard['n_documents']} / {shard['n_sentences']}")
        metadata = [json.loads(raw) for raw in dt.column("metadata").to_pylist()]
        return dt.column("doc_id").to_pylist(), counts, metadata, dt.column("source").to_pylist()
    except QascError:
        raise
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, pa.ArrowException) as exc:
        raise _damaged(where, exc) from None


class DocumentTexts(Sequence[str]):
    """The texts of a store's D documents (Sequence[str]), each shard's read on first use and kept: shards (S)
    their documents tables' paths, first_doc (S+1,) int64 each shard's first document."""

    def __init__(self, root: Path, shards: list[str], first_doc: np.ndarray) -> None:
        self.root = root
        self.shards = shards
        self.first_doc = [int(x) for x in first_doc]
        self._loaded: dict[int, list[str]] = {}

    def __len__(self) -> int:
        return self.first_doc[-1]

    def __getitem__(self, d: int) -> str:  # type: ignore[override]
        if not -len(self) <= d < len(self):
            raise IndexError(f"document {d} of {len(self)}")
        d %= len(self)
        s = bisect.bisect_right(self.first_doc, d) - 1
        return self.shard_texts(s)[d - self.first_doc[s]]

    def __iter__(self) -> Iterator[str]:
        for s in range(len(self.shards)):
            yield from self.shard_texts(s)

    def shard_texts(self, s: int) -> list[str]:
        """Shard s's texts, read the first time (QascError naming the file when damaged or of the wrong count)."""
        texts = self._loaded.get(s)
        if texts is None:
            where = self.root / self.shards[s]
            try:
                texts = read_table(self.root, self.shards[s], ["text"]).column("text").to_pylist()
            except (UnicodeDecodeError, ValueError, TypeError, KeyError, pa.ArrowException) as exc:
                raise _damaged(where, exc) from None
            if len(texts) != self.first_doc[s + 1] - self.first_doc[s]:
                raise QascError(f"{where}: {len(texts)} texts, {self.first_doc[s + 1] - self.first_doc[s]} "
                                f"documents at open; run qasc verify")
            self._loaded[s] = texts
        return texts


class MappedDocs(Sequence[Sentences]):
    """A mapped store's documents as `Sentences`, made on access (`docs[d]`): doc_ids (D), offsets (D+1,) int64
    each document's first row, rows {name: (N,) array} the mapped row arrays (ROW_COLUMNS), texts the documents'
    texts (`DocumentTexts`, read by shard on first use)."""

    def __init__(self, doc_ids: list[str], offsets: np.ndarray, rows: dict[str, np.ndarray],
                 texts: DocumentTexts) -> None:
        self.doc_ids = doc_ids
        self.offsets = offsets
        self.rows = {name: rows[name].view(np.ndarray) for name in ROW_COLUMNS}  # plain views of the mapped pages
        self.texts = texts

    def __len__(self) -> int:
        return len(self.doc_ids)

    def __getitem__(self, d):  # type: ignore[override]
        if isinstance(d, slice):  # a view: its documents are made (and their texts read) only where used
            return DocsView(self, range(*d.indices(len(self))))
        text = self.texts[d]
        d %= len(self)
        a, b = int(self.offsets[d]), int(self.offsets[d + 1])
        return Sentences(self.doc_ids[d], text, *(self.rows[name][a:b] for name in ROW_COLUMNS))

    def __iter__(self) -> Iterator[Sentences]:
        return (self[d] for d in range(len(self)))

    def lengths(self) -> np.ndarray:
        """(D,) int64 each document's sentences, without making its Sentences."""
        return np.diff(self.offsets)


class DocsView(Sequence[Sentences]):
    """Some of a MappedDocs' documents (a slice), made on access as its own."""

    def __init__(self, docs: MappedDocs, which: range) -> None:
        self.docs = docs
        self.which = which

    def __len__(self) -> int:
        return len(self.which)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return DocsView(self.docs, self.which[i])
        return self.docs[self.which[i]]


def open_mapped_docs(root: Path, shards: list[dict], rows: dict[str, np.ndarray]
                     ) -> tuple[MappedDocs, list[dict], list[str]]:
    """A mapped store's shards -> (its documents, metadata, sources); the texts are not read (module docstring)."""
    doc_ids: list[str] = []
    counts: list[np.ndarray] = []
    metadata: list[dict] = []
    sources: list[str] = []
    first_doc = [0]
    for shard in shards:
        ids, n, meta, src = read_documents(root, shard)
        doc_ids += ids
        counts.append(n)
        metadata += meta
        sources += src
        first_doc.append(first_doc[-1] + len(ids))
    lengths = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    texts = DocumentTexts(root, [shard["documents"] for shard in shards], np.asarray(first_doc, np.int64))
    return MappedDocs(doc_ids, offsets, rows, texts), metadata, sources
