"""QASC engine: splitting, embedding, store, index and query engine (the stateful parts around kernels/).

The names below load on first use (PEP 562), so that `import engine.errors` or `engine.store.schema`
does not pull in torch and the model code.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Chunk": "qasc.engine.types",
    "EmbedderConfig": "qasc.engine.config",
    "Embedder": "qasc.engine.embedder",
    "EngineConfig": "qasc.engine.config",
    "QascParams": "qasc.kernels.params",
    "RetrievalConfig": "qasc.engine.config",
    "Sentences": "qasc.engine.types",
    "SplitterConfig": "qasc.engine.splitter",
    "chunk": "qasc.engine.chunker",
    "split_sentences": "qasc.engine.splitter",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
