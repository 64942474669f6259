"""Term counts saved at ingest (engine.store.lexical): the BM25 index made from them equals the one built from the
texts (sentences and passages, chroma-like and non-ASCII text), after an append and a resumed ingest too; a store
written before them (or by another term rule) opens and answers as before; verify catches damaged counts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.lexical import LexicalIndex, count_terms
from qasc.engine.query import Engine
from qasc.engine.store import IngestConfig, ResumableError, Store, file_digest, ingest, verify_store
from qasc.engine.store.lexical import PASSAGES, ROWS, passage_texts, row_texts, table_counts, terms_table
from qasc.kernels.params import QascParams
from tests.engine.test_store import write_corpus

DOCS = {
    "cats": "# Cats\n\nCats are small carnivorous mammals. They are often kept as pets. Cats sleep a lot during the "
            "day.\n\nDomestic cats hunt mice. They communicate by meowing and purring.\n",
    "dogs": "# Dogs\n\nDogs are loyal animals. They were domesticated from wolves. Dogs need daily walks.\n\n"
            "Dogs can be trained to herd sheep. Some dogs guide blind people. Herding dogs work with farmers.\n",
    "unicode": "# Übersicht\n\nDie Straße führt nach Köln. Ærø og Øresund ligger i Danmark. Число 42 и слово мир.\n\n"
               "東京は日本の首都です。 Café naïve résumé, ÉTÉ été Été. Ω-3 fatty acids; x² + y² = z².\n",
    "wiki": "= Valkyria Chronicles III =\n\nSenjō no Valkyria 3 : Unrecorded Chronicles is a tactical role @-@ "
            "playing video game developed by Sega and Media.Vision for the PlayStation Portable. Released in "
            "January 2011 in Japan, it is the third game in the Valkyria series.\n",
}
QUESTIONS = ["Which animals herd sheep?", "Where does the Straße lead?", "Who developed Valkyria Chronicles III?"]


def assert_same_index(a: LexicalIndex, b: LexicalIndex) -> None:
    """The same vocabulary ids, idf and CSR arrays, byte for byte."""
    assert a.vocab == b.vocab and list(a.vocab) == list(b.vocab)
    assert a.idf.tobytes() == b.idf.tobytes()
    for name in ("row_ptr", "row_terms", "row_weights"):
        assert getattr(a, name).numpy().tobytes() == getattr(b, name).numpy().tobytes(), name


def texts_of(store: Store) -> list[str]:
    return list(row_texts(store.docs))


def passage_texts_of(store: Store) -> list[str]:
    return passage_texts(store.docs, store.passages.first, store.passages.count)


def assert_saved_equals_rebuilt(root: Path) -> Store:
    """The store's saved counts give the index (rows and passages) a build over its texts gives."""
    store = Store.open(root)
    assert_same_index(LexicalIndex.from_counts(store.row_term_counts()), LexicalIndex.build(texts_of(store)))
    assert_same_index(LexicalIndex.from_counts(store.passage_term_counts()),
                      LexicalIndex.build(passage_texts_of(store)))
    return store


def drop_term_counts(root: Path) -> None:
    """Rewrite a store as the engine before saved term counts wrote it: no lexical files, no keys for them."""
    m = json.loads((root / "manifest.json").read_text())
    for shard in m["shards"]:
        for key in (ROWS, PASSAGES):
            if key in shard:
                (root / shard[key]).unlink()
                m["checksums"].pop(shard.pop(key))
        for key in ("n_terms", "n_passage_terms", "term_rule"):
            shard.pop(key, None)
    if m.pop("mapped", None):  # nor the mapped arrays that came later (they hold the merged index)
        m["checksums"] = {k: v for k, v in m["checksums"].items() if not k.startswith("mapped-")}
    (root / "manifest.json").write_text(json.dumps(m))


# ------------------------------------------------------------------------------------------- pure (no model)

@pytest.mark.parametrize("cuts", [(), (1,), (2, 3), (1, 2, 3, 4, 5)])
def test_counts_of_parts_give_the_index_of_the_whole(cuts):
    """Parts with vocabularies of their own, merged in order: the build's vocab ids, idf and arrays exactly."""
    texts = [t for doc in DOCS.values() for t in doc.split(". ")] + ["", "the of and", "Cats cats CATS."]
    bounds = [0, *(round(c * len(texts) / 6) for c in cuts), len(texts)]
    parts = [count_terms(texts[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    assert_same_index(LexicalIndex.from_counts(parts), LexicalIndex.build(texts))
    assert_same_index(LexicalIndex.from_counts(parts), LexicalIndex.build(texts, block_rows=3))


def test_a_terms_table_round_trips():
    counts = count_terms(["Cats purr, cats sleep.", "", "Straße straße STRASSE 東京", "the of"])
    table = terms_table(counts)
    assert table.column("term").to_pylist() == ["cats", "purr", "sleep", "straße", "strasse", "東京"]
    assert table.column("rows").to_pylist()[0] == [0] and table.column("counts").to_pylist()[3] == [2]
    assert table_counts(table, 4, "t").equals(counts)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["rows"].__setitem__(0, [0, 9]), "rows outside"),
    (lambda d: d["rows"].__setitem__(0, [1, 0]), "not ascending"),
    (lambda d: d["counts"].__setitem__(1, [1, 0]), "counts below 1"),
    (lambda d: d["counts"].__setitem__(1, [1]), "unequal length"),
    (lambda d: d["term"].__setitem__(1, "cats"), "listed twice"),
    (lambda d: [d[k].reverse() for k in d], "order of first use"),
])
def test_a_table_that_breaks_the_format_is_refused(edit, message):
    data = terms_table(count_terms(["Cats purr.", "Dogs bark, cats purr."])).to_pydict()
    edit(data)
    table = pa.table(data)
    with pytest.raises(QascError, match=message):
        table_counts(table, 2, "t")


