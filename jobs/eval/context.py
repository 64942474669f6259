"""The same heading context (and lexical term) for the baselines: `qasc eval` ranks every baseline's chunks a
second time with QASC's query-gated heading boost, so the chunking comparison stays fair (the context is a
retrieval lever).

A chunk's heading path is the path in force at its first character (engine.splitter.heading_paths, the same
rule as the store's sentences); its vector is the store's (same text, same model) or, for a path the store
lacks, embedded here. Ranking is exact and dense: cos (Q, N) over every chunk, the gate over the distinct
paths of the top CONTEXT_POOL chunks, then QASC's scoring model (kernels.signals.row_scores: the boost
w * spread * (c - cref), the heading residual -beta * c * (h . chunk) and, alpha > 0, the lexical term over the
chunks' own texts); the best `depth` by the model's score.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from qasc.engine.lexical import LexicalIndex
from qasc.engine.splitter import heading_paths
from qasc.jobs.eval.retrieval import ChunkSet, EvalCache, Hit, model_key, sha
from qasc.kernels.context import heading_gate
from qasc.kernels.lexical import lexical_scores
from qasc.kernels.signals import ScoringModel, normalised_lexical, row_scores

CONTEXT_POOL = 32  # the same pool as the engine's gate (engine.query.CONTEXT_POOL)
SUFFIX = " + same context"
LEXICAL_QUERIES = 32  # queries per block of the per-chunk lexical gather (memory: queries x chunks x postings)


class Lexical(NamedTuple):
    """QASC's lexical term for a baseline: alpha, the questions (Q), the chunks' texts (N) and the heading paths'
    texts (H, the chunks' `path` ids index them; their terms leave a chunk's lexical signal, as the engine's)."""

    weight: float
    questions: Sequence[str]
    chunk_texts: Sequence[str]
    path_texts: Sequence[str] = ()


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


def _scores_without_heading_terms(index: LexicalIndex, ptr: torch.Tensor, terms: torch.Tensor, path: torch.Tensor,
                                  path_ptr: torch.Tensor, path_terms: torch.Tensor) -> torch.Tensor:
    """query CSR (ptr (Q+1,), terms), path (Q, N) each chunk's heading path -> (Q, N) BM25 of every chunk without the
    terms its heading path holds (kernels.lexical.lexical_scores), LEXICAL_QUERIES queries at a time."""
    q, n = path.shape
    out = torch.zeros((q, n), dtype=torch.float32)
    for lo in range(0, q, LEXICAL_QUERIES):
        hi = min(lo + LEXICAL_QUERIES, q)
        rows = torch.arange(n).expand(hi - lo, n)
        out[lo:hi] = lexical_scores(index.row_ptr, index.row_terms, index.row_weights, ptr[lo : hi + 1] - ptr[lo],
                                    terms[ptr[lo] : ptr[hi]], index.vocab_size, rows,
                                    torch.ones_like(rows, dtype=torch.bool), path[lo:hi], path_ptr, path_terms)
    return out


def context_ranked(chunks: ChunkSet, query_emb: np.ndarray, path: np.ndarray, path_emb: np.ndarray, weight: float,
                   depth: int, residual: float = 0.0, lexical: Lexical | None = None) -> list[list[Hit]]:
    """query_emb (Q, dim), path (N,) int64, path_emb (H, dim), residual = beta -> per query its `depth` best
    chunks by QASC's scoring model with weights (weight, residual, alpha of `lexical`; no lexical term without it)
    (ties: the earlier chunk), each Hit scored with the model's score."""
    q = torch.as_tensor(np.asarray(query_emb, dtype=np.float32))
    cos = q @ torch.as_tensor(chunks.emb).T  # (Q, N)
    n = cos.shape[1]
    every = torch.ones_like(cos, dtype=torch.bool)
    model = ScoringModel(weight, residual, lexical.weight if lexical is not None else 0.0)
    heading, lex = {}, None
    if n and len(path_emb) and weight > 0:
        pid = torch.as_tensor(path).expand_as(cos)
        c = torch.where(pid >= 0, (q @ torch.as_tensor(path_emb).T).gather(1, pid.clamp(min=0)), torch.zeros_like(cos))
        pool = cos.topk(min(CONTEXT_POOL, n), dim=1).indices
        spread, cref = heading_gate(c.gather(1, pool), pid.gather(1, pool), torch.ones_like(pool, dtype=torch.bool))
        emb, ids = torch.as_tensor(chunks.emb), torch.as_tensor(path)
        hs = torch.where(ids >= 0, (emb * torch.as_tensor(path_emb)[ids.clamp(min=0)]).sum(dim=1), 0.0)
        heading = {"c": c, "path": pid, "hs": hs.expand_as(cos), "spread": spread, "cref": cref}
    if lexical is not None and n and lexical.weight > 0:
        index = LexicalIndex.build(lexical.chunk_texts)
        ptr, terms, best = index.query_terms(lexical.questions)
        if heading and lexical.path_texts:  # a chunk's heading words are the heading signal's (kernels.lexical)
            path_ptr, path_terms, _ = index.query_terms(lexical.path_texts)
            bm25 = _scores_without_heading_terms(index, ptr, terms, heading["path"], path_ptr, path_terms)
        else:
            bm25 = index.dense_scores(ptr, terms)
        lex = normalised_lexical(bm25, best)
    score = row_scores(model, cos, every, lex=lex, **heading).total
    order = score.sort(dim=1, descending=True, stable=True).indices[:, :depth]
    best = score.gather(1, order)
    starts, ends, toks = chunks.starts.tolist(), chunks.ends.tolist(), chunks.n_tokens.tolist()
    return [[(chunks.doc_ids[i], starts[i], ends[i], toks[i], s, 0) for s, i in zip(rs, ri, strict=True)]
            for rs, ri in zip(best.tolist(), order.tolist(), strict=True)]
