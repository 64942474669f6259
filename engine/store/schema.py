"""Store format: file names, Arrow schemas of the tables, and the embedding column <-> numpy.

A store is one folder (README, "Store format"):
    manifest.json                  written last, atomically; lists every file with its sha256 and size
    documents/part-NNNNNN.parquet  DOCUMENTS_SCHEMA: doc_id, text, metadata (JSON), source, n_sentences
    sentences/part-NNNNNN.parquet  sentences_schema(dim, dtype): doc_id, sentence, paragraph, section,
                                   char_start, char_end, n_tokens, heading (format 2), embedding
                                   fixed_size_list<float32|float16>[dim]
    headings/part-NNNNNN.parquet   headings_schema(dim, dtype) (format 2): path, embedding; the shard's distinct
                                   heading paths, indexed by the sentences' heading column (-1 = none)
    passages/part-NNNNNN.parquet   passages_schema(dim, dtype) (format 3): first, count, n_tokens, embedding; runs
                                   of the shard's sentence rows (first: shard-local row) packed within a paragraph
                                   up to the store's passage_tokens, each embedded as one text (engine.passages)
    lexical/part-NNNNNN.parquet    TERMS_SCHEMA: the shard's sentence rows' terms (engine.store.lexical): one row per
                                   distinct term of the shard, in order of first use: term, rows (shard-local rows
                                   holding it, ascending), counts (its occurrences in each); read at open instead
                                   of tokenizing every sentence for the BM25 index
    passage_lexical/part-NNNNNN.parquet  TERMS_SCHEMA over the shard's passages (rows: shard-local passage ids)
    index-GGGG.faiss               FAISS index over every sentence row (id = global row), generation GGGG
    _staging/                      only while an ingest runs or after it crashed: plan.json, the workers' shard
                                   files (documents/, sentences/, headings/, passages/, lexical/, passage_lexical/
                                   uUUUUUU-sKKKKKK.parquet),
                                   shards/UUUUUU-KKKKKK.json, units/UUUUUU.json, commit.json (staged file -> store
                                   shard id)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from qasc.engine.errors import QascError

FORMAT = "qasc-store"
# 2: heading column + headings/ files (a format-1 store opens, without headings); 3: passages/ files (a format-2
# store opens, without passages: no budget fill)
FORMAT_VERSION = 3
MANIFEST = "manifest.json"
STAGING = "_staging"
LOCK = ".lock"
DOCUMENTS_DIR = "documents"
SENTENCES_DIR = "sentences"
HEADINGS_DIR = "headings"
PASSAGES_DIR = "passages"
LEXICAL_DIR = "lexical"  # the sentence rows' term counts (no format bump: an older engine ignores these files)
PASSAGE_LEXICAL_DIR = "passage_lexical"  # the passages' term counts
STORE_DTYPES = ("float32", "float16")
SENTENCE_ROW_GROUP = 8192
DOCUMENT_ROW_GROUP = 256

DOCUMENTS_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("text", pa.large_string(), nullable=False),
    pa.field("metadata", pa.string(), nullable=False),  # JSON object: the input's extra columns ({} for files)
    pa.field("source", pa.string(), nullable=False),  # path, path:line (jsonl) or path#row (parquet)
    pa.field("n_sentences", pa.int32(), nullable=False),
])
SENTENCE_COLUMNS = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("sentence", pa.int32(), nullable=False),  # index within its document, 0..n-1
    pa.field("paragraph", pa.int32(), nullable=False),
    pa.field("section", pa.int32(), nullable=False),
    pa.field("char_start", pa.int64(), nullable=False),  # text[char_start:char_end] is the sentence
    pa.field("char_end", pa.int64(), nullable=False),
    pa.field("n_tokens", pa.int32(), nullable=False),  # model tokens without specials, <= max_sentence_tokens
])
HEADING_COLUMN = pa.field("heading", pa.int32(), nullable=False)  # row of the shard's headings file, -1 = none
EMBEDDING_TYPES = {"float32": pa.float32(), "float16": pa.float16()}


def _embedding(dim: int, dtype: str) -> pa.Field:
    return pa.field("embedding", pa.list_(EMBEDDING_TYPES[dtype], dim), nullable=False)


def sentences_schema(dim: int, dtype: str = "float32", headings: bool = True) -> pa.Schema:
    """SENTENCE_COLUMNS + heading int32 (format 2; headings=False: format 1) + embedding
    fixed_size_list<dtype>[dim]."""
    cols = SENTENCE_COLUMNS.append(HEADING_COLUMN) if headings else SENTENCE_COLUMNS
    return cols.append(_embedding(dim, dtype))


def headings_schema(dim: int, dtype: str = "float32") -> pa.Schema:
    """path string ("H1 > H2") + embedding fixed_size_list<dtype>[dim] of that text."""
    return pa.schema([pa.field("path", pa.string(), nullable=False), _embedding(dim, dtype)])


def passages_schema(dim: int, dtype: str = "float32") -> pa.Schema:
    """first int32 (shard-local sentence row), count int32 (rows), n_tokens int32 + embedding
    fixed_size_list<dtype>[dim] of the rows' text (engine.passages)."""
    return pa.schema([pa.field("first", pa.int32(), nullable=False), pa.field("count", pa.int32(), nullable=False),
                      pa.field("n_tokens", pa.int32(), nullable=False), _embedding(dim, dtype)])