# ------------------------------------------------------------------------------------------ stores (tiny model)

@pytest.fixture(scope="module")
def config(tiny_model) -> EngineConfig:
    return EngineConfig(embedder=EmbedderConfig(model=tiny_model))


@pytest.fixture(scope="module")
def saved_store(tmp_path_factory, config) -> Path:
    tmp = tmp_path_factory.mktemp("lexical_store")
    ingest([str(write_corpus(tmp / "src", DOCS))], tmp / "store", config, IngestConfig(shard_chars=150))
    return tmp / "store"


def test_ingest_saves_counts_that_give_the_rebuilt_index(saved_store):
    store = assert_saved_equals_rebuilt(saved_store)
    m = store.manifest
    assert len(m["shards"]) >= 3 and m["format_version"] == 3
    for shard in m["shards"]:
        for key in (ROWS, PASSAGES):
            assert shard[key] in m["checksums"] and (saved_store / shard[key]).is_file()
        assert shard["n_terms"] == pq.read_metadata(saved_store / shard[ROWS]).num_rows
    assert all(ok for _, ok, _ in verify_store(saved_store))


def _answers(root: Path, monkeypatch=None) -> tuple[list, LexicalIndex, LexicalIndex]:
    engine = Engine.open(str(root), device="cpu")
    params = QascParams(lexical_weight=0.8, budget_tokens=60)
    chunks = engine.query(QUESTIONS, params)
    return ([[(c.doc_id, c.char_start, c.char_end, round(c.score, 6)) for c in q] for q in chunks],
            engine.tables.lexical_index(), engine.tables.passage_tier().lexical())


def test_the_engine_reads_the_counts_not_the_texts(saved_store, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("built from the texts")

    monkeypatch.setattr(LexicalIndex, "build", no_build)
    _, rows, passages = _answers(saved_store)
    assert rows.n_rows == Store.open(saved_store).manifest["counts"]["sentences"] and len(passages.vocab)


def test_a_store_without_saved_counts_answers_as_before(saved_store, tmp_path):
    """Written before term counts were saved: built from the texts (no error), the same answers and index; an
    append then saves counts for its new shards only, and the mixed store still gives the rebuilt index."""
    new_answers, new_rows, new_passages = _answers(saved_store)
    old = Path(shutil.copytree(saved_store, tmp_path / "old"))
    drop_term_counts(old)
    assert Store.open(old).row_term_counts() is None and not list((old / "lexical").iterdir())
    old_answers, old_rows, old_passages = _answers(old)
    assert old_answers == new_answers
    assert_same_index(old_rows, new_rows)
    assert_same_index(old_passages, new_passages)
    result = {name: (ok, detail) for name, ok, detail in verify_store(old)}
    assert all(ok for ok, _ in result.values()) and "0 of" in result["lexical"][1]
    ingest([str(write_corpus(tmp_path / "more", {"extra": "Owls hunt at night. Owls eat mice."}))], old)
    shards = Store.open(old).manifest["shards"]
    assert ROWS in shards[-1] and not any(ROWS in s for s in shards[:-1])
    assert_saved_equals_rebuilt(old)
    assert all(ok for _, ok, _ in verify_store(old))


def test_counts_of_another_term_rule_are_not_used(saved_store, tmp_path):
    root = Path(shutil.copytree(saved_store, tmp_path / "rule"))
    m = json.loads((root / "manifest.json").read_text())
    m["shards"][0]["term_rule"] = "terms-older"
    (root / "manifest.json").write_text(json.dumps(m))
    (root / m["shards"][0][ROWS]).write_bytes(b"")  # never read: counted from the shard's texts instead
    m["checksums"][m["shards"][0][ROWS]] = file_digest(root / m["shards"][0][ROWS])
    (root / "manifest.json").write_text(json.dumps(m))
    assert_saved_equals_rebuilt(root)


def test_an_append_and_a_resumed_ingest_keep_the_counts_equal(saved_store, tmp_path, config, monkeypatch):
    root = Path(shutil.copytree(saved_store, tmp_path / "store"))
    more = write_corpus(tmp_path / "more", {f"m{i}": f"Moths number {i} fly to the lamp. Ünïcode мотылёк {i}."
                                            for i in range(6)})
    monkeypatch.setenv("QASC_FAILPOINT", "parquet-write:9:enospc")  # a full disk in the third new shard
    with pytest.raises(ResumableError):
        ingest([str(more)], root, config, IngestConfig(shard_chars=40))
    monkeypatch.delenv("QASC_FAILPOINT")
    summary = ingest([str(more)], root, config, IngestConfig(shard_chars=40))
    assert summary["resumed_shards"] >= 1
    store = assert_saved_equals_rebuilt(root)
    assert all(ROWS in s and PASSAGES in s for s in store.manifest["shards"])
    assert all(ok for _, ok, _ in verify_store(root))
