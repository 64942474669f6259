"""Bulk ingest: input kinds, doc ids, metadata, token cap at exact offsets, a 10 MB line, chroma_general,
appending, progress and the summary line."""

from __future__ import annotations

import json
import re
import time
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.errors import QascError
from qasc.engine.splitter import split_sentences
from qasc.engine.store import IngestConfig, IngestProgress, Store, ingest, verify_store
from qasc.engine.tokencap import cap_tokens, count_tokens, load_tokenizer
from tests.conftest import CHROMA
from tests.engine.test_store import DOCS, write_corpus


def tiny(model: str) -> EngineConfig:
    return EngineConfig(embedder=EmbedderConfig(model=model))


class HashEmbedder:
    """Stands in for the model where only reading, splitting and storing are under test (a 10 MB line, a
    whole corpus): the model's real tokenizer, and unit vectors seeded by a hash of each text."""

    def __init__(self, model: str, dim: int = 32, poison: str | None = None) -> None:
        self.tokenizer = load_tokenizer(model)
        self.dim = dim
        self.poison = poison  # texts containing this embed to NaN

    def encode(self, texts: list[str], progress=None) -> np.ndarray:
        out = np.stack([np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim) for t in texts])
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        if self.poison is not None:
            out[[self.poison in t for t in texts]] = np.nan
        if progress is not None:
            progress(len(texts))
        return out.astype(np.float32)


@pytest.fixture
def hash_embedder(tiny_model):
    """A HashEmbedder with the tiny model's tokenizer, handed to ingest(embedder=...) instead of the model."""
    return HashEmbedder(tiny_model)


def check_offsets(store: Store, cap: int = 128) -> None:
    """Every stored sentence: inside its document, trimmed, non-empty, within the token cap."""
    for doc in store.docs:
        assert len(doc) > 0
        assert (doc.char_start >= 0).all() and (doc.char_end <= len(doc.text)).all()
        assert (doc.char_end > doc.char_start).all() and (np.diff(doc.char_start) > 0).all()
        assert (doc.char_start[1:] >= doc.char_end[:-1]).all()
        for s in doc.texts():
            assert s and s == s.strip()
        assert int(doc.n_tokens.max()) <= cap


# ------------------------------------------------------------------------------------------- token cap

WORDS = ["the", "lighthouse", "Fresnel", "1822", "antidisestablishmentarianism", "https://example.org/a?b=c",
         "naïve", "東京", "🙂", "x", "--", "(", "pneumonoultramicroscopicsilicovolcanoconiosis", "e.g.", "3.14159"]


@settings(max_examples=40, deadline=None)
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=400), cap=st.integers(1, 40),
       seps=st.lists(st.sampled_from([" ", " ", " ", "\n", "  ", ""]), min_size=400, max_size=400))
def test_cap_tokens_exact_offsets(tiny_model, words, cap, seps):
    tokenizer = load_tokenizer(tiny_model)
    text = "Intro. " + "".join(w + s for w, s in zip(words, seps, strict=False)) + " End."
    capped = cap_tokens(split_sentences(text, "d"), tokenizer, cap)
    pieces = capped.texts()
    assert pieces and all(p == p.strip() and p for p in pieces)
    np.testing.assert_array_equal(capped.n_tokens, count_tokens(tokenizer, pieces))
    assert int(capped.n_tokens.max()) <= cap
    assert (np.diff(capped.char_start) > 0).all() and (capped.char_start[1:] >= capped.char_end[:-1]).all()
    # nothing is lost: the pieces are the whole text minus whitespace
    assert "".join(pieces).replace(" ", "") == re.sub(r"\s", "", text).replace(" ", "") or \
        re.sub(r"\s", "", "".join(pieces)) == re.sub(r"\s", "", text)


