"""Ray job for very large query files: shards of queries on actors that each open the store once.

Connects like the ingest job (jobs/ray_session.py: --ray-address, RAY_ADDRESS, the cluster of a submitted job,
else a local instance); actors take one GPU each when the cluster has GPUs and --device is not cpu.
Each actor call answers one shard of queries and returns it as an Arrow table (the rows of jobs/results.py plus
the queries' input positions); an actor killed mid-job is restarted and its shard retried (max_restarts /
max_task_retries), so the output is the same. Ray Data keeps the shards' order (`preserve_order`), and the
driver iterates the results shard by shard as they finish, yielding them in input order (query position, then
rank, as the local path) without ever holding all rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from qasc.engine.config import RetrievalConfig
from qasc.engine.errors import QascError
from qasc.engine.query import DEFAULT_SLICE_SIZE
from qasc.jobs.ingest_ray import FAULT_MARKER_ENV, MAX_RESTARTS, MAX_TASK_RETRIES
from qasc.jobs.ray_session import actor_placement, connect, die_once
from qasc.kernels.params import QascParams

DEFAULT_WORKERS = 2  # query actors
DEFAULT_SHARD_SIZE = 512  # queries per actor call
POSITION = "position"  # the input position of a row's query, carried next to the result columns


class QueryActor:
    """Callable class for `map_batches`: opens the store (and model) once, answers shards of queries with a
    pyarrow Table: the result columns (engine/columns.py) and `position`, each row's query's input position."""

    def __init__(self, store: str, params: dict, retrieval: dict, device: str,
                 slice_size: int = DEFAULT_SLICE_SIZE, reranker: str | None = None,
                 rerank_top: int | None = None, fault_marker: str | None = None) -> None:
        from qasc.engine.query import Engine
        from qasc.engine.rerank import RERANK_TOP

        self.engine = Engine.open(store, device=device, reranker=reranker,  # a store, or a collection as one store
                                  rerank_top=RERANK_TOP if rerank_top is None else rerank_top)
        self.fault_marker = fault_marker
        self.params = QascParams(**params)
        self.retrieval = RetrievalConfig(**retrieval)
        self.slice_size = slice_size

    def __call__(self, batch: dict):
        import numpy as np
        import pyarrow as pa

        from qasc.engine.columns import results_schema

        die_once(self.fault_marker)  # test hook: the first shard's actor dies once, mid-job
        questions = [str(q) for q in batch["question"]]
        ids = [str(i) for i in batch["query_id"]]
        table = pa.Table.from_batches(list(self.engine.query_stream(
            questions, ids, self.params, self.retrieval, self.slice_size)),
            schema=results_schema(self.engine.reranker is not None))
        positions = np.asarray(batch[POSITION], dtype=np.int64)
        index = {qid: i for i, qid in enumerate(ids)}
        local = np.asarray([index[q] for q in table.column("query_id").to_pylist()], dtype=np.int64)
        return table.append_column(POSITION, pa.array(positions[local] if len(local) else local, pa.int64()))


def run_query_job(
    store: str,
    ids: list[str],
    questions: list[str],
    params: QascParams,
    retrieval: RetrievalConfig,
    workers: int = DEFAULT_WORKERS,
    ray_address: str | None = None,
    device: str = "auto",
    shard_size: int = DEFAULT_SHARD_SIZE,
    slice_size: int = DEFAULT_SLICE_SIZE,
    reranker: str | None = None,
    rerank_top: int | None = None,
) -> Iterator:
    """Answer `questions` on a Ray actor pool -> pyarrow RecordBatches of result rows (engine.columns
    .results_schema()), in the local path's order, yielded as the shards finish (a generator: Ray starts on
    the first next() and is shut down, when this call started it, once the generator ends or is closed).
    reranker, rerank_top: the rerank stage, loaded by every actor (engine.rerank)."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    from qasc.engine.columns import results_schema

    if len(ids) != len(questions):
        raise QascError(f"{len(ids)} query ids for {len(questions)} questions")
    started_here = connect(ray_address, num_cpus=max(2, workers))
    ctx = DataContext.get_current()
    keep_order = ctx.execution_options.preserve_order
    try:
        resources = ray.cluster_resources()  # the cluster's GPUs decide, not the driver's torch
        num_gpus, actor_device = actor_placement(resources, device)
        gpus = int(resources.get("GPU", 0))
        if num_gpus and workers > gpus:
            raise QascError(f"--workers {workers} but the Ray cluster has {gpus} GPU(s)")
        ctx.execution_options.preserve_order = True  # shards come back in input order
        pairs = enumerate(zip(ids, questions, strict=True))
        ds = ray.data.from_items([{POSITION: i, "query_id": qid, "question": q} for i, (qid, q) in pairs])
        ds = ds.map_batches(
            QueryActor,
            fn_constructor_kwargs={"store": str(store), "params": params.to_dict(),
                                   "retrieval": retrieval.__dict__, "device": actor_device,
                                   "slice_size": slice_size, "reranker": reranker, "rerank_top": rerank_top,
                                   "fault_marker": os.environ.get(FAULT_MARKER_ENV)},
            batch_size=shard_size,
            compute=ActorPoolStrategy(size=workers),
            num_gpus=num_gpus,
            num_cpus=1,
            batch_format="numpy",
            max_restarts=MAX_RESTARTS,
            max_task_retries=MAX_TASK_RETRIES,
        )
        last, schema = -1, results_schema(reranker is not None)
        for table in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            if table.num_rows == 0:
                continue
            pos = table.column(POSITION).to_numpy()
            if pos[0] < last or (len(pos) > 1 and bool((pos[1:] < pos[:-1]).any())):
                raise QascError("Ray returned query shards out of order")  # preserve_order broken: never seen
            last = int(pos[-1])
            yield from table.drop_columns([POSITION]).cast(schema).to_batches()
    finally:
        ctx.execution_options.preserve_order = keep_order
        if started_here:
            ray.shutdown()
