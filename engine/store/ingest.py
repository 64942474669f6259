"""`ingest()`: split, embed and index documents into a store (created, resumed, or appended to);
`ingest_table()`: the same from an in-memory Arrow table, pandas DataFrame or iterable of records.

Stages: plan (list the inputs with their sizes / row counts and cut them into read units; no document is
read) -> per unit, in a worker: read and validate -> cut into shards of about shard_chars characters -> per
shard: split (sentences, token cap) -> embed -> write (atomic, into _staging/) -> the driver records the
shard (and checks its doc_ids against the store and the other shards) -> once every unit is done: rename the
staged shards into the store -> index -> manifest. A bad input aborts before the manifest is written and
leaves the committed store as it was; a rerun of the same command skips the recorded shards and units. The
units are run by a shard runner: `LocalRunner` (in-process, the default) or the Ray Data pipeline that jobs/
passes in. The driver holds the plan (one entry a file or segment), one small record a shard and 8 bytes a
document, never text or embeddings.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from qasc.engine.config import EngineConfig
from qasc.engine.errors import QascError, first_line
from qasc.engine.passages import DEFAULT_PASSAGE_TOKENS
from qasc.engine.store import index as faiss_index
from qasc.engine.store.files import (
    ResumableError,
    atomic_write,
    failpoint,
    file_digest,
    locked,
    read_table,
)
from qasc.engine.store.inputs import InputUnit, pack_units, plan_files, plan_memory
from qasc.engine.store.manifest import (
    DocIdSet,
    Staging,
    build_manifest,
    check_compatible,
    check_sizes,
    existing_manifest,
    id_hashes,
    now,
    remove_new_store,
    shard_entry,
    source_of,
    store_doc_ids,
)
from qasc.engine.store.mapped_write import remove_previous, write_mapped
from qasc.engine.store.progress import IngestProgress, PhaseClock, log_stderr
from qasc.engine.store.records import ReadOptions
from qasc.engine.store.schema import MANIFEST, STORE_DTYPES
from qasc.engine.store.stages import IngestContext, LocalRunner, ShardRunner
from qasc.engine.tokencap import DEFAULT_MAX_SENTENCE_TOKENS, load_tokenizer

DEFAULT_SHARD_CHARS = 524_288  # characters of input text per shard (the unit of writing and of resume)
DEFAULT_UNIT_BYTES = 64 * 2**20  # input bytes per read unit (the unit of planning and of parallel reading)


@dataclass(frozen=True)
class IngestConfig:
    """How inputs become a store. None: the existing store's setting, else the default.

    Saved, resolved, in the manifest under "ingest" (beside "config", the EngineConfig).
    """

    index: str = "auto"  # auto | flat | ivf | hnsw
    dtype_store: str | None = None  # float32 | float16 (None: the store's, else float32)
    max_sentence_tokens: int | None = None  # token cap of a sentence (None: the store's, else 128)
    # passages (engine.passages) packed up to this many tokens, 0: none (None: the store's; a store written
    # before format 3 has none; else DEFAULT_PASSAGE_TOKENS)
    passage_tokens: int | None = None
    shard_chars: int = DEFAULT_SHARD_CHARS  # input characters per shard: the unit of writing and of resume
    unit_bytes: int = DEFAULT_UNIT_BYTES  # input bytes per read unit: the unit of planning and parallel reading
    read: ReadOptions = field(default_factory=ReadOptions)

    def resolved(self, old: dict | None) -> IngestConfig:
        """The unset settings filled from an existing store's manifest (or the defaults)."""
        dtype = self.dtype_store if self.dtype_store is not None else old["dtype"] if old else "float32"
        cap = self.max_sentence_tokens
        if cap is None:
            cap = old["splitter"]["max_sentence_tokens"] if old else DEFAULT_MAX_SENTENCE_TOKENS
        passage = self.passage_tokens
        if passage is None:
            passage = old["splitter"].get("passage_tokens", 0) if old else DEFAULT_PASSAGE_TOKENS
        return replace(self, dtype_store=dtype, max_sentence_tokens=cap, passage_tokens=passage)

    def to_dict(self) -> dict:
        return asdict(self)


