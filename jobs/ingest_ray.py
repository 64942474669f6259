"""Ray Data pipeline of `qasc ingest`: read + cut + split (CPU tasks, one per read unit) -> embed + write
(actor pool, one row per shard) -> the driver records each shard's small record.

`RayRunner` is the shard runner that `qasc ingest` hands to `engine.store.ingest` (the engine never imports
Ray). One row per read unit enters the pipeline; the CPU task reads and validates the unit and cuts it into
shards (one row each); the embedding actors embed a shard (and its heading paths) and write its three Parquet
files into the store's _staging/ themselves, and the driver receives only the record (names, digests, counts,
doc_ids): it never holds text or embeddings. The stages call the same engine functions as the local path
(engine/store/stages.py), so on a multi-node cluster both the inputs and the store folder must be on a path
every node can read and write. Embedding actors take num_gpus=1 each when the cluster has GPUs, else one CPU
each (torch using the CPUs left per actor); a killed actor is restarted and its shard retried
(max_restarts / max_task_retries).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import NoReturn

import numpy as np

from qasc.engine.errors import QascError
from qasc.engine.store import IngestContext, InputUnit, ResumableError
from qasc.jobs.ray_session import connect, die_once

MAX_RESTARTS = 3  # an embedding actor killed mid-job is restarted this many times
MAX_TASK_RETRIES = 3  # and its shard retried on the new actor
FAULT_MARKER_ENV = "QASC_RAY_FAULT_MARKER"  # test only: the first embedding call SIGKILLs its actor once


def read_split(row: dict, ctx: IngestContext, done: Mapping[int, Collection[int]]) -> Iterator[dict]:
    """Ray task (CPU): {unit} -> one row {unit, index, payload=(docs, sentences)} per shard still to embed,
    then {unit, index=-1, payload=the unit's summary}."""
    from qasc.engine.store.stages import split_shard, unit_shards
    from qasc.engine.tokencap import load_tokenizer

    unit: InputUnit = pickle.loads(row["unit"])
    tokenizer = load_tokenizer(ctx.config.embedder.model)
    skip = done.get(unit.unit_id, ())
    counts: dict[str, int] = {}
    n = 0
    for k, docs in unit_shards(unit, ctx, counts):
        n = k + 1
        if k not in skip:
            sents = split_shard(docs, ctx, tokenizer)
            yield {"unit": unit.unit_id, "index": k, "payload": pickle.dumps((docs, sents), protocol=5)}
    summary = {"unit": unit.unit_id, "shards": n, "jsonl_counts": counts}
    yield {"unit": unit.unit_id, "index": -1, "payload": pickle.dumps(summary, protocol=5)}


class EmbedActor:
    """Ray actor: loads the embedder once, then embeds and writes one shard per call (the same calls as the
    local path) and returns its record; unit summaries pass through."""

    def __init__(self, ctx: IngestContext, threads: int, fault_marker: str | None = None) -> None:
        import torch

        from qasc.engine.chunker import embedder_from

        if not torch.cuda.is_available():
            torch.set_num_threads(max(1, min(threads, os.cpu_count() or 1)))
        self.embedder = embedder_from(ctx.config)
        self.ctx = ctx
        self.fault_marker = fault_marker

    def __call__(self, batch: dict) -> dict:
        from qasc.engine.store.stages import embed_headings, embed_passages, embed_shard, shard_label, write_shard

        out = []
        for unit, k, payload in zip(batch["unit"].tolist(), batch["index"].tolist(), batch["payload"], strict=True):
            if k < 0:
                out.append(payload)
                continue
            die_once(self.fault_marker)  # test hook: die once, mid-job
            docs, sents = pickle.loads(payload)
            label = shard_label(self.ctx, int(unit), int(k))
            emb = embed_shard(sents, self.embedder, label)
            heads = embed_headings(sents, self.embedder, label)
            passages = embed_passages(sents, self.embedder, label, self.ctx.passage_tokens)
            out.append(pickle.dumps(write_shard(self.ctx, int(unit), int(k), docs, sents, emb, heads, passages),
                                    protocol=5))
        return {"unit": batch["unit"], "index": batch["index"], "payload": np.array(out, dtype=object)}


def _qasc_cause(exc: BaseException) -> QascError | None:
    """The QascError raised inside a Ray task, if that is what failed (Ray wraps it, sometimes twice)."""
    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        cause = getattr(e, "cause", None)
        if type(e) is QascError or (isinstance(e, QascError) and not hasattr(e, "cause")):
            return e
        stack.extend([cause, e.__cause__, e.__context__])
    return None


def _reraise(exc: Exception, failed: str, kept: str) -> NoReturn:
    """A Ray failure -> the QascError / ResumableError raised inside the task as itself, anything else (a lost
    node, a killed worker) as a ResumableError: '<failed> (<error>); <kept>, run the same ingest again'."""
    cause = _qasc_cause(exc)
    if cause is not None:
        kind = ResumableError if isinstance(cause, ResumableError) else QascError
        raise kind(str(cause.args[0]) if cause.args else str(cause)) from None
    text = str(exc).strip().splitlines()
    raise ResumableError(f"{failed} ({type(exc).__name__}: {text[0] if text else ''}); {kept}, run the same "
                         f"ingest again to resume") from None


def run_ray(
    units: Sequence[InputUnit],
    ctx: IngestContext,
    done: Mapping[int, Collection[int]],
    *,
    workers: int,
    ray_address: str | None,
    on_shard: Callable[[dict], None],
    on_unit: Callable[[dict], None],
    on_split: Callable[[int, int], None] | None = None,
) -> None:
    """Runs read -> split -> embed -> write over `units` on Ray; calls on_shard(record) per written shard and
    on_unit(summary) per finished unit on the driver (small dicts only).

    Connects first when the caller has not (see `connect`); disconnects only what it connected.
    """
    started = connect(ray_address, num_cpus=os.cpu_count())
    import ray

    fault_marker = os.environ.get(FAULT_MARKER_ENV)
    try:
        from ray.data import ActorPoolStrategy, DataContext

        data_ctx = DataContext.get_current()
        data_ctx.enable_progress_bars = False
        data_ctx.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        if gpus and workers > gpus:
            raise QascError(f"--workers {workers} but the Ray cluster has {gpus} GPU(s)")
        if not gpus and workers >= max(cpus, 1) and cpus > 1:
            raise QascError(f"--workers {workers} leaves no CPU for splitting on a cluster of {cpus} CPUs; "
                            f"use at most {cpus - 1}")
        rows = [{"unit": u.unit_id, "payload": pickle.dumps(u, protocol=5)} for u in units]
        ds = ray.data.from_items([{"unit": r["payload"]} for r in rows], override_num_blocks=len(rows))
        ds = ds.flat_map(read_split, fn_kwargs={"ctx": ctx, "done": {k: sorted(v) for k, v in done.items()}},
                         num_cpus=1)
        embed_args = dict(
            fn_constructor_kwargs={"ctx": ctx, "threads": max(1, cpus // workers), "fault_marker": fault_marker},
            batch_size=1,
            compute=ActorPoolStrategy(size=workers),
            num_gpus=1 if gpus else 0,
            num_cpus=1,
        )
        try:  # Ray 2.60 has no named parameter for these; its default is unbounded (-1), ours is bounded
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                ds = ds.map_batches(EmbedActor, **embed_args, max_restarts=MAX_RESTARTS,
                                    max_task_retries=MAX_TASK_RETRIES)
        except TypeError:  # a Ray without ray_remote_args: keep its (unbounded) restarts and retries
            ds = ds.map_batches(EmbedActor, **embed_args)
        for row in ds.iter_rows():
            item = pickle.loads(row["payload"])
            if int(row["index"]) < 0:
                on_unit(item)
                continue
            if on_split is not None:
                on_split(item["chars"], item["n_sentences"])
            on_shard(item)
    except QascError:
        raise
    except Exception as exc:
        _reraise(exc, "the Ray pipeline failed", "finished shards are kept")
    finally:
        if started:
            ray.shutdown()


class RayRunner:
    """The shard runner of `engine.store.ingest` on Ray: `ingest(..., runner=RayRunner(workers=2))`.

    workers: embedding actors (one GPU each on a GPU cluster); ray_address: None = RAY_ADDRESS, else the
    cluster of a submitted Ray job, else a new local instance (jobs/ray_session.py). Ray is connected when
    the ingest enters `session()`, before anything is written.
    """

    mode = "ray"

    def __init__(self, workers: int = 1, ray_address: str | None = None) -> None:
        if workers < 1:
            raise QascError(f"--workers must be >= 1, got {workers}")
        self.workers = workers
        self.ray_address = ray_address

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Connects to Ray (a bad address writes nothing); disconnects what it connected."""
        started = connect(self.ray_address, num_cpus=os.cpu_count())
        try:
            yield
        finally:
            if started:
                import ray

                ray.shutdown()

    def run(self, units: Sequence[InputUnit], ctx: IngestContext, done: Mapping[int, Collection[int]],
            on_shard: Callable[[dict], None], on_unit: Callable[[dict], None], progress) -> None:
        run_ray(units, ctx, done, workers=self.workers, ray_address=self.ray_address, on_shard=on_shard,
                on_unit=on_unit, on_split=progress.split)

    def build_index(self, root: str, shards: list[dict], old: dict | None, kind: str, dim: int, index_file: str,
                    log: Callable[[str], None]) -> dict:
        """The index built and written by one Ray task (`build_index_remote`): the driver gets its manifest entry."""
        return build_index_remote(root, shards, old, kind, dim, index_file, log)


def _build_index_task(root: str, shards: list[dict], old: dict | None, kind: str, dim: int, index_file: str
                      ) -> tuple[dict, str]:
    """-> (the index's manifest entry, where it was built: 'node IP, pid N')."""
    import ray

    from qasc.engine.store.index_build import build_index_file
    from qasc.engine.store.progress import log_stderr

    entry = build_index_file(root, shards, old, kind, dim, index_file, log_stderr)
    return entry, f"node {ray.util.get_node_ip_address()}, pid {os.getpid()}"


def build_index_remote(root: str, shards: list[dict], old: dict | None, kind: str, dim: int, index_file: str,
                       log: Callable[[str], None]) -> dict:
    """`engine.store.index_build.build_index_file` in a Ray task on one node (root: a path that node can read and
    write) -> the manifest entry; the driver holds neither vectors nor index. The task asks for the CPUs of the
    largest node (the embedding actors are gone by now), so that faiss's k-means threads have them (Ray sets
    OMP_NUM_THREADS to a task's CPUs). A QascError / ResumableError of the task is raised as itself."""
    import ray

    cpus = max([int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")] + [1])
    log(f"qasc ingest: building the index in a Ray task ({cpus} CPU)")
    task = ray.remote(num_cpus=cpus, max_retries=0)(_build_index_task)
    try:
        entry, where = ray.get(task.remote(root, shards, old, kind, dim, index_file))
        log(f"qasc ingest: {entry['kind']} index of {entry['ntotal']} vectors written by the Ray task ({where})")
        return entry
    except QascError:
        raise
    except Exception as exc:
        _reraise(exc, "building the index on Ray failed", "the shards are committed")
