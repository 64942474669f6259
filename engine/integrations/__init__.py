"""Adapters that put a QASC store behind other RAG stacks' retriever interfaces.

Each adapter is its own module and needs its optional extra; this package imports none of them:

    engine.integrations.langchain   QascRetriever(langchain_core BaseRetriever)     pip install -e ".[langchain]"
    engine.integrations.llamaindex  QascRetriever(llama_index.core BaseRetriever)   pip install -e ".[llamaindex]"

Both wrap one `ChunkSource`: an Engine opened once, the parameter overrides, one engine call per batch of
questions, and each chunk's metadata and stable id.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qasc.engine.config import RetrievalConfig
from qasc.kernels.params import QascParams

if TYPE_CHECKING:
    from qasc.engine.query import Engine
    from qasc.engine.types import Chunk

# uuid5 namespace of chunk ids: uuid5(NAMESPACE_URL, "https://github.com/qasc/qasc#chunk"), fixed forever.
CHUNK_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/qasc/qasc#chunk")

# The chunk's position and score: metadata every result carries, kept out of the text an LLM or embedder sees.
POSITION_KEYS = ("char_start", "char_end", "score", "n_tokens", "sentence_start", "sentence_end")


def missing_extra(extra: str, package: str, exc: ImportError) -> ImportError:
    """The one-line ImportError raised (`from None`) when an integration's optional dependency is missing."""
    return ImportError(f"the {extra} integration needs {package} ({exc}): pip install -e \".[{extra}]\"")


class ChunkSource:
    """An Engine (given, or opened once from a store folder) and optional parameter overrides.

    `query(questions)` makes exactly one `Engine.query` call for any number of questions; `metadata(chunk)`
    and `chunk_id(chunk)` turn its Chunks into what the retrievers return.
    """

    def __init__(self, engine: Engine | None = None, store: str | Path | None = None,
                 params: QascParams | None = None, retrieval: RetrievalConfig | None = None,
                 device: str = "auto", reranker: str | None = None) -> None:
        if (engine is None) == (store is None):
            raise ValueError("give either engine= (an opened engine.query.Engine) or store= (a store folder)")
        if engine is not None and reranker is not None:
            raise ValueError("reranker= opens the store with it (store=...); an opened engine keeps its own "
                             "(Engine.open(store, reranker=...))")
        if params is not None and not isinstance(params, QascParams):
            raise TypeError(f"params must be a kernels.params.QascParams, got {type(params).__name__}")
        if retrieval is not None and not isinstance(retrieval, RetrievalConfig):
            raise TypeError(f"retrieval must be an engine.config.RetrievalConfig, got {type(retrieval).__name__}")
        if engine is None:
            from qasc.engine.query import Engine

            engine = Engine.open(str(store), device=device, reranker=reranker)
        self.engine = engine
        self.params = params
        self.retrieval = retrieval
        store_ = engine.store
        self._doc_index = {doc_id: i for i, doc_id in enumerate(store_.doc_ids)}
        self._digests: dict[int, str] = {}

    def query(self, questions: Sequence[str]) -> list[list[Chunk]]:
        """questions (Q) -> per question, its chunks in rank order: one engine call."""
        return self.engine.query(list(questions), self.params, self.retrieval)

    def metadata(self, chunk: Chunk) -> dict:
        """The chunk's source, position and score on top of its document's stored metadata; on a key clash
        the chunk's own fields (source included) win."""
        i = self._doc_index[chunk.doc_id]
        store = self.engine.store
        return {
            **store.metadata[i],
            "source": store.sources[i],
            "doc_id": chunk.doc_id,
            "char_start": chunk.char_start,
            "char_end": chunk.char_end,
            "score": float(chunk.score),
            "n_tokens": chunk.n_tokens,
            "sentence_start": chunk.sentence_start,
            "sentence_end": chunk.sentence_end,
            **({} if self.engine.reranker is None else {"reranker": self.engine.reranker.name,
                                                        "rerank_score": chunk.rerank_score}),
        }

    def chunk_id(self, chunk: Chunk) -> str:
        """A uuid5 of (document content digest, doc_id, character range): the same span of the same document
        gets the same id in every call, every process, and every store holding that document."""
        i = self._doc_index[chunk.doc_id]
        digest = self._digests.get(i)
        if digest is None:
            text = self.engine.store.doc_texts[i]  # a mapped store's: its shard's texts read on first use
            digest = self._digests[i] = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        return str(uuid.uuid5(CHUNK_NAMESPACE, f"{digest}\x00{chunk.doc_id}\x00{chunk.char_start}\x00{chunk.char_end}"))
