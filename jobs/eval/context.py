"""The same heading context (and lexical term) for the baselines: `qasc eval` ranks every baseline's chunks a
second time with QASC's query-gated heading boost, so the chunking comparison stays fair (the context is a
retrieval lever).

A chunk's heading path is the path in force at its first character (engine.splitter.heading_paths, the same
rule as the store's sentences); its vector is the store's (same text, same model) or, for a path the store
lacks, embedded here. Ranking is exact and dense: cos (Q, N) over every chunk, the gate over the distinct
paths of the top CONTEXT_POOL chunks, boost = w * spread * (c - cref), and (beta > 0) QASC's heading residual
-beta * c * (h . chunk) (kernels.context.heading_residual), and (alpha > 0) QASC's gated lexical term over the
chunks' own texts (kernels.lexical.lexical_boost, the same spread); the best `depth` by their sum.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from engine.lexical import LexicalIndex
from engine.splitter import heading_paths
from jobs.eval.retrieval import ChunkSet, EvalCache, Hit, model_key, sha
from kernels.context import context_boost, heading_gate, heading_residual
from kernels.lexical import lexical_boost

CONTEXT_POOL = 32  # the same pool as the engine's gate (engine.query.CONTEXT_POOL)
SUFFIX = " + same context"


class Lexical(NamedTuple):
    """QASC's gated lexical term for a baseline: alpha, the spread below which it is on (None: always), the
    questions (Q) and the chunks' texts (N)."""

    weight: float
    max_spread: float | None
    questions: Sequence[str]
    chunk_texts: Sequence[str]


def chunk_paths(chunks: ChunkSet, corpora: Mapping[str, str]) -> tuple[list[str], np.ndarray]:
    """-> (distinct heading paths, (N,) int64 each chunk's path at its start, -1: none)."""
    paths: dict[str, int] = {}
    ids = np.full(len(chunks), -1, np.int64)
    doc_ids = np.asarray(chunks.doc_ids, dtype=object)
    for cid in dict.fromkeys(chunks.doc_ids):
        sel = np.flatnonzero(doc_ids == cid)
        local, at = heading_paths(corpora[cid], chunks.starts[sel])
        remap = np.array([paths.setdefault(p, len(paths)) for p in local] + [-1], dtype=np.int64)
        ids[sel] = remap[at]
    return list(paths), ids


def path_vectors(paths: list[str], engine, embedder, cache: EvalCache | None = None) -> np.ndarray:
    """paths (H) -> (H, dim) float32: the store's vectors where it has the path, the rest embedded (through
    the cache when one is given)."""
    store = getattr(engine, "store", None)
    known = dict(zip(getattr(store, "heading_paths", []), getattr(store, "heading_emb", []), strict=True))
    missing = [p for p in paths if p not in known]
    if missing:
        key = f"{model_key(embedder)}|headings|{sha(json.dumps(missing))}"
        got = cache.load_arrays("emb", key) if cache is not None else None
        vecs = got["emb"] if got is not None else embedder.encode(missing)
        if got is None and cache is not None:
            cache.save_arrays("emb", key, emb=np.asarray(vecs, np.float32))
        known.update(zip(missing, vecs, strict=True))
    return np.stack([known[p] for p in paths]).astype(np.float32) if paths else np.zeros((0, 1), np.float32)


def context_ranked(chunks: ChunkSet, query_emb: np.ndarray, path: np.ndarray, path_emb: np.ndarray, weight: float,
                   depth: int, residual: float = 0.0, lexical: Lexical | None = None) -> list[list[Hit]]:
    """query_emb (Q, dim), path (N,) int64, path_emb (H, dim), residual = beta -> per query its `depth` best
    chunks by cos + boost + heading residual (+ QASC's gated lexical term when `lexical` is given: the same
    alpha * BM25 / best where the query's spread < t, BM25 over the chunks' texts) (ties: the earlier chunk),
    each Hit scored with that sum."""
    q = torch.as_tensor(np.asarray(query_emb, dtype=np.float32))
    cos = q @ torch.as_tensor(chunks.emb).T  # (Q, N)
    n = cos.shape[1]
    spread = torch.zeros(cos.shape[0])
    if n == 0 or not len(path_emb) or weight == 0:
        score = cos
    else:
        pid = torch.as_tensor(path).expand_as(cos)
        c = torch.where(pid >= 0, (q @ torch.as_tensor(path_emb).T).gather(1, pid.clamp(min=0)), torch.zeros_like(cos))
        pool = cos.topk(min(CONTEXT_POOL, n), dim=1).indices
        spread, cref = heading_gate(c.gather(1, pool), pid.gather(1, pool), torch.ones_like(pool, dtype=torch.bool))
        every = torch.ones_like(pid, dtype=torch.bool)
        score = cos + context_boost(c, pid, every, spread, cref, weight)
        if residual > 0:
            emb, ids = torch.as_tensor(chunks.emb), torch.as_tensor(path)
            hs = torch.where(ids >= 0, (emb * torch.as_tensor(path_emb)[ids.clamp(min=0)]).sum(dim=1), 0.0)
            score = score + heading_residual(c, hs.expand_as(cos), pid, every, residual)
    if lexical is not None and n and lexical.weight > 0:
        index = LexicalIndex.build(lexical.chunk_texts)
        ptr, terms, best = index.query_terms(lexical.questions)
        bm25 = index.dense_scores(ptr, terms)
        score = score + lexical_boost(bm25, torch.ones_like(bm25, dtype=torch.bool), best, spread, lexical.weight,
                                      lexical.max_spread)
    order = score.sort(dim=1, descending=True, stable=True).indices[:, :depth]
    best = score.gather(1, order)
    starts, ends, toks = chunks.starts.tolist(), chunks.ends.tolist(), chunks.n_tokens.tolist()
    return [[(chunks.doc_ids[i], starts[i], ends[i], toks[i], s, 0) for s, i in zip(rs, ri, strict=True)]
            for rs, ri in zip(best.tolist(), order.tolist(), strict=True)]
