"""`ingest()`: split, embed and index documents into a store (created, resumed, or appended to);
`ingest_table()`: the same from an in-memory Arrow table, pandas DataFrame or iterable of records.

Stages: plan (read and validate every input, assign documents to shards; nothing is written before it
passes) -> per shard: read -> split (sentences, token cap) -> embed -> write (atomic, recorded in
_staging) -> index -> manifest. A rerun of the same command skips the recorded shards. The shards are run
by a shard runner: `LocalRunner` (in-process, the default) or the Ray Data pipeline that jobs/ passes in.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from engine.config import EngineConfig
from engine.errors import QascError, first_line
from engine.store import index as faiss_index
from engine.store.files import ResumableError, atomic_write, failpoint, locked
from engine.store.inputs import Document, ReadOptions, ShardTask, assign_shards, plan_inputs, plan_memory
from engine.store.manifest import (
    Staging,
    build_manifest,
    check_compatible,
    existing_doc_ids,
    existing_manifest,
    now,
    remove_new_store,
    shard_entry,
)
from engine.store.progress import IngestProgress, log_stderr
from engine.store.schema import MANIFEST, STORE_DTYPES
from engine.store.stages import IngestContext, LocalRunner, ShardRunner, write_shard
from engine.tokencap import DEFAULT_MAX_SENTENCE_TOKENS, load_tokenizer
from engine.types import Sentences

DEFAULT_SHARD_CHARS = 524_288  # characters of input text per shard (the unit of work and of resume)


@dataclass(frozen=True)
class IngestConfig:
    """How inputs become a store. None: the existing store's setting, else the default.

    Saved, resolved, in the manifest under "ingest" (beside "config", the EngineConfig).
    """

    index: str = "auto"  # auto | flat | ivf | hnsw
    dtype_store: str | None = None  # float32 | float16 (None: the store's, else float32)
    max_sentence_tokens: int | None = None  # token cap of a sentence (None: the store's, else 128)
    shard_chars: int = DEFAULT_SHARD_CHARS  # input characters per shard: the unit of work and of resume
    read: ReadOptions = field(default_factory=ReadOptions)

    def resolved(self, old: dict | None) -> IngestConfig:
        """The unset settings filled from an existing store's manifest (or the defaults)."""
        dtype = self.dtype_store if self.dtype_store is not None else old["dtype"] if old else "float32"
        cap = self.max_sentence_tokens
        if cap is None:
            cap = old["splitter"]["max_sentence_tokens"] if old else DEFAULT_MAX_SENTENCE_TOKENS
        return replace(self, dtype_store=dtype, max_sentence_tokens=cap)

    def to_dict(self) -> dict:
        return asdict(self)


def _validate(config: EngineConfig, settings: IngestConfig, local: bool) -> None:
    from engine.embedder import resolve_device, resolve_dtype

    e = config.embedder
    if e.max_length < 8:
        raise QascError(f"--max-length must be >= 8, got {e.max_length}")
    if e.batch_tokens is not None and e.batch_tokens < e.max_length:
        raise QascError(f"--batch-tokens ({e.batch_tokens}) must be >= --max-length ({e.max_length})")
    try:
        resolve_dtype(e.dtype, resolve_device(e.device if local else "cpu"))
    except (ValueError, RuntimeError) as exc:
        raise QascError(str(exc)) from None
    if settings.shard_chars < 1:
        raise QascError(f"--shard-chars must be >= 1, got {settings.shard_chars}")
    if not 1 <= settings.max_sentence_tokens <= e.max_length - 2:
        raise QascError(f"--max-sentence-tokens must be in [1, {e.max_length - 2}] (--max-length minus the 2 "
                        f"special tokens), got {settings.max_sentence_tokens}")
    if settings.dtype_store not in STORE_DTYPES:
        raise QascError(f"--dtype-store must be one of {', '.join(STORE_DTYPES)}, got {settings.dtype_store!r}")
    faiss_index.choose_kind(0, settings.index)


