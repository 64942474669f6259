"""The query engine: FAISS pre-retrieval, candidate regions around the hits, QASC over a padded batch.

Candidate rule: each of the `depth` FAISS hits (sentences) brings the sentences within `neighbourhood`
positions of it in its own document, and (block extents on) every row of its block when the block can be a
block extent (`block_bounds`); overlapping or touching neighbourhoods of one document merge into one region.
A query's row is its regions in store order; QASC never crosses a region boundary.

Heading context (QascParams.context_weight > 0, stores with heading paths): c(row) = cosine of the query and
the row's heading path; the gate (kernels.context.heading_gate) over the distinct paths of the top
CONTEXT_POOL rows by cosine gives spread and cref; boost(row) = w * spread * (c(row) - cref). The `depth` hits
are the best rows by cosine + boost among that pool and the rows of the CONTEXT_PATHS best-matching paths, and
the boost goes to QASC with the candidates' similarities (`run_qasc(boost=...)`: added to them for seeding and
whole blocks, once per pooled run). With QascParams.heading_residual = beta > 0,
both rankings also take beta * c(row) * (h . s)(row) off each row's cosine (kernels.context.heading_residual:
the part of the similarity the row's heading explains; h . s is kept per store row, `heading_row_dots`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from engine.assemble import ChunkColumns, RowTable, assemble_columns
from engine.config import EngineConfig, RetrievalConfig
from engine.cpu import cpu_has_int8_dot, cpu_has_native_bf16
from engine.embedder import Embedder
from engine.errors import QascError
from engine.fill import FillUnits, PassageTier, fill_columns, merge_units
from engine.lexical import LexicalIndex
from engine.threads import ThreadGovernor
from engine.types import Chunk, Sentences, check_query_list
from kernels.candidates import CandidateRows, candidate_rows
from kernels.context import best_paths, heading_gate, int8_heading_table, packed_path_rows
from kernels.extents import block_stats, neighbour_dots
from kernels.gather import gathered_dots, segment_first
from kernels.lexical import lexical_scores
from kernels.params import QascParams
from kernels.pipeline import QascBatch, run_qasc
from kernels.signals import RowScores, ScoringModel, normalised_lexical, row_scores

if TYPE_CHECKING:
    import pyarrow as pa

MAX_QUERY_CHARS = 10_000
STATS_BLOCK_ROWS = 16384  # store rows per block of the query-independent stats (cast to float32 per block)
BLOCK_ROWS_MAX = 32  # whole blocks brought into the candidate region: at most this many rows (and the token cap)
DEFAULT_SLICE_SIZE = 2048  # queries per slice: embedded, answered and yielded (written) together
# on CPU, a slice's kernels and assembly run this many queries at a time, so their working memory (~75 KB per
# query on bench.scale's 1M store) stays bounded whatever the slice: 1024 took the kernel time of 2048 there,
# 512 1.5x, 256 2.2x (bench/RESULTS.md). CUDA devices take the whole slice (fewer launches).
KERNEL_SLICE_QUERIES_CPU = 1024
SEARCH_BLOCK_QUERIES = 8192  # queries per search: whole slices (the ivf scan does 1.5x the queries/s at 10k as at 2k)
SEARCH_TAIL_SHARE = 0.25  # a last search of fewer than this share of a block joins the one before (search_block_end)
GOVERNED_MIN_QUERIES = 256  # smaller batches skip the thread governor (its start check sleeps ~1 ms)
CONTEXT_POOL = 32  # heading context: the gate's pool, the top rows by raw cosine
FILL_ROWS = 16  # budget fill: the single rows that compete with the passages (the pre-retrieval's best)
CONTEXT_PATHS = 8  # pre-retrieval: the rows of this many best-matching heading paths join the rerank
HEADING_SHORTLIST_MIN_PATHS = 4096  # below this many heading paths the float32 product is cheap: no shortlist
CONTEXT_PATH_ROWS = 512  # ... at most this many rows of each (its first, in store order)


def check_settings(params, retrieval) -> None:
    """TypeError unless params is None or a QascParams and retrieval None or a RetrievalConfig (a dict of fields
    would fail deep inside with an AttributeError)."""
    if params is not None and not isinstance(params, QascParams):
        raise TypeError(f"params must be a QascParams (e.g. QascParams().replace(top_k=1)), got "
                        f"{type(params).__name__}")
    if retrieval is not None and not isinstance(retrieval, RetrievalConfig):
        raise TypeError(f"retrieval must be a RetrievalConfig, got {type(retrieval).__name__}")


def store_vectors(store, device: torch.device) -> torch.Tensor:
    """A store's embeddings as the engine's one tensor (N, dim) float32 | float16 on `device`.

    engine.store.Store moves its own `vectors` (`to_device`: no host copy kept on CUDA, no copy at all on CPU);
    duck-typed stores (numpy `embeddings`) are wrapped without a copy on CPU (float16 stays float16; other
    dtypes become float32)."""
    if hasattr(store, "to_device"):
        return store.to_device(device)
    emb = store.embeddings
    if not isinstance(emb, torch.Tensor):
        emb = np.asarray(emb)
        emb = torch.from_numpy(np.ascontiguousarray(emb if emb.dtype in (np.float16, np.float32) else
                                                    emb.astype(np.float32)))
    return emb.to(device)


class LexicalTerm(NamedTuple):
    """One batch's lexical signal: the queries' known terms (CSR) and the most a row can score per query
    (engine.lexical, kernels.lexical)."""

    query_ptr: torch.Tensor  # (Q+1,) int64
    query_terms: torch.Tensor  # (T,) int64
    best: torch.Tensor  # (Q,) float32


class HeadingGate(NamedTuple):
    """One batch's heading gate (kernels.context.heading_gate): spread (Q,) and cref (Q,) float32."""

    spread: torch.Tensor
    cref: torch.Tensor


