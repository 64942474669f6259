"""Ray job for very large query files: shards of queries on actors that each open the store once.

Output rows are sorted back into input order (query position, then rank), so they equal the local path's.
"""

from __future__ import annotations

import os

from engine.config import RetrievalConfig
from kernels.params import QascParams


class QueryActor:
    """Callable class for `map_batches`: opens the store (and model) once, answers batches of queries."""

    def __init__(self, store: str, params: dict, retrieval: dict, device: str) -> None:
        from engine.query import Engine

        self.engine = Engine.open(store, device=device)
        self.params = QascParams(**params)
        self.retrieval = RetrievalConfig(**retrieval)

    def __call__(self, batch: dict) -> dict:
        from jobs.query_cmd import result_rows

        questions = [str(q) for q in batch["question"]]
        ids = [str(i) for i in batch["query_id"]]
        results = self.engine.query(questions, self.params, self.retrieval)
        rows = result_rows(ids, results)
        order = {qid: int(pos) for qid, pos in zip(ids, batch["position"], strict=True)}
        columns = {name: [r[name] for r in rows] for name in
                   ("query_id", "rank", "doc_id", "char_start", "char_end", "score", "text", "n_tokens",
                    "seed_ids", "sentence_start", "sentence_end")}
        columns["position"] = [order[r["query_id"]] for r in rows]
        return columns


def run_query_job(
    store: str,
    ids: list[str],
    questions: list[str],
    params: QascParams,
    retrieval: RetrievalConfig,
    workers: int = 2,
    ray_address: str | None = None,
    device: str = "auto",
    shard_size: int = 512,
) -> list[dict]:
    """Answer `questions` on a Ray actor pool -> result rows in the local path's order."""
    import ray
    from ray.data import ActorPoolStrategy

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started_here = False
    if not ray.is_initialized():
        if ray_address:
            ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(num_cpus=max(2, workers), include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        import torch

        use_gpu = device != "cpu" and torch.cuda.is_available()
        pairs = enumerate(zip(ids, questions, strict=True))
        items = [{"position": i, "query_id": qid, "question": q} for i, (qid, q) in pairs]
        ds = ray.data.from_items(items)
        ds = ds.map_batches(
            QueryActor,
            fn_constructor_kwargs={"store": str(store), "params": params.to_dict(),
                                   "retrieval": retrieval.__dict__, "device": "cuda" if use_gpu else "cpu"},
            batch_size=shard_size,
            compute=ActorPoolStrategy(size=workers),
            num_gpus=1 if use_gpu else 0,
            num_cpus=1,
            batch_format="numpy",
        )
        rows = ds.take_all()
    finally:
        if started_here:
            ray.shutdown()
    out = []
    for r in sorted(rows, key=lambda r: (int(r["position"]), int(r["rank"]))):
        out.append({
            "query_id": str(r["query_id"]), "rank": int(r["rank"]), "doc_id": str(r["doc_id"]),
            "char_start": int(r["char_start"]), "char_end": int(r["char_end"]), "score": float(r["score"]),
            "text": str(r["text"]), "n_tokens": int(r["n_tokens"]),
            "seed_ids": [int(x) for x in r["seed_ids"]], "sentence_start": int(r["sentence_start"]),
            "sentence_end": int(r["sentence_end"]),
        })
    return out
