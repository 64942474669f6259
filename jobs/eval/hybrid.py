"""The simple retrievers practitioners build: dense, BM25 and their reciprocal rank fusion over plain units.

Method names are `<signal>[-ctx]-<units>` (`qasc eval --methods`):

    signal   dense   MiniLM cosine, exact inner product (the harness's search)
             bm25    Okapi BM25 through `bm25s` (k1 1.5, b 0.75, Lucene idf; lower-cased words of 2+ characters,
                     bm25s's English stop words, no stemming); units without a matching term are not returned
             rrf     reciprocal rank fusion of the two: score = sum over both lists of 1 / (60 + rank), rank from 1,
                     each list cut at its top 100 (Cormack et al.'s k = 60); ties keep the dense order
    -ctx     "contextual chunk headers": each unit's text is prefixed by its heading path (the document's title and
             section, the markdown path in force at its first character: engine.splitter.heading_paths, the rule
             of jobs/eval/context.py and of the store) before it is embedded and indexed; the spans returned are
             the units themselves (the header is not returned, nor counted in tokens)
    units    sentences (the store's rows), fixed-N (MiniLM word-pieces), recursive-Nc / recursive-Nt (LangChain's
             recursive splitter, characters / cl100k tokens): the harness's own chunkers, so the plain variants
             share their spans and cached embeddings (`dense-<units>` ranks exactly like the `<units>` baseline)

One index per data set over every corpus (like the dense search); each method's k comes from the harness's
cross-validation like every other baseline.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from qasc.jobs.eval import baselines as B
from qasc.jobs.eval.retrieval import ChunkSet, Hit, ranked_hits, search

SIGNALS = ("dense", "bm25", "rrf")
RRF_K = 60  # reciprocal rank fusion constant (Cormack, Clarke and Buettcher 2009; LangChain's and LlamaIndex's)
FUSE_DEPTH = 100  # each list's depth before fusion
NAME = re.compile(r"^(dense|bm25|rrf)(-ctx)?-(sentences|fixed-[1-9]\d*|recursive-[1-9]\d*[ct])$")
PATTERN = "{dense,bm25,rrf}[-ctx]-{sentences,fixed-N,recursive-Nc,recursive-Nt}"


def parse(name: str) -> tuple[str, bool, str] | None:
    """`rrf-ctx-recursive-400c` -> ("rrf", True, "recursive-400c"); None for another name."""
    m = NAME.match(name)
    return None if m is None else (m.group(1), bool(m.group(2)), m.group(3))


def base_chunker(units: str, tokenizer) -> B.Chunker:
    """`sentences` / `fixed-N` / `recursive-Nc` / `recursive-Nt` -> the harness's chunker of that name."""
    if units == "sentences":
        return B.SentenceChunker(tokenizer)
    size = int(re.sub(r"\D", "", units))
    if units.startswith("fixed-"):
        return B.FixedTokenChunker(size, tokenizer)
    return B.RecursiveCharChunker(size) if units.endswith("c") else B.RecursiveTokenChunker(size)


def heading_prefixed(text: str, spans: Sequence[B.Span]) -> list[str]:
    """Each span's text prefixed by the heading path in force at its start ("Title > Section\\n<text>")."""
    from qasc.engine.splitter import heading_paths

    paths, at = heading_paths(text, np.asarray([s for s, _ in spans], dtype=np.int64))
    return [(f"{paths[p]}\n" if p >= 0 else "") + text[s:e] for (s, e), p in zip(spans, at.tolist(), strict=True)]


# ------------------------------------------------------------------------------------------------ signals

def bm25_tokens(texts: Sequence[str]) -> list[list[str]]:
    """Lower-cased words of 2+ characters, bm25s's English stop words removed, no stemming."""
    import bm25s

    return bm25s.tokenize(list(texts), lower=True, stopwords="en", return_ids=False, show_progress=False)


def bm25_top(unit_texts: Sequence[str], questions: Sequence[str], depth: int) -> tuple[np.ndarray, np.ndarray]:
    """-> ids (Q, depth) int64 (-1: none; units without a matching term are left out), scores (Q, depth) float32,
    best first, through one bm25s index over `unit_texts`."""
    from qasc.jobs.eval.peer_support import require

    bm25s = require("bm25s", "bm25s")
    ids = np.full((len(questions), depth), -1, dtype=np.int64)
    scores = np.zeros((len(questions), depth), dtype=np.float32)
    depth = min(depth, len(unit_texts))
    if not depth or not len(questions):
        return ids, scores
    index = bm25s.BM25(k1=1.5, b=0.75)
    index.index(bm25s.tokenize(list(unit_texts), lower=True, stopwords="en", show_progress=False),
                show_progress=False)
    got, val = index.retrieve(bm25_tokens(questions), k=depth, show_progress=False, n_threads=1)
    hit = val > 0
    ids[:, :depth] = np.where(hit, got, -1)
    scores[:, :depth] = np.where(hit, val, 0.0)
    return ids, scores


