"""`qasc ingest PATH... --store DIR`: split, embed and index documents into a store (new, resumed or appended)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from qasc.engine.errors import QascError
from qasc.engine.store.index import AUTO_FLAT_MAX, KINDS
from qasc.engine.store.ingest import DEFAULT_SHARD_CHARS, DEFAULT_UNIT_BYTES
from qasc.engine.store.records import ENCODING_ERRORS
from qasc.engine.store.schema import STORE_DTYPES
from qasc.jobs.devices import add_device_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="text/markdown files, folders of them (doc_id = path relative to the folder, without "
                        "extension), or .jsonl/.parquet files with id and text columns (other columns become "
                        "metadata)")
    p.add_argument("--store", required=True, metavar="DIR",
                   help="store folder: created if new, resumed after a crash, appended to if it exists")
    p.add_argument("--partitions", type=int, metavar="N",
                   help="write a collection of N partition stores instead (documents assigned by a hash of doc_id; "
                        "docs/collections.md); an existing collection is appended to")
    m = p.add_argument_group("model (unset: the store's setting, else the default)")
    m.add_argument("--model", metavar="NAME_OR_PATH",
                   help="embedding model: a local folder or a Hugging Face name (default: all-MiniLM-L6-v2, bundled)")
    add_device_argument(m, default=None, unset="the store's setting, else auto")
    m.add_argument("--dtype", metavar="DTYPE",
                   help="compute dtype of the model: auto | float32 | float16 | bfloat16 (default auto: bf16/fp16 "
                        "on GPU, fp32 on CPU)")
    m.add_argument("--batch-tokens", type=int, metavar="N",
                   help="padded tokens per embedding batch (default 1024 on CPU, 262144 on GPU)")
    m.add_argument("--max-length", type=int, metavar="N", help="model input length in tokens (default 256)")
    s = p.add_argument_group("sentences (unset: the store's setting, else the default)")
    s.add_argument("--max-sentence-tokens", type=int, metavar="N",
                   help="sentences longer than N model tokens are cut at token offsets (default 128)")
    s.add_argument("--passage-tokens", type=int, metavar="N",
                   help="passages for the budget fill: sentence runs within a paragraph packed up to N model tokens, "
                        "each embedded as one text (default 128 for a new store, else the store's; 0: none)")
    s.add_argument("--max-chars", type=int, metavar="N",
                   help="sentences longer than N characters are cut at whitespace first (default 2000)")
    s.add_argument("--line-breaks", metavar="MODE",
                   help="does a single newline end a sentence: ignore | paragraph | always (default always)")
    o = p.add_argument_group("store")
    o.add_argument("--dtype-store", metavar="DTYPE",
                   help=f"embedding storage type: {' | '.join(STORE_DTYPES)} (default float32; float16 halves the "
                        f"store)")
    o.add_argument("--index", default="auto", metavar="KIND",
                   help=f"FAISS index: {' | '.join(KINDS)}; auto = flat (exact) up to {AUTO_FLAT_MAX} sentences, "
                        f"ivf above (default auto)")
    o.add_argument("--shard-chars", type=int, default=DEFAULT_SHARD_CHARS, metavar="N",
                   help=f"document characters per shard, the unit of writing and of resume (default "
                        f"{DEFAULT_SHARD_CHARS})")
    o.add_argument("--unit-bytes", type=int, default=DEFAULT_UNIT_BYTES, metavar="N",
                   help=f"input bytes per read unit, planned from file sizes and read by one worker; shards are cut "
                        f"inside a unit (default {DEFAULT_UNIT_BYTES})")
    i = p.add_argument_group("input")
    i.add_argument("--encoding", default="utf-8", help="text encoding of the input files (default utf-8)")
    i.add_argument("--errors", default="strict", metavar="MODE",
                   help=f"undecodable bytes: {' | '.join(ENCODING_ERRORS)} (default strict: refuse the file)")
    i.add_argument("--id-field", default="id", metavar="NAME", help="id column of .jsonl/.parquet inputs")
    i.add_argument("--text-field", default="text", metavar="NAME", help="text column of .jsonl/.parquet inputs")
    r = p.add_argument_group("execution")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true",
                      help="run in this process without Ray (the default on one machine with one embedder)")
    mode.add_argument("--ray", action="store_true",
                      help="run on Ray even on one machine with one embedder (default: Ray when --workers > 1, "
                           "--ray-address or $RAY_ADDRESS names a cluster, or under `ray job submit`)")
    r.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster to use: 'auto' (the cluster this machine belongs to) or HOST:PORT of its head "
                        "(default: $RAY_ADDRESS, set by `ray job submit`, else a new local instance)")
    r.add_argument("--workers", type=int, default=1, metavar="N",
                   help="embedding actors on Ray, one GPU each when the cluster has GPUs (default 1)")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: a bar on a terminal, plain log lines otherwise)")


def build_config(args: argparse.Namespace):
    """Flags -> EngineConfig: the store's config (or the defaults) with every given flag applied."""
    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.splitter import SplitterConfig
    from qasc.engine.store.manifest import existing_manifest

    old = existing_manifest(args.store)
    base = EngineConfig.from_dict(old["config"]) if old else EngineConfig()
    emb = {**asdict(base.embedder), **{k: v for k, v in (
        ("model", args.model), ("device", args.device), ("dtype", args.dtype), ("batch_tokens", args.batch_tokens),
        ("max_length", args.max_length)) if v is not None}}
    spl = {**asdict(base.splitter), **{k: v for k, v in (
        ("max_chars", args.max_chars), ("line_breaks", args.line_breaks)) if v is not None}}
    try:
        return EngineConfig(embedder=EmbedderConfig(**emb), splitter=SplitterConfig(**spl), qasc=base.qasc,
                            retrieval=base.retrieval)
    except ValueError as exc:
        raise QascError(str(exc)) from None


