"""The rerank stage (engine.rerank): the batched stage against a pair-by-pair loop on random ragged batches (empty
candidate lists, N larger than the candidates, token budgets), the engine's hook against the same loop over the
first stage's chunks, and the loader's refusals. The cross-encoder is a tiny random one (tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qasc.kernels.reference as ref
from qasc.engine.assemble import ChunkColumns
from qasc.engine.columns import RERANK_COLUMNS, RESULT_COLUMNS
from qasc.engine.errors import QascError
from qasc.engine.rerank import Reranker, first_stage_params
from tests.engine.test_query import QUESTIONS

WORDS = ["bread", "the", "lighthouse", "lens", "solar", "battery", "crust", "of", "proof", "an", "Fresnel", "dough"]


@pytest.fixture(scope="module")
def reranker(tiny_cross_encoder) -> Reranker:
    return Reranker(tiny_cross_encoder, "cpu", top=4)


def pair_score(reranker: Reranker, question: str, text: str) -> float:
    """One pair, one forward: no padding, no batch."""
    enc = reranker.tokenizer(question, text, truncation="longest_first", max_length=reranker.max_length,
                             return_tensors="pt")
    with torch.inference_mode():
        return float(reranker.model(**enc).logits[0, 0])


def reference_rerank(reranker, cols: ChunkColumns, questions, paths, top, top_k, budget) -> list[list[tuple]]:
    """Per query: its first `top` chunks by first-stage rank, each pair scored alone, fused by the loop twin,
    ordered by fused score (ties: first-stage rank), then top_k and the budget (stop at the first overflow) ->
    (chunk index in cols, rank, cross score) per kept chunk."""
    out = []
    for q in range(cols.n_queries):
        mine = sorted((int(cols.rank[j]), j) for j in np.flatnonzero(cols.query == q))
        mine = [j for _, j in mine][:top]
        cross = [pair_score(reranker, questions[q], f"{paths[j]}\n{cols.text[j]}" if paths[j] else cols.text[j])
                 for j in mine]
        fused = ref.rerank_scores(torch.tensor([[float(cols.score[j]) for j in mine]]), torch.tensor([cross]),
                                  torch.ones(1, len(mine), dtype=torch.bool))[0].tolist() if mine else []
        order = sorted(range(len(mine)), key=lambda i: (-fused[i], i))
        kept, used = [], 0
        for i in order:
            if top_k is not None and len(kept) >= top_k:
                break
            used += int(cols.n_tokens[mine[i]])
            if budget is not None and used > budget:
                break
            kept.append((mine[i], len(kept), cross[i]))
        out.append(kept)
    return out


@st.composite
def first_stages(draw: st.DrawFn):
    """A slice's first-stage chunks: Q queries, 0..7 chunks each (first-stage rank order, distinct scores), texts of
    1..80 words, a heading path or none, a few seeds each."""
    q = draw(st.integers(0, 4))
    counts = [draw(st.one_of(st.just(0), st.integers(0, 7))) for _ in range(q)]
    query = np.repeat(np.arange(q), counts).astype(np.int64)
    rank = np.concatenate([np.arange(c) for c in counts]).astype(np.int32) if q else np.zeros(0, np.int32)
    m = len(query)
    scores = [sorted(draw(st.lists(st.integers(0, 1000), min_size=c, max_size=c, unique=True)), reverse=True)
              for c in counts]
    text = [" ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=80))) for _ in range(m)]
    paths = [draw(st.sampled_from(["", "Baking > Bread", "Lighthouses"])) for _ in range(m)]
    seeds = [draw(st.lists(st.integers(0, 50), max_size=3)) for _ in range(m)]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seeds])]).astype(np.int32)
    i64 = np.arange(m, dtype=np.int64)
    cols = ChunkColumns(
        n_queries=q, query=query, rank=rank, doc=i64 % 3, char_start=i64, char_end=i64 + 1,
        score=np.asarray([s / 1000 for row in scores for s in row], np.float32),
        n_tokens=np.asarray([draw(st.integers(1, 60)) for _ in range(m)], np.int32),
        sentence_start=i64.astype(np.int32), sentence_end=i64.astype(np.int32), seed_offsets=offsets,
        seed_ids=np.asarray([x for s in seeds for x in s], np.int32), text=text)
    questions = [" ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12))) for _ in range(q)]
    return cols, questions, paths


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                                   HealthCheck.data_too_large])
@given(case=first_stages(), top=st.integers(1, 9), top_k=st.sampled_from([None, 1, 3]),
       budget=st.sampled_from([None, 40, 150]))
def test_batched_stage_equals_pair_by_pair(reranker, case, top, top_k, budget) -> None:
    cols, questions, paths = case
    reranker.top = top
    got = reranker.rerank(cols, questions, paths, top_k, budget)
    want = reference_rerank(reranker, cols, questions, paths, top, top_k, budget)
    flat = [k for kept in want for k in kept]
    assert got.n_queries == cols.n_queries and len(got) == len(flat)
    take = np.asarray([j for j, _, _ in flat], np.int64)
    assert got.query.tolist() == cols.query[take].tolist()
    assert got.rank.tolist() == [r for _, r, _ in flat]
    assert got.char_start.tolist() == cols.char_start[take].tolist() and got.text == [cols.text[j] for j in take]
    assert got.score.tolist() == cols.score[take].tolist()
    np.testing.assert_allclose(got.rerank, [s for _, _, s in flat], rtol=1e-4, atol=1e-4)
    seeds = [cols.seed_ids[cols.seed_offsets[j]:cols.seed_offsets[j + 1]].tolist() for j in take]
    assert [got.seed_ids[a:b].tolist() for a, b in zip(got.seed_offsets[:-1], got.seed_offsets[1:],
                                                        strict=True)] == seeds


def test_buckets_cut_by_padded_tokens(reranker) -> None:
    lengths = np.asarray([500, 3, 7, 7, 120, 1, 300, 9])
    buckets = reranker.buckets(lengths)
    assert sorted(np.concatenate(buckets).tolist()) == list(range(len(lengths)))
    for b in buckets:
        assert len(b) * lengths[b].max() <= reranker.batch_tokens and lengths[b[-1]] == lengths[b].max()
    assert [lengths[b].max() for b in buckets] == sorted(lengths[b].max() for b in buckets)


@pytest.fixture(scope="module")
def engines(demo_store, tiny_cross_encoder):
    from qasc.engine.query import Engine

    return Engine.open(str(demo_store)), Engine.open(str(demo_store), reranker=tiny_cross_encoder, rerank_top=6)


@pytest.mark.slow
def test_engine_hook_equals_the_loop_over_the_first_stage(engines) -> None:
    """Engine.query with the stage == the loop above over the first stage's chunks (top_k = rerank_top)."""
    off, on = engines
    params = off.config.qasc
    first = off.query_columns(off.embed_queries(QUESTIONS), first_stage_params(params, 6), questions=QUESTIONS)
    cols = ChunkColumns.concat([c for _, c in first])
    store = off.store
    rows = np.asarray(store.doc_offsets)[cols.doc] + cols.sentence_start
    paths = [store.heading_paths[h] if h >= 0 else "" for h in np.asarray(store.row_heading)[rows].tolist()]
    assert any(paths)  # the demo corpus has headings: the reranker reads them
    want = reference_rerank(on.reranker, cols, QUESTIONS, paths, 6, params.top_k, params.budget_tokens)
    got = on.query(QUESTIONS)
    for chunks, kept in zip(got, want, strict=True):
        assert [(c.doc_id, c.char_start, c.char_end) for c in chunks] == [
            (store.doc_ids[cols.doc[j]], cols.char_start[j], cols.char_end[j]) for j, _, _ in kept]
        np.testing.assert_allclose([c.rerank_score for c in chunks], [s for _, _, s in kept], rtol=1e-4, atol=1e-4)
    assert sum(len(x) for x in got) > 0


