"""Frozen stage outputs: the sentences of one document, heading paths, and the chunks returned for a query."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True)
class Sentences:
    """The sentences of one document: exact character offsets and block ids, arrays of length N."""

    doc_id: str
    text: str
    char_start: np.ndarray  # (N,) int64
    char_end: np.ndarray  # (N,) int64, exclusive
    paragraph: np.ndarray  # (N,) int32, increasing; new at blank lines and headings
    section: np.ndarray  # (N,) int32, increasing; new at headings
    n_tokens: np.ndarray = field(default=None)  # (N,) int32 model tokens, filled by the embedder

    def __post_init__(self) -> None:
        n = len(self.char_start)
        for name in ("char_end", "paragraph", "section"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Sentences.{name} has {len(getattr(self, name))} entries, expected {n}")
        if self.n_tokens is not None and len(self.n_tokens) != n:
            raise ValueError(f"Sentences.n_tokens has {len(self.n_tokens)} entries, expected {n}")
        if n and (self.char_start.min() < 0 or self.char_end.max() > len(self.text)):
            raise ValueError(f"sentence offsets of {self.doc_id!r} fall outside the document")
        if n and bool(np.any(self.char_end <= self.char_start)):
            raise ValueError(f"empty or inverted sentence span in {self.doc_id!r}")

    def __len__(self) -> int:
        return len(self.char_start)

    def texts(self) -> list[str]:
        return [self.text[s:e] for s, e in zip(self.char_start.tolist(), self.char_end.tolist(), strict=True)]

    def with_tokens(self, n_tokens: np.ndarray) -> Sentences:
        return Sentences(
            self.doc_id, self.text, self.char_start, self.char_end, self.paragraph, self.section,
            np.asarray(n_tokens, dtype=np.int32),
        )


class Headings(NamedTuple):
    """Heading paths of a set of sentence rows (a shard, a store): paths (H) distinct "H1 > H2" texts, rows (N,)
    int each row's path (-1: no heading in force), emb (H, dim) float32 the paths' embeddings."""

    paths: list[str]
    rows: np.ndarray
    emb: np.ndarray


@dataclass(frozen=True)
class Chunk:
    """One returned chunk: text == document[char_start:char_end]."""

    doc_id: str
    char_start: int
    char_end: int
    text: str
    score: float
    seed_ids: tuple[int, ...]  # sentence indices (within the document) of the seeds inside
    n_tokens: int
    sentence_start: int  # first sentence index (inclusive)
    sentence_end: int  # last sentence index (inclusive)
    rerank_score: float | None = None  # the rerank stage's cross-encoder score (None: no rerank stage, or a fill row)

    def __post_init__(self) -> None:
        if not 0 <= self.char_start < self.char_end:
            raise ValueError(f"bad chunk span [{self.char_start}, {self.char_end}) in {self.doc_id!r}")
        if len(self.text) != self.char_end - self.char_start:
            raise ValueError("chunk text length disagrees with its offsets")


def check_query_list(queries) -> list[str]:
    """queries: a list (or any iterable, read once) of strings -> that list; TypeError for one bare string (it
    would be answered character by character), None, a non-iterable or a non-string element."""
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, got one str; pass [question]")
    try:
        out = list(queries)
    except TypeError:
        raise TypeError(f"queries must be a list of strings, got {type(queries).__name__}") from None
    for i, x in enumerate(out):
        if not isinstance(x, str):
            raise TypeError(f"queries must be strings; query {i} is {type(x).__name__} {x!r}")
    return out