def _validate(config: EngineConfig, settings: IngestConfig, local: bool) -> None:
    from qasc.engine.embedder import resolve_device, resolve_dtype

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
    if settings.unit_bytes < 1:
        raise QascError(f"--unit-bytes must be >= 1, got {settings.unit_bytes}")
    if not 1 <= settings.max_sentence_tokens <= e.max_length - 2:
        raise QascError(f"--max-sentence-tokens must be in [1, {e.max_length - 2}] (--max-length minus the 2 "
                        f"special tokens), got {settings.max_sentence_tokens}")
    if not 0 <= settings.passage_tokens <= e.max_length - 2:
        raise QascError(f"--passage-tokens must be in [0, {e.max_length - 2}] (0: no passages; at most --max-length "
                        f"minus the 2 special tokens), got {settings.passage_tokens}")
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

    def planner(opts: ReadOptions, unit_bytes: int, root: Path) -> tuple[list, list, list, dict, list]:
        segments, sources, skipped = plan_files(paths, opts, unit_bytes, exclude=root)
        return segments, sources, skipped, {}, [(s.doc_id, s.path) for s in segments if s.kind == "text"]

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

    def planner(opts: ReadOptions, unit_bytes: int, root: Path) -> tuple[list, list, list, dict, list]:
        segments, sources, memory = plan_memory(data, opts, source)
        return segments, sources, [], memory, [(d.doc_id, d.source) for docs in memory.values() for d in docs]

    return _ingest(planner, store, config, settings, embedder, runner, progress, log)


