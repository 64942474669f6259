"""The query engine: a batch's candidate regions around its hits, QASC over them, in bounded slices.

Candidate rule: each of the `depth` hits (sentences; engine.retrieval) brings the sentences within
`neighbourhood` positions of it in its own document, and (block extents on) every row of its block when the block
can be a block extent (`block_bounds`); overlapping or touching neighbourhoods of one document merge into one
region. A query's row is its regions in store order; QASC never crosses a region boundary. Each candidate row is
scored by the scoring model (engine.signals, kernels.signals): the plain scores are QASC's similarities, the
heading boost goes with them (`run_qasc(boost=...)`: added for seeding and whole sections, once per pooled run).

The engine's parts, one concern a module: engine.tables (the store's tables, built once), engine.signals (the
rows' signals), engine.retrieval (search and the heading rerank), this module (the batch, the slice loop and the
public entry points).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from qasc.engine.assemble import ChunkColumns, assemble_columns
from qasc.engine.config import EngineConfig, RetrievalConfig
from qasc.engine.embedder import Embedder
from qasc.engine.errors import QascError
from qasc.engine.fill import fill_columns
from qasc.engine.rerank import RERANK_TOP, Reranker, first_stage_params
from qasc.engine.retrieval import CONTEXT_PATH_ROWS, CONTEXT_PATHS, CONTEXT_POOL, FILL_ROWS, Retrieval, StoreSearch  # noqa: F401, E501
from qasc.engine.signals import HeadingGate, LexicalTerm, RowSignals  # noqa: F401  (the engine's API)
from qasc.engine.tables import BLOCK_ROWS_MAX, STATS_BLOCK_ROWS, StoreTables, store_vectors  # noqa: F401
from qasc.engine.threads import ThreadGovernor
from qasc.engine.types import Chunk, check_query_list
from qasc.kernels.candidates import CandidateRows, candidate_rows
from qasc.kernels.params import QascParams
from qasc.kernels.pipeline import QascBatch, run_qasc

if TYPE_CHECKING:
    import pyarrow as pa

    from qasc.engine.store.search import IvfSettings

MAX_QUERY_CHARS = 10_000
DEFAULT_SLICE_SIZE = 2048  # queries per slice: embedded, answered and yielded (written) together
# on CPU, a slice's kernels and assembly run this many queries at a time, so their working memory (~75 KB per
# query on bench.scale's 1M store) stays bounded whatever the slice: 1024 took the kernel time of 2048 there,
# 512 1.5x, 256 2.2x (bench/RESULTS.md). CUDA devices take the whole slice (fewer launches).
KERNEL_SLICE_QUERIES_CPU = 1024
SEARCH_BLOCK_QUERIES = 8192  # queries per search: whole slices (FAISS threads over a search's queries)
SEARCH_TAIL_SHARE = 0.25  # a last search of fewer than this share of a block joins the one before (search_block_end)
GOVERNED_MIN_QUERIES = 256  # smaller batches skip the thread governor (its start check sleeps ~1 ms)


def check_settings(params, retrieval) -> None:
    """TypeError unless params is None or a QascParams and retrieval None or a RetrievalConfig (a dict of fields
    would fail deep inside with an AttributeError)."""
    if params is not None and not isinstance(params, QascParams):
        raise TypeError(f"params must be a QascParams (e.g. QascParams().replace(top_k=1)), got "
                        f"{type(params).__name__}")
    if retrieval is not None and not isinstance(retrieval, RetrievalConfig):
        raise TypeError(f"retrieval must be a RetrievalConfig, got {type(retrieval).__name__}")


def search_block_end(lo: int, n: int, block: int) -> int:
    """The queries lo..end of n one search takes: a block, or all the rest when what would be left after the
    block is fewer than SEARCH_TAIL_SHARE of a block (measured for the torch scan that searched ivf stores before
    FAISS did: 10,000 queries as 8,192 + 1,808 at 1,450 q/s, at once at 1,660; bench/LOG.md, "The thread
    governor's start check")."""
    end = min(lo + block, n)
    return n if n - end < SEARCH_TAIL_SHARE * block else end


class Engine:
    """A store opened for querying, with one loaded embedding model: `Engine.open(store).query(questions)`.

    Its parts, one concern a module, held (not inherited): `tables`, the store's tables
    (engine.tables.StoreTables); `signals`, the rows' signals for the scoring model (engine.signals.RowSignals,
    holding the tables); `retrieval`, the search and the heading context's rerank (engine.retrieval.Retrieval,
    holding the signals and a searcher: the store's own, `StoreSearch`, unless one is handed in); here the batch
    (`run_batch`), the slice loop (`query_columns`) and the entry points."""

    def __init__(self, store, embedder: Embedder, config: EngineConfig, device: torch.device,
                 searcher=None, partitions=None) -> None:
        self.tables = StoreTables(store, device, partitions)
        self.signals = RowSignals(self.tables)
        if searcher is None:
            searcher = partitions.search if partitions is not None else StoreSearch(store, device)
        self.retrieval = Retrieval(self.signals, searcher)
        self.embedder = embedder
        self.config = config
        self.reranker: Reranker | None = None  # the rerank stage (engine.rerank), off by default

    @property
    def store(self):
        return self.tables.store

    @property
    def device(self) -> torch.device:
        return self.tables.device

    @property
    def n_total(self) -> int:
        return self.tables.n_total

    @property
    def embeddings(self) -> torch.Tensor:
        return self.tables.embeddings

    @property
    def row_table(self):
        return self.tables.row_table

    @property
    def row_tokens(self) -> np.ndarray:
        return self.tables.row_tokens

    @property
    def row_sections(self) -> np.ndarray:
        return self.tables.row_sections

    @classmethod
    def open(cls, store_dir: str, config: EngineConfig | None = None, device: str = "auto",
             nprobe: int | None = None, ivf: IvfSettings | None = None, reranker: str | None = None,
             rerank_top: int = RERANK_TOP, partitions=None) -> Engine:
        """Open a store; the embedding model is the one recorded in its manifest (a mismatch is refused).
        reranker: a cross-encoder's folder or hub name for the rerank stage (engine.rerank; its `rerank_top`
        best candidates a query), loaded before the store (a bad one fails first).

        A collection (engine.store.collection) opens as one store whose vectors stay with its partitions
        (engine.partition): served in this process, or by `partitions` (a function of the opened collection view
        -> engine.partition.PartitionedVectors; jobs.query_partitions serves them on Ray actors).

        ivf: how an ivf store is searched (engine.store.search.IvfSettings: nprobe, max_codes; default the
        store's, docs/store.md "Indexes"); nprobe: the same as ivf=IvfSettings(nprobe) (either, not both)."""
        from qasc.engine.embedder import resolve_device
        from qasc.engine.store.collection import is_collection, store_manifest
        from qasc.engine.store.reader import Store
        from qasc.engine.store.search import IvfSettings

        root = Path(store_dir).expanduser().absolute()
        collection = is_collection(root)  # a collection answers as one store (engine.store.collection_reader)
        stored = EngineConfig.from_dict(store_manifest(root).get("config", {}))
        config = config or stored
        if config.embedder.model not in (None, stored.embedder.model):
            raise QascError(
                f"store {store_dir} was built with model {stored.embedder.model or 'default'!r}, "
                f"not {config.embedder.model!r}"
            )
        dev = resolve_device(device if device != "auto" else config.embedder.device)
        rerank = None if reranker is None else Reranker(reranker, dev, rerank_top)
        if collection:
            from qasc.engine.store.collection_reader import open_collection

            if nprobe is not None or (ivf is not None and ivf != IvfSettings()):
                raise QascError(f"{root} is a collection: each partition is searched with its own index's settings; "
                                f"nprobe / ivf settings do not apply")
            from qasc.engine.partition import local_partitions

            # the collection-wide view here, each partition's vectors with its server (docs/collections.md)
            store = open_collection(root, vectors=False)
            partitions = (partitions or local_partitions)(store, dev)
        else:
            store = Store.open(store_dir, device=dev, nprobe=nprobe, ivf=ivf)  # the FAISS index follows the device
        emb_cfg = stored.embedder
        embedder = Embedder(emb_cfg.model, str(dev), config.embedder.dtype, emb_cfg.max_length, emb_cfg.batch_tokens)
        if embedder.dim != int(store.manifest["dim"]) or embedder.fingerprint != store.manifest.get(
            "fingerprint", embedder.fingerprint
        ):
            raise QascError(
                f"store {store_dir} holds {store.manifest['dim']}-d vectors of model fingerprint "
                f"{store.manifest.get('fingerprint')}; the loaded model gives {embedder.dim}-d, {embedder.fingerprint}"
            )
        engine = cls(store, embedder, config, dev, partitions=partitions if collection else None)
        engine.reranker = rerank
        return engine

    def embed_queries(self, questions: Sequence[str]) -> torch.Tensor:
        """questions (Q) -> (Q, dim) float32 on the engine's device; empty or overlong questions are refused."""
        self.check_questions(questions)
        return torch.as_tensor(self.embedder.encode(list(questions)), device=self.device)


    def run_batch(
        self, query_emb: torch.Tensor, params: QascParams, retrieval: RetrievalConfig,
        pool: torch.Tensor | None = None, questions: Sequence[str] | None = None, rerank_top: int | None = None,
    ) -> tuple[QascBatch, CandidateRows]:
        """query_emb (Q, dim) -> the QASC result over each query's candidate rows (with the heading context
        when params.context_weight > 0 and the store has heading paths). pool: the search's hits (Q,
        `pool_width`) when done already (query_columns searches several slices at once). questions (Q): the
        queries' texts, for the gated lexical term when params.lexical_weight > 0 (left out without them).
        rerank_top: the rerank stage's candidates (engine.rerank.first_stage_params) instead of the selection."""
        depth = min(retrieval.depth, max(self.n_total, 1))
        lexical = self.signals.lexical_term(params, questions, query_emb.shape[0])
        gate = None
        if self.signals.uses_context(params):
            hits, gate = self.retrieval.context_hits(query_emb, depth, params.scoring, pool, lexical)
        else:
            hits = self.retrieval.search(query_emb, depth) if pool is None else pool[:, :depth]
        first, last = self.tables.block_bounds(params.block_kinds, params.max_tokens) or (None, None)
        cand = candidate_rows(hits, self.tables.doc_first, self.tables.doc_last, retrieval.neighbourhood, self.n_total,
                              first, last, BLOCK_ROWS_MAX)
        rows = torch.where(cand.valid, cand.rows, torch.zeros_like(cand.rows))
        query = query_emb.to(device=self.device, dtype=torch.float32)
        scored = self.signals.score_rows(query, rows, cand.valid, params.scoring, gate, lexical)
        sims, boost = scored.plain, (scored.boost if gate is not None else None)
        dots = self.tables.neighbour_dots(params.max_extent)[rows]  # (Q, L, W)
        blocks = {}
        for kind in params.block_kinds:
            sizes, norms = self.tables.block_stats(kind)
            sizes = sizes[rows].long()
            if kind == "section":  # a title's text is a document, not a section: no whole-block candidate
                sizes = torch.where(self.tables.titled_rows()[rows], torch.zeros_like(sizes), sizes)
            blocks[kind] = (sizes, norms[rows])
        batch = run_qasc(
            sims, cand.valid, cand.region, self.tables.paragraph[rows].long(), self.tables.section[rows].long(),
            self.tables.n_tokens[rows].long(),
            params if rerank_top is None else first_stage_params(params, rerank_top),
            dots=dots, blocks=blocks, boost=boost,
        )
        return batch, cand


    def query_columns(
        self,
        query_emb: torch.Tensor,
        params: QascParams | None = None,
        retrieval: RetrievalConfig | None = None,
        slice_size: int = DEFAULT_SLICE_SIZE,
        questions: Sequence[str] | None = None,
        fill_units: list | None = None,
    ) -> Iterator[tuple[int, ChunkColumns]]:
        """query_emb (Q, dim) -> per slice of `slice_size` queries, (its first query's index, its chunks as
        columns). Memory stays at one slice's kernels and results whatever Q is. On CPU the batch runs under
        `engine.threads.ThreadGovernor` (one torch thread while the process waits for a core; the caller's
        thread count restored at the end). questions (Q): the queries' texts, for the gated lexical term
        (params.lexical_weight > 0); without them the term is left out (vectors alone carry no words).

        query_emb may be on any device and of any float dtype (a numpy array too): it is moved to the engine's
        device as float32 first (queries are few: they keep full precision whatever the store's dtype).

        fill_units: a list that gets each query's budget-fill units (`fill_units`) appended, whether or not a
        budget is set (the harness applies its budgets itself); stays empty where the fill has nothing to use."""
        check_settings(params, retrieval)
        params = params or self.config.qasc
        retrieval = retrieval or self.config.retrieval
        if slice_size < 1:
            raise QascError(f"slice_size must be >= 1, got {slice_size}")
        query_emb = torch.as_tensor(query_emb).to(device=self.device, dtype=torch.float32)
        if questions is not None and len(questions) != query_emb.shape[0]:
            raise QascError(f"{len(questions)} question texts for {query_emb.shape[0]} query vectors")
        reranker = self.reranker
        if reranker is not None and questions is None:
            raise QascError(f"the reranker {reranker.name} reads the questions: pass their texts (questions=...)")
        table = self.row_table
        block = slice_size * max(1, SEARCH_BLOCK_QUERIES // slice_size)  # searched at once: whole slices
        block_lo, block_hi = 0, 0  # the queries of the current search
        step = slice_size if self.device.type == "cuda" else min(slice_size, KERNEL_SLICE_QUERIES_CPU)
        pool = None
        n = query_emb.shape[0]
        # CPU batches of GOVERNED_MIN_QUERIES or more: torch on one thread while the process waits for a core
        governor = ThreadGovernor(threads=None if self.device.type == "cpu" and n >= GOVERNED_MIN_QUERIES else 1)
        try:
            for lo in range(0, n, slice_size):
                hi = min(lo + slice_size, n)
                if self.n_total == 0:
                    yield lo, ChunkColumns.empty(hi - lo)
                    continue
                if lo >= block_hi:  # one search for the next slices (a block of queries)
                    block_lo, block_hi = lo, search_block_end(lo, n, block)
                    width = self.retrieval.pool_width(params, retrieval)
                    pool = self.retrieval.search(query_emb[block_lo:block_hi], width)
                    governor.step()
                parts = []
                for a in range(lo, hi, step):  # kernels and assembly a bounded block of queries at a time
                    b = min(a + step, hi)
                    texts = None if questions is None else questions[a:b]
                    fill = params.budget_fill and (params.budget_tokens is not None or fill_units is not None) and (
                        self.tables.passage_tier() is not None)  # passages load only for a fill (+0.4-0.5 GiB at 1M)
                    batch, cand = self.run_batch(query_emb[a:b], params, retrieval,
                                                 pool[a - block_lo : b - block_lo], texts,
                                                 None if reranker is None else reranker.top)
                    rows = torch.where(cand.valid, cand.rows, torch.zeros_like(cand.rows))
                    cols = assemble_columns(batch, rows, table)
                    if reranker is not None:
                        cols = reranker.rerank(cols, texts, self.chunk_paths(cols), params.top_k,
                                               params.budget_tokens, governor.step)
                    if fill:
                        units = self.retrieval.fill_units(query_emb[a:b], params, texts,
                                                          pool[a - block_lo : b - block_lo])
                        if fill_units is not None:
                            fill_units.extend(units)
                        if params.budget_tokens is not None:
                            cols = fill_columns(cols, units, params.budget_tokens, table,
                                                np.asarray(self.store.doc_offsets, np.int64), self.row_tokens,
                                                self.row_sections, params.fill_diversity)
                    parts.append(cols)
                    del batch, cand, rows  # freed before the next block's kernels run
                    governor.step()
                yield lo, ChunkColumns.concat(parts)
        finally:
            governor.close()

    def query_embedded(
        self,
        query_emb: torch.Tensor,
        params: QascParams | None = None,
        retrieval: RetrievalConfig | None = None,
        slice_size: int = DEFAULT_SLICE_SIZE,
        questions: Sequence[str] | None = None,
        fill_units: list | None = None,
    ) -> list[list[Chunk]]:
        """query_emb (Q, dim) -> per query, its chunks in rank order; runs in slices of `slice_size` (through
        `query_columns`, which moves query_emb to the engine's device as float32). questions (Q): the texts,
        for the lexical term (left out without them). fill_units: see `query_columns`."""
        out: list[list[Chunk]] = []
        for _, cols in self.query_columns(query_emb, params, retrieval, slice_size, questions, fill_units):
            out.extend(cols.to_chunks(self.row_table.doc_ids))
        return out

    def query_batches(
        self,
        query_emb: torch.Tensor,
        ids: Sequence[str] | None = None,
        params: QascParams | None = None,
        retrieval: RetrievalConfig | None = None,
        slice_size: int = DEFAULT_SLICE_SIZE,
        questions: Sequence[str] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """query_emb (Q, dim), ids (Q) query ids (default "0", "1", ...) -> one pyarrow RecordBatch per slice
        (engine.columns.results_schema(): one row per chunk, query order then rank), yielded as each slice
        finishes, so a writer can stream them (jobs.results.ResultWriter). questions (Q): the texts, for the
        lexical term (left out without them)."""
        import pyarrow as pa

        n = int(query_emb.shape[0])
        ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in ids]
        if len(ids) != n:
            raise QascError(f"{len(ids)} query ids for {n} query vectors")
        for lo, cols in self.query_columns(query_emb, params, retrieval, slice_size, questions):
            qids = pa.array(ids[lo : lo + cols.n_queries], pa.string())
            yield cols.to_record_batch(qids, self.row_table.doc_id_array,
                                       None if self.reranker is None else self.reranker.name)

    def chunk_paths(self, cols: ChunkColumns) -> list[str]:
        """Each chunk's heading path at its first sentence ("" without one): what the reranker reads before it."""
        paths = getattr(self.store, "heading_paths", None)
        if not paths:
            return [""] * len(cols)
        rows = np.asarray(self.store.doc_offsets, np.int64)[cols.doc] + cols.sentence_start
        return [paths[h] if h >= 0 else "" for h in np.asarray(self.store.row_heading)[rows].tolist()]

    def query_stream(
        self,
        questions: Sequence[str],
        ids: Sequence[str] | None = None,
        params: QascParams | None = None,
        retrieval: RetrievalConfig | None = None,
        slice_size: int = DEFAULT_SLICE_SIZE,
    ) -> Iterator[pa.RecordBatch]:
        """questions (Q), ids (Q) -> one pyarrow RecordBatch per slice of `slice_size` questions, each embedded
        only when its slice runs: neither the query vectors nor the results of all Q are ever held at once.
        Every question is checked (empty, too long) before the first slice runs."""
        n = len(questions)
        ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in ids]
        if len(ids) != n:
            raise QascError(f"{len(ids)} query ids for {n} questions")
        if slice_size < 1:
            raise QascError(f"slice_size must be >= 1, got {slice_size}")
        self.check_questions(questions)
        for lo in range(0, n, slice_size):
            emb = self.embed_queries(questions[lo : lo + slice_size])
            yield from self.query_batches(emb, ids[lo : lo + slice_size], params, retrieval, slice_size,
                                          questions[lo : lo + slice_size])

    def check_questions(self, questions: Sequence[str]) -> None:
        """Empty or overlong questions -> QascError naming the first."""
        for i, text in enumerate(questions):
            if not isinstance(text, str) or not text.strip():
                raise QascError(f"query {i} is empty")
            if len(text) > MAX_QUERY_CHARS:
                raise QascError(f"query {i} has {len(text)} characters; the limit is {MAX_QUERY_CHARS}")

    def query(
        self,
        questions: Sequence[str],
        params: QascParams | None = None,
        retrieval: RetrievalConfig | None = None,
    ) -> list[list[Chunk]]:
        """questions (Q) -> per question, its query-adapted chunks in rank order."""
        questions = check_query_list(questions)
        check_settings(params, retrieval)
        if not questions:
            return []
        return self.query_embedded(self.embed_queries(questions), params, retrieval, questions=questions)
