"""Ray pipeline of `qasc ingest`: read + cut + split (CPU tasks, one per read unit, streaming their shards)
-> embed + write (embedding actors, one shard per call) -> the driver records each shard's small record.

`RayRunner` is the shard runner that `qasc ingest` hands to `engine.store.ingest` (the engine never imports
Ray). One read task per read unit (at most the CPUs the actors leave, at a time) reads and validates the unit,
cuts it into shards and streams each one (a small header, then the shard's documents and sentences) through
the object store; the driver sends each shard to the least busy embedding actor, which embeds it (sentences,
heading paths, passages) and writes its Parquet files into the store's _staging/ itself, and the driver receives
only the record (names, digests, counts, doc_ids): it never holds text or embeddings. The stages call the same
engine functions as the local path (engine/store/stages.py), so on a multi-node cluster both the inputs and the
store folder must be on a path every node can read and write. Embedding actors take num_gpus=1 each when the
cluster has GPUs, else one CPU each (torch using the CPUs left per actor); a killed actor is restarted and its
shard retried (max_restarts / max_task_retries). Plain Ray tasks and actors rather than Ray Data's actor pool:
Ray Data creates its actors from arguments in the object store, which Ray cannot restart safely once those are
gone (ray-project/ray#53727; Ray prints an error line for every such actor), and it adds start-up and scheduling
work a pipeline of one read and one embed stage does not need.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import NoReturn

from qasc.engine.errors import QascError
from qasc.engine.store import IngestContext, InputUnit, ResumableError
from qasc.jobs.ray_session import connect, die_once

MAX_RESTARTS = 3  # an embedding actor killed mid-job is restarted this many times
MAX_TASK_RETRIES = 3  # and its shard retried on the new actor
FAULT_MARKER_ENV = "QASC_RAY_FAULT_MARKER"  # test only: the first embedding call SIGKILLs its actor once


def read_split(unit_blob: bytes, ctx: IngestContext, skip: Collection[int]) -> Iterator[bytes]:
    """Ray task (CPU, a streaming generator): a pickled read unit -> per shard still to embed, a small header
    {unit, index} and then its payload (docs, sentences); last a header {unit, index=-1, summary}. Headers
    are pickled dicts the driver reads; payloads go from the object store to an embedding actor unread."""
    from qasc.engine.store.stages import split_shard, unit_shards
    from qasc.engine.tokencap import load_tokenizer

    unit: InputUnit = pickle.loads(unit_blob)
    tokenizer = load_tokenizer(ctx.config.embedder.model)
    counts: dict[str, int] = {}
    n = 0
    for k, docs in unit_shards(unit, ctx, counts):
        n = k + 1
        if k not in skip:
            payload = pickle.dumps((docs, split_shard(docs, ctx, tokenizer)), protocol=5)
            yield pickle.dumps({"unit": unit.unit_id, "index": k})
            yield payload
    summary = {"unit": unit.unit_id, "shards": n, "jsonl_counts": counts}
    yield pickle.dumps({"unit": unit.unit_id, "index": -1, "summary": summary})


class EmbedActor:
    """Ray actor: loads the embedder once, then embeds and writes one shard per call (the same calls as the
    local path) and returns its record (a small dict).

    Its constructor arguments are small (the context without in-memory documents, which only the read tasks
    need) so that Ray passes them inline: an actor created from arguments in the object store cannot be
    restarted safely once they are gone (Ray warns about it, ray-project/ray#53727), and this one is restarted
    (MAX_RESTARTS) when its process dies."""

    def __init__(self, ctx: IngestContext, threads: int, fault_marker: str | None = None) -> None:
        import torch

        from qasc.engine.chunker import embedder_from

        if not torch.cuda.is_available():
            torch.set_num_threads(max(1, min(threads, os.cpu_count() or 1)))
        self.embedder = embedder_from(ctx.config)
        self.ctx = ctx
        self.fault_marker = fault_marker

    def embed(self, unit: int, k: int, payload: bytes) -> dict:
        from qasc.engine.store.stages import embed_and_write

        die_once(self.fault_marker)  # test hook: die once, mid-job
        docs, sents = pickle.loads(payload)
        return embed_and_write(self.ctx, unit, k, docs, sents, self.embedder)


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
    on_unit(summary) per finished unit (after its shards) on the driver (small dicts only).

    Connects first when the caller has not (see `connect`); disconnects only what it connected.
    """
    started = connect(ray_address, num_cpus=os.cpu_count())
    import ray

    actors: list = []
    try:
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        if gpus and workers > gpus:
            raise QascError(f"--workers {workers} but the Ray cluster has {gpus} GPU(s)")
        if not gpus and workers >= max(cpus, 1) and cpus > 1:
            raise QascError(f"--workers {workers} leaves no CPU for splitting on a cluster of {cpus} CPUs; "
                            f"use at most {cpus - 1}")
        actor_cls = ray.remote(num_cpus=1, num_gpus=1 if gpus else 0, max_restarts=MAX_RESTARTS,
                               max_task_retries=MAX_TASK_RETRIES)(EmbedActor)
        fault_marker = os.environ.get(FAULT_MARKER_ENV)
        # the actors never read inputs: their context leaves the in-memory documents out (small, inline)
        actors += [actor_cls.remote(replace(ctx, memory={}), max(1, cpus // workers), fault_marker)
                   for _ in range(workers)]
        splitter = ray.remote(num_cpus=1, num_returns="streaming", max_retries=0,
                              _generator_backpressure_num_objects=2 * SHARDS_AHEAD)(read_split)
        pipeline = _Pipeline(actors, ray.put(ctx), done, on_shard, on_unit, on_split)
        pipeline.run(units, splitter, max(1, cpus - workers) if not gpus else max(1, cpus))
    except QascError:
        raise
    except Exception as exc:
        _reraise(exc, "the Ray pipeline failed", "finished shards are kept")
    finally:
        for actor in actors:  # on a cluster that outlives this job, no actor goes on writing after a failure
            ray.kill(actor, no_restart=True)
        if started:
            ray.shutdown()


SHARDS_AHEAD = 2  # split shards waiting per embedding actor (and per read task, unconsumed)


class _Pipeline:
    """The driver's loop: read tasks stream (header, payload) pairs; each payload goes to the least busy
    embedding actor (at most SHARDS_AHEAD each); each record comes back to on_shard, and a unit's summary goes
    to on_unit once its last shard is recorded. The driver gets only headers and records, never a payload."""

    def __init__(self, actors: list, ctx_ref, done: Mapping[int, Collection[int]], on_shard, on_unit, on_split):
        self.actors, self.ctx_ref, self.done = actors, ctx_ref, done
        self.on_shard, self.on_unit, self.on_split = on_shard, on_unit, on_split
        self.busy = [0] * len(actors)
        self.running: dict = {}  # result ref -> (actor index, unit)
        self.shards: deque = deque()  # (unit, index, payload ref) split, not yet sent to an actor
        self.header: dict = {}  # read generator -> the header whose payload comes next (None: a header next)
        self.left: dict[int, int] = {}  # unit -> its shards sent and not yet recorded
        self.summaries: dict[int, dict] = {}  # unit -> summary, until its shards are recorded

    def run(self, units: Sequence[InputUnit], splitter, max_reads: int) -> None:
        import ray

        todo = deque(units)
        while todo or self.header or self.shards or self.running:
            while todo and len(self.header) < max_reads:
                unit = todo.popleft()
                gen = splitter.remote(pickle.dumps(unit, protocol=5), self.ctx_ref,
                                      sorted(self.done.get(unit.unit_id, ())))
                self.header[gen] = None
                self.left.setdefault(unit.unit_id, 0)
            self._dispatch()
            reading = list(self.header) if len(self.shards) < SHARDS_AHEAD * len(self.actors) else []
            ready, _ = ray.wait(list(self.running) + reading, num_returns=1)
            for item in ready:
                if item in self.running:
                    self._recorded(item)
                else:
                    self._read(item)

    def _dispatch(self) -> None:
        while self.shards and min(self.busy) < SHARDS_AHEAD:
            i = self.busy.index(min(self.busy))
            unit, k, payload = self.shards.popleft()
            self.running[self.actors[i].embed.remote(unit, k, payload)] = (i, unit)
            self.busy[i] += 1

    def _read(self, gen) -> None:
        import ray

        try:
            ref = next(gen)
        except StopIteration:
            del self.header[gen]
            return
        header = self.header[gen]
        if header is not None:  # this is its payload
            self.shards.append((header["unit"], header["index"], ref))
            self.left[header["unit"]] += 1
            self.header[gen] = None
            return
        header = pickle.loads(ray.get(ref))
        if header["index"] >= 0:
            self.header[gen] = header
        else:
            self.summaries[header["unit"]] = header["summary"]
            self._unit_finished(header["unit"])

    def _recorded(self, ref) -> None:
        import ray

        i, unit = self.running.pop(ref)
        self.busy[i] -= 1
        record = ray.get(ref)
        if self.on_split is not None:
            self.on_split(record["chars"], record["n_sentences"])
        self.on_shard(record)
        self.left[unit] -= 1
        self._unit_finished(unit)

    def _unit_finished(self, unit: int) -> None:
        if unit in self.summaries and self.left[unit] == 0:
            self.on_unit(self.summaries.pop(unit))


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
