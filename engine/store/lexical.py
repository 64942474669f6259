"""Saved term counts: what the BM25 index (engine.lexical) needs of a shard's rows, written at ingest and read
when the first lexical query needs the index, instead of tokenizing every sentence again.

Per shard, two files of TERMS_SCHEMA: lexical/part-NNNNNN.parquet (its sentence rows) and passage_lexical/
part-NNNNNN.parquet (its passages, in stores with passages). A file has one row per distinct term of the
shard's rows, in order of first use (row after row, in text order): the term, the shard-local rows that hold
it (ascending) and its count in each. A row's length in terms (BM25's dl) is its counts summed. The manifest's
shard entry names the files ("lexical", "passage_lexical") with their term counts ("n_terms",
"n_passage_terms") and the term rule they were counted by ("term_rule", engine.lexical.term_rule()).

idf and avgdl depend on the whole store, so they are not saved: `LexicalIndex.from_counts` computes them from
the shards' counts at open (vectorised, one pass over the postings), and an append writes only its new shards'
files. A shard without saved counts (written before them, or by another term rule) is counted from its texts
there, so a store of any age gives the index `LexicalIndex.build` gives over its texts, array for array.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from qasc.engine.errors import QascError, first_line
from qasc.engine.lexical import TermCounts, count_terms, stable_order, term_rule
from qasc.engine.passages import Passages
from qasc.engine.store.files import read_table
from qasc.engine.store.schema import TERMS_SCHEMA
from qasc.engine.types import Sentences

ROWS, PASSAGES = "lexical", "passage_lexical"  # the shard entry's keys of the two files


def terms_table(counts: TermCounts) -> pa.Table:
    """counts (n rows, v terms, nnz postings) -> TERMS_SCHEMA table (v rows: term, rows, counts), terms in
    counts.vocab's order, each term's rows ascending."""
    row = np.repeat(np.arange(counts.n_rows, dtype=np.int32), np.diff(counts.row_ptr))
    order = stable_order(counts.terms, len(counts.vocab))  # term-major; rows stay ascending within a term
    offsets = np.zeros(len(counts.vocab) + 1, dtype=np.int32)
    np.cumsum(np.bincount(counts.terms, minlength=len(counts.vocab)), out=offsets[1:])
    lists = lambda values: pa.ListArray.from_arrays(  # noqa: E731
        pa.array(offsets), pa.array(np.ascontiguousarray(values[order], dtype=np.int32)))
    return pa.Table.from_arrays([pa.array(list(counts.vocab), pa.string()), lists(row), lists(counts.tf)],
                                schema=TERMS_SCHEMA)


def table_counts(table: pa.Table, n_rows: int, where: str) -> TermCounts:
    """TERMS_SCHEMA table of a shard's n_rows rows -> its TermCounts (rows ascending, term ids ascending within
    a row); QascError naming `where` when the table breaks the format (rows outside [0, n_rows), not ascending
    within a term, counts < 1, a term listed twice or out of first-use order, rows and counts of unequal length)."""
    if table.schema.names != TERMS_SCHEMA.names:
        raise QascError(f"{where}: unexpected columns {table.schema.names}")
    rows_col, counts_col = (table.column(c).combine_chunks() for c in ("rows", "counts"))
    if rows_col.null_count or counts_col.null_count or table.column("term").null_count:
        raise QascError(f"{where}: null values in a term counts table")
    offsets = rows_col.offsets.to_numpy()
    if not np.array_equal(offsets, counts_col.offsets.to_numpy()):
        raise QascError(f"{where}: rows and counts lists of unequal length")
    rows = rows_col.flatten().to_numpy().astype(np.int64)
    tf = counts_col.flatten().to_numpy().astype(np.int32)
    lengths = np.diff(offsets)
    v = len(lengths)
    term = np.repeat(np.arange(v, dtype=np.int64), lengths)
    same = term[1:] == term[:-1]
    firsts = rows[offsets[:-1]] if v and lengths.min() > 0 else np.zeros(0, np.int64)
    problems = [
        (v and lengths.min() < 1, "a term without rows"),
        (len(rows) and (rows.min() < 0 or rows.max() >= n_rows), f"rows outside [0, {n_rows})"),
        (bool(np.any(rows[1:][same] <= rows[:-1][same])), "a term's rows not ascending"),
        (len(tf) and tf.min() < 1, "counts below 1"),
        (bool(np.any(np.diff(firsts) < 0)), "terms not in order of first use"),
    ]
    bad = [what for failed, what in problems if failed]
    if bad:
        raise QascError(f"{where}: {', '.join(bad)}")
    vocab = table.column("term").combine_chunks()
    if len(vocab.unique()) != v:
        raise QascError(f"{where}: a term listed twice")
    order = stable_order(rows, n_rows)  # row-major; term ids (term-major input) stay ascending within a row
    row_ptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=row_ptr[1:])
    return TermCounts(vocab, row_ptr, term[order].astype(np.int32), tf[order])


def read_counts(root: Path, rel: str, n_rows: int) -> TermCounts:
    """One saved term counts file of the store -> TermCounts; QascError naming the file when it is missing,
    unreadable or breaks the format (`table_counts`)."""
    try:
        return table_counts(read_table(root, rel), n_rows, str(root / rel))
    except (ValueError, TypeError, pa.ArrowException) as exc:
        raise QascError(f"{root / rel}: damaged term counts ({first_line(exc)}); run qasc verify") from None


def row_texts(docs: Sequence[Sentences]) -> Iterator[str]:
    """docs -> their sentence rows' texts, in row order."""
    for doc in docs:
        for a, b in zip(doc.char_start.tolist(), doc.char_end.tolist(), strict=True):
            yield doc.text[a:b]