# a shard's term counts (engine.store.lexical): one row per distinct term of its rows (sentences or passages)
TERMS_SCHEMA = pa.schema([
    pa.field("term", pa.string(), nullable=False),  # engine.lexical.terms: lower-cased, not a stop word
    pa.field("rows", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),  # ascending
    pa.field("counts", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),  # >= 1 each
])


def shard_name(shard_id: int) -> str:
    return f"part-{shard_id:06d}.parquet"


def embeddings_of(table: pa.Table, dim: int, where: str, dtype: str | None = "float32",
                  out: np.ndarray | None = None) -> np.ndarray:
    """sentences (or headings) table -> (N, dim) in `dtype` (None: the column's own float32 | float16).

    Zero-copy where Arrow allows (one chunk, no nulls, dtype None or equal to the column's): the result is a
    read-only view of the table's buffer. With `out` ((N, dim), preallocated), the rows are written into it
    chunk by chunk (one copy, cast to out's dtype) and `out` is returned: no concatenated temporary."""
    col = table.column("embedding")
    if not pa.types.is_fixed_size_list(col.type) or col.type.list_size != dim:
        raise QascError(f"{where}: embedding column is {col.type}, expected fixed_size_list<float>[{dim}]")
    if col.null_count:
        raise QascError(f"{where}: embedding column holds {col.null_count} null rows")
    if out is not None:
        if out.shape != (len(col), dim):
            raise QascError(f"{where}: {len(col)} x {dim} embeddings, expected {out.shape}")
        lo = 0
        for chunk in col.chunks:  # flatten() honours the chunk's offset (sliced arrays)
            n = len(chunk)
            out[lo : lo + n] = chunk.flatten().to_numpy(zero_copy_only=False).reshape(n, dim)
            lo += n
        return out
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    flat = arr.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
    return flat if dtype is None else flat.astype(dtype, copy=False)


STAGED_DOCUMENTS = f"{STAGING}/{DOCUMENTS_DIR}"  # a running ingest's shard files, renamed into place at commit
STAGED_SENTENCES = f"{STAGING}/{SENTENCES_DIR}"
STAGED_HEADINGS = f"{STAGING}/{HEADINGS_DIR}"
STAGED_PASSAGES = f"{STAGING}/{PASSAGES_DIR}"
STAGED_LEXICAL = f"{STAGING}/{LEXICAL_DIR}"
STAGED_PASSAGE_LEXICAL = f"{STAGING}/{PASSAGE_LEXICAL_DIR}"
HEADING_ROW_GROUP = 8192
PASSAGE_ROW_GROUP = 8192
TERMS_ROW_GROUP = 65536


def staged_name(unit_id: int, k: int) -> str:
    """File name of the k-th shard of a read unit while it is staged."""
    return f"u{unit_id:06d}-s{k:06d}.parquet"