def ingest(
    paths: Sequence[str | Path],
    store: str | Path,
    config: EngineConfig | None = None,
    settings: IngestConfig | None = None,
    *,
    embedder=None,
    runner: ShardRunner | None = None,
    progress: IngestProgress | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Split, embed and index documents into a store (created, resumed, or appended to).

    config: the EngineConfig saved with the store; settings: the IngestConfig (both None: the existing
    store's, else the defaults; an existing store's model and splitter must match). embedder: the loaded
    model the in-process runner embeds with (None: one is loaded from config.embedder). runner: runs the
    shards (None: LocalRunner(embedder); jobs/ingest_ray.RayRunner for Ray). progress: receives the
    progress calls (None: a bar on a terminal, else log lines). log: one-line notes (None: stderr).
    Returns the summary: documents, sentences (this run), seconds, sentences_per_s, store totals.
    """

    def planner(opts: ReadOptions, existing: dict[str, str], root: Path) -> tuple[list, list, list, dict]:
        refs, sources, skipped = plan_inputs(paths, opts, existing, exclude=root)
        return refs, sources, skipped, {}

    return _ingest(planner, store, config, settings, embedder, runner, progress, log)


def ingest_table(
    data,
    store: str | Path,
    config: EngineConfig | None = None,
    settings: IngestConfig | None = None,
    *,
    source: str | None = None,
    embedder=None,
    runner: ShardRunner | None = None,
    progress: IngestProgress | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """`ingest()` from memory: a pyarrow Table (or RecordBatch), a pandas DataFrame, or an iterable of
    mappings (records), with an id and a text column/key (settings.read.id_field / text_field); every other
    column/key is the document's metadata.

    The same validation (nothing is written for a bad table: missing column, non-string text, empty text,
    duplicate ids, ids already in the store), resume (rerun with the same data) and manifest as files. Table
    rows become the Documents of a .parquet file's rows, records those of a .jsonl file's lines; `source`
    labels them (default "table" / "records"; stored as `LABEL#rowN` / `LABEL:N`), so with source = a file's
    absolute path the store is byte-identical to the one `ingest([that file])` builds.
    """

    def planner(opts: ReadOptions, existing: dict[str, str], root: Path) -> tuple[list, list, list, dict]:
        refs, sources, memory = plan_memory(data, opts, existing, source)
        return refs, sources, [], memory

    return _ingest(planner, store, config, settings, embedder, runner, progress, log)


def _ingest(planner, store, config, settings, embedder, runner, progress, log) -> dict:
    """The orchestration behind ingest() and ingest_table(); planner(opts, existing ids, root) ->
    (refs, sources, skipped files, in-memory Documents by label)."""
    from engine.embedder import DEFAULT_MODEL, model_fingerprint, resolve_model_path

    t0 = time.perf_counter()
    log = log or log_stderr
    progress = progress or IngestProgress(log=log)
    root = Path(store).expanduser().absolute()
    old = existing_manifest(root)
    if config is None:
        config = EngineConfig.from_dict(old["config"]) if old else EngineConfig()
    settings = (settings or IngestConfig()).resolved(old)
    local = runner is None or runner.mode == "local"
    _validate(config, settings, local)
    name = config.embedder.model or DEFAULT_MODEL
    try:
        fingerprint = model_fingerprint(resolve_model_path(config.embedder.model))
    except (ImportError, OSError) as exc:
        raise QascError(f"cannot find model {name!r}: {first_line(exc)}") from None
    dtype_store = settings.dtype_store
    splitter_desc = {**config.splitter.describe(), "max_sentence_tokens": settings.max_sentence_tokens}
    if old:
        check_compatible(old, root, name, fingerprint, splitter_desc, dtype_store)

    # plan: every input read and validated before anything is written
    opts = settings.read
    refs, sources, skipped, memory = planner(opts, existing_doc_ids(root, old), root)
    if skipped:
        log(f"qasc ingest: skipped {len(skipped)} file(s) that are not text/markdown, e.g. {skipped[0]}")
    first_id = old["counts"]["shards"] if old else 0
    tasks = assign_shards(refs, settings.shard_chars, first_id)
    ctx = IngestContext(config, opts, settings.max_sentence_tokens, memory)
    plan = {"base_generation": old["generation"] if old else 0, "fingerprint": fingerprint,
            "splitter": splitter_desc, "dtype": dtype_store, "read": asdict(opts), "sources": sources,
            "shards": [[asdict(r) for r in t.docs] for t in tasks], "first_shard": first_id}
    plan["hash"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()

    if runner is None:
        if embedder is None:
            from engine.chunker import embedder_from

            try:
                embedder = embedder_from(config)
            except ValueError as exc:
                raise QascError(str(exc)) from None
        runner = LocalRunner(embedder)
    load_tokenizer(config.embedder.model)  # fail early on a bad model name, before any write
    created = old is None
    with runner.session(), locked(root):
        staging = Staging(root, plan, log)
        todo = [t for t in tasks if t.shard_id not in staging.done]
        done_chars = sum(t.chars for t in tasks if t.shard_id in staging.done)
        progress.start(sum(t.chars for t in tasks), len(tasks), done_chars, len(tasks) - len(todo))
        embedded = 0
        try:
            def on_shard(task: ShardTask, docs: list[Document], sents: list[Sentences], emb: np.ndarray) -> None:
                nonlocal embedded
                try:
                    record = write_shard(root, task.shard_id, docs, sents, emb, dtype_store)
                    staging.record(record)
                except OSError as exc:
                    raise ResumableError(f"cannot write shard {task.shard_id} into {root}: "
                                         f"{exc.strerror or exc}; finished shards are kept, run the same "
                                         f"ingest again to resume") from None
                embedded += len(emb)
                progress.shard_done(task.chars, len(emb), embedded_here=local)

            if todo:
                runner.run(todo, ctx, on_shard, progress)
            records = [staging.done[t.shard_id] for t in tasks]
            dims = {r["dim"] for r in records} | ({old["dim"]} if old else set())
            if len(dims) != 1:
                raise QascError(f"embedding width {sorted(dims)} disagrees with the store's; refusing to mix models")
            dim = dims.pop()
            all_shards = (old["shards"] if old else []) + [shard_entry(r) for r in records]
            data, index_entry = faiss_index.build_index(root, all_shards, old, settings.index, dim, log)
        except ResumableError:
            progress.close()
            raise
        except QascError:
            progress.close()
            staging.discard()
            if created:
                remove_new_store(root)
            raise
        progress.close()
        generation = (old["generation"] if old else 0) + 1
        index_file = f"index-{generation:04d}.faiss"
        try:
            atomic_write(root / index_file, data)
        except OSError as exc:
            raise ResumableError(f"cannot write {root / index_file}: {exc.strerror or exc}; run the same ingest "
                                 f"again to resume") from None
        failpoint("index-written")
        index_entry["file"] = index_file
        seconds = time.perf_counter() - t0
        run = {"finished": now(), "documents": len(refs), "sentences": sum(r["n_sentences"] for r in records),
               "embedded_here": embedded, "seconds": round(seconds, 3), "mode": runner.mode,
               "workers": runner.workers, "resumed_shards": len(tasks) - len(todo)}
        manifest = build_manifest(old, config, name, fingerprint, dim, dtype_store, splitter_desc, all_shards,
                                  records, index_entry, faiss_index.sha256(data), len(data), generation, run,
                                  settings.to_dict())
        failpoint("before-manifest")
        atomic_write(root / MANIFEST, json.dumps(manifest, indent=1).encode())
        if old and old["index"]["file"] != index_file:
            (root / old["index"]["file"]).unlink(missing_ok=True)
        staging.finish()
    seconds = time.perf_counter() - t0
    return {"store": str(root), "documents": run["documents"], "sentences": run["sentences"],
            "seconds": round(seconds, 2), "sentences_per_s": round(embedded / max(seconds, 1e-9), 1),
            "embedded": embedded, "resumed_shards": run["resumed_shards"], "mode": run["mode"],
            "store_documents": manifest["counts"]["documents"], "store_sentences": manifest["counts"]["sentences"],
            "index": index_entry["kind"]}


def summary_line(summary: dict) -> str:
    resumed = f", {summary['resumed_shards']} shard(s) resumed" if summary.get("resumed_shards") else ""
    return (f"ingested {summary['documents']} documents, {summary['sentences']} sentences in "
            f"{summary['seconds']:.1f} s ({summary['sentences_per_s']:.1f} sentences/s{resumed}) into "
            f"{summary['store']} (store: {summary['store_documents']} documents, {summary['store_sentences']} "
            f"sentences, {summary['index']} index)")
