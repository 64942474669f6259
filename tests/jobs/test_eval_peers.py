"""Peer baselines (jobs.eval.peers): exact offsets through the peers' own code, the sentence-window and
auto-merging recipes, determinism, and a clear error when a peer package is missing."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from qasc.engine.errors import QascError
from qasc.jobs.eval import peer_support as PS
from qasc.jobs.eval import peers as P
from qasc.jobs.eval.peer_methods import make_peer
from qasc.jobs.eval.retrieval import ChunkSet, TokenCutter

TEXT = (
    "# Lighthouses\n\nA lighthouse is a tower that emits light.   It guides ships at night. Fresnel lenses made "
    "the light visible from far away.\n\nKeepers lived in the towers. They trimmed the wicks every night. Storms "
    "tested them.\n\n# Sourdough\n\nSourdough bread rises with wild yeast. The starter is fed with flour and "
    "water.\nA long, cool proof develops flavour. Bake it hot! The crust darkens as sugars caramelise. Is it "
    "done? Tap the bottom.\n\n# Comets\n\nComets are icy bodies. Near the Sun they grow a coma and a tail. "
    "Halley's comet returns every 76 years. Its last visit was in 1986.  Its next is in 2061."
)
ABOUT = "d"


def squeeze(s: str) -> str:
    return "".join(ch for ch in s if not ch.isspace())


def check_spans(spans, text, overlap=False):
    assert spans, "no chunks"
    for s, e in spans:
        assert 0 <= s < e <= len(text)
        assert text[s:e] == text[s:e].strip()
    if not overlap:
        for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False):
            assert e0 <= s1, "chunks overlap or are out of order"
        # every non-whitespace character of the text lies in exactly one chunk
        assert "".join(squeeze(text[s:e]) for s, e in spans) == squeeze(text)


@pytest.fixture(scope="module")
def tok(embedder):
    return embedder.tokenizer


def test_locator_maps_normalised_pieces():
    text = "Alpha  beta.\n\nGamma delta.   Epsilon."
    loc = PS.Locator(text)
    assert loc.find("Alpha beta.") == (0, 12)
    assert loc.find("Gamma delta. Epsilon.") == (14, len(text))
    assert loc.find("   ") is None
    with pytest.raises(QascError, match="not found"):
        loc.find("Alpha")  # behind the cursor
    assert PS.exact_or_locate(text, ["Alpha beta.", "Gamma delta.", "Epsilon."], [0, 99, 29]) == [
        (0, 12), (14, 26), (29, 37)]


def test_locator_overlapping_siblings_in_repetitive_text():
    text = "abcdefghijklmnopqrstuvwxyz0123" * 8  # period 30, no whitespace
    loc = PS.Locator(text)
    first = loc.find(text[:90], overlap=True)
    second = loc.find(text[75:165], overlap=True)  # also occurs at 15 and 45: must be the one in `first`'s tail
    third = loc.find(text[150:240], overlap=True)
    assert (first, second, third) == ((0, 90), (75, 165), (150, 240))


@pytest.mark.parametrize("name", ["lc-semantic", "chonkie-semantic", "semchunk", "li-sentence-window"])
def test_peer_offsets_exact_and_deterministic(name, embedder, tok):
    pytest.importorskip({"lc-semantic": "langchain_experimental", "chonkie-semantic": "chonkie",
                         "semchunk": "semchunk", "li-sentence-window": "llama_index.core"}[name])
    chunker = P.Semchunk(24, tok) if name == "semchunk" else make_peer(name, embedder)
    assert chunker.family == "peer" and chunker.note and chunker.expensive
    spans = chunker.spans(ABOUT, TEXT)
    check_spans(spans, TEXT)
    assert len(spans) > 1
    assert chunker.spans(ABOUT, TEXT) == spans, "deterministic"


def test_semchunk_respects_its_size(tok):
    pytest.importorskip("semchunk")
    for size in (16, 32):
        spans = P.Semchunk(size, tok).spans(ABOUT, TEXT)
        check_spans(spans, TEXT)
        assert max(len(tok(TEXT[s:e], add_special_tokens=False)["input_ids"]) for s, e in spans) <= size


def test_chonkie_caps_chunks(embedder, tok):
    pytest.importorskip("chonkie")
    spans = P.ChonkieSemantic(embedder, chunk_size=20).spans(ABOUT, TEXT)
    check_spans(spans, TEXT)
    assert max(len(tok(TEXT[s:e], add_special_tokens=False)["input_ids"]) for s, e in spans) <= 30


def test_lc_semantic_maps_joined_sentences(embedder):
    pytest.importorskip("langchain_experimental")
    from langchain_experimental.text_splitter import SemanticChunker

    pieces = SemanticChunker(PS.langchain_embeddings(embedder)).split_text(TEXT)
    spans = P.LangChainSemantic(embedder).spans(ABOUT, TEXT)
    assert [squeeze(TEXT[s:e]) for s, e in spans] == [squeeze(p) for p in pieces if p.strip()]


def _chunkset(doc_spans: dict[str, list[tuple[int, int]]]) -> ChunkSet:
    ids, starts, ends = [], [], []
    for d, spans in doc_spans.items():
        ids += [d] * len(spans)
        starts += [s for s, _ in spans]
        ends += [e for _, e in spans]
    n = len(ids)
    return ChunkSet("x", ids, np.asarray(starts), np.asarray(ends), np.ones(n, np.int32), np.zeros((n, 2), np.float32))


def test_sentence_window_matches_llama_index_and_expands_hits(tok):
    pytest.importorskip("llama_index.core")
    from llama_index.core import Document
    from llama_index.core.node_parser import SentenceWindowNodeParser

    sw = P.SentenceWindow(tok)
    sents = sw.spans(ABOUT, TEXT)
    check_spans(sents, TEXT)
    nodes = SentenceWindowNodeParser.from_defaults(window_size=3).get_nodes_from_documents([Document(text=TEXT)])
    assert [squeeze(TEXT[s:e]) for s, e in sents] == [squeeze(n.text) for n in nodes]

    other = "Short doc. Two sentences."
    chunks = _chunkset({ABOUT: sents, "e": [(0, 10), (11, len(other))]})
    texts = {ABOUT: TEXT, "e": other}
    n = len(sents)

    def hit(d, i, score):
        s, e = (sents[i] if d == ABOUT else [(0, 10), (11, len(other))][i])
        return (d, s, e, 1, score, 0)

    ranked = [[hit(ABOUT, 5, 0.9), hit(ABOUT, 7, 0.8), hit("e", 1, 0.7), hit(ABOUT, 6, 0.6), hit(ABOUT, 0, 0.5),
               hit(ABOUT, n - 1, 0.4)]]
    (out,) = sw.expand(chunks, ranked, texts)
    # sentence 5's window is 2..8; 7's is 4..10 (kept: not covered); 6's (3..9) is covered by 2..10 -> dropped
    assert [(h[0], h[1], h[2]) for h in out] == [
        (ABOUT, sents[2][0], sents[8][1]), (ABOUT, sents[4][0], sents[10][1]), ("e", 0, len(other)),
        (ABOUT, sents[0][0], sents[3][1]), (ABOUT, sents[n - 4][0], sents[n - 1][1])]
    assert [h[4] for h in out] == [0.9, 0.8, 0.7, 0.5, 0.4], "rank order kept"
    assert out[0][5] == 7 and out[2][5] == 2 and out[3][5] == 4
    for d, s, e, ntok, _, _ in out:
        assert ntok == len(tok(texts[d][s:e], add_special_tokens=False)["input_ids"])
    # the window of sentence 5 is LlamaIndex's own window metadata
    assert squeeze(TEXT[out[0][1] : out[0][2]]) == squeeze(nodes[5].metadata["window"])
    views = sw.retrieval_views(chunks, ranked, ["k=1", "budget=100"], TokenCutter(tok, texts))
    assert views == [("chunks", [out], ["k=1", "budget=100"])]


@pytest.fixture(scope="module")
def automerge(tok):
    pytest.importorskip("llama_index.core")
    return P.AutoMerge(tok, chunk_sizes=(128, 64, 32))


def test_automerge_leaves_and_tree(automerge):
    leaves = automerge.spans(ABOUT, TEXT)
    check_spans(leaves, TEXT, overlap=True)
    assert leaves == sorted(leaves) and len(leaves) > 3
    covered = "".join(squeeze(TEXT[s:e]) for s, e in leaves)
    assert set(squeeze(TEXT)) <= set(covered)
    t = automerge.tree(ABOUT, TEXT)
    by_id = {n.node_id: n for n in t["nodes"]}
    for nid, (s, e) in t["span"].items():  # every node (parents too) is located verbatim, up to whitespace
        assert squeeze(TEXT[s:e]) == squeeze(by_id[nid].get_content())
    assert automerge.spans(ABOUT, TEXT) == leaves, "deterministic"


def test_automerge_merges_parents_like_llama_index(automerge, tok):
    t = automerge.tree(ABOUT, TEXT)
    by_id = {n.node_id: n for n in t["nodes"]}
    leaves = automerge.spans(ABOUT, TEXT)
    texts = {ABOUT: TEXT}
    merge = automerge.merger(texts)
    # a parent with >= 2 leaves: all of its leaves retrieved -> the parent comes back instead
    parent = next(n for n in t["nodes"] if n.child_nodes and len(n.child_nodes) >= 2
                  and all(by_id[c.node_id].child_nodes is None for c in n.child_nodes))
    kids = [t["span"][c.node_id] for c in parent.child_nodes]
    hits = [(ABOUT, s, e, 1, 0.9 - 0.1 * i, 0) for i, (s, e) in enumerate(kids)]
    out = merge(hits)
    assert (out[0][1], out[0][2]) in {t["span"][parent.node_id], t["span"].get(getattr(parent.parent_node, "node_id",
                                                                                            ""), (-1, -1))}
    assert out[0][3] == len(tok(TEXT[out[0][1] : out[0][2]], add_special_tokens=False)["input_ids"])
    # one far-apart leaf alone stays a leaf
    one = merge([(ABOUT, *leaves[-1], 1, 0.5, 0)])
    assert [(h[1], h[2]) for h in one] == [leaves[-1]]
    # views: one base per k (merging depends on k) and a deep one for budgets
    chunks = _chunkset({ABOUT: leaves})
    ranked = [[(ABOUT, s, e, 1, 1.0 - 0.01 * i, 0) for i, (s, e) in enumerate(leaves)]]
    views = automerge.retrieval_views(chunks, ranked, ["k=1", "k=3", "budget=50"], TokenCutter(tok, texts))
    assert [(b, sels) for b, _, sels in views] == [("top1", ["k=1"]), ("top3", ["k=3"]), ("deep", ["budget=50"])]
    assert [(h[1], h[2]) for h in views[0][1][0]] == [leaves[0]]


def test_missing_package_names_the_extra(monkeypatch, embedder, tok):
    monkeypatch.setitem(sys.modules, "semchunk", None)
    with pytest.raises(QascError, match=r"`semchunk`.*qasc\[eval\]"):
        P.Semchunk(64, tok).spans(ABOUT, TEXT)
    monkeypatch.setitem(sys.modules, "langchain_experimental", None)
    monkeypatch.setitem(sys.modules, "langchain_experimental.text_splitter", None)
    with pytest.raises(QascError, match=r"`langchain-experimental`.*qasc\[eval\]"):
        P.LangChainSemantic(embedder).spans(ABOUT, TEXT)


def test_harness_builds_every_peer(embedder):
    from qasc.jobs.eval import baselines as B
    from qasc.jobs.eval.config import EvalConfig
    from qasc.jobs.eval.methods import make_chunkers

    names = [m for m in B.DEFAULT_METHODS if m in P.PEER_METHODS]
    assert names == list(P.PEER_METHODS)
    chunkers = make_chunkers(names + ["semchunk-64"], embedder, None, EvalConfig(data_dir="unused"), print)
    assert [c.name for c in chunkers] == names + ["semchunk-64"]
    assert all(c.family == "peer" for c in chunkers)
    assert len({c.key() for c in chunkers}) == len(chunkers)


def test_own_semantic_chunker_is_capped():
    from qasc.jobs.eval import baselines as B

    spans = [(i * 10, i * 10 + 9) for i in range(6)]
    emb = np.tile(np.array([[1.0, 0.0]], np.float32), (6, 1))
    capped = B.SemanticChunker(lambda cid, text: (spans, emb, np.full(6, 100)), percentile=95)
    assert capped.version >= 2 and "t256" in capped.key()
    assert capped.spans("d", "x" * 60) == [(0, 19), (20, 39), (40, 59)]
