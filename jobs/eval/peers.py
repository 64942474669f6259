"""Baselines through the peers' own code: what a user would pick instead of QASC.

Every peer runs its library's own splitter / retriever with our model (all-MiniLM-L6-v2 through
engine.embedder.Embedder, behind a small adapter where the library embeds) and hands back exact character
spans into the original text, so the harness scores it like every other baseline (same embeddings, same
exact inner-product search, Chroma's character metric):

    lc-semantic         langchain-experimental SemanticChunker, default breakpoints (95th percentile)
    chonkie-semantic    chonkie SemanticChunker, chunk_size capped at the model window (256)
    semchunk-128/256    semchunk with the MiniLM tokenizer as token counter (offsets from semchunk)
    li-sentence-window  LlamaIndex SentenceWindowNodeParser (window 3) + MetadataReplacementPostProcessor
    li-automerge        LlamaIndex HierarchicalNodeParser (2048/512/128) + AutoMergingRetriever

Where a peer normalises whitespace (LangChain joins sentences with " ", LlamaIndex's SentenceSplitter
strips), its chunk texts are mapped back by `Locator`: an exact search of the chunk's non-whitespace
characters in the text's non-whitespace characters from a moving cursor; the chunker's `note` says so.
The two LlamaIndex recipes are retrieval recipes, not chunkers: they expose `retrieval_views()` which turns
the ranked hits of their nodes into what the recipe returns (windows; merged parents).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qasc.engine.errors import QascError
from qasc.jobs.eval.baselines import Chunker, Span, _trimmed
from qasc.jobs.eval.peer_support import (
    Locator,
    chonkie_embeddings,
    exact_or_locate,
    langchain_embeddings,
    llama_index_offline,
    require,
)

MODEL_WINDOW = 256  # word-pieces all-MiniLM-L6-v2 reads (engine.embedder.Embedder max_length)
PEER_METHODS = ("lc-semantic", "chonkie-semantic", "semchunk-128", "semchunk-256", "li-sentence-window",
                "li-automerge")


# ------------------------------------------------------------------------------------------------ chunkers

class PeerChunker(Chunker):
    family = "peer"
    expensive = True
    tokenizer = None  # the model's (MiniLM word-pieces), for the token counts of what a recipe returns

    def _count(self, texts: dict[str, str], doc: str, s: int, e: int) -> int:
        """Model tokens of texts[doc][s:e], memoised (windows and parents recur across questions)."""
        memo = self.__dict__.setdefault("_tokens", {})
        if (doc, s, e) not in memo:
            memo[(doc, s, e)] = len(self.tokenizer(texts[doc][s:e], add_special_tokens=False,
                                                   return_attention_mask=False, verbose=False)["input_ids"])
        return memo[(doc, s, e)]


class LangChainSemantic(PeerChunker):
    """langchain_experimental.text_splitter.SemanticChunker with its defaults: sentences split on
    `(?<=[.?!])\\s+`, each embedded with one neighbour each side (buffer_size=1), a chunk ends where the
    cosine distance to the next exceeds the 95th percentile; no size cap."""

    name = "lc-semantic"
    note = ("LangChain SemanticChunker (langchain-experimental), defaults: percentile 95, buffer 1, no size cap; "
            "MiniLM adapter; it joins sentences with ' ', spans mapped back by whitespace-insensitive search")

    def __init__(self, embedder) -> None:
        self.embedder = embedder

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        ts = require("langchain_experimental.text_splitter", "langchain-experimental")
        splitter = ts.SemanticChunker(langchain_embeddings(self.embedder))
        return exact_or_locate(text, splitter.split_text(text))


class ChonkieSemantic(PeerChunker):
    """chonkie.SemanticChunker with our model; its defaults except chunk_size (2048 is sized for chonkie's own
    static model; MiniLM reads 256 word-pieces, so chunks are capped there)."""

    name = "chonkie-semantic"

    def __init__(self, embedder, chunk_size: int = MODEL_WINDOW) -> None:
        self.embedder = embedder
        self.chunk_size = chunk_size
        self.note = (f"chonkie SemanticChunker, defaults (threshold 0.8, window 3, Savitzky-Golay) with MiniLM, "
                     f"chunk_size {chunk_size} MiniLM tokens; chonkie's start/end offsets (verified)")

    def key(self) -> str:
        return f"{self.name}-t{self.chunk_size}-v{self.version}"

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        chonkie = require("chonkie", "chonkie")
        chunker = chonkie.SemanticChunker(embedding_model=chonkie_embeddings(self.embedder), chunk_size=self.chunk_size)
        chunks = chunker.chunk(text)
        return exact_or_locate(text, [c.text for c in chunks], [c.start_index for c in chunks])


class Semchunk(PeerChunker):
    """semchunk.chunkerify(MiniLM tokenizer, size), offsets=True: recursive splitting at the most
    semantically meaningful separator (newlines, tabs, spaces, sentence ends, ...) that keeps chunks <= size."""

    def __init__(self, size: int, tokenizer) -> None:
        self.size = size
        self.tokenizer = tokenizer
        self.name = f"semchunk-{size}"
        self.note = f"semchunk, {size} MiniLM tokens per chunk (its token counter), semchunk's own offsets"
        self._chunker = None

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        semchunk = require("semchunk", "semchunk")
        if self._chunker is None:
            self._chunker = semchunk.chunkerify(self.tokenizer, self.size)
        chunks, offsets = self._chunker(text, offsets=True)
        return exact_or_locate(text, chunks, [s for s, _ in offsets])


def _llama_document(text: str, corpus_id: str):
    from llama_index.core import Document

    return Document(text=text, id_=corpus_id)


def _node_id(i: int, doc) -> str:
    """Deterministic LlamaIndex node ids ("<corpus>:<i>"; its default is a random uuid, which orders the
    vector store's equal-score ties at random)."""
    return f"{doc.doc_id}:{i}"


class SentenceWindow(PeerChunker):
    """LlamaIndex's sentence-window recipe: SentenceWindowNodeParser(window_size=3) makes one node per
    sentence (its NLTK Punkt splitter), each embedded alone and searched; MetadataReplacementPostProcessor then
    replaces every retrieved sentence by its `window` metadata: the 3 sentences before, itself, the 3 after.

    `spans()` gives the sentences (checked against LlamaIndex's own window text); `retrieval_views()` applies
    the replacement to the ranked hits. A window entirely covered by windows already returned adds nothing and
    is dropped (so k counts distinct windows); the rest keep rank order and their full text."""

    name = "li-sentence-window"
    note = ("LlamaIndex SentenceWindowNodeParser (window 3) + MetadataReplacementPostProcessor: top-k sentences "
            "replaced by their windows (covered windows dropped); sentence spans exact (LlamaIndex keeps them)")

    def __init__(self, tokenizer, window: int = 3) -> None:
        self.tokenizer = tokenizer
        self.window = window

    def key(self) -> str:
        return f"{self.name}-w{self.window}-v{self.version}"

    def nodes(self, corpus_id: str, text: str) -> tuple[list, list[Span | None]]:
        """-> LlamaIndex's sentence nodes of `text` and each one's trimmed span (None: whitespace only)."""
        require("llama_index.core", "llama-index-core")
        from llama_index.core.node_parser import SentenceWindowNodeParser

        llama_index_offline()
        parser = SentenceWindowNodeParser.from_defaults(window_size=self.window, id_func=_node_id)
        nodes = parser.get_nodes_from_documents([_llama_document(text, corpus_id)])
        raw: list[Span] = []
        cursor = 0
        for n in nodes:  # sentences are consecutive slices of the text (Punkt spans up to the next start)
            s = text.find(n.text, cursor)
            if s < 0:
                raise QascError(f"LlamaIndex sentence not found in the text after {cursor}: {n.text[:80]!r}")
            raw.append((s, s + len(n.text)))
            cursor = s + len(n.text)
        for i, n in enumerate(nodes):  # our window rule == LlamaIndex's window metadata
            lo, hi = max(0, i - self.window), min(len(nodes), i + self.window + 1)
            if Locator.squeeze(n.metadata["window"]) != Locator.squeeze(text[raw[lo][0] : raw[hi - 1][1]]):
                raise QascError(f"LlamaIndex window of sentence {i} does not match the text")
        return nodes, [next(iter(_trimmed(text, [r])), None) for r in raw]

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        return [s for s in self.nodes(corpus_id, text)[1] if s is not None]

    def windows(self, chunks, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ChunkSet rows (sentences) -> window starts, ends: rows i-w .. i+w of the same corpus."""
        doc = np.asarray(chunks.doc_ids, dtype=object)
        n = len(chunks)
        lo = np.clip(rows - self.window, 0, n - 1)
        hi = np.clip(rows + self.window, 0, n - 1)
        for j, r in enumerate(rows.tolist()):
            while doc[lo[j]] != doc[r]:
                lo[j] += 1
            while doc[hi[j]] != doc[r]:
                hi[j] -= 1
        return chunks.starts[lo], chunks.ends[hi]

    def expand(self, chunks, ranked, texts: dict[str, str]) -> list[list]:
        """Ranked sentence hits -> ranked window hits (doc, ws, we, n_tokens, score, n_sentences)."""
        row_of = {(d, int(s), int(e)): i for i, (d, s, e) in
                  enumerate(zip(chunks.doc_ids, chunks.starts.tolist(), chunks.ends.tolist(), strict=True))}
        out = []
        for hits in ranked:
            rows = np.asarray([row_of[(h[0], h[1], h[2])] for h in hits], dtype=np.int64)
            ws, we = self.windows(chunks, rows) if len(rows) else (rows, rows)
            kept, cover = [], {}
            for h, s, e, r in zip(hits, ws.tolist(), we.tolist(), rows.tolist(), strict=True):
                if _covered(cover.get(h[0], []), s, e):
                    continue
                cover.setdefault(h[0], []).append((s, e))
                n_sent = int(np.sum(np.asarray(chunks.doc_ids[max(0, r - self.window): r + self.window + 1],
                                               dtype=object) == h[0]))
                kept.append((h[0], s, e, self._count(texts, h[0], s, e), h[4], n_sent))
            out.append(kept)
        return out

    def retrieval_views(self, chunks, ranked, selectors, cutter):
        return [("chunks", self.expand(chunks, ranked, cutter.texts), selectors)]


def _covered(spans: list[Span], s: int, e: int) -> bool:
    """Is [s, e) inside the union of `spans`?"""
    pos = s
    for a, b in sorted(spans):
        if a <= pos < b:
            pos = b
        if pos >= e:
            return True
    return pos >= e


class AutoMerge(PeerChunker):
    """LlamaIndex's auto-merging recipe: HierarchicalNodeParser.from_defaults() (SentenceSplitter at 2048, 512
    and 128 cl100k tokens, overlap 20) over each corpus; the leaves (128) are embedded and searched; the top-k
    leaves go through LlamaIndex's own AutoMergingRetriever (fill in gaps between neighbours, replace children
    by their parent when more than half of its children were retrieved, repeat, sort by score).

    The vector search is ours (exact inner product, as for every baseline) behind a BaseRetriever that hands
    LlamaIndex the precomputed hits; the merge step runs in LlamaIndex's code over an in-memory docstore."""

    name = "li-automerge"
    note = ("LlamaIndex HierarchicalNodeParser (2048/512/128) + AutoMergingRetriever (ratio 0.5) over the top-k "
            "leaves; our exact search feeds it; SentenceSplitter strips, spans mapped by whitespace-insensitive "
            "search; leaves overlap (20 tokens)")

    def __init__(self, tokenizer, chunk_sizes: Sequence[int] = (2048, 512, 128)) -> None:
        self.tokenizer = tokenizer
        self.chunk_sizes = tuple(chunk_sizes)
        self._trees: dict[tuple[str, int], dict] = {}

    def key(self) -> str:
        return f"{self.name}-{'-'.join(map(str, self.chunk_sizes))}-v{self.version}"

    def tree(self, corpus_id: str, text: str) -> dict:
        """-> {"nodes": [BaseNode], "span": {node_id: (s, e)}, "leaves": [node_id in text order]}."""
        k = (corpus_id, len(text))
        if k in self._trees:
            return self._trees[k]
        require("llama_index.core", "llama-index-core")
        from llama_index.core.node_parser import HierarchicalNodeParser, get_leaf_nodes

        llama_index_offline()
        parser = HierarchicalNodeParser.from_defaults(chunk_sizes=list(self.chunk_sizes))
        nodes = parser.get_nodes_from_documents([_llama_document(text, corpus_id)])
        by_id = {n.node_id: n for n in nodes}
        span: dict[str, Span] = {}
        loc = Locator(text)

        def place(ids: list[str], lo: int | None, hi: int | None) -> None:
            loc.cursor = loc.prev_end = 0
            for nid in ids:  # siblings in order, overlapping by up to `chunk_overlap` tokens
                got = loc.find(by_id[nid].get_content(), overlap=True, lo=lo, hi=hi)
                if got is not None:
                    span[nid] = got
            for nid in ids:
                kids = [c.node_id for c in (by_id[nid].child_nodes or [])]
                if kids and nid in span:
                    place(kids, *span[nid])

        roots = [n.node_id for n in nodes if n.parent_node is None]
        place(roots, None, None)
        leaves = [n.node_id for n in get_leaf_nodes(nodes) if n.node_id in span]
        leaves.sort(key=lambda nid: span[nid])
        self._trees[k] = {"nodes": nodes, "span": span, "leaves": leaves}
        return self._trees[k]

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        t = self.tree(corpus_id, text)
        return [t["span"][nid] for nid in t["leaves"]]

    def merger(self, texts: dict[str, str]):
        """-> (merge(hits) -> merged hits, through AutoMergingRetriever)."""
        from llama_index.core import StorageContext
        from llama_index.core.retrievers import AutoMergingRetriever, BaseRetriever
        from llama_index.core.schema import NodeWithScore, QueryBundle
        from llama_index.core.storage.docstore import SimpleDocumentStore

        docstore = SimpleDocumentStore()
        leaf_of: dict[tuple[str, int, int], object] = {}
        where: dict[str, tuple[str, int, int]] = {}
        for doc in sorted(texts):
            t = self.tree(doc, texts[doc])
            docstore.add_documents(t["nodes"], allow_update=True)
            by_id = {n.node_id: n for n in t["nodes"]}
            for nid, (s, e) in t["span"].items():
                where[nid] = (doc, s, e)
            for nid in t["leaves"]:
                leaf_of.setdefault((doc, *t["span"][nid]), by_id[nid])

        class Precomputed(BaseRetriever):
            current: list = []

            def _retrieve(self, query_bundle):
                return list(self.current)

        base = Precomputed()
        amr = AutoMergingRetriever(base, StorageContext.from_defaults(docstore=docstore), simple_ratio_thresh=0.5)

        def merge(hits) -> list:
            base.current = [NodeWithScore(node=leaf_of[(h[0], h[1], h[2])], score=float(h[4])) for h in hits]
            out = []
            for nws in amr.retrieve(QueryBundle(query_str="", embedding=[0.0])):
                doc, s, e = where[nws.node.node_id]
                out.append((doc, s, e, self._count(texts, doc, s, e), float(nws.score), 0))
            return out

        return merge

    def retrieval_views(self, chunks, ranked, selectors, cutter):
        """k=K: the top-K leaves merged (each K its own base); budgets: the deepest ranking merged."""
        merge = self.merger(cutter.texts)
        views = []
        for sel in selectors:
            kind, value = sel.split("=")
            if kind == "k":
                views.append((f"top{value}", [merge(h[: int(value)]) for h in ranked], [sel]))
        budgets = [s for s in selectors if s.startswith("budget=")]
        if budgets:
            views.append(("deep", [merge(h) for h in ranked], budgets))
        return views