def build_settings(args: argparse.Namespace):
    """Flags -> IngestConfig (unset dtype/token cap: the store's setting, resolved by ingest)."""
    from qasc.engine.store import IngestConfig, ReadOptions

    return IngestConfig(index=args.index, dtype_store=args.dtype_store, max_sentence_tokens=args.max_sentence_tokens,
                        passage_tokens=args.passage_tokens, shard_chars=args.shard_chars, unit_bytes=args.unit_bytes,
                        read=ReadOptions(args.encoding, args.errors, args.id_field, args.text_field))


def use_ray(args: argparse.Namespace) -> bool:
    """Ray where it can add something: more than one embedder (--workers), a cluster to run on (--ray-address,
    $RAY_ADDRESS, a submitted Ray job), or --ray; else (one embedder on this machine) in-process, which embeds
    the same shards without Ray's start-up and scheduling (bench/RESULTS.md, issue 52)."""
    from qasc.jobs.ray_session import target_address

    if args.local:
        return False
    return args.ray or args.workers > 1 or target_address(args.ray_address) is not None


def build_runner(args: argparse.Namespace):
    """In-process (None: ingest's LocalRunner) or the Ray pipeline with --workers actors (see `use_ray`)."""
    if args.workers < 1:
        raise QascError(f"--workers must be >= 1, got {args.workers}")
    if args.local and args.workers > 1:
        raise QascError(f"--workers {args.workers} needs Ray; drop --local (the local path runs one embedder)")
    if not use_ray(args):
        return None
    from qasc.jobs.ingest_ray import RayRunner

    return RayRunner(workers=args.workers, ray_address=args.ray_address)


def run(args: argparse.Namespace) -> int:
    from qasc.engine.store import IngestProgress, ingest, summary_line

    if args.partitions is not None:
        return run_partitions(args)
    config, settings, runner = build_config(args), build_settings(args), build_runner(args)
    summary = ingest(args.paths, args.store, config, settings, runner=runner, progress=IngestProgress(args.progress))
    print(summary_line(summary), flush=True)
    return 0


def run_partitions(args: argparse.Namespace) -> int:
    """--partitions N: engine.store.collection.ingest_partitions, each partition ingested in turn (--local or Ray,
    as a store); the partitions' settings come from the flags (or the collection's first partition)."""
    from qasc.engine.store import IngestProgress
    from qasc.engine.store.collection import ingest_partitions, is_collection, partition_name

    store = args.store
    if is_collection(store):  # an append: the partitions' settings, as a store's
        args.store = str(Path(store) / partition_name(0))
    config, settings = build_config(args), build_settings(args)
    args.store = store
    runner = build_runner(args)
    summary = ingest_partitions(args.paths, store, args.partitions, config, settings, runner=runner,
                                progress=IngestProgress(args.progress))
    print(f"ingested {summary['documents']} documents, {summary['sentences']} sentences into collection {store} "
          f"({args.partitions} partitions)", flush=True)
    return 0
