"""Arrow/Parquet sentence store: one module per concern.

    schema    file names, Arrow schemas, the embedding column <-> numpy
    files     atomic writes, digests, the writer's lock, Parquet reads, test failpoints
    inputs    discover inputs, plan read units from their sizes, read and validate a unit
    stages    read -> cut -> split -> embed -> write of a unit's shards; the in-process runner
    manifest  the committed manifest and the _staging area of a running ingest
    index     FAISS index: kinds, build, load, search; blocked exact torch top-k, recall@depth
    progress  the progress bar / log lines of an ingest
    ingest    `ingest()`, `ingest_table()` (in-memory inputs) and `IngestConfig`: the orchestration
    reader    `Store`: a committed store in memory
    verify    `verify_store`: every integrity check
"""

from qasc.engine.store.files import ResumableError, file_digest
from qasc.engine.store.index import exact_search, exact_topk, recall_at_depth
from qasc.engine.store.ingest import (
    DEFAULT_SHARD_CHARS,
    DEFAULT_UNIT_BYTES,
    IngestConfig,
    ingest,
    ingest_table,
    summary_line,
)
from qasc.engine.store.inputs import Document, InputUnit, ReadOptions, Segment
from qasc.engine.store.manifest import existing_manifest, read_manifest
from qasc.engine.store.progress import IngestProgress
from qasc.engine.store.reader import Store
from qasc.engine.store.schema import DOCUMENTS_SCHEMA, SENTENCE_COLUMNS, sentences_schema
from qasc.engine.store.stages import IngestContext, LocalRunner, ShardRunner
from qasc.engine.store.verify import verify_store

__all__ = [
    "DEFAULT_SHARD_CHARS",
    "DEFAULT_UNIT_BYTES",
    "DOCUMENTS_SCHEMA",
    "SENTENCE_COLUMNS",
    "Document",
    "IngestConfig",
    "IngestContext",
    "IngestProgress",
    "InputUnit",
    "LocalRunner",
    "ReadOptions",
    "ResumableError",
    "ShardRunner",
    "Segment",
    "Store",
    "exact_search",
    "exact_topk",
    "existing_manifest",
    "file_digest",
    "ingest",
    "ingest_table",
    "read_manifest",
    "recall_at_depth",
    "sentences_schema",
    "summary_line",
    "verify_store",
]
