"""Hybrid retrievers (jobs.eval.hybrid) and the LangChain / LlamaIndex fusion pipelines (jobs.eval.pipelines):
names, exact spans, the RRF and BM25 rules, heading-prefixed embeddings, no network, and the harness end to end.

Fast: a hashing embedder (no model), the MiniLM tokenizer only, tiny texts."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from qasc.engine.errors import QascError
from qasc.jobs.eval import hybrid as H
from qasc.jobs.eval import pipelines as PL
from qasc.jobs.eval.config import EvalConfig
from qasc.jobs.eval.data import Question
from qasc.jobs.eval.harness import run_eval
from qasc.jobs.eval.methods import make_chunkers, parse_method
from qasc.jobs.eval.retrieval import EvalCache, build_chunkset, ranked_hits
from tests.jobs.test_eval_harness import HashEmbedder, write_dataset
from tests.jobs.test_eval_peers import TEXT, squeeze

OTHER = "# Tides\n\nThe Moon pulls the oceans. Two high tides a day. Spring tides follow a full moon."
CORPORA = {"d": TEXT, "e": OTHER}
ASKED = ["When does Halley's comet return?", "What feeds the sourdough starter?", "Why are there tides?"]
PIPELINES = ["lc-ensemble-120c", "li-fusion-48", "li-fusion-sentence-window"]
SIMPLE = ["dense-sentences", "bm25-sentences", "rrf-sentences", "dense-ctx-fixed-16", "bm25-ctx-recursive-120c",
          "rrf-ctx-sentences"]


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection attempt fails the test: nothing here may download (models, tokenizers, NLTK data)."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def embedder():
    return HashEmbedder()


def questions(texts=ASKED) -> list[Question]:
    return [Question(qid=i, text=t, corpus_id="d", evidence=((0, 1),)) for i, t in enumerate(texts)]


def ranked(name, embedder):
    (chunker,) = make_chunkers([name], embedder, None, EvalConfig(data_dir="unused"), print)
    chunks = build_chunkset(chunker, CORPORA, embedder, EvalCache(None))
    qs = questions()
    return chunker, chunks, chunker.rank(chunks, embedder.encode([q.text for q in qs]), qs, CORPORA, 12)


def test_names_parse_and_route():
    assert H.parse("rrf-ctx-recursive-400c") == ("rrf", True, "recursive-400c")
    assert H.parse("bm25-fixed-64") == ("bm25", False, "fixed-64")
    assert PL.parse("lc-ensemble-400c") == ("lc-ensemble", 400)
    assert PL.parse("li-fusion-128") == ("li-fusion", 128)
    assert PL.parse("li-fusion-sentence-window") == ("li-fusion-sentence-window", None)
    for bad in ("rrf-paragraphs", "bm25-fixed-0", "dense-ctx", "lc-ensemble-400", "li-fusion-x"):
        assert H.parse(bad) is None and PL.parse(bad) is None
        with pytest.raises(QascError, match="unknown method"):
            parse_method(bad)
    for name in PIPELINES + SIMPLE:
        assert parse_method(name) == ("peer", None)


@pytest.mark.parametrize("name", PIPELINES + SIMPLE)
def test_every_new_peer_returns_exact_spans(name, embedder):
    chunker, chunks, hits = ranked(name, embedder)
    assert chunker.family == "peer" and chunker.note and chunker.name == name
    spans = set(zip(chunks.doc_ids, chunks.starts.tolist(), chunks.ends.tolist(), strict=True))
    assert len(hits) == len(ASKED) and all(hits)
    for row in hits:
        assert len({(h[0], h[1], h[2]) for h in row}) == len(row) <= 12, "no repeated chunk"
        for d, s, e, n_tok, _, _ in row:
            assert (d, s, e) in spans
            doc = CORPORA[d]
            assert 0 <= s < e <= len(doc) and doc[s:e] == doc[s:e].strip()
            assert n_tok == len(embedder.tokenizer(doc[s:e], add_special_tokens=False)["input_ids"])
    again = chunker.rank(chunks, embedder.encode(ASKED), questions(), CORPORA, 12)
    assert [[h[:3] for h in r] for r in again] == [[h[:3] for h in r] for r in hits], "deterministic"


def test_llama_index_nodes_map_to_their_text(embedder):
    fusion = PL.LlamaIndexFusion(embedder, 48)
    nodes, spans = fusion.nodes("d", TEXT)
    assert len(nodes) > 2 and all(s is not None for s in spans)
    for n, (s, e) in zip(nodes, spans, strict=True):  # the node's text is the span's, up to whitespace
        assert squeeze(n.get_content()) == squeeze(TEXT[s:e])
    assert spans == sorted(spans) and spans[-1][1] == len(TEXT.rstrip())


def test_sentence_window_fusion_returns_llama_index_windows(embedder):
    from llama_index.core.postprocessor import MetadataReplacementPostProcessor
    from llama_index.core.schema import NodeWithScore

    chunker, chunks, hits = ranked("li-fusion-sentence-window", embedder)
    views = chunker.retrieval_views(chunks, hits, ["k=1"], type("Cutter", (), {"texts": CORPORA})())
    (_, windows, _), = views
    nodes, spans = chunker.nodes("d", TEXT)
    by_span = {s: n for n, s in zip(nodes, spans, strict=True)}
    d, s, e = hits[0][0][:3]
    (replaced,) = MetadataReplacementPostProcessor(target_metadata_key="window").postprocess_nodes(
        [NodeWithScore(node=by_span[(s, e)], score=1.0)])
    assert d == "d" and windows[0][0][0] == "d"
    assert squeeze(TEXT[windows[0][0][1] : windows[0][0][2]]) == squeeze(replaced.node.get_content())


def test_rrf_rule_and_bm25_drops_non_matches():
    fused = H.rrf([np.array([[3, 1, 2, -1]]), np.array([[1, 4, -1, -1]])], k=60)[0]
    assert [i for i, _ in fused] == [1, 3, 4, 2]  # 1: 1/62 + 1/61; 3 and 4 tie at 1/61 + 0 vs 1/62: 3 first
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)
    ids, scores = H.bm25_top(["the cat sat", "a dog barked", "cats and dogs"], ["cat", "zebra"], 3)
    assert ids[0].tolist() == [0, -1, -1] and scores[0, 0] > 0  # "cats" is not "cat": no stemming
    assert ids[1].tolist() == [-1, -1, -1]


def test_ctx_units_embed_their_heading_path(embedder):
    plain = H.SimpleRetriever("dense-sentences", embedder.tokenizer)
    ctx = H.SimpleRetriever("dense-ctx-sentences", embedder.tokenizer)
    spans = plain.spans("d", TEXT)
    assert ctx.spans("d", TEXT) == spans and ctx.key() != plain.key() == plain.base.key()
    heads = ctx.index_texts("d", TEXT, spans)
    comet = next(i for i, (s, _) in enumerate(spans) if TEXT[s:].startswith("Halley"))
    assert heads[comet] == "Comets\n" + TEXT[spans[comet][0] : spans[comet][1]]
    a = build_chunkset(plain, {"d": TEXT}, embedder, EvalCache(None))
    b = build_chunkset(ctx, {"d": TEXT}, embedder, EvalCache(None))
    np.testing.assert_array_equal(a.n_tokens, b.n_tokens)  # tokens of what is returned, not of the header
    np.testing.assert_allclose(b.emb, embedder.encode(heads))
    # dense over plain units is the harness's own dense ranking (the `sentences` baseline)
    _, chunks, hits = ranked("dense-sentences", embedder)
    assert hits == ranked_hits(chunks, embedder.encode(ASKED), 12)


def test_cached_vectors_embed_only_unknown_texts(embedder):
    vec = PL.CachedVectors(embedder, ["a  b\nc"], np.ones((1, embedder.dim), np.float32))
    before = embedder.encoded
    out = vec.encode(["a b c", "new text", "new   text"])
    assert embedder.encoded == before + 1 and vec.misses == 1
    np.testing.assert_array_equal(out[0], np.ones(embedder.dim))
    np.testing.assert_array_equal(out[1], out[2])


def test_harness_scores_the_new_methods(tmp_path, embedder):
    data = write_dataset(tmp_path / "data")
    methods = ("sentences", "rrf-sentences", "bm25-ctx-fixed-16", "lc-ensemble-60c", "li-fusion-32",
               "li-fusion-sentence-window")
    cfg = EvalConfig(data_dir=str(data), out_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                     methods=methods, ks=(1, 2), budgets=(20,), n_boot=20)
    res = run_eval(cfg, embedder=embedder, log=lambda m: None)
    held = res["heldout"]
    assert set(held) == set(methods) | {"sentences + same context"}  # own rankings get no dense re-ranking
    for name in methods:
        assert 0 <= held[name]["f1"]["mean"] <= 100 and held[name]["family"] in ("sentence", "peer")
        assert res["budget"][name]["20"]["tokens"] <= 20
    assert res["in_sample"]["rrf-sentences"]["recall"]["mean"] > 0
