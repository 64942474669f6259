"""QASC engine: splitting, embedding, store, index and query engine (the stateful parts around kernels/)."""

from engine.chunker import chunk
from engine.config import EmbedderConfig, EngineConfig, RetrievalConfig
from engine.embedder import Embedder
from engine.splitter import SplitterConfig, split_sentences
from engine.types import Chunk, Sentences
from kernels.params import QascParams

__version__ = "0.1.0"

__all__ = [
    "Chunk",
    "EmbedderConfig",
    "Embedder",
    "EngineConfig",
    "QascParams",
    "RetrievalConfig",
    "Sentences",
    "SplitterConfig",
    "chunk",
    "split_sentences",
]
