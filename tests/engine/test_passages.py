"""Passages (format 3) and the budget fill: packing, the fill rule, ingest -> store -> query, older stores."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.passages import fill_budget, pack_passages
from qasc.engine.query import Engine
from qasc.engine.store import IngestConfig, Store, ingest, verify_store
from qasc.engine.store.files import file_digest
from qasc.kernels.params import QascParams
from tests.engine.test_lexical_store import drop_term_counts
from tests.engine.test_store import write_corpus

DOCS = {
    "cats": "# Cats\n\nCats are small carnivorous mammals. They are often kept as pets. Cats sleep a lot during the "
            "day.\n\nDomestic cats hunt mice. They communicate by meowing and purring.\n",
    "dogs": "# Dogs\n\nDogs are loyal animals. They were domesticated from wolves. Dogs need daily walks.\n\n"
            "Dogs can be trained to herd sheep. Some dogs guide blind people. Herding dogs work with farmers.\n",
}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 60)), max_size=40), st.integers(1, 100))
def test_passages_tile_a_document_within_paragraphs_and_the_cap(rows, cap):
    steps, tokens = zip(*rows, strict=True) if rows else ((), ())
    paragraph = np.cumsum([0, *steps[1:]]) if rows else np.zeros(0, np.int64)
    n_tokens = np.asarray(tokens, np.int64)
    first, count = pack_passages(paragraph, n_tokens, cap)
    assert count.sum() == len(rows) and (count > 0).all()
    assert np.array_equal(first, np.concatenate([[0], np.cumsum(count)[:-1]]) if len(first) else first)
    for a, c in zip(first.tolist(), count.tolist(), strict=True):
        assert len(set(paragraph[a : a + c].tolist())) == 1  # never across a paragraph break
        assert c == 1 or n_tokens[a : a + c].sum() <= cap  # within the cap unless one row alone exceeds it
        nxt = a + c
        if nxt < len(rows) and paragraph[nxt] == paragraph[a]:  # closed early only when the next row overflows
            assert n_tokens[a : nxt + 1].sum() > cap


def test_fill_skips_what_is_taken_and_cuts_at_the_budget():
    first, count = np.array([0, 3, 6]), np.array([3, 3, 2])
    tokens = np.array([10, 10, 10, 10, 10, 10, 10, 10])
    # passage 1 (rows 3-5) overlaps the taken chunk (row 4): its free runs 3 and 5 are added separately
    got = fill_budget([(4, 4)], 10, 45, [1, 0, 2], [0.9, 0.8, 0.7], first, count, tokens)
    assert got == [(3, 3, 10, 0.9), (5, 5, 10, 0.9), (0, 0, 10, 0.8)]  # 10 + 30 = 40: row 1 would pass 45
    assert fill_budget([], 0, 100, [2, 0], [1.0, 0.5], first, count, tokens) == [(6, 7, 20, 1.0), (0, 2, 30, 0.5)]
    assert fill_budget([(0, 7)], 80, 100, [0, 1, 2], [1, 1, 1], first, count, tokens) == []  # all taken
    assert fill_budget([], 0, 5, [0], [1.0], first, count, tokens) == []  # not one row fits


def test_fill_goes_on_after_a_unit_that_does_not_fit():
    first, count = np.array([0, 3, 4]), np.array([3, 1, 1])
    tokens = np.array([10, 10, 10, 30, 5])
    # unit 0 is cut after two rows (20 of 28); unit 1 (30 tokens) does not fit; unit 2 (5) still does
    assert fill_budget([], 0, 28, [0, 1, 2], [0.9, 0.8, 0.7], first, count, tokens) == [(0, 1, 20, 0.9),
                                                                                         (4, 4, 5, 0.7)]


def test_fill_diversity_reaches_another_section_first():
    first, count = np.array([0, 2, 4]), np.array([2, 2, 2])
    tokens = np.full(6, 10)
    sections = np.array([7, 7, 7, 7, 9, 9])  # units 0 and 1 in section 7, unit 2 in section 9
    ranked, scores = [1, 2, 0], [0.90, 0.88, 0.80]
    by_score = fill_budget([(0, 0)], 10, 100, ranked, scores, first, count, tokens, sections, 0.0)
    assert [p[0] for p in by_score] == [2, 4, 1]
    # the returned chunk (row 0) is in section 7: unit 1 counts 0.90 - 0.05 < 0.88, so section 9 comes first;
    # then unit 1 (0.85) beats unit 0 (0.75); the pieces keep their own scores
    diverse = fill_budget([(0, 0)], 10, 100, ranked, scores, first, count, tokens, sections, 0.05)
    assert diverse == [(4, 5, 20, 0.88), (2, 3, 20, 0.90), (1, 1, 10, 0.80)]
    assert fill_budget([(0, 0)], 10, 100, ranked, scores, first, count, tokens, None, 0.05) == by_score


def reference_fill(taken, used, budget, ranked, scores, first, count, n_tokens, groups, diversity):
    """fill_budget's rule, slowly: each step takes the best remaining unit by score - diversity x [its first row's
    group is seen] (ties: rank order), adds its free rows in order while they fit, and goes on."""
    covered = {r for a, b in taken for r in range(a, b + 1)}
    seen = {int(groups[a]) for a, _ in taken}
    left = list(zip(ranked, scores, strict=True))
    out = []
    while left and used < budget:
        value = [sc - (diversity if int(groups[first[p]]) in seen else 0.0) for p, sc in left]
        k = max(range(len(left)), key=lambda j: (value[j], -j))
        p, sc = left.pop(k)
        seen.add(int(groups[first[p]]))
        piece: list[int] = []
        for r in range(int(first[p]), int(first[p] + count[p])):
            if r in covered:
                if piece:
                    out.append((piece[0], piece[-1], int(n_tokens[piece].sum()), sc))
                    piece = []
                continue
            if used + n_tokens[r] > budget:
                break
            piece.append(r)
            covered.add(r)
            used += int(n_tokens[r])
        if piece:
            out.append((piece[0], piece[-1], int(n_tokens[piece].sum()), sc))
    return out


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fill_never_overlaps_and_never_passes_the_budget(data):
    n = data.draw(st.integers(1, 30))
    tokens = np.asarray(data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n)), np.int64)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=8)) if n > 1 else []))
    first = np.asarray([0, *cuts], np.int64)
    count = np.diff(np.asarray([*first.tolist(), n]))
    taken_rows = sorted(set(data.draw(st.lists(st.integers(0, n - 1), max_size=5))))
    taken = [(r, r) for r in taken_rows]
    used = int(tokens[taken_rows].sum()) if taken_rows else 0
    budget = data.draw(st.integers(0, 200))
    ranked = data.draw(st.permutations(range(len(first))))
    scores = sorted(data.draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=len(ranked),
                                       max_size=len(ranked))), reverse=True)
    sections = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int64)
    diversity = data.draw(st.sampled_from([0.0, 0.25, 2.0]))
    got = fill_budget(taken, used, budget, ranked, scores, first, count, tokens, sections, diversity)
    assert got == reference_fill(taken, used, budget, ranked, scores, first, count, tokens, sections, diversity)
    rows = [r for a, b, _, _ in got for r in range(a, b + 1)]
    assert len(rows) == len(set(rows)) and not set(rows) & set(taken_rows)
    assert all(t == tokens[a : b + 1].sum() for a, b, t, _ in got)
    total = used + sum(t for _, _, t, _ in got)
    assert total <= max(budget, used)
    # the fill goes on past a unit that does not fit: a unit left wholly untouched is one whose first row does
    # not fit what is left
    touched = set(rows) | set(taken_rows)
    for a, c in zip(first.tolist(), count.tolist(), strict=True):
        if not touched & set(range(a, a + c)):
            assert total + tokens[a] > budget


@pytest.fixture(scope="module")
def cat_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("passages")
    src = write_corpus(tmp / "src", DOCS)
    ingest([str(src)], tmp / "store")
    return tmp / "store"


def test_ingest_stores_passages_that_tile_the_rows(cat_store):
    store = Store.open(cat_store)
    p = store.passages
    assert store.manifest["format_version"] == 3 and store.manifest["splitter"]["passage_tokens"] == 128
    assert int(p.count.sum()) == len(store.embeddings) and p.emb.shape == (len(p.first), 384)
    norms = np.linalg.norm(np.asarray(p.emb, np.float32), axis=1)
    assert np.allclose(norms, 1.0, atol=1e-3)
    assert all(ok for _, ok, _ in verify_store(cat_store))


def test_budget_fill_adds_passages_up_to_the_budget(cat_store):
    engine = Engine.open(str(cat_store))
    q = ["How do cats communicate?"]
    plain = engine.query(q, QascParams(budget_tokens=60, budget_fill=False))[0]
    filled = engine.query(q, QascParams(budget_tokens=60))[0]
    assert [c.text for c in filled[: len(plain)]] == [c.text for c in plain]  # the chunks first, unchanged
    assert len(filled) > len(plain) and sum(c.n_tokens for c in filled) <= 60
    assert sum(c.n_tokens for c in filled) > sum(c.n_tokens for c in plain)
    docs = {d.doc_id: d.text for d in engine.store.docs}
    spans = []
    for c in filled:
        assert docs[c.doc_id][c.char_start : c.char_end] == c.text
        spans.append((c.doc_id, c.char_start, c.char_end))
    for i, (d, a, b) in enumerate(spans):  # no two returned chunks share a character
        assert all(d != e or b <= x or y <= a for e, x, y in spans[i + 1 :])
    assert engine.query(q)[0] == engine.query(q, QascParams(budget_fill=False))[0]  # no budget: no fill


def test_passages_load_only_for_a_budget_fill(cat_store):
    engine = Engine.open(str(cat_store))
    q = ["How do cats communicate?"]
    engine.query(q)  # no budget
    engine.query(q, QascParams(budget_tokens=60, budget_fill=False))  # a budget without the fill
    assert ("passage_tier",) not in engine._tables and engine.store._passages is None  # neither tier nor table
    engine.query(q, QascParams(budget_tokens=60))
    tier = engine._tables[("passage_tier",)]
    assert tier is not None and tier is not False and len(tier) == len(engine.store.passages.first)
    assert not isinstance(tier._texts, list)  # the texts are sliced for the lexical index, not held
    index = tier.lexical()
    assert index is tier.lexical()  # built once


def test_a_store_without_passages_returns_the_chunks_alone(tmp_path, cat_store):
    src = write_corpus(tmp_path / "src", DOCS)
    ingest([str(src)], tmp_path / "store", settings=IngestConfig(passage_tokens=0))
    store = Store.open(tmp_path / "store")
    assert len(store.passages.first) == 0 and "passage_tokens" not in store.manifest["splitter"]
    engine = Engine.open(str(tmp_path / "store"))
    q = ["How do cats communicate?"]
    assert engine.passage_tier() is None
    assert engine.query(q, QascParams(budget_tokens=60))[0] == engine.query(
        q, QascParams(budget_tokens=60, budget_fill=False))[0]
    with pytest.raises(QascError, match="passage_tokens"):  # appending with passages would mix the settings
        ingest([str(write_corpus(tmp_path / "more", {"c": "More text here."}))], tmp_path / "store",
               settings=IngestConfig(passage_tokens=64))
    with pytest.raises(QascError, match="--passage-tokens"):
        ingest([str(src)], tmp_path / "other", settings=IngestConfig(passage_tokens=-1))


def downgrade_to_format_2(root) -> None:
    """Rewrite a store as format 2 wrote it: no passages files, no passage_tokens, manifest version 2."""
    drop_term_counts(root)  # saved term counts came later still
    m = json.loads((root / "manifest.json").read_text())
    for shard in m["shards"]:
        (root / shard["passages"]).unlink()
        m["checksums"].pop(shard.pop("passages"))
        shard.pop("n_passages")
    m["splitter"].pop("passage_tokens")
    m["format_version"] = 2
    (root / "manifest.json").write_text(json.dumps(m))


def test_format_2_store_opens_without_passages_and_appends_without_them(tmp_path, tiny_model):
    src = write_corpus(tmp_path / "src", DOCS)
    ingest([str(src)], tmp_path / "store", EngineConfig(embedder=EmbedderConfig(model=tiny_model)))
    downgrade_to_format_2(tmp_path / "store")
    old = Store.open(tmp_path / "store")
    assert old.manifest["format_version"] == 2 and len(old.passages.first) == 0
    assert all(ok for _, ok, _ in verify_store(tmp_path / "store"))
    ingest([str(write_corpus(tmp_path / "more", {"c": "More text here. And more."}))], tmp_path / "store")
    both = Store.open(tmp_path / "store")
    assert len(both.passages.first) == 0 and "passage_tokens" not in both.manifest["splitter"]
    assert all(ok for _, ok, _ in verify_store(tmp_path / "store"))


def test_damaged_passages_are_refused(tmp_path, tiny_model):
    src = write_corpus(tmp_path / "src", DOCS)
    ingest([str(src)], tmp_path / "store", EngineConfig(embedder=EmbedderConfig(model=tiny_model)))
    m = json.loads((tmp_path / "store" / "manifest.json").read_text())
    rel = m["shards"][0]["passages"]
    table = pq.read_table(tmp_path / "store" / rel)
    bad = table.set_column(1, "count", pa.array(table.column("count").to_numpy()[::-1] + 1, pa.int32()))
    pq.write_table(bad, tmp_path / "store" / rel)
    m["checksums"][rel] = file_digest(tmp_path / "store" / rel)  # a consistent manifest: the content is wrong
    (tmp_path / "store" / "manifest.json").write_text(json.dumps(m))
    store = Store.open(tmp_path / "store")  # the sentences are intact: the store opens, its passages do not
    with pytest.raises(QascError, match="do not tile"):
        _ = store.passages
    assert not all(ok for _, ok, _ in verify_store(tmp_path / "store"))


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 5), st.integers(1, 40), st.integers(1, 70), st.integers(1, 9), st.integers(0, 2**16))
def test_blocked_cosine_scan_equals_the_dense_top_k(n_q, n_p, k, block, seed):
    import torch

    from qasc.engine import fill
    from qasc.engine.passages import Passages

    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(n_p, 8, generator=g), dim=1)
    emb[n_p // 2] = emb[0]  # a tie: the lower id first
    query = torch.randn(n_q, 8, generator=g)
    tier = fill.PassageTier(Passages(np.arange(n_p), np.ones(n_p, np.int32), np.ones(n_p, np.int32), emb.numpy()),
                            ["x"] * n_p, torch.device("cpu"), None)
    old = fill.PASSAGE_BLOCK_ELEMENTS
    fill.PASSAGE_BLOCK_ELEMENTS = block
    try:
        cos, ids = tier.top_cosine(query, min(k, n_p))
    finally:
        fill.PASSAGE_BLOCK_ELEMENTS = old
    dense = query @ emb.T
    order = torch.sort(dense, dim=1, descending=True, stable=True).indices[:, : min(k, n_p)]
    assert torch.allclose(cos, dense.gather(1, order), atol=1e-6)
    assert torch.allclose(dense.gather(1, ids), cos, atol=1e-6)
    tied = (cos[:, 1:] == cos[:, :-1]) & (cos[:, 1:] > cos[:, -1:])  # ties inside the top k: in id order
    assert bool((ids[:, 1:] > ids[:, :-1])[tied].all())
    assert ids.shape == (n_q, min(k, n_p)) and all(len(set(r)) == len(r) for r in ids.tolist())


def test_the_harness_budget_view_is_the_engines_fill(cat_store):
    """qasc eval scores QASC's token budgets by composing a neutral pass with the engine's fill units; without
    a token cutter (an overflowing chunk dropped, as the engine's budget rule does) and with the setting's fill
    diversity that is the engine's answer with the same score margin (for budgets of at least max_tokens: a
    smaller budget also caps the engine's chunks): by default the shipped margin, as `qasc query --budget-tokens`
    keeps its chunks."""
    from qasc.jobs.eval import qasc as Q
    from qasc.jobs.eval.qasc import BudgetFill, chunks_to_hits

    engine = Engine.open(str(cat_store))
    questions = ["How do cats communicate?", "What do dogs do for farmers?", "Which animals sleep a lot?"]
    emb = engine.embed_queries(questions)
    for params in (QascParams(), QascParams(lexical_weight=0.0),
                   QascParams(fill_diversity=0.0), QascParams(fill_diversity=0.5)):
        neutral = params.replace(**Q.NEUTRAL, max_tokens=20)
        units: list = []
        ranked = chunks_to_hits(engine.query_embedded(emb, neutral, questions=questions, fill_units=units))
        assert len(units) == len(questions)
        for budget in (20, 40, 90):
            for margin, top_k in ((Q.BUDGET_MARGIN, Q.BUDGET_TOP_K), (None, None), (0.0, None), (None, 1)):
                budgeted = neutral.replace(budget_tokens=budget, score_margin=margin, top_k=top_k)
                want = chunks_to_hits(engine.query_embedded(emb, budgeted, questions=questions))
                got = BudgetFill(engine, margin, top_k).hits(ranked, units, budget, None, neutral.fill_diversity)
                assert got == want
    assert (Q.BUDGET_MARGIN, Q.BUDGET_TOP_K) == (QascParams().score_margin, QascParams().top_k)
    assert BudgetFill(engine).margin == Q.BUDGET_MARGIN and BudgetFill(engine).top_k == Q.BUDGET_TOP_K


def test_fill_units_take_rows_only_below_the_spread_gate(cat_store):
    import torch

    from qasc.engine.fill import merge_units

    engine = Engine.open(str(cat_store))
    tier = engine.passage_tier()
    q = engine.embed_queries(["How do cats communicate?", "Dogs?"])
    ids, scores = tier.rank(q, QascParams(), None, None)
    rows = torch.tensor([[0, 1, 2], [3, 4, 0]])
    valid = torch.tensor([[True, True, False], [True, True, True]])
    row_score = torch.tensor([[9.0, 0.0, 5.0], [9.0, 8.0, 7.0]])
    spread = torch.tensor([0.05, 0.5])
    on = valid & (spread < 0.1)[:, None]
    units = merge_units(tier, ids, scores, rows, on, row_score)
    assert units[0].first[0] == 0 and units[0].count[0] == 1 and units[0].score[0] == 9.0  # the best, a row
    assert 5.0 not in units[0].score.tolist() and 0.0 in units[0].score.tolist()  # row 2 is invalid, row 1 is not
    assert len(units[1].first) == len(tier)  # gate closed: passages only
    assert all(bool((np.diff(u.score) <= 0).all()) for u in units)


def test_passages_of_many_shards_read_into_one_array(tmp_path, tiny_model):
    """Store.passages reads shard by shard into one preallocated array: the same values, order and dtype as each
    shard's own passages concatenated; a passages file gone missing is a clear error."""
    from qasc.engine.store.reader import load_passages

    docs = {f"{name}{i}": text for i in range(3) for name, text in DOCS.items()}  # six documents, one per shard
    src = write_corpus(tmp_path / "src", docs)
    ingest([str(src)], tmp_path / "store", EngineConfig(embedder=EmbedderConfig(model=tiny_model)),
           IngestConfig(dtype_store="float16", shard_chars=100))
    store = Store.open(tmp_path / "store")
    shards = store.manifest["shards"]
    assert len(shards) >= 3
    p = store.passages
    parts, row = [], 0
    for shard in shards:
        parts.append(load_passages(store.path, shard, store.manifest, row))
        row += int(shard["n_sentences"])
    assert p.emb.dtype == np.float16 and p.emb.shape == (sum(len(q.first) for q in parts), 32)
    np.testing.assert_array_equal(p.first, np.concatenate([q.first for q in parts]))
    np.testing.assert_array_equal(p.count, np.concatenate([q.count for q in parts]))
    np.testing.assert_array_equal(p.n_tokens, np.concatenate([q.n_tokens for q in parts]))
    np.testing.assert_array_equal(p.emb, np.concatenate([np.asarray(q.emb) for q in parts]))
    (tmp_path / "store" / shards[-1]["passages"]).unlink()
    with pytest.raises(QascError, match="missing store file"):
        _ = Store.open(tmp_path / "store").passages
