"""A collection served across a Ray cluster: its partitions on actors, the engine's collection-wide view in the
driver.

Each partition actor (`PartitionActor`) opens one or a few partition stores (engine.partition.PartitionServer:
their vectors and index, never the whole collection) and answers the vector operations of the protocol in
engine.partition; the driver opens the collection without its vectors (the rows' positions, heading paths, BM25
statistics and passages' rows, collection-wide) and runs the unchanged engine, each fan-out submitted to every
actor before any result is awaited. The answers are those of the collection opened in one process, which are
those of one store of the same documents (docs/collections.md, "Serving partitions": where it is exact).

Placement is Ray's own: actors are created with the SPREAD scheduling strategy (spread over the cluster's nodes),
each asking for a share of a CPU (the cluster's CPUs over the actors, at most 1) so that more partitions than
cores still start. An actor killed mid-batch is restarted (MAX_RESTARTS) and its call retried
(MAX_TASK_RETRIES): every call is a pure function of the partition and its arguments, so the output is the same.
A partition an actor cannot open fails the job with one line naming it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from qasc.engine.config import RetrievalConfig
from qasc.engine.errors import QascError, first_line
from qasc.engine.query import DEFAULT_SLICE_SIZE
from qasc.jobs.ingest_ray import FAULT_MARKER_ENV, MAX_RESTARTS, MAX_TASK_RETRIES
from qasc.jobs.ray_session import connect, die_once
from qasc.kernels.params import QascParams


class PartitionActor:
    """One or a few partition stores served on a Ray actor: `call(path, method, *args)` runs
    PartitionServer(path).method(*args)."""

    def __init__(self, paths: Sequence[str], fault_marker: str | None = None) -> None:
        from qasc.engine.partition import PartitionServer

        self.fault_marker = fault_marker
        self.servers = {path: PartitionServer(path) for path in paths}

    def call(self, path: str, method: str, *args):
        if method == "dots":
            die_once(self.fault_marker)  # test hook: an actor dies once, mid-batch
        return getattr(self.servers[path], method)(*args)


class RayClient:
    """One partition on its actor, as engine.partition's clients are called: `submit` -> an ObjectRef,
    `gather` -> the values."""

    def __init__(self, actor, path: str) -> None:
        self.actor = actor
        self.path = path

    def submit(self, method: str, *args):
        return self.actor.call.remote(self.path, method, *args)

    def gather(self, pending: list) -> list:
        import ray

        try:
            return ray.get(pending)
        except ray.exceptions.RayError as exc:
            raise QascError(f"partition {self.path} cannot be served: {first_line(exc)}") from None


def actor_groups(paths: Sequence[str], actors: int) -> list[list[str]]:
    """The partitions' paths dealt round robin over `actors` actors (none left empty)."""
    actors = max(1, min(actors, len(paths)))
    return [list(paths[a::actors]) for a in range(actors)]


def ray_partitions(actors: int | None = None, fault_marker: str | None = None, actors_out: list | None = None):
    """-> a function of the opened collection view and the device -> engine.partition.PartitionedVectors
    served by `actors` Ray actors (default one per partition that holds documents; Engine.open(partitions=)).
    actors_out: a list that gets the actor handles (bench: per-actor memory)."""

    def serve(store, device):
        import ray

        from qasc.engine.partition import PartitionedVectors

        layout = store.layout
        paths = [str(p) for p, held in zip(layout.paths, layout.held, strict=True) if held]
        groups = actor_groups(paths, actors or len(paths))
        cpus = ray.cluster_resources().get("CPU", 1.0)
        share = max(0.01, min(1.0, cpus / len(groups)))
        remote = ray.remote(PartitionActor).options(
            num_cpus=share, max_restarts=MAX_RESTARTS, max_task_retries=MAX_TASK_RETRIES, scheduling_strategy="SPREAD")
        handles = [remote.remote(group, fault_marker) for group in groups]
        by_path = {path: handle for group, handle in zip(groups, handles, strict=True) for path in group}
        clients = [RayClient(by_path[str(p)], str(p)) if held else None
                   for p, held in zip(layout.paths, layout.held, strict=True)]
        for client in clients:  # each actor opened its partitions: a failure names the partition, before any query
            if client is not None:
                client.gather([client.submit("peak_rss")])
        if actors_out is not None:
            actors_out.extend(handles)
        return PartitionedVectors(layout, clients, device)

    return serve


def run_collection_job(
    store: str,
    ids: list[str],
    questions: list[str],
    params: QascParams,
    retrieval: RetrievalConfig,
    workers: int | None = None,
    ray_address: str | None = None,
    device: str = "auto",
    slice_size: int = DEFAULT_SLICE_SIZE,
    reranker: str | None = None,
    rerank_top: int | None = None,
) -> Iterator:
    """Answer `questions` over a collection whose partitions are served by Ray actors (`workers` of them, default
    one per partition) -> pyarrow RecordBatches of result rows (engine.columns.results_schema()), slice by slice
    in input order (a generator: Ray starts on the first next() and is shut down, when this call started it, once
    the generator ends or is closed). The driver embeds the questions and runs the engine (--device is the
    driver's); reranker: the rerank stage, in the driver."""
    import ray

    from qasc.engine.query import Engine
    from qasc.engine.rerank import RERANK_TOP

    if len(ids) != len(questions):
        raise QascError(f"{len(ids)} query ids for {len(questions)} questions")
    started_here = connect(ray_address, num_cpus=None)
    try:
        engine = Engine.open(store, device=device, reranker=reranker,
                             rerank_top=RERANK_TOP if rerank_top is None else rerank_top,
                             partitions=ray_partitions(workers, os.environ.get(FAULT_MARKER_ENV)))
        yield from engine.query_stream(questions, ids, params, retrieval, slice_size)
    finally:
        if started_here:
            ray.shutdown()
