"""Heading paths: the splitter's headings per sentence, stored per shard (format 2), format-1 stores still open."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

from qasc.engine.config import EmbedderConfig, EngineConfig
from qasc.engine.splitter import heading_paths, heading_title, split_sentences
from qasc.engine.store import IngestConfig, Store, ingest, verify_store
from qasc.engine.store.files import file_digest
from tests.engine.test_lexical_store import drop_term_counts
from tests.engine.test_store import write_corpus

DOC = ("Intro line before any heading.\n\n# Privacy policy of a.com\n\nWe collect data. We share it.\n\n"
       "## Cookies\nCookies are small files.\n\n### Details\nThey expire.\n\n# Contact ##\n\nWrite to us.\n\n"
       " = = Plot = = \nA wikitext section.\n")


def test_heading_titles_and_levels():
    assert heading_title("## Cookies") == (2, "Cookies")
    assert heading_title("# Contact ##") == (1, "Contact")
    assert heading_title(" = = Plot = = ") == (2, "Plot")
    assert heading_title("== Early life ==") == (2, "Early life")
    assert heading_title("= Title =") == (1, "Title")


def test_heading_paths_follow_the_outermost_two_markdown_headings():
    sents = split_sentences(DOC)
    paths, ids = heading_paths(DOC, sents.char_start)
    got = [paths[i] if i >= 0 else None for i in ids]
    expected = {"Intro line before any heading.": None, "# Privacy policy of a.com": "Privacy policy of a.com",
                "We share it.": "Privacy policy of a.com", "## Cookies": "Privacy policy of a.com > Cookies",
                "They expire.": "Privacy policy of a.com > Cookies",  # level 3 does not enter the path
                "Write to us.": "Contact", "A wikitext section.": "Contact"}  # wikitext: not in paths
    texts = sents.texts()
    for text, path in expected.items():
        assert got[texts.index(text)] == path, text
    assert len(set(paths)) == len(paths)
    wiki_paths, wiki = heading_paths(DOC, sents.char_start, wikitext=True)
    assert wiki_paths[wiki[texts.index("A wikitext section.")]] == "Contact > Plot"
    assert heading_paths("no headings at all. none.", np.array([0, 20]))[1].tolist() == [-1, -1]


def _paths_by_sentence(text):
    sents = split_sentences(text)
    paths, ids = heading_paths(text, sents.char_start)
    assert all(text[a:b] == t for a, b, t in zip(sents.char_start, sents.char_end, sents.texts(), strict=True))
    return {t: (paths[i] if i >= 0 else None) for t, i in zip(sents.texts(), ids, strict=True)}


def test_hash_lines_inside_fenced_code_are_not_headings():
    doc = "# Code\n\nRun this:\n\n```python\n# not a heading\n\nx = 1\n```\n\nAfter the block.\n\n~~~\n## nor this\n"
    got = _paths_by_sentence(doc)
    assert got["After the block."] == "Code"
    assert got["# not a heading"] == "Code"
    assert got["## nor this"] == "Code"  # an unclosed fence runs to the end
    assert split_sentences(doc).section.max() == 0  # one section: the fence opens none


def test_old_mac_line_ends_and_a_byte_order_mark():
    doc = "Old Mac\r\rLine one.\rLine two.\r\r# Part\rBody text.\r"
    got = _paths_by_sentence(doc)
    assert got == {"Old Mac": None, "Line one.": None, "Line two.": None, "# Part": "Part", "Body text.": "Part"}
    crlf = "Alpha one.\r\n\r\nBeta two.\r\n# Part\r\nBody text.\r\n"
    assert split_sentences(crlf).paragraph.tolist() == split_sentences(crlf.replace("\r", "")).paragraph.tolist()
    assert _paths_by_sentence(crlf)["Body text."] == "Part"
    bom = "\ufeff# BOM Title\n\nFirst sentence here.\n"
    got = _paths_by_sentence(bom)
    assert got == {"# BOM Title": "BOM Title", "First sentence here.": "BOM Title"}
    assert split_sentences(bom).char_start[0] == 1  # the mark is not part of the first sentence


def test_setext_headings():
    doc = ("Privacy policy\n==============\n\nWe collect data.\n\nCookies\n-------\nCookies are small files.\n\n"
           "A paragraph of two lines,\nover a rule:\n---\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert heading_title("Cookies\n-------") == (2, "Cookies")
    got = _paths_by_sentence(doc)
    assert got["We collect data."] == "Privacy policy"
    assert got["Cookies are small files."] == "Privacy policy > Cookies"
    assert got["over a rule:"] == got["---"] == "Privacy policy > Cookies"  # two lines over a rule: no heading
    assert got["|---|---|"] == "Privacy policy > Cookies"  # a table's separator row is no underline
    assert split_sentences(doc).section.max() == 1


def test_full_width_sentence_ends():
    doc = "# 标题\n\n第一句话。第二句话！「第三句？」最后\nAn English sentence. Another one."
    sents = split_sentences(doc)
    assert sents.texts() == ["# 标题", "第一句话。", "第二句话！", "「第三句？」", "最后", "An English sentence.",
                             "Another one."]
    assert all(doc[a:b] == t for a, b, t in zip(sents.char_start, sents.char_end, sents.texts(), strict=True))


def test_store_keeps_heading_paths_per_shard(tmp_path, tiny_model):
    docs = {"a": DOC, "b": DOC.replace("a.com", "b.com"), "plain": "Just text. Nothing else."}
    src = write_corpus(tmp_path / "src", docs)
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    ingest([str(src)], tmp_path / "store", config, settings=IngestConfig(shard_chars=200))  # one doc a shard
    store = Store.open(tmp_path / "store")
    m = store.manifest
    assert m["format_version"] == 3 and all("headings" in s for s in m["shards"])
    assert all(s["headings"] in m["checksums"] for s in m["shards"])
    assert len(store.row_heading) == len(store.embeddings) == m["counts"]["sentences"]
    assert store.heading_emb.shape == (len(store.heading_paths), m["dim"])
    np.testing.assert_allclose(np.linalg.norm(store.heading_emb, axis=1), 1, atol=1e-3)
    assert "Privacy policy of b.com > Cookies" in store.heading_paths
    assert len(set(store.heading_paths)) == len(store.heading_paths)
    for d, lo in zip(store.docs, store.doc_offsets[:-1].tolist(), strict=True):
        paths, ids = heading_paths(d.text, d.char_start)
        want = [paths[i] if i >= 0 else None for i in ids]
        rows = store.row_heading[lo:lo + len(d)]
        assert [store.heading_paths[i] if i >= 0 else None for i in rows] == want
    assert all(ok for _, ok, _ in verify_store(tmp_path / "store"))

    heads = tmp_path / "store" / m["shards"][0]["headings"]  # a changed headings file is caught
    table = pq.read_table(heads)
    pq.write_table(table.slice(0, 1), heads)
    assert not dict((n, ok) for n, ok, _ in verify_store(tmp_path / "store"))["checksums"]


def downgrade_to_format_1(root) -> None:
    """Rewrite a store as format 1 wrote it: no heading column, no headings or passages files, manifest version 1."""
    drop_term_counts(root)  # saved term counts came later still
    m = json.loads((root / "manifest.json").read_text())
    for shard in m["shards"]:
        st = pq.read_table(root / shard["sentences"])
        pq.write_table(st.drop_columns(["heading"]), root / shard["sentences"], compression="zstd")
        m["checksums"][shard["sentences"]] = file_digest(root / shard["sentences"])
        (root / shard.pop("headings")).unlink()
        m["checksums"].pop(f"headings/{shard['sentences'].split('/')[1]}")
        shard.pop("n_headings")
        if "passages" in shard:  # format 3's passages files came later still
            (root / shard["passages"]).unlink()
            m["checksums"].pop(shard.pop("passages"))
            shard.pop("n_passages")
    m["splitter"].pop("passage_tokens", None)
    m["format_version"] = 1
    (root / "manifest.json").write_text(json.dumps(m))


def test_format_1_store_opens_without_headings(tmp_path, tiny_model):
    src = write_corpus(tmp_path / "src", {"a": DOC, "b": DOC.replace("a.com", "b.com")})
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    ingest([str(src)], tmp_path / "store", config)
    before = Store.open(tmp_path / "store")
    downgrade_to_format_1(tmp_path / "store")
    old = Store.open(tmp_path / "store")
    assert old.manifest["format_version"] == 1 and old.heading_paths == [] and old.heading_emb.shape == (0, 32)
    assert old.row_heading.tolist() == [-1] * len(before.embeddings)
    np.testing.assert_array_equal(old.embeddings, before.embeddings)
    assert all(ok for _, ok, _ in verify_store(tmp_path / "store"))
    more = write_corpus(tmp_path / "more", {"c": DOC.replace("a.com", "c.com")})  # append: new shards get headings
    ingest([str(more)], tmp_path / "store")
    both = Store.open(tmp_path / "store")
    assert both.manifest["format_version"] == 3 and "Privacy policy of c.com" in both.heading_paths
    assert (both.row_heading[: len(before.embeddings)] == -1).all() and (both.row_heading >= 0).any()
    assert all(ok for _, ok, _ in verify_store(tmp_path / "store"))