def passage_texts(docs: Sequence[Sentences], first: np.ndarray, count: np.ndarray) -> list[str]:
    """docs (their rows numbered from 0, in order), first (P,) / count (P,) passages over those rows (each
    within one document) -> the passages' texts: from the first row's start to the last row's end."""
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    first = np.asarray(first, np.int64)
    doc = np.searchsorted(offsets, first, side="right") - 1
    lo, hi = first - offsets[doc], first + np.asarray(count, np.int64) - 1 - offsets[doc]
    return [docs[d].text[int(docs[d].char_start[a]):int(docs[d].char_end[b])]
            for d, a, b in zip(doc.tolist(), lo.tolist(), hi.tolist(), strict=True)]


def saved(shard: dict, key: str) -> bool:
    """Whether a shard entry has term counts of `key` (ROWS | PASSAGES) counted by this engine's term rule."""
    return key in shard and shard.get("term_rule") == term_rule()


def _shards(manifest: dict, docs: Sequence[Sentences]) -> Iterator[tuple[dict, Sequence[Sentences], int]]:
    """A store's shards in order, docs (all of the store's) -> (entry, its documents' Sentences, its first row)."""
    doc = row = 0
    for shard in manifest["shards"]:
        n_docs = int(shard["n_documents"])
        yield shard, docs[doc : doc + n_docs], row
        doc, row = doc + n_docs, row + int(shard["n_sentences"])


def row_counts(root: Path, manifest: dict, docs: Sequence[Sentences]) -> Iterator[TermCounts]:
    """A store's sentence rows' TermCounts per shard (docs: all of its documents): read where saved, else counted
    from the shard's texts."""
    for shard, shard_docs, _ in _shards(manifest, docs):
        if saved(shard, ROWS):
            yield read_counts(root, shard[ROWS], int(shard["n_sentences"]))
        else:
            yield count_terms(row_texts(shard_docs))


def passage_counts(root: Path, manifest: dict, docs: Sequence[Sentences], passages: Passages
                   ) -> Iterator[TermCounts]:
    """A store's passages' TermCounts per shard (passages: the store's, global first rows, in shard order): read
    where saved, else counted from the passages' texts."""
    at = 0
    for shard, shard_docs, row in _shards(manifest, docs):
        n = int(shard.get("n_passages", 0))
        if saved(shard, PASSAGES):
            yield read_counts(root, shard[PASSAGES], n)
        else:
            first, count = passages.first[at : at + n] - row, passages.count[at : at + n]
            yield count_terms(passage_texts(shard_docs, first, count))
        at += n


def has_saved(manifest: dict, key: str) -> bool:
    """Whether any shard of the store has saved term counts of `key` (else the index is built from the texts
    in one pass, as before they were saved)."""
    return any(saved(shard, key) for shard in manifest["shards"])


def shard_problems(root: Path, shard: dict, docs: Sequence[Sentences], first: np.ndarray, count: np.ndarray
                   ) -> list[str]:
    """`qasc verify` of one shard's saved term counts: docs its Sentences, first/count (P,) its passages (shard-local
    rows) -> problems (empty: none, or a shard without saved counts). Each file must be readable, in the format
    (`table_counts`), as many terms as the entry says and, where counted by this engine's term rule, equal to its
    texts counted again."""
    if ROWS not in shard:
        return [f"shard {shard.get('id')}: passage term counts without the rows'"] if PASSAGES in shard else []
    if ("passages" in shard) != (PASSAGES in shard):
        return [f"shard {shard.get('id')}: " + ("passages without their term counts" if "passages" in shard else
                                                "passage term counts without passages")]
    problems = []
    files = [(ROWS, "n_terms", int(shard["n_sentences"]), lambda: row_texts(docs))]
    if PASSAGES in shard:
        files.append((PASSAGES, "n_passage_terms", len(first), lambda: passage_texts(docs, first, count)))
    for key, n_key, n_rows, texts in files:
        try:
            got = read_counts(root, shard[key], n_rows)
        except QascError as exc:
            problems.append(str(exc))
            continue
        if len(got.vocab) != shard.get(n_key):
            problems.append(f"{shard[key]}: {len(got.vocab)} terms, the manifest says {shard.get(n_key)}")
        elif saved(shard, key) and not got.equals(count_terms(texts())):
            problems.append(f"{shard[key]}: term counts differ from the shard's texts")
    return problems
