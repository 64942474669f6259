"""A collection served across a Ray cluster: its partitions on actors, the engine's collection-wide view in the
driver.

Each partition actor (`PartitionActor`) opens one or a few partition stores (engine.partition.PartitionServer:
their vectors and index, never the whole collection) and answers the vector operations of the protocol in
engine.partition; the driver opens the collection without its vectors (the rows' positions, heading paths, BM25
statistics and passages' rows, collection-wide) and runs the unchanged engine, each fan-out submitted to every
actor before any result is awaited. The answers are those of the collection opened in one process, which are
those of one store of the same documents (docs/collections.md, "Serving partitions": where it is exact).

Placement is Ray's own: actors are created with the SPREAD scheduling strategy (spread over the cluster's nodes),
each asking for a share of a CPU (`cpu_share`: at most 1, small enough that the actors spread evenly fit the
smallest node) so that more partitions than cores still start. An actor killed mid-batch is restarted
(MAX_RESTARTS) and its call retried (MAX_TASK_RETRIES): every call is a pure function of the partition and its
arguments, so the output is the same. A partition an actor cannot open fails the job with one line naming it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence

from qasc.engine.config import RetrievalConfig
from qasc.engine.errors import QascError, first_line
from qasc.engine.query import DEFAULT_SLICE_SIZE
from qasc.jobs.ingest_ray import FAULT_MARKER_ENV, MAX_RESTARTS, MAX_TASK_RETRIES
from qasc.jobs.ray_session import connect, die_once
from qasc.kernels.params import QascParams

# a partition actor not placed and open by then fails the job, naming the partition (QASC_ACTOR_START_TIMEOUT_S)
ACTOR_START_TIMEOUT_S = float(os.environ.get("QASC_ACTOR_START_TIMEOUT_S", 300))


class PartitionActor:
    """One or a few partition stores served on a Ray actor: `call(path, method, *args)` runs
    PartitionServer(path).method(*args)."""

    def __init__(self, paths: Sequence[str], fault_marker: str | None = None) -> None:
        from qasc.engine.partition import PartitionServer

        self.fault_marker = fault_marker
        self.servers = {path: PartitionServer(path) for path in paths}

    @staticmethod
    def node_id() -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

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

    def gather(self, pending: list, timeout: float | None = None) -> list:
        import ray

        try:
            return ray.get(pending, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise QascError(f"partition {self.path}: its Ray actor did not start within {timeout:.0f} s (no free "
                            f"CPU share on the cluster's nodes?)") from None
        except ray.exceptions.RayError as exc:
            raise QascError(f"partition {self.path} cannot be served: {first_line(exc)}") from None


def actor_groups(paths: Sequence[str], actors: int) -> list[list[str]]:
    """The partitions' paths dealt round robin over `actors` actors (none left empty)."""
    actors = max(1, min(actors, len(paths)))
    return [list(paths[a::actors]) for a in range(actors)]


def cpu_share(node_cpus: Sequence[float], actors: int) -> float:
    """The CPU share each of `actors` actors asks for, so that they all fit when spread evenly over the nodes
    with CPUs (each node takes ceil(actors / nodes), the smallest node bounds the share): at most 1, at least
    0.01 (a cluster of 1-CPU nodes serving more partitions than nodes still starts every actor)."""
    cpus = [c for c in node_cpus if c > 0] or [1.0]
    per_node = -(-actors // len(cpus))
    return max(0.01, min(1.0, min(cpus) / per_node))


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
        share = cpu_share([n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")], len(groups))
        remote = ray.remote(PartitionActor).options(
            num_cpus=share, max_restarts=MAX_RESTARTS, max_task_retries=MAX_TASK_RETRIES, scheduling_strategy="SPREAD")
        handles = [remote.remote(group, fault_marker) for group in groups]
        if actors_out is not None:
            actors_out.extend(handles)
        by_path = {path: handle for group, handle in zip(groups, handles, strict=True) for path in group}
        clients = [RayClient(by_path[str(p)], str(p)) if held else None
                   for p, held in zip(layout.paths, layout.held, strict=True)]
        for client in clients:  # each actor opened its partitions: a failure names the partition, before any query
            if client is not None:
                client.gather([client.submit("peak_rss")], ACTOR_START_TIMEOUT_S)
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
    actors: list = []
    try:
        engine = Engine.open(store, device=device, reranker=reranker,
                             rerank_top=RERANK_TOP if rerank_top is None else rerank_top,
                             partitions=ray_partitions(workers, os.environ.get(FAULT_MARKER_ENV), actors))
        yield from engine.query_stream(questions, ids, params, retrieval, slice_size)
        served = engine.tables.partitions
        peaks = served.peak_rss()
        nodes = ray.get([actor.node_id.remote() for actor in actors])
        print(f"qasc query: {len(served.held)} partitions on {len(actors)} Ray actors, {len(set(nodes))} node(s); "
              f"actor peak RSS {', '.join(f'{x / 2**30:.2f}' for x in peaks)} GiB", file=sys.stderr)
    finally:
        for actor in actors:  # their CPU shares freed now, not when Ray gets round to the ended job's actors
            ray.kill(actor)
        if started_here:
            ray.shutdown()
