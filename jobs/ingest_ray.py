"""Ray Data pipeline of `qasc ingest`: read -> split (CPU tasks) -> embed (actor pool) -> write (driver).

`RayRunner` is the shard runner that `qasc ingest` hands to `engine.store.ingest` (the engine never imports
Ray). One row per shard flows through the pipeline (the shard is the unit of work and of resume). The stages
call the same engine functions as the local path (engine/store/stages.py): read_shard, split_shard, embed_shard;
the driver writes each finished shard atomically as it arrives, so the store lives on the driver's disk
and a multi-node cluster only needs the inputs on a path every node can read. Embedding actors take
num_gpus=1 each when the cluster has GPUs, else one CPU each (torch using the CPUs left per actor); a
killed actor is restarted and its shard retried (max_restarts / max_task_retries).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import warnings
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from engine.errors import QascError
from engine.store import IngestContext, ResumableError, ShardTask
from jobs.ray_session import connect

MAX_RESTARTS = 3  # an embedding actor killed mid-job is restarted this many times
MAX_TASK_RETRIES = 3  # and its shard retried on the new actor
FAULT_MARKER_ENV = "QASC_RAY_FAULT_MARKER"  # test only: the first embedding call SIGKILLs its actor once


def read_split(row: dict, ctx: IngestContext) -> dict:
    """Ray task (CPU): {shard, task} -> {shard, payload=(docs, sentences)}."""
    from engine.store.inputs import read_shard
    from engine.store.stages import split_shard
    from engine.tokencap import load_tokenizer

    task: ShardTask = pickle.loads(row["task"])
    docs = read_shard(task.docs, ctx.read, ctx.memory)
    sents = split_shard(docs, ctx, load_tokenizer(ctx.config.embedder.model))
    return {"shard": row["shard"], "payload": pickle.dumps((docs, sents), protocol=5)}


class EmbedActor:
    """Ray actor: loads the embedder once, then embeds one shard per call (the same call as the local path)."""

    def __init__(self, ctx: IngestContext, threads: int, fault_marker: str | None = None) -> None:
        import torch

        from engine.chunker import embedder_from

        if not torch.cuda.is_available():
            torch.set_num_threads(max(1, min(threads, os.cpu_count() or 1)))
        self.embedder = embedder_from(ctx.config)
        self.fault_marker = fault_marker

    def __call__(self, batch: dict) -> dict:
        from engine.store.stages import embed_shard

        out = []
        for shard, payload in zip(batch["shard"].tolist(), batch["payload"], strict=True):
            if self.fault_marker and not os.path.exists(self.fault_marker):  # test hook: die once, mid-job
                with open(self.fault_marker, "w") as fh:
                    fh.write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
            docs, sents = pickle.loads(payload)
            emb = embed_shard(sents, self.embedder, int(shard))
            out.append(pickle.dumps((docs, sents, emb), protocol=5))
        return {"shard": batch["shard"], "payload": np.array(out, dtype=object)}


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


def run_ray(
    tasks: Sequence[ShardTask],
    ctx: IngestContext,
    *,
    workers: int,
    ray_address: str | None,
    on_shard: Callable,
    on_split: Callable[[int, int], None] | None = None,
) -> None:
    """Runs read -> split -> embed over `tasks` on Ray; calls on_shard(task, docs, sents, emb) on the driver.

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
        by_id = {t.shard_id: t for t in tasks}
        rows = [{"shard": t.shard_id, "task": pickle.dumps(t, protocol=5)} for t in tasks]
        ds = ray.data.from_items(rows, override_num_blocks=len(rows))
        ds = ds.map(read_split, fn_kwargs={"ctx": ctx}, num_cpus=1)
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
            task = by_id[int(row["shard"])]
            docs, sents, emb = pickle.loads(row["payload"])
            if on_split is not None:
                on_split(task.chars, len(emb))
            on_shard(task, docs, sents, emb)
    except QascError:
        raise
    except Exception as exc:
        cause = _qasc_cause(exc)
        if cause is not None:
            raise QascError(str(cause.args[0]) if cause.args else str(cause)) from None
        text = str(exc).strip().splitlines()
        raise ResumableError(f"the Ray pipeline failed ({type(exc).__name__}: {text[0] if text else ''}); "
                             f"finished shards are kept, run the same ingest again to resume") from None
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

    def run(self, tasks: Sequence[ShardTask], ctx: IngestContext, on_shard: Callable, progress) -> None:
        run_ray(tasks, ctx, workers=self.workers, ray_address=self.ray_address, on_shard=on_shard,
                on_split=progress.split)