def test_cap_keeps_short_sentences(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    sents = split_sentences(DOCS["beta"], "beta")
    capped = cap_tokens(sents, tokenizer, 128)
    np.testing.assert_array_equal(capped.char_start, sents.char_start)
    np.testing.assert_array_equal(capped.char_end, sents.char_end)
    np.testing.assert_array_equal(capped.paragraph, sents.paragraph)


# --------------------------------------------------------------------------------------------- inputs

@pytest.mark.slow
def test_input_kinds_ids_and_metadata(tmp_path, tiny_model, capsys):
    folder = write_corpus(tmp_path / "folder")
    (folder / "sub").mkdir()
    (folder / "sub" / "nested.txt").write_text("Nested text file. It has two sentences.")
    (folder / "image.png").write_bytes(b"\x89PNG\x00\x00")  # skipped: not a text extension
    (folder / ".hidden.md").write_text("hidden files are skipped")
    single = tmp_path / "loose" / "single.markdown"
    single.parent.mkdir()
    single.write_text("A single file given by path.")
    jsonl = tmp_path / "records.jsonl"
    jsonl.write_text(json.dumps({"id": "j1", "text": "From JSON lines.", "lang": "en", "year": 2020}) + "\n\n"
                     + json.dumps({"id": 7, "text": "Integer ids become strings.", "tags": ["a", "b"]}) + "\n")
    parquet = tmp_path / "table.parquet"
    pq.write_table(pa.table({"id": ["p1", "p2"], "text": ["Parquet row one.", "Parquet row two. Second."],
                             "score": [0.5, 1.5]}), parquet)
    summary = ingest([str(folder), str(single), str(jsonl), str(parquet)], tmp_path / "s", tiny(tiny_model))
    assert "skipped 1 file(s)" in capsys.readouterr().err
    store = Store.open(tmp_path / "s")
    assert store.doc_ids == ["alpha", "beta", "gamma", "sub/nested", "single", "j1", "7", "p1", "p2"]
    assert summary["documents"] == 9 and summary["sentences"] == len(store)
    assert store.metadata[5] == {"lang": "en", "year": 2020} and store.metadata[6] == {"tags": ["a", "b"]}
    assert store.metadata[7] == {"score": 0.5} and store.metadata[0] == {}
    assert store.sources[3].endswith("sub/nested.txt") and store.sources[5].endswith("records.jsonl:1")
    assert store.sources[6].endswith("records.jsonl:3") and store.sources[8].endswith("table.parquet#row1")
    assert store.docs[8].texts() == ["Parquet row one.", "Parquet row two.", "Second."][1:] or \
        store.docs[8].texts() == ["Parquet row two.", "Second."]
    check_offsets(store)


@pytest.mark.slow
def test_append_refuses_other_model_and_duplicates(tmp_path, tiny_model):
    first = write_corpus(tmp_path / "a", {"one": "First document. Two sentences."})
    second = write_corpus(tmp_path / "b", {"two": "Second document here.", "three": "Third one."})
    store = tmp_path / "s"
    ingest([str(first)], store, tiny(tiny_model))
    before = Store.open(store)
    summary = ingest([str(second)], store)  # settings come from the store
    after = Store.open(store, load_index=True)
    assert summary["documents"] == 2 and summary["store_documents"] == 3
    assert after.doc_ids == ["one", "three", "two"] and after.manifest["generation"] == 2
    np.testing.assert_array_equal(after.embeddings[: len(before)], before.embeddings)
    assert after.index.ntotal == len(after) and len(list(store.glob("index-*.faiss"))) == 1
    assert [s["id"] for s in after.manifest["shards"]] == [0, 1]
    manifest = (store / "manifest.json").read_bytes()
    with pytest.raises(QascError, match="duplicate doc_id 'three'.*already in the store"):
        ingest([str(second)], store)
    with pytest.raises(QascError, match="refusing to add embeddings of 'all-MiniLM-L6-v2'"):
        ingest([str(write_corpus(tmp_path / "c", {"four": "Four."}))], store, EngineConfig())
    with pytest.raises(QascError, match="max_sentence_tokens"):
        ingest([str(tmp_path / "c")], store, settings=IngestConfig(max_sentence_tokens=64))
    assert (store / "manifest.json").read_bytes() == manifest and not (store / "_staging").exists()
    assert all(ok for _, ok, _ in verify_store(store))


@pytest.mark.slow
def test_ten_megabyte_line_without_breaks(tmp_path, tiny_model, hash_embedder):
    rng = np.random.default_rng(0)
    vocab = np.array(["alpha", "beta", "gamma", "delta", "lighthouse", "lens", "prism", "photon", "of", "the"])
    words = vocab[rng.integers(0, len(vocab), 1_900_000)]
    text = " ".join(words.tolist())[: 10 * 2**20]
    assert "\n" not in text and "." not in text and len(text) == 10 * 2**20
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "line.txt").write_text(text)
    t0 = time.perf_counter()
    summary = ingest([str(tmp_path / "in")], tmp_path / "s", tiny(tiny_model), embedder=hash_embedder)
    store = Store.open(tmp_path / "s")
    doc = store.docs[0]
    assert store.doc_ids == ["line"] and doc.text == text and summary["sentences"] == len(doc)
    assert int(doc.n_tokens.max()) <= 128 and len(doc) > 10 * 2**20 / 2000
    for i in rng.choice(len(doc), 200, replace=False):
        piece = text[doc.char_start[i]:doc.char_end[i]]
        assert piece == piece.strip() and len(piece) <= 2000
    assert all(ok for _, ok, _ in verify_store(tmp_path / "s"))
    print(f"10 MB line: {len(doc)} sentences in {time.perf_counter() - t0:.1f} s")


@pytest.mark.slow
def test_chroma_general_one_document_per_file_exact_offsets(tmp_path, tiny_model, hash_embedder):
    corpora = CHROMA / "corpora"
    if not corpora.is_dir():
        pytest.skip(f"chroma_general not found at {CHROMA}")
    ingest([str(corpora)], tmp_path / "s", tiny(tiny_model), embedder=hash_embedder)
    store = Store.open(tmp_path / "s")
    files = sorted(corpora.glob("*.md"))
    assert store.doc_ids == [f.stem for f in files]
    assert [d.text for d in store.docs] == [f.read_text(encoding="utf-8") for f in files]
    check_offsets(store)  # every sentence of every document


# ---------------------------------------------------------------------------------- CLI and progress

@pytest.mark.slow
def test_cli_log_lines_summary_and_bar(tmp_path, tiny_model, capsys):
    from qasc.jobs.cli import main

    corpus = write_corpus(tmp_path / "c")
    code = main(["ingest", str(corpus), "--store", str(tmp_path / "s"), "--local", "--model", tiny_model,
                 "--shard-chars", "100", "--dtype-store", "float16"])
    out, err = capsys.readouterr()
    assert code == 0
    assert re.fullmatch(r"ingested 3 documents, \d+ sentences in [\d.]+ s \([\d.]+ sentences/s\) into .*\n", out)
    assert re.search(r"qasc ingest: shard 3/3, \d+ sentences, [\d.]+ sentences/s, eta \d+ s", err)
    assert Store.open(tmp_path / "s").manifest["dtype"] == "float16"
    summary = ingest([str(write_corpus(tmp_path / "d", {"delta": "One more. And another."}))], tmp_path / "s",
                     progress=IngestProgress(bar=True))
    err = capsys.readouterr().err
    assert "qasc ingest" in err and "sent" in err and summary["store_documents"] == 4
    assert main(["verify", "--store", str(tmp_path / "s")]) == 0
    assert capsys.readouterr().out.rstrip().endswith(": OK")
