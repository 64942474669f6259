"""Ray job for very large query files: shards of queries on actors that each open the store once.

Connects like the ingest job (jobs/ray_session.py: --ray-address, RAY_ADDRESS, the cluster of a submitted job,
else a local instance); actors take one GPU each when the cluster has GPUs and --device is not cpu.
Output rows are sorted back into input order (query position, then rank), so they equal the local path's.
"""

from __future__ import annotations

from engine.config import RetrievalConfig
from engine.errors import QascError
from jobs.ray_session import actor_placement, connect
from jobs.results import result_rows, row_from_record, rows_to_columns
from kernels.params import QascParams

DEFAULT_WORKERS = 2  # query actors
DEFAULT_SHARD_SIZE = 512  # queries per actor call


class QueryActor:
    """Callable class for `map_batches`: opens the store (and model) once, answers batches of queries."""

    def __init__(self, store: str, params: dict, retrieval: dict, device: str) -> None:
        from engine.query import Engine

        self.engine = Engine.open(store, device=device)
        self.params = QascParams(**params)
        self.retrieval = RetrievalConfig(**retrieval)

    def __call__(self, batch: dict) -> dict:
        questions = [str(q) for q in batch["question"]]
        ids = [str(i) for i in batch["query_id"]]
        results = self.engine.query(questions, self.params, self.retrieval)
        rows = result_rows(ids, results)
        order = {qid: int(pos) for qid, pos in zip(ids, batch["position"], strict=True)}
        columns = rows_to_columns(rows)
        columns["position"] = [order[r["query_id"]] for r in rows]
        return columns


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
) -> list[dict]:
    """Answer `questions` on a Ray actor pool -> result rows in the local path's order."""
    import ray
    from ray.data import ActorPoolStrategy

    started_here = connect(ray_address, num_cpus=max(2, workers))
    try:
        resources = ray.cluster_resources()  # the cluster's GPUs decide, not the driver's torch
        num_gpus, actor_device = actor_placement(resources, device)
        gpus = int(resources.get("GPU", 0))
        if num_gpus and workers > gpus:
            raise QascError(f"--workers {workers} but the Ray cluster has {gpus} GPU(s)")
        pairs = enumerate(zip(ids, questions, strict=True))
        items = [{"position": i, "query_id": qid, "question": q} for i, (qid, q) in pairs]
        ds = ray.data.from_items(items)
        ds = ds.map_batches(
            QueryActor,
            fn_constructor_kwargs={"store": str(store), "params": params.to_dict(),
                                   "retrieval": retrieval.__dict__, "device": actor_device},
            batch_size=shard_size,
            compute=ActorPoolStrategy(size=workers),
            num_gpus=num_gpus,
            num_cpus=1,
            batch_format="numpy",
        )
        rows = ds.take_all()
    finally:
        if started_here:
            ray.shutdown()
    return [row_from_record(r) for r in sorted(rows, key=lambda r: (int(r["position"]), int(r["rank"])))]
