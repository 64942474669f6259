"""Chunk embeddings cached on disk, exact inner-product search (faiss IndexFlatIP), ranked hits per query.

Cache layout under `cache_dir` (every file written to a temp name, then renamed):
    spans/<key>.json   chunk spans of one corpus for an expensive chunker (key: chunker + corpus sha)
    emb/<key>.npz      emb (N, dim) float32 + n_tokens (N,) int32 of one corpus's chunks
                       (key: model fingerprint + chunker key + corpus sha + spans sha)
    queries/<key>.npy  question embeddings (Q, dim) float32
so reruns, and methods that share chunks, never embed the same text twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qasc.jobs.eval.baselines import Chunker, Span

Hit = tuple[str, int, int, int, float, int]  # (doc_id, char_start, char_end, n_tokens, score, n_sentences or 0)


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()[:20]


def _atomic(path: Path, write: Callable[[str], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


class EvalCache:
    """Content-addressed files under one folder; `None` root disables caching."""

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root else None
        self.hits = 0
        self.misses = 0

    def _path(self, kind: str, key: str, ext: str) -> Path | None:
        return None if self.root is None else self.root / kind / f"{sha(key)}.{ext}"

    def load_spans(self, key: str) -> list[Span] | None:
        p = self._path("spans", key, "json")
        if p is None or not p.exists():
            return None
        return [tuple(x) for x in json.loads(p.read_text())]

    def save_spans(self, key: str, spans: Sequence[Span]) -> None:
        p = self._path("spans", key, "json")
        if p is not None:
            _atomic(p, lambda tmp: Path(tmp).write_text(json.dumps([list(s) for s in spans])))

    def load_arrays(self, kind: str, key: str) -> dict[str, np.ndarray] | None:
        p = self._path(kind, key, "npz")
        if p is None or not p.exists():
            self.misses += 1
            return None
        with np.load(p) as z:
            self.hits += 1
            return {k: z[k] for k in z.files}

    def save_arrays(self, kind: str, key: str, **arrays: np.ndarray) -> None:
        p = self._path(kind, key, "npz")
        if p is not None:
            def write(tmp: str) -> None:
                with open(tmp, "wb") as fh:
                    np.savez(fh, **arrays)

            _atomic(p, write)


@dataclass
class ChunkSet:
    """Every chunk of one method over a data set: spans, token counts and embeddings (N, dim) float32."""

    method: str
    doc_ids: list[str]
    starts: np.ndarray  # (N,) int64
    ends: np.ndarray  # (N,) int64
    n_tokens: np.ndarray  # (N,) int32, model word-pieces
    emb: np.ndarray  # (N, dim) float32, L2-normalised
    seconds_chunk: float = 0.0
    seconds_embed: float = 0.0

    def __len__(self) -> int:
        return len(self.starts)

    def restrict(self, corpus_ids: Sequence[str]) -> ChunkSet:
        keep = np.flatnonzero(np.isin(np.asarray(self.doc_ids, dtype=object), list(corpus_ids)))
        return ChunkSet(self.method, [self.doc_ids[i] for i in keep], self.starts[keep], self.ends[keep],
                        self.n_tokens[keep], self.emb[keep], self.seconds_chunk, self.seconds_embed)


def model_key(embedder) -> str:
    """Model fingerprint + compute dtype: what the cached vectors depend on."""
    return f"{embedder.fingerprint}:{str(getattr(embedder, 'dtype', '')).replace('torch.', '')}"


def corpus_spans(chunker: Chunker, corpus_id: str, text: str, cache: EvalCache) -> list[Span]:
    """Spans of one corpus, through the spans cache when the chunker is expensive."""
    if not chunker.expensive:
        return chunker.spans(corpus_id, text)
    key = f"{chunker.key()}|{corpus_id}|{sha(text)}"
    spans = cache.load_spans(key)
    if spans is None:
        spans = chunker.spans(corpus_id, text)
        cache.save_spans(key, spans)
    return spans


def embed_corpus(embedder, chunker_key: str, corpus_id: str, text: str, spans: Sequence[Span],
                 cache: EvalCache, index_texts: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
    """-> emb (N, dim) float32, n_tokens (N,) int32, and whether the cache had them.

    index_texts (N): what is embedded instead of the spans' own texts (a chunker's `index_texts`, e.g. each
    chunk prefixed by its heading path); n_tokens always counts the spans' texts (what a method returns)."""
    key = f"{model_key(embedder)}|{chunker_key}|{corpus_id}|{sha(text)}|{sha(json.dumps(list(spans)))}"
    if index_texts is not None:
        key += f"|{sha(json.dumps(list(index_texts)))}"
    got = cache.load_arrays("emb", key)
    if got is not None:
        return got["emb"], got["n_tokens"], True
    texts = [text[s:e] for s, e in spans]
    embedded = texts if index_texts is None else list(index_texts)
    emb = embedder.encode(embedded) if texts else np.zeros((0, embedder.dim), np.float32)
    n_tokens = embedder.count_tokens(texts).astype(np.int32)
    cache.save_arrays("emb", key, emb=emb, n_tokens=n_tokens)
    return emb, n_tokens, False


