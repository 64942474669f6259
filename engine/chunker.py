"""In-memory QASC for one document and many queries: `chunk(text, queries, config)`.

No heading context here (QascParams.context_weight is not used): within one document every sentence is a
candidate already, and the gate needs heading paths embedded at ingest; `Engine` (a store) applies it."""

from __future__ import annotations

import torch

from qasc.engine.assemble import RowTable, assemble_chunks
from qasc.engine.config import EngineConfig
from qasc.engine.embedder import Embedder
from qasc.engine.splitter import split_sentences
from qasc.engine.tokencap import DEFAULT_MAX_SENTENCE_TOKENS, cap_tokens
from qasc.engine.types import Chunk, Sentences, check_query_list
from qasc.kernels.extents import block_stats, neighbour_dots
from qasc.kernels.pipeline import run_qasc


def embedder_from(config: EngineConfig) -> Embedder:
    c = config.embedder
    return Embedder(c.model, c.device, c.dtype, c.max_length, c.batch_tokens)


def prepare(text: str, embedder: Embedder, config: EngineConfig, doc_id: str = "doc") -> tuple[Sentences, torch.Tensor]:
    """text -> (sentences with token counts, embeddings (N, dim) float32 tensor)."""
    sents = split_sentences(text, doc_id, config.splitter)
    # as ingest does: no sentence longer than the model reads (it would be embedded from its first tokens only)
    if hasattr(embedder, "tokenizer") and hasattr(embedder, "max_length"):
        sents = cap_tokens(sents, embedder.tokenizer, min(DEFAULT_MAX_SENTENCE_TOKENS, embedder.max_length - 2))
    else:  # a duck-typed embedder without a tokenizer: counted, not cut
        sents = sents.with_tokens(embedder.count_tokens(sents.texts()))
    return sents, torch.from_numpy(embedder.encode(sents.texts()))


def chunk_sentences(
    sents: Sentences, sent_emb: torch.Tensor, query_emb: torch.Tensor, config: EngineConfig
) -> list[list[Chunk]]:
    """sents (N sentences), sent_emb (N, dim), query_emb (Q, dim) -> per query, its ranked chunks."""
    q, n = query_emb.shape[0], len(sents)
    device = query_emb.device
    sims = query_emb @ sent_emb.to(device).T if n else torch.zeros((q, 0), device=device)  # (Q, N)
    valid = torch.ones((q, n), dtype=torch.bool, device=device)
    positions = torch.arange(n, device=device).expand(q, n)
    zeros = torch.zeros((q, n), dtype=torch.long, device=device)
    para = torch.as_tensor(sents.paragraph, dtype=torch.long, device=device).expand(q, n)
    sect = torch.as_tensor(sents.section, dtype=torch.long, device=device).expand(q, n)
    ntok = torch.as_tensor(sents.n_tokens, dtype=torch.long, device=device).expand(q, n)
    p = config.qasc
    vectors = sent_emb.to(device)
    dots = None
    if p.extent == "pooled":  # (Q, N, W): one copy, expanded
        dots = neighbour_dots(vectors, p.max_extent).expand(q, n, p.max_extent)
    ids = {"paragraph": sents.paragraph, "section": sents.section}
    blocks = {kind: tuple(t.expand(q, n) for t in block_stats(vectors, torch.as_tensor(ids[kind], device=device)))
              for kind in p.block_kinds}
    batch = run_qasc(sims, valid, zeros, para, sect, ntok, config.qasc, dots=dots, blocks=blocks)
    return assemble_chunks(batch, positions, RowTable.from_docs([sents]))


def chunk(
    text: str,
    queries: list[str],
    config: EngineConfig | None = None,
    embedder: Embedder | None = None,
    doc_id: str = "doc",
) -> list[list[Chunk]]:
    """One document, many queries -> per query, its query-adapted chunks in rank order."""
    config = config or EngineConfig()
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not isinstance(doc_id, str):
        raise TypeError(f"doc_id must be a str, got {type(doc_id).__name__}")
    queries = check_query_list(queries)
    for i, x in enumerate(queries):  # strings already (check_query_list); none may be blank
        if not x.strip():
            raise ValueError(f"every query must be a non-empty string; query {i} is {x!r}")
    embedder = embedder or embedder_from(config)
    sents, sent_emb = prepare(text, embedder, config, doc_id)
    query_emb = torch.from_numpy(embedder.encode(queries))
    return chunk_sentences(sents, sent_emb, query_emb, config)