def rrf(lists: Sequence[np.ndarray], k: int = RRF_K) -> list[list[tuple[int, float]]]:
    """lists: each (Q, D) int64 ranked ids (-1: none) -> per query [(id, fused score)], best first;
    score = sum of 1 / (k + rank), rank from 1; ties keep first appearance (the first list's order first)."""
    out = []
    for q in range(lists[0].shape[0]):
        fused: dict[int, float] = {}
        for ranked in lists:
            for rank, i in enumerate(ranked[q].tolist(), start=1):
                if i >= 0:
                    fused[i] = fused.get(i, 0.0) + 1.0 / (k + rank)
        out.append(sorted(fused.items(), key=lambda t: -t[1]))  # stable: ties stay in insertion order
    return out


def as_hits(chunks: ChunkSet, ranked: Sequence[Sequence[tuple[int, float]]], depth: int) -> list[list[Hit]]:
    """Per query [(row, score)] -> its first `depth` Hits."""
    starts, ends, toks = chunks.starts.tolist(), chunks.ends.tolist(), chunks.n_tokens.tolist()
    return [[(chunks.doc_ids[i], starts[i], ends[i], toks[i], float(s), 0) for i, s in row[:depth]] for row in ranked]


# ------------------------------------------------------------------------------------------------ the method

class SimpleRetriever(B.Chunker):
    """One `<signal>[-ctx]-<units>` method: the units' spans, (with -ctx) header-prefixed index texts, and its
    own ranking (`rank`, which the harness calls instead of its dense search)."""

    family = "peer"

    def __init__(self, name: str, tokenizer) -> None:
        parsed = parse(name)
        if parsed is None:
            raise ValueError(f"not a simple retriever: {name!r} (expected {PATTERN})")
        self.signal, self.ctx, units = parsed
        self.name = name
        self.base = base_chunker(units, tokenizer)
        self.expensive = self.base.expensive
        how = {"dense": "MiniLM cosine", "bm25": "BM25 (bm25s, no stemming)",
               "rrf": f"RRF (k={RRF_K}) of MiniLM cosine and BM25 (bm25s), each over its top {FUSE_DEPTH}"}
        self.note = f"{how[self.signal]} over {units} units" + (
            "; each unit prefixed by its heading path before it is embedded and indexed" if self.ctx else "")

    def key(self) -> str:
        """The base chunker's key (plain variants share its spans and embeddings); -ctx embeds other texts."""
        return f"ctx-{self.base.key()}" if self.ctx else self.base.key()

    def spans(self, corpus_id: str, text: str) -> list[B.Span]:
        return self.base.spans(corpus_id, text)

    def index_texts(self, corpus_id: str, text: str, spans: Sequence[B.Span]) -> list[str] | None:
        return heading_prefixed(text, spans) if self.ctx else None

    def unit_texts(self, chunks: ChunkSet, texts: dict[str, str]) -> list[str]:
        """The texts BM25 indexes (N): each unit's own text, or (-ctx) the header-prefixed one."""
        out = [""] * len(chunks)
        doc = np.asarray(chunks.doc_ids, dtype=object)
        for cid in dict.fromkeys(chunks.doc_ids):
            sel = np.flatnonzero(doc == cid).tolist()
            spans = [(int(chunks.starts[i]), int(chunks.ends[i])) for i in sel]
            got = heading_prefixed(texts[cid], spans) if self.ctx else [texts[cid][s:e] for s, e in spans]
            for i, t in zip(sel, got, strict=True):
                out[i] = t
        return out

    def rank(self, chunks: ChunkSet, query_emb: np.ndarray, questions: Sequence, texts: dict[str, str],
             depth: int) -> list[list[Hit]]:
        """query_emb (Q, dim), questions (Q) with .text -> per question its `depth` best units, best first."""
        if self.signal == "dense":
            return ranked_hits(chunks, query_emb, depth)
        words = [q.text for q in questions]
        if self.signal == "bm25":
            ids, scores = bm25_top(self.unit_texts(chunks, texts), words, depth)
            return as_hits(chunks, [[(i, s) for i, s in zip(r, v, strict=True) if i >= 0]
                                    for r, v in zip(ids.tolist(), scores.tolist(), strict=True)], depth)
        lexical, _ = bm25_top(self.unit_texts(chunks, texts), words, FUSE_DEPTH)
        _, dense = search(chunks, query_emb, min(FUSE_DEPTH, len(chunks)))
        return as_hits(chunks, rrf([np.asarray(dense, dtype=np.int64), lexical]), depth)


def make(name: str, embedder) -> SimpleRetriever | None:
    """The method named `name`, or None when it is not a simple retriever's name."""
    return SimpleRetriever(name, embedder.tokenizer) if parse(name) else None