def _ingest(planner, store, config, settings, embedder, runner, progress, log) -> dict:
    """The orchestration behind ingest() and ingest_table(); planner(opts, unit_bytes, root) -> (segments,
    sources, skipped files, in-memory Documents by label, [(doc_id, where)] known before reading)."""
    from qasc.engine.embedder import DEFAULT_MODEL, model_fingerprint, resolve_model_path

    t0 = time.perf_counter()
    clock = PhaseClock()
    clock.start("plan")
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
    if settings.passage_tokens:  # absent from stores without passages (those written before format 3 too)
        splitter_desc["passage_tokens"] = settings.passage_tokens
    if old:
        check_compatible(old, root, name, fingerprint, splitter_desc, dtype_store)
        check_sizes(root, old)  # never append to a store whose committed files are missing or cut

    # plan from sizes: no document is read here; what needs the content is checked by the workers, and ids
    # across units / against the store by on_shard below, all before the manifest is written
    opts = settings.read
    segments, sources, skipped, memory, known = planner(opts, settings.unit_bytes, root)
    if skipped:
        log(f"qasc ingest: skipped {len(skipped)} file(s) that are not text/markdown, e.g. {skipped[0]}")
    units = pack_units(segments, settings.unit_bytes)
    first_id = old["counts"]["shards"] if old else 0
    ids = _IdCheck(root, old)
    ids.check_known(known)
    ctx = IngestContext(config, opts, settings.max_sentence_tokens, str(root), dtype_store, settings.shard_chars,
                        first_id, memory, settings.passage_tokens)
    plan = {"base_generation": old["generation"] if old else 0, "fingerprint": fingerprint,
            "splitter": splitter_desc, "dtype": dtype_store, "read": asdict(opts), "sources": sources,
            "shard_chars": settings.shard_chars, "unit_bytes": settings.unit_bytes,
            "units": [[asdict(s) for s in u.segments] for u in units], "first_shard": first_id}
    plan["hash"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
    del segments, known
    clock.stop()

    if runner is None:
        if embedder is None:
            from qasc.engine.chunker import embedder_from

            try:
                with clock("model load"):
                    embedder = embedder_from(config)
            except ValueError as exc:
                raise QascError(str(exc)) from None
        runner = LocalRunner(embedder, clock)
    load_tokenizer(config.embedder.model)  # fail early on a bad model name, before any write
    created = old is None
    with runner.session(), locked(root):
        staging = Staging(root, plan, log)
        resumed = len(staging.done)
        ids.staging = staging
        for record in staging.done.values():
            ids.add_staged(record)
        todo = [u for u in units if u.unit_id not in staging.units]
        done: dict[int, set[int]] = {}
        for unit_id, k in staging.done:
            done.setdefault(unit_id, set()).add(k)
        total = sum(u.size for u in units)
        progress.start(total, max(1, round(total / settings.shard_chars)),
                       sum(r["chars"] for r in staging.done.values()), resumed)
        embedded = 0
        try:
            def on_shard(record: dict) -> None:
                nonlocal embedded
                ids.add_new(record)  # QascError for a doc_id in the store or in another shard
                try:
                    staging.record(record)
                except OSError as exc:
                    raise ResumableError(f"cannot record shard {record['index']} of unit {record['unit']} in "
                                         f"{root}: {exc.strerror or exc}; finished shards are kept, run the same "
                                         f"ingest again to resume") from None
                embedded += record["n_sentences"]
                progress.shard_done(record["chars"], record["n_sentences"], embedded_here=local)

            if todo:
                with clock("run" if runner.mode != "local" else "read, record"):
                    runner.run(todo, ctx, done, on_shard, staging.unit_done, progress)
            _check_finished(units, staging)
            progress.finish(len(staging.done))
            progress.close()
            dims = {r["dim"] for r in staging.done.values()} | ({old["dim"]} if old else set())
            if len(dims) != 1:
                raise QascError(f"embedding width {sorted(dims)} disagrees with the store's; refusing to mix models")
            dim = dims.pop()
            with clock("commit"):
                records = staging.commit(first_id)
            all_shards = (old["shards"] if old else []) + [shard_entry(r) for r in records]
            generation = (old["generation"] if old else 0) + 1
            index_file = f"index-{generation:04d}.faiss"
            with clock("index"):
                index_entry = runner.build_index(str(root), all_shards, old, settings.index, dim, index_file, log)
        except ResumableError:
            progress.close()
            raise
        except QascError:
            progress.close()
            staging.discard()
            if created:
                remove_new_store(root)
            raise
        try:
            index_digest = file_digest(root / index_file)
        except OSError as exc:
            raise ResumableError(f"cannot read {root / index_file}: {exc.strerror or exc}; run the same ingest "
                                 f"again to resume") from None
        failpoint("index-written")
        seconds = time.perf_counter() - t0
        run = {"finished": now(), "documents": sum(r["n_documents"] for r in records),
               "sentences": sum(r["n_sentences"] for r in records), "embedded_here": embedded,
               "seconds": round(seconds, 3), "mode": runner.mode, "workers": runner.workers,
               "resumed_shards": resumed}
        manifest = build_manifest(old, config, name, fingerprint, dim, dtype_store, splitter_desc, all_shards,
                                  records, index_entry, index_digest["sha256"], index_digest["bytes"], generation, run,
                                  settings.to_dict())
        with clock("mapped tables"):
            manifest = write_mapped(root, manifest, log)  # engine.store.mapped_write: what a query maps at open
        failpoint("before-manifest")
        atomic_write(root / MANIFEST, json.dumps(manifest, indent=1).encode())
        if old and old["index"]["file"] != index_file:
            (root / old["index"]["file"]).unlink(missing_ok=True)
        remove_previous(root, old, manifest)
        staging.finish()
    seconds = time.perf_counter() - t0
    return {"store": str(root), "documents": run["documents"], "sentences": run["sentences"],
            "seconds": round(seconds, 2), "sentences_per_s": round(embedded / max(seconds, 1e-9), 1),
            "embedded": embedded, "resumed_shards": run["resumed_shards"], "mode": run["mode"],
            "store_documents": manifest["counts"]["documents"], "store_sentences": manifest["counts"]["sentences"],
            "index": index_entry["kind"], "index_peak_rss_gb": getattr(runner, "index_peak_rss_gb", None),
            "phases": _phases(clock.seconds)}


def _phases(seconds: dict[str, float]) -> dict[str, float]:
    """The runner's phases are timed inside the local run ("read, record" holds them): that entry keeps only
    what is left (reading, the driver's records, progress), so the phases add up to the ingest's time."""
    out = dict(seconds)
    inner = sum(v for k, v in out.items() if k not in ("plan", "model load", "read, record", "commit", "index",
                                                                 "mapped tables"))
    if "read, record" in out:
        out["read, record"] = max(0.0, out["read, record"] - inner)
    return {k: round(v, 3) for k, v in out.items()}


def _check_finished(units: Sequence[InputUnit], staging: Staging) -> None:
    """Every unit finished with all its shards staged; a .jsonl file cut into several segments has records."""
    missing = [u.unit_id for u in units if u.unit_id not in staging.units]
    if missing:
        raise ResumableError(f"the runner finished without read unit(s) {missing[:5]}; run the same ingest again "
                             f"to resume")
    totals: dict[str, int] = {}
    for summary in staging.units.values():
        for path, n in summary.get("jsonl_counts", {}).items():
            totals[path] = totals.get(path, 0) + n
    for path, n in sorted(totals.items()):
        if n == 0:
            raise QascError(f"{path}: empty collection (no records)")


class _IdCheck:
    """Doc_ids unique in the store after this run, checked as each shard's ids arrive (before the manifest is
    written). The driver keeps 8 bytes a document (DocIdSet); a hash match is confirmed by reading the doc_id
    and source columns of the files involved, which also gives the message its two places."""

    def __init__(self, root: Path, old: dict | None) -> None:
        self.root, self.old = root, old
        self.store = store_doc_ids(root, old)
        self.seen = DocIdSet()
        self.staging: Staging | None = None

    def _in_store(self, doc_id: str) -> str | None:
        for shard in self.old["shards"] if self.old else []:
            if source_of(self.root, shard["documents"], doc_id) is not None:
                return f"{self.root}/{shard['documents']}"
        return None

    def check_known(self, known: Sequence[tuple[str, str]]) -> None:
        """Ids known from the plan (text files' paths, in-memory inputs) against the store, before any work."""
        hashes = id_hashes([d for d, _ in known])
        for i in np.flatnonzero(self.store.hits(hashes)):
            doc_id, where = known[i]
            if (file := self._in_store(doc_id)) is not None:
                raise QascError(f"duplicate doc_id {doc_id!r}: {where} is already in the store ({file})")

    def add_staged(self, record: dict) -> None:
        """A shard kept from an earlier run (its ids were checked then)."""
        rel = self.staging.documents_file(record)
        self.seen.add(id_hashes(read_table(self.root, rel, columns=["doc_id"]).column(0).to_pylist()))

    def add_new(self, record: dict) -> None:
        """A shard a worker just wrote: record["doc_ids"] (removed from the record) against the store and
        every other shard of this run."""
        doc_ids = record.pop("doc_ids")
        hashes = id_hashes(doc_ids)
        for i in np.flatnonzero(self.store.hits(hashes)):
            if (file := self._in_store(doc_ids[i])) is not None:
                here = source_of(self.root, record["documents"], doc_ids[i])
                raise QascError(f"duplicate doc_id {doc_ids[i]!r}: {here} is already in the store ({file})")
        for i in np.flatnonzero(self.seen.hits(hashes)):
            here = ((record["unit"], record["index"]), source_of(self.root, record["documents"], doc_ids[i]))
            for key, other in sorted(self.staging.done.items()):
                where = source_of(self.root, self.staging.documents_file(other), doc_ids[i])
                if where is not None:
                    first, second = sorted([(key, where), here])
                    raise QascError(f"duplicate doc_id {doc_ids[i]!r}: {first[1]} and {second[1]}")
        self.seen.add(hashes)


def summary_line(summary: dict) -> str:
    resumed = f", {summary['resumed_shards']} shard(s) resumed" if summary.get("resumed_shards") else ""
    return (f"ingested {summary['documents']} documents, {summary['sentences']} sentences in "
            f"{summary['seconds']:.1f} s ({summary['sentences_per_s']:.1f} sentences/s{resumed}) into "
            f"{summary['store']} (store: {summary['store_documents']} documents, {summary['store_sentences']} "
            f"sentences, {summary['index']} index)")