def search_block_end(lo: int, n: int, block: int) -> int:
    """The queries lo..end of n one search takes: a block, or all the rest when what would be left after the
    block is fewer than SEARCH_TAIL_SHARE of a block. The ivf scan's rate grows with the queries of a search (its
    per-list cost is shared): 10,000 queries as 8,192 + 1,808 searched at 1,450 q/s, at once at 1,660
    (bench/RESULTS.md, "The thread governor's start check")."""
    end = min(lo + block, n)
    return n if n - end < SEARCH_TAIL_SHARE * block else end


class Engine:
    """A store opened for querying, with one loaded embedding model: `Engine.open(store).query(questions)`."""

    def __init__(self, store, embedder: Embedder, config: EngineConfig, device: torch.device) -> None:
        self.store = store
        self.embedder = embedder
        self.config = config
        self.device = device
        docs: Sequence[Sentences] = store.docs
        offsets = np.asarray(store.doc_offsets, dtype=np.int64)
        self.n_total = int(offsets[-1])
        lengths = np.diff(offsets)
        doc_of_row = np.repeat(np.arange(len(docs), dtype=np.int64), lengths)
        if self.n_total >= 2**31:
            raise QascError(f"a store of {self.n_total} sentences: the engine's per-row arrays hold int32 rows")
        cat = (lambda name: np.concatenate([getattr(d, name) for d in docs])) if docs else (
            lambda name: np.zeros(0, dtype=np.int32))
        # per-row arrays in int32 (half the bytes: 4 MB each at 1M rows); gathered per slice, then widened to int64
        as_t = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int32), device=device)  # noqa: E731
        self.doc_of_row = as_t(doc_of_row)
        self.doc_first = as_t(offsets[doc_of_row])
        self.doc_last = as_t(offsets[doc_of_row + 1] - 1)
        self.paragraph = as_t(cat("paragraph"))
        self.section = as_t(cat("section"))
        self.n_tokens = as_t(cat("n_tokens"))
        del doc_of_row
        self.embeddings = store_vectors(store, device)  # (N_total, dim) float32 | float16: the store's own copy
        self._dots: torch.Tensor | None = None  # (N_total, W) neighbour dots, computed on first pooled query
        self._blocks: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # kind -> (sizes, norms) (N_total,)
        self._heading_dots: torch.Tensor | None = None  # (N_total,) rows . their heading path (heading residual)
        self._lexical: LexicalIndex | None = None  # the rows' BM25 weights (gated lexical term), built on first use
        self._bounds: dict[tuple[tuple[str, ...], int], tuple[torch.Tensor, torch.Tensor]] = {}  # -> first, last
        self._passages: PassageTier | None | bool = False  # the budget fill's passages, loaded on first use

    def block_keys(self, kind: str) -> torch.Tensor:
        """kind paragraph | section -> (N_total,) int64 keys, equal for the rows of one block of one document."""
        ids = self.paragraph if kind == "paragraph" else self.section
        return self.doc_of_row.long() * (int(ids.max()) + 1 if ids.numel() else 1) + ids

    def block_bounds(self, kinds: tuple[str, ...], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """block kinds (paragraph / section), a chunk's token cap -> first, last (N_total,) int32: the rows of each
        row's block when it can be a whole-block extent (at most BLOCK_ROWS_MAX rows and `max_tokens` tokens), else
        the row itself; with several kinds, the widest of them. A hit brings these rows into its candidate region,
        so that a block extent is never missed because the neighbourhood around the hit was narrower than the
        block. None for no kinds. Computed once per (kinds, cap) and kept."""
        if not kinds:
            return None
        if (kinds, max_tokens) not in self._bounds:
            n = self.n_total
            own = torch.arange(n, dtype=torch.long, device=self.device)
            lo, hi = own.clone(), own.clone()
            for kind in kinds:
                keys = self.block_keys(kind)
                opens = torch.ones(n, dtype=torch.bool, device=self.device)
                opens[1:] = keys[1:] != keys[:-1]
                label = opens.long().cumsum(0) - 1  # (N,) block index
                n_blocks = int(label[-1]) + 1 if n else 0
                first = opens.nonzero().squeeze(1)  # (B,) each block's first row
                size = torch.bincount(label, minlength=n_blocks)
                tokens = torch.zeros(n_blocks, dtype=torch.long, device=self.device).index_add_(0, label,
                                                                                                self.n_tokens.long())
                whole = ((size <= BLOCK_ROWS_MAX) & (tokens <= max_tokens))[label]
                lo = torch.minimum(lo, torch.where(whole, first[label], own))
                hi = torch.maximum(hi, torch.where(whole, (first + size - 1)[label], own))
            # int32 (rows < 2^31): two more per-row arrays, kept at half the bytes (8 MB at 1M rows)
            self._bounds[(kinds, max_tokens)] = (lo.int(), hi.int())
        return self._bounds[(kinds, max_tokens)]

    def block_stats(self, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """kind paragraph | section -> sizes (N_total,) int32, norms (N_total,) float32: each row's whole block
        in its document (rows, norm of the summed vectors); query independent, computed once and kept.

        Computed over row blocks cut at block boundaries, each cast to float32, so a float16 store gets float32
        sums and the temporary memory stays at about STATS_BLOCK_ROWS rows."""
        if kind not in self._blocks:
            keys = self.block_keys(kind)
            n = keys.shape[0]
            sizes = torch.zeros(n, dtype=torch.int32, device=self.device)
            norms = torch.zeros(n, dtype=torch.float32, device=self.device)
            starts = torch.ones(n, dtype=torch.bool, device=self.device)  # rows that open a block
            starts[1:] = keys[1:] != keys[:-1]
            cuts = starts.nonzero().squeeze(1).tolist() + [n]
            lo = 0
            while lo < n:  # [lo, hi): whole blocks, about STATS_BLOCK_ROWS rows (one longer block alone)
                hi = cuts[min(bisect.bisect_right(cuts, lo + STATS_BLOCK_ROWS) - 1, len(cuts) - 1)]
                hi = hi if hi > lo else cuts[bisect.bisect_right(cuts, lo)]
                sizes[lo:hi], norms[lo:hi] = block_stats(self.embeddings[lo:hi].float(), keys[lo:hi])
                lo = hi
            self._blocks[kind] = (sizes, norms)
        return self._blocks[kind]

    def neighbour_dots(self, width: int) -> torch.Tensor:
        """(N_total, >= width) float32: each row's dot products with its next width-1 rows (query independent,
        computed once and kept; rows of different documents never share a run, so their dots are unused).

        Computed over row blocks (plus the width-1 rows after each) cast to float32, so a float16 store gets
        float32 dots and the temporary memory stays at about STATS_BLOCK_ROWS rows."""
        if self._dots is None or self._dots.shape[1] < width:
            n = self.embeddings.shape[0]
            dots = torch.zeros((n, width), dtype=torch.float32, device=self.device)
            for lo in range(0, n, STATS_BLOCK_ROWS):
                hi = min(lo + STATS_BLOCK_ROWS, n)
                part = self.embeddings[lo : min(hi + width - 1, n)].float()
                dots[lo:hi] = neighbour_dots(part, width, block_rows=STATS_BLOCK_ROWS)[: hi - lo]
            self._dots = dots
        return self._dots

    def heading_row_dots(self) -> torch.Tensor:
        """(N_total,) float32: each row's dot product with its own heading path's embedding (0 for rows without
        a heading); query independent, computed once and kept (blocks of STATS_BLOCK_ROWS rows cast to float32).
        Needs heading paths (`heading_tensors`)."""
        if self._heading_dots is None:
            heading_emb, row_heading = self.heading_tensors()[:2]
            n = self.embeddings.shape[0]
            dots = torch.zeros(n, dtype=torch.float32, device=self.device)
            for lo in range(0, n, STATS_BLOCK_ROWS):
                hi = min(lo + STATS_BLOCK_ROWS, n)
                path = row_heading[lo:hi]
                part = (self.embeddings[lo:hi].float() * heading_emb[path.clamp(min=0)]).sum(dim=1)
                dots[lo:hi] = torch.where(path >= 0, part, torch.zeros_like(part))
            self._heading_dots = dots
        return self._heading_dots

    def candidate_sims(self, query_emb: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """query_emb (Q, dim), rows/valid (Q, L) -> sims (Q, L) float32 (0 where invalid).

        Only the valid entries' vectors are gathered (padding costs nothing), GATHER_BLOCK_ELEMENTS floats at a
        time, in the store's dtype and then cast to float32, so memory stays bounded whatever Q is."""
        query = query_emb.to(device=self.device, dtype=torch.float32)
        return gathered_dots(self.embeddings, query, rows, valid)

    @classmethod
    def open(cls, store_dir: str, config: EngineConfig | None = None, device: str = "auto",
             nprobe: int | None = None) -> Engine:
        """Open a store; the embedding model is the one recorded in its manifest (a mismatch is refused).

        nprobe: inverted lists an ivf store's search probes (default: the store's, see README "Indexes")."""
        from engine.embedder import resolve_device
        from engine.store import read_manifest
        from engine.store.reader import Store

        stored = EngineConfig.from_dict(read_manifest(Path(store_dir).expanduser().absolute()).get("config", {}))
        config = config or stored
        if config.embedder.model not in (None, stored.embedder.model):
            raise QascError(
                f"store {store_dir} was built with model {stored.embedder.model or 'default'!r}, "
                f"not {config.embedder.model!r}"
            )
        dev = resolve_device(device if device != "auto" else config.embedder.device)
        store = Store.open(store_dir, device=dev, nprobe=nprobe)  # the FAISS index follows the engine's device
        emb_cfg = stored.embedder
        embedder = Embedder(emb_cfg.model, str(dev), config.embedder.dtype, emb_cfg.max_length, emb_cfg.batch_tokens)
        if embedder.dim != int(store.manifest["dim"]) or embedder.fingerprint != store.manifest.get(
            "fingerprint", embedder.fingerprint
        ):
            raise QascError(
                f"store {store_dir} holds {store.manifest['dim']}-d vectors of model fingerprint "
                f"{store.manifest.get('fingerprint')}; the loaded model gives {embedder.dim}-d, {embedder.fingerprint}"
            )
        return cls(store, embedder, config, dev)

    def embed_queries(self, questions: Sequence[str]) -> torch.Tensor:
        """questions (Q) -> (Q, dim) float32 on the engine's device; empty or overlong questions are refused."""
        self.check_questions(questions)
        return torch.as_tensor(self.embedder.encode(list(questions)), device=self.device)

    def search(self, query_emb: torch.Tensor, depth: int) -> torch.Tensor:
        """query_emb (Q, dim) -> hits (Q, depth) int64 global rows (-1 where the store has fewer).

        Stores with `search_tensor` (engine.store.Store) search on their own vectors' device (exact, blocked)
        or through FAISS; others (duck-typed stores) through numpy `search`."""
        if hasattr(self.store, "search_tensor"):
            _, rows = self.store.search_tensor(query_emb, depth)
            return rows.to(device=self.device, dtype=torch.long)
        _, rows = self.store.search(query_emb.float().cpu().numpy(), depth)
        return torch.as_tensor(rows, dtype=torch.long, device=self.device)

    def heading_tensors(self) -> tuple[torch.Tensor, ...] | None:
        """The store's heading paths on the engine's device, built once: heading_emb (H, dim) float32,
        row_heading (N_total,) int64 (-1: none), and the rows of each path as CSR: path_start (H,), path_count
        (H,), path_rows (rows with a heading,) int64. None when the store has no heading paths."""
        if not hasattr(self, "_headings"):
            emb = np.asarray(getattr(self.store, "heading_emb", np.zeros((0, 1))), dtype=np.float32)
            self._headings = None
            if len(emb):
                row_heading = np.asarray(self.store.row_heading, dtype=np.int64)
                order = np.argsort(row_heading, kind="stable")
                order = order[row_heading[order] >= 0]
                counts = np.bincount(row_heading[order], minlength=len(emb))
                starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
                self._headings = tuple(torch.as_tensor(a, device=self.device) for a in (
                    emb, row_heading, starts.astype(np.int64), counts.astype(np.int64), order.astype(np.int64)))
        return self._headings

    def heading_low(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The heading paths' table for `best_paths`' shortlist, built once, and its int8 scale: on a CPU with int8
        dot products the int8 codes and their (dim,) scale (`int8_heading_table`, ~2x the bf16 product there), on
        one with native bf16 instructions the bfloat16 table (~3x float32) and None, else (None, None): float32
        throughout (also below HEADING_SHORTLIST_MIN_PATHS paths and on CUDA)."""
        if not hasattr(self, "_heading_low"):
            emb = self.heading_tensors()[0]
            self._heading_low = None, None
            if self.device.type == "cpu" and len(emb) > HEADING_SHORTLIST_MIN_PATHS:
                if cpu_has_int8_dot() and emb.shape[1] % 8 == 0:  # torch._int_mm's CPU kernel needs dim % 8 == 0
                    self._heading_low = int8_heading_table(emb)
                elif cpu_has_native_bf16():
                    self._heading_low = emb.to(torch.bfloat16), None
        return self._heading_low

    def heading_sims(self, query: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        """query (Q, dim) float32, path (Q, L) int64 (-1: none) -> c (Q, L) float32, cosine of the query and
        the path's embedding (0 where path < 0). A query's candidates come in runs under one path (rows in store
        order), so each run's path is scored once (`segment_first`) and the score spread over the run."""
        seg, first_path = segment_first(path)
        c = gathered_dots(self.heading_tensors()[0], query, first_path.clamp(min=0), first_path >= 0)
        return torch.where(path >= 0, c.gather(1, seg), torch.zeros(path.shape, device=c.device))

    def lexical_index(self) -> LexicalIndex:
        """The store rows' BM25 weights (`engine.lexical.LexicalIndex`) on the engine's device, made on first use
        and kept: from the term counts saved at ingest (`Store.row_term_counts`), else from the sentences' texts."""
        if self._lexical is None:
            saved = getattr(self.store, "row_term_counts", lambda: None)()  # a file store's, saved at ingest
            self._lexical = LexicalIndex.from_counts_or_texts(saved, lambda: (
                doc.text[a:b] for doc in self.store.docs
                for a, b in zip(doc.char_start.tolist(), doc.char_end.tolist(), strict=True)), self.device)
        return self._lexical

    def lexical_term(self, params: QascParams, questions: Sequence[str] | None, n: int) -> LexicalTerm | None:
        """The lexical signal of a batch of n queries: None when params.lexical_weight is 0, the store is empty or
        the questions' texts are not given (queries as vectors only: there are no words to match); QascError when
        their count is not n."""
        if params.lexical_weight <= 0 or self.n_total == 0 or questions is None:
            return None
        if len(questions) != n:
            raise QascError(f"{len(questions)} question texts for {n} query vectors")
        return LexicalTerm(*self.lexical_index().query_terms(questions))

    def lexical_signal(self, term: LexicalTerm, rows: torch.Tensor, valid: torch.Tensor,
                       paths: torch.Tensor | None = None) -> torch.Tensor:
        """rows/valid (Q, L) -> (Q, L) float32 each row's BM25 / the most a row could score for its query. paths
        (Q, L) int64 the rows' heading paths (-1: none): the query terms a row's path holds do not count for it
        (kernels.lexical; None: every term counts)."""
        index = self.lexical_index()
        heads = self.heading_terms() if paths is not None else (None, None)
        scores = lexical_scores(index.row_ptr, index.row_terms, index.row_weights, term.query_ptr,
                                term.query_terms, index.vocab_size, rows, valid, paths, *heads)
        return normalised_lexical(scores, term.best)

    def titled_rows(self) -> torch.Tensor:
        """(N_total,) bool: the rows whose section is a title's (their heading path holds one heading, or none).
        A level-1 heading titles a document (an article, a paper, a policy); the text under it alone is that
        document's, not a section of it, so it is never a whole-block extent (bench/RESULTS.md, "One scoring
        model"). Built once."""
        if not hasattr(self, "_titled"):
            from engine.splitter import PATH_SEP

            headings = self.heading_tensors()
            self._titled = torch.ones(self.n_total, dtype=torch.bool, device=self.device)
            if headings is not None:
                depth = torch.tensor([p.count(PATH_SEP) + 1 for p in self.store.heading_paths], dtype=torch.long,
                                     device=self.device)
                row_heading = headings[1]
                self._titled = (row_heading < 0) | (depth[row_heading.clamp(min=0)] < 2)
        return self._titled

    def heading_terms(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The store's heading paths' terms in the lexical index's vocabulary, as CSR: path_ptr (H+1,), path_terms
        (nnz,) int64 (each path's distinct known terms, sorted). Built once."""
        if not hasattr(self, "_heading_terms"):
            ptr, ids, _ = self.lexical_index().query_terms(list(getattr(self.store, "heading_paths", [])))
            self._heading_terms = ptr, ids
        return self._heading_terms

    def score_rows(self, query: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, model: ScoringModel,
                   gate: HeadingGate | None, lexical: LexicalTerm | None) -> RowScores:
        """query (Q, dim) float32, rows/valid (Q, L) -> the scoring model's (kernels.signals.row_scores) plain
        scores and heading boost of those rows: their cosines, with the gate their heading signals, with the
        lexical term their BM25 (without the terms their heading paths hold, when the gate is on; invalid entries
        are never read)."""
        cos = self.candidate_sims(query, rows, valid)
        heading, path = {}, None
        if gate is not None:
            path = torch.where(valid, self.heading_tensors()[1][rows], torch.full_like(rows, -1))
            heading = {"c": self.heading_sims(query, path), "path": path, "hs": self.heading_row_dots()[rows],
                       "spread": gate.spread, "cref": gate.cref}
        lex = None
        if lexical is not None:
            lex = self.lexical_signal(lexical, rows, valid, path)
        return row_scores(model, cos, valid, lex=lex, **heading)

    def passage_tier(self) -> PassageTier | None:
        """The store's passages on the engine's device (engine.fill.PassageTier) with their texts, built on first
        use; None for a store without passages (written before format 3 or with --passage-tokens 0)."""
        if self._passages is False:
            passages = getattr(self.store, "passages", None)
            self._passages = None
            if passages is not None and len(passages.first):
                table = self.row_table
                first, last = passages.first, passages.first + passages.count - 1

                def texts() -> Iterator[str]:  # sliced when the tier's lexical index is built, not held
                    return (table.texts[d][a:b] for d, a, b in zip(
                        table.doc[first].tolist(), table.char_start[first].tolist(), table.char_end[last].tolist(),
                        strict=True))

                self._passages = PassageTier(passages, texts, self.device, self.heading_tensors(),
                                             list(getattr(self.store, "heading_paths", [])),
                                             counts=getattr(self.store, "passage_term_counts", None))
        return self._passages

    def fill_rows(self, query_emb: torch.Tensor, params: QascParams, pool: torch.Tensor | None,
                  questions: Sequence[str] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """A block's queries (Q, dim) -> the budget fill's single-sentence units, the same whatever the setting's
        depth and neighbourhood: rows (Q, FILL_ROWS) int64 (-1: none) and their scores (Q, FILL_ROWS) float32 (the
        pre-retrieval ranking's: the scoring model's plain score + heading boost). pool: the block's search hits
        when they are at least FILL_ROWS wide."""
        k = min(FILL_ROWS, self.n_total)
        lexical = self.lexical_term(params, questions, query_emb.shape[0])
        if self.uses_context(params):
            scores: list = []
            use = pool if pool is not None and pool.shape[1] >= max(k, min(CONTEXT_POOL, self.n_total)) else None
            rows, _ = self.context_hits(query_emb, k, params.scoring, use, lexical, scores)
            return rows, scores[0]
        rows = pool[:, :k] if pool is not None and pool.shape[1] >= k else self.search(query_emb, k)
        valid = rows >= 0
        safe = rows.clamp(min=0)
        query = query_emb.to(device=self.device, dtype=torch.float32)
        score = self.score_rows(query, safe, valid, params.scoring, None, lexical).total
        score = torch.where(valid, score, torch.full_like(score, float("-inf")))
        order = score.sort(dim=1, descending=True, stable=True).indices
        return rows.gather(1, order), score.gather(1, order)

    def fill_units(self, query_emb: torch.Tensor, params: QascParams, questions: Sequence[str] | None,
                   pool: torch.Tensor | None = None) -> list[FillUnits]:
        """A block's queries (Q, dim) -> per query, the units the budget fill draws on, best first
        (`engine.fill.merge_units`): the store's passages, ranked (`PassageTier.rank`), and the FILL_ROWS best
        single rows (`fill_rows`), all scored by the same model."""
        tier = self.passage_tier()
        heading_emb = self.heading_tensors()[0] if self.uses_context(params) else None
        query = query_emb.to(device=self.device, dtype=torch.float32)
        ids, scores = tier.rank(query, params, questions, heading_emb)
        rows, row_score = self.fill_rows(query, params, pool, questions)
        return merge_units(tier, ids, scores, rows.clamp(min=0), rows >= 0, row_score)

    @cached_property
    def row_tokens(self) -> np.ndarray:
        """(N_total,) int64 each row's model tokens (host), for the budget fill."""
        return self.n_tokens.cpu().numpy().astype(np.int64)

    @cached_property
    def row_sections(self) -> np.ndarray:
        """(N_total,) int64 each row's section key (host; equal for the rows of one section of one document), for
        the budget fill's diversity (QascParams.fill_diversity)."""
        return self.block_keys("section").cpu().numpy().astype(np.int64)

    def pool_width(self, params: QascParams, retrieval: RetrievalConfig) -> int:
        """The rows one search returns per query for `run_batch`: the depth, or the heading context's pool."""
        depth = min(retrieval.depth, max(self.n_total, 1))
        return min(max(depth, CONTEXT_POOL), self.n_total) if self.uses_context(params) else depth

    def uses_context(self, params: QascParams) -> bool:
        return params.context_weight > 0 and self.n_total > 0 and self.heading_tensors() is not None

    def context_hits(
        self, query_emb: torch.Tensor, depth: int, model: ScoringModel, pool: torch.Tensor | None = None,
        lexical: LexicalTerm | None = None, scores_out: list | None = None,
    ) -> tuple[torch.Tensor, HeadingGate]:
        """query_emb (Q, dim), depth, the scoring model (heading weight > 0) -> hits (Q, depth) int64 (-1 where
        missing) and the batch's HeadingGate: one search of max(depth, CONTEXT_POOL) rows; the gate over its first
        CONTEXT_POOL; the hits are the best `depth` rows by the model's score (plain + boost) among those rows and
        the first CONTEXT_PATH_ROWS rows of each of the CONTEXT_PATHS paths most similar to the query (ties: lower
        row first). pool: that search's result when already done (`pool_width` rows per query). lexical: the
        batch's lexical signal (`lexical_term`). scores_out: a list that gets the hits' scores (Q, depth) float32
        appended (-inf where a hit is missing)."""
        _, row_heading, path_start, path_count, path_rows = self.heading_tensors()
        query = query_emb.to(device=self.device, dtype=torch.float32)
        q, n = query.shape[0], self.n_total
        if pool is None:
            pool = self.search(query_emb, min(max(depth, CONTEXT_POOL), n))  # (Q, M) by raw cosine
        pool_valid = pool >= 0
        pool = pool.clamp(min=0)
        g = min(CONTEXT_POOL, pool.shape[1])
        gate_path = torch.where(pool_valid[:, :g], row_heading[pool[:, :g]], torch.full_like(pool[:, :g], -1))
        gate = HeadingGate(*heading_gate(self.heading_sims(query, gate_path), gate_path, pool_valid[:, :g]))
        heading_emb = self.heading_tensors()[0]
        low, low_scale = self.heading_low()
        best = best_paths(query, heading_emb, CONTEXT_PATHS, low, low_scale=low_scale)[1]  # (Q, J)
        extra, extra_valid = packed_path_rows(best, path_start, path_count.clamp(max=CONTEXT_PATH_ROWS), path_rows)
        rows = torch.cat([pool, extra], dim=1)
        valid = torch.cat([pool_valid, extra_valid], dim=1)
        key, _ = torch.where(valid, rows, torch.full_like(rows, n)).sort(dim=1)  # rows ascending, invalid last
        valid = key < n
        valid[:, 1:] &= key[:, 1:] != key[:, :-1]  # a pool row under a best path counts once
        rows = key.clamp(max=n - 1)
        score = self.score_rows(query, rows, valid, model, gate, lexical).total
        score = torch.where(valid, score, torch.full_like(score, float("-inf")))
        order = score.sort(dim=1, descending=True, stable=True).indices[:, :depth]
        hits = torch.where(valid.gather(1, order), rows.gather(1, order), torch.full_like(order, -1))
        if scores_out is not None:
            scores_out.append(score.gather(1, order))
        if hits.shape[1] < depth:
            hits = torch.cat([hits, hits.new_full((q, depth - hits.shape[1]), -1)], dim=1)
            if scores_out is not None:
                scores_out[-1] = torch.cat([scores_out[-1], scores_out[-1].new_full((q, depth - order.shape[1]),
                                                                                     float("-inf"))], dim=1)
        return hits, gate

    def run_batch(
        self, query_emb: torch.Tensor, params: QascParams, retrieval: RetrievalConfig,
        pool: torch.Tensor | None = None, questions: Sequence[str] | None = None,
    ) -> tuple[QascBatch, CandidateRows]:
        """query_emb (Q, dim) -> the QASC result over each query's candidate rows (with the heading context
        when params.context_weight > 0 and the store has heading paths). pool: the search's hits (Q,
        `pool_width`) when done already (query_columns searches several slices at once). questions (Q): the
        queries' texts, for the gated lexical term when params.lexical_weight > 0 (left out without them)."""
        depth = min(retrieval.depth, max(self.n_total, 1))
        lexical = self.lexical_term(params, questions, query_emb.shape[0])
        gate = None
        if self.uses_context(params):
            hits, gate = self.context_hits(query_emb, depth, params.scoring, pool, lexical)
        else:
            hits = self.search(query_emb, depth) if pool is None else pool[:, :depth]
        first, last = self.block_bounds(params.block_kinds, params.max_tokens) or (None, None)
        cand = candidate_rows(hits, self.doc_first, self.doc_last, retrieval.neighbourhood, self.n_total,
                              first, last, BLOCK_ROWS_MAX)
        rows = torch.where(cand.valid, cand.rows, torch.zeros_like(cand.rows))
        query = query_emb.to(device=self.device, dtype=torch.float32)
        scored = self.score_rows(query, rows, cand.valid, params.scoring, gate, lexical)
        sims, boost = scored.plain, (scored.boost if gate is not None else None)
        dots = self.neighbour_dots(params.max_extent)[rows] if params.extent == "pooled" else None  # (Q, L, W)
        blocks = {}
        for kind in params.block_kinds:
            sizes, norms = self.block_stats(kind)
            sizes = sizes[rows].long()
            if kind == "section":  # a title's text is a document, not a section: no whole-block candidate
                sizes = torch.where(self.titled_rows()[rows], torch.zeros_like(sizes), sizes)
            blocks[kind] = (sizes, norms[rows])
        batch = run_qasc(
            sims, cand.valid, cand.region, self.paragraph[rows].long(), self.section[rows].long(),
            self.n_tokens[rows].long(), params, dots=dots, blocks=blocks, boost=boost,
        )
        return batch, cand

    @cached_property
    def row_table(self) -> RowTable:
        """Per global row its document, sentence index and character span (numpy, host): built on first use."""
        return RowTable.from_docs(self.store.docs)

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
                if lo >= block_hi:  # one search for the next slices: the ivf scan is faster on many queries at once
                    block_lo, block_hi = lo, search_block_end(lo, n, block)
                    pool = self.search(query_emb[block_lo:block_hi], self.pool_width(params, retrieval))
                    governor.step()
                parts = []
                for a in range(lo, hi, step):  # kernels and assembly a bounded block of queries at a time
                    b = min(a + step, hi)
                    texts = None if questions is None else questions[a:b]
                    fill = params.budget_fill and (params.budget_tokens is not None or fill_units is not None) and (
                        self.passage_tier() is not None)  # passages load only for a fill (+0.4-0.5 GiB at 1M)
                    batch, cand = self.run_batch(query_emb[a:b], params, retrieval,
                                                 pool[a - block_lo : b - block_lo], texts)
                    rows = torch.where(cand.valid, cand.rows, torch.zeros_like(cand.rows))
                    cols = assemble_columns(batch, rows, table)
                    if fill:
                        units = self.fill_units(query_emb[a:b], params, texts, pool[a - block_lo : b - block_lo])
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
            yield cols.to_record_batch(qids, self.row_table.doc_id_array)

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
