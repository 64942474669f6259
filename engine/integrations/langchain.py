"""LangChain retriever over a QASC store: `QascRetriever(store=...)` or `QascRetriever(engine=...)`.

`invoke(question)` returns Documents (page_content = the chunk, metadata = its position, score and the
document's stored metadata); `batch(questions)` / `abatch` run one engine batch for all of them.
Needs the 'langchain' extra (langchain-core).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qasc.engine.integrations import ChunkSource, missing_extra

try:
    from langchain_core.callbacks import CallbackManager, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnableConfig
    from langchain_core.runnables.config import ensure_config, get_config_list, run_in_executor
    from pydantic import ConfigDict, InstanceOf, PrivateAttr, model_validator
except ImportError as exc:
    raise missing_extra("langchain", "langchain-core", exc) from None

from qasc.engine.config import RetrievalConfig
from qasc.engine.query import Engine
from qasc.engine.types import Chunk
from qasc.kernels.params import QascParams


class QascRetriever(BaseRetriever):
    """Query-adapted chunks of a QASC store as LangChain Documents.

    engine: an opened `engine.query.Engine`, or store: a store folder (opened once, on `device`);
    params / retrieval: QascParams / RetrievalConfig overrides (None: the store's settings); reranker: a
    cross-encoder's folder or hub name for the rerank stage (with store=; engine.rerank).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: InstanceOf[Engine] | None = None
    store: str | Path | None = None
    params: InstanceOf[QascParams] | None = None
    retrieval: InstanceOf[RetrievalConfig] | None = None
    device: str = "auto"
    reranker: str | None = None

    _source: ChunkSource = PrivateAttr()

    @model_validator(mode="after")
    def _open(self) -> QascRetriever:
        self._source = ChunkSource(self.engine, self.store, self.params, self.retrieval, self.device, self.reranker)
        self.engine = self._source.engine
        return self

    def _documents(self, chunks: list[Chunk]) -> list[Document]:
        src = self._source
        return [Document(page_content=c.text, metadata=src.metadata(c), id=src.chunk_id(c)) for c in chunks]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self._documents(self._source.query([query])[0])

    def _run_manager(self, question: str, config: RunnableConfig, kwargs: dict) -> CallbackManagerForRetrieverRun:
        """The callback run of one question, set up as BaseRetriever.invoke does."""
        manager = CallbackManager.configure(
            config.get("callbacks"), None, verbose=kwargs.get("verbose", False),
            inheritable_tags=config.get("tags"), local_tags=self.tags,
            inheritable_metadata={**(config.get("metadata") or {}), **self._get_ls_params(**kwargs)},
            local_metadata=self.metadata,
        )
        return manager.on_retriever_start(None, question, name=config.get("run_name") or self.get_name(),
                                          run_id=config.get("run_id"))

    def batch(self, inputs: list[str], config: RunnableConfig | list[RunnableConfig] | None = None, *,
              return_exceptions: bool = False, **kwargs: Any) -> list[list[Document]]:
        """All questions in one engine batch (one embedding pass, one FAISS search, one QASC pass); each
        still gets its own callback run. A failure fails the whole batch (returned for every input with
        return_exceptions=True)."""
        if not inputs:
            return []
        runs = [self._run_manager(q, ensure_config(c), kwargs)
                for q, c in zip(inputs, get_config_list(config, len(inputs)), strict=True)]
        try:
            results = [self._documents(chunks) for chunks in self._source.query(inputs)]
        except Exception as e:
            for run in runs:
                run.on_retriever_error(e)
            if return_exceptions:
                return [e] * len(inputs)
            raise
        for run, docs in zip(runs, results, strict=True):
            run.on_retriever_end(docs)
        return results

    async def abatch(self, inputs: list[str], config: RunnableConfig | list[RunnableConfig] | None = None, *,
                     return_exceptions: bool = False, **kwargs: Any) -> list[list[Document]]:
        """`batch` in a worker thread: one engine batch, the event loop stays free."""
        return await run_in_executor(None, self.batch, inputs, config, return_exceptions=return_exceptions,
                                     **kwargs)