def build_chunkset(chunker: Chunker, corpora: dict[str, str], embedder, cache: EvalCache,
                   log: Callable[[str], None] | None = None) -> ChunkSet:
    """Chunk every corpus and embed the chunks (cached) -> ChunkSet in corpus order."""
    doc_ids: list[str] = []
    starts, ends, toks, embs = [], [], [], []
    t_chunk = t_embed = 0.0
    for cid in sorted(corpora):
        text = corpora[cid]
        t0 = time.perf_counter()
        spans = corpus_spans(chunker, cid, text, cache)
        t1 = time.perf_counter()
        index = getattr(chunker, "index_texts", None)  # what is embedded, when not the chunks' own texts
        emb, n_tok, hit = embed_corpus(embedder, chunker.key(), cid, text, spans, cache,
                                       None if index is None else index(cid, text, spans))
        t2 = time.perf_counter()
        t_chunk += t1 - t0
        t_embed += t2 - t1
        if log and not hit:
            log(f"  {chunker.name}: {cid}: {len(spans)} chunks embedded in {t2 - t1:.1f} s")
        doc_ids.extend([cid] * len(spans))
        starts.append(np.asarray([s for s, _ in spans], dtype=np.int64))
        ends.append(np.asarray([e for _, e in spans], dtype=np.int64))
        toks.append(np.asarray(n_tok, dtype=np.int32))
        embs.append(np.asarray(emb, dtype=np.float32).reshape(len(spans), embedder.dim))
    return ChunkSet(chunker.name, doc_ids, np.concatenate(starts), np.concatenate(ends), np.concatenate(toks),
                    np.concatenate(embs), t_chunk, t_embed)


def search(chunks: ChunkSet, query_emb: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """query_emb (Q, dim) -> scores (Q, depth) float32, ids (Q, depth) int64 (-1 past the end); exact
    inner product through faiss.IndexFlatIP."""
    import faiss

    index = faiss.IndexFlatIP(chunks.emb.shape[1])
    if len(chunks):
        index.add(np.ascontiguousarray(chunks.emb, dtype=np.float32))
    return index.search(np.ascontiguousarray(query_emb, dtype=np.float32), depth)


def ranked_hits(chunks: ChunkSet, query_emb: np.ndarray, depth: int) -> list[list[Hit]]:
    """query_emb (Q, dim) -> per query, its `depth` best chunks as Hits, best first."""
    scores, ids = search(chunks, query_emb, depth)
    out = []
    starts, ends, toks = chunks.starts.tolist(), chunks.ends.tolist(), chunks.n_tokens.tolist()
    for row_s, row_i in zip(scores.tolist(), ids.tolist(), strict=True):
        out.append([(chunks.doc_ids[i], starts[i], ends[i], toks[i], s, 0)
                    for s, i in zip(row_s, row_i, strict=True) if i >= 0])
    return out


class TokenCutter:
    """Cuts a chunk after its first n model tokens: (doc text, start, end, n) -> new end (character)."""

    def __init__(self, tokenizer, texts: dict[str, str]) -> None:
        self.tokenizer = tokenizer
        self.texts = texts
        self._memo: dict[tuple[str, int, int, int], int] = {}

    def cut(self, doc_id: str, start: int, end: int, n: int) -> int:
        key = (doc_id, start, end, n)
        if key not in self._memo:
            if n <= 0:
                self._memo[key] = start
            else:
                offsets = self.tokenizer(self.texts[doc_id][start:end], add_special_tokens=False,
                                         return_offsets_mapping=True, return_attention_mask=False,
                                         verbose=False)["offset_mapping"]
                self._memo[key] = end if n >= len(offsets) else start + int(offsets[n - 1][1])
        return self._memo[key]


def within_budget(hits: Sequence[Hit], budget: int, cutter: TokenCutter | None) -> list[Hit]:
    """Ranked hits -> the prefix that fits `budget` tokens; the first chunk that overflows is cut to the
    tokens left (when a cutter is given; else dropped) and the selection stops there."""
    out: list[Hit] = []
    used = 0
    for h in hits:
        if used + h[3] <= budget:
            out.append(h)
            used += h[3]
            continue
        left = budget - used
        if cutter is not None and left > 0:
            end = cutter.cut(h[0], h[1], h[2], left)
            if end > h[1]:
                out.append((h[0], h[1], end, left, h[4], h[5]))
        break
    return out