@pytest.mark.slow
def test_engine_columns_off_and_on(engines) -> None:
    off, on = engines
    emb = off.embed_queries(QUESTIONS[:2])
    batch_off = next(off.query_batches(emb, questions=QUESTIONS[:2]))
    assert tuple(batch_off.schema.names) == RESULT_COLUMNS
    assert all(c.rerank_score is None for cs in off.query(QUESTIONS[:2]) for c in cs)
    batch_on = next(on.query_batches(emb, questions=QUESTIONS[:2]))
    assert tuple(batch_on.schema.names) == RESULT_COLUMNS + RERANK_COLUMNS
    assert set(batch_on.column("reranker").to_pylist()) == {on.reranker.name}
    assert batch_on.column("rerank_score").null_count == 0
    with pytest.raises(QascError, match="reads the questions"):
        on.query_embedded(emb)


@pytest.mark.parametrize("kind", ["missing", "file", "empty", "base_model", "two_labels", "hub_offline"])
def test_loader_refuses_what_is_no_cross_encoder(tmp_path, kind, monkeypatch) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    from qasc.engine.embedder import resolve_model_path
    from qasc.engine.rerank import resolve_reranker

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = {"missing": str(tmp_path / "none"), "file": str(tmp_path / "model.bin"), "empty": str(tmp_path),
            "base_model": resolve_model_path(None), "two_labels": str(tmp_path / "two"),
            "hub_offline": "cross-encoder/ms-marco-MiniLM-L-6-v2"}[kind]
    (tmp_path / "model.bin").write_bytes(b"x")
    if kind == "two_labels":
        config = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8,
                            vocab_size=50, num_labels=2)
        BertForSequenceClassification(config).save_pretrained(name)
    message = {"missing": "no such folder", "file": "not a folder", "empty": "not a transformers model folder",
               "base_model": "not a sequence classifier", "two_labels": "2 labels",
               "hub_offline": "the model hub is offline"}[kind]
    with pytest.raises(QascError, match=message) as info:
        resolve_reranker(name)
    assert name in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_retrievers_take_the_reranker(demo_store, tiny_cross_encoder, engines) -> None:
    """LangChain / LlamaIndex: reranker= opens the store with the stage (the engine's answers, its metadata keys);
    with an opened engine it is refused (the engine keeps its own)."""
    lc = pytest.importorskip("qasc.engine.integrations.langchain", exc_type=ImportError)
    li = pytest.importorskip("qasc.engine.integrations.llamaindex", exc_type=ImportError)
    _, on = engines
    want = on.query([QUESTIONS[1]])[0]
    docs = lc.QascRetriever(store=str(demo_store), device="cpu", reranker=tiny_cross_encoder).invoke(QUESTIONS[1])
    nodes = li.QascRetriever(store=str(demo_store), device="cpu", reranker=tiny_cross_encoder).retrieve(QUESTIONS[1])
    assert len(docs) == len(nodes) == len(want) > 0
    for doc, node, chunk in zip(docs, nodes, want, strict=True):
        assert doc.page_content == node.node.text == chunk.text
        assert doc.metadata["reranker"] == tiny_cross_encoder
        assert doc.metadata["rerank_score"] == pytest.approx(chunk.rerank_score, rel=1e-4, abs=1e-4)
    assert "reranker" not in lc.QascRetriever(engine=engines[0]).invoke(QUESTIONS[1])[0].metadata  # off: as before
    with pytest.raises(ValueError, match="reranker= opens the store"):
        lc.QascRetriever(engine=on, reranker=tiny_cross_encoder)
