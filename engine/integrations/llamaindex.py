"""LlamaIndex retriever over a QASC store: `QascRetriever(store=...)` or `QascRetriever(engine=...)`.

`retrieve(question)` / `aretrieve` return NodeWithScore(TextNode) with the chunk's position, score and the
document's stored metadata, and node ids stable across calls; `retrieve_many(questions)` /
`aretrieve_many` answer many questions with one engine call. Needs the 'llamaindex' extra (llama-index-core).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from qasc.engine.integrations import POSITION_KEYS, ChunkSource, missing_extra

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeRelationship, NodeWithScore, QueryBundle, RelatedNodeInfo, TextNode
except ImportError as exc:
    raise missing_extra("llamaindex", "llama-index-core", exc) from None

from qasc.engine.config import RetrievalConfig
from qasc.engine.query import Engine
from qasc.engine.types import Chunk
from qasc.kernels.params import QascParams


class QascRetriever(BaseRetriever):
    """Query-adapted chunks of a QASC store as LlamaIndex nodes.

    engine: an opened `engine.query.Engine`, or store: a store folder (opened once, on `device`);
    params / retrieval: QascParams / RetrievalConfig overrides (None: the store's settings); reranker: a
    cross-encoder's folder or hub name for the rerank stage (with store=; engine.rerank).
    A node's id is a uuid5 of its document's content digest, doc_id and character range; its SOURCE
    relationship is the doc_id; the position keys are excluded from the text LLMs and embedders see.
    """

    def __init__(self, engine: Engine | None = None, store: str | Path | None = None, *,
                 params: QascParams | None = None, retrieval: RetrievalConfig | None = None, device: str = "auto",
                 callback_manager: CallbackManager | None = None, verbose: bool = False,
                 reranker: str | None = None) -> None:
        self._source = ChunkSource(engine, store, params, retrieval, device, reranker)
        self.engine = self._source.engine
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _nodes(self, chunks: list[Chunk]) -> list[NodeWithScore]:
        src = self._source
        out = []
        for c in chunks:
            node = TextNode(
                id_=src.chunk_id(c), text=c.text, metadata=src.metadata(c),
                start_char_idx=c.char_start, end_char_idx=c.char_end,
                excluded_llm_metadata_keys=list(POSITION_KEYS), excluded_embed_metadata_keys=list(POSITION_KEYS),
                relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=c.doc_id)},
            )
            out.append(NodeWithScore(node=node, score=float(c.score)))
        return out

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._nodes(self._source.query([query_bundle.query_str])[0])

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)

    def retrieve_many(self, questions: Sequence[str | QueryBundle]) -> list[list[NodeWithScore]]:
        """Per question (a string or a QueryBundle), its nodes in rank order: one engine call for all."""
        texts = [q.query_str if isinstance(q, QueryBundle) else q for q in questions]
        if not texts:
            return []
        return [self._nodes(chunks) for chunks in self._source.query(texts)]

    async def aretrieve_many(self, questions: Sequence[str | QueryBundle]) -> list[list[NodeWithScore]]:
        """`retrieve_many` in a worker thread: one engine call, the event loop stays free."""
        return await asyncio.to_thread(self.retrieve_many, questions)
