"""Ray Data stage: `QascQuery`, a callable class for `Dataset.map_batches` that answers a column of questions.

    ds = ray.data.read_parquet("questions.parquet")            # a `question` column, optionally `id`
    answers = ds.map_batches(QascQuery, fn_constructor_kwargs={"store": "/data/store"}, batch_size=256,
                             compute=ray.data.ActorPoolStrategy(size=2), num_gpus=0)   # or concurrency=2
    answers.write_parquet("answers/")

Each actor opens the store (and its embedding model) once, in __init__; each batch is one engine call (one
embedding pass, one FAISS search, one QASC pass). The output rows are those of `qasc query` (the columns and
Arrow schema of jobs/results.py): one row per returned chunk, `query_id` = the batch's `id` (as a string), or
the question itself when the batch has no `id` column (a batch does not know its rows' positions in the
dataset). Ray Data does not keep row order across actors: sort by your ids (and `rank`) when order matters.
"""

from __future__ import annotations

from dataclasses import asdict

from qasc.engine.columns import results_schema
from qasc.engine.config import RetrievalConfig
from qasc.engine.errors import QascError
from qasc.jobs.env import set_env_defaults
from qasc.kernels.params import QascParams

RETRIEVAL_KEYS = tuple(RetrievalConfig.__dataclass_fields__)


def _column_names(batch) -> list[str]:
    names = getattr(batch, "column_names", None)  # pyarrow.Table
    if names is None:
        names = list(batch.columns) if hasattr(batch, "columns") else list(batch)  # pandas / dict of numpy
    return [str(n) for n in names]


def _column(batch, name: str) -> list:
    col = batch[name]
    if hasattr(col, "to_pylist"):
        return col.to_pylist()
    return col.tolist() if hasattr(col, "tolist") else list(col)


class QascQuery:
    """Callable class for `map_batches`: a batch with a `question` column (and an optional `id` column) ->
    a pyarrow Table of chunk rows (jobs/results.py's columns), one engine call per batch.

    store: the store folder (on a path every Ray node can read). device: auto | cpu | cuda (auto: the GPU
    map_batches gave the actor via num_gpus, else the CPU). params / retrieval: a QascParams / RetrievalConfig
    or a dict of their fields; **overrides: single QASC or retrieval fields (top_k=3, depth=32, ...). Unset
    values are the store's (the config saved by `qasc ingest`), as `qasc query` does. reranker / rerank_top: the
    rerank stage (engine.rerank; `qasc query --reranker / --rerank-top`), which adds its two result columns.
    """

    def __init__(self, store: str, device: str = "auto", params: QascParams | dict | None = None,
                 retrieval: RetrievalConfig | dict | None = None, reranker: str | None = None,
                 rerank_top: int | None = None, **overrides: object) -> None:
        set_env_defaults()
        from qasc.engine.query import Engine
        from qasc.engine.rerank import RERANK_TOP

        self.engine = Engine.open(str(store), device=device, reranker=reranker,
                                  rerank_top=RERANK_TOP if rerank_top is None else rerank_top)
        stored = self.engine.config
        base = params.to_dict() if isinstance(params, QascParams) else dict(params or {})
        found = asdict(retrieval) if isinstance(retrieval, RetrievalConfig) else dict(retrieval or {})
        found.update({k: overrides.pop(k) for k in RETRIEVAL_KEYS if k in overrides})
        base.update(overrides)
        try:
            self.params = stored.qasc.replace(**base)
            self.retrieval = RetrievalConfig(**{**asdict(stored.retrieval), **found})
        except (TypeError, ValueError) as exc:
            raise QascError(f"QascQuery: {exc}") from None

    def __call__(self, batch):
        names = _column_names(batch)
        if "question" not in names:
            raise QascError(f"QascQuery: the batch has no `question` column (columns: {', '.join(names)})")
        questions = _column(batch, "question")
        for i, q in enumerate(questions):
            if not isinstance(q, str) or not q.strip():
                raise QascError(f"QascQuery: empty question in row {i} of a batch ({q!r})")
        ids = list(questions)
        if "id" in names:
            ids = []
            for i, x in enumerate(_column(batch, "id")):
                if x is None or isinstance(x, bool) or (isinstance(x, float) and x != x):
                    raise QascError(f"QascQuery: row {i} of a batch has no usable id ({x!r})")
                ids.append(str(x))
        import pyarrow as pa

        # one slice for the whole batch: one engine call, its memory set by map_batches' batch_size
        batches = self.engine.query_stream(questions, ids, self.params, self.retrieval,
                                           slice_size=max(len(questions), 1))
        return pa.Table.from_batches(list(batches), schema=results_schema(self.engine.reranker is not None))
