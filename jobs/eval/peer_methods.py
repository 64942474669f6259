"""Every peer method by name: the peers' own chunkers (peers.py), the framework pipelines (pipelines.py) and the
simple retrievers (hybrid.py). Kept apart from those modules, which import peers.py, so nothing imports in a cycle."""

from __future__ import annotations

from qasc.engine.errors import QascError
from qasc.jobs.eval import hybrid, pipelines
from qasc.jobs.eval.baselines import Chunker
from qasc.jobs.eval.peers import PEER_METHODS, AutoMerge, ChonkieSemantic, LangChainSemantic, Semchunk, SentenceWindow

FAMILIES = (pipelines, hybrid)


def is_peer(name: str) -> bool:
    """Is `name` a peer method: one of PEER_METHODS, semchunk-<N>, or a pipeline / simple retriever name."""
    return name in PEER_METHODS or any(m.parse(name) is not None for m in FAMILIES)


def make_peer(name: str, embedder) -> Chunker:
    tok = embedder.tokenizer
    if name == "lc-semantic":
        return LangChainSemantic(embedder)
    if name == "chonkie-semantic":
        return ChonkieSemantic(embedder)
    if name.startswith("semchunk-"):
        return Semchunk(int(name.split("-")[1]), tok)
    if name == "li-sentence-window":
        return SentenceWindow(tok)
    if name == "li-automerge":
        return AutoMerge(tok)
    for module in FAMILIES:
        made = module.make(name, embedder)
        if made is not None:
            return made
    raise QascError(f"unknown peer {name!r}; known: {', '.join(PEER_METHODS)}, semchunk-<N>, {pipelines.PATTERN}, "
                    f"{hybrid.PATTERN}")

