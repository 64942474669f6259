"""Per-store tables of the query engine: built once per opened store, on the engine's device.

`StoreTables` holds what a query reads about the store's rows besides their vectors' similarities: the per-row
arrays (document bounds, paragraph and section ids, tokens), the embeddings (the store's own copy), the
query-independent stats (neighbour dots, block sizes and norms, block bounds), the heading paths (vectors, each
row's path, each path's rows, the low-precision shortlist table, each row's dot with its path, whether a row's
section is a title's), the lexical index and the heading paths' terms, the budget fill's passages, and the host
tables of the assembly. One caching rule: each table is built on first use and kept for the life of the engine
(`cached_property` for a table of the store, a dict keyed by the arguments for a table of the store and a setting).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from qasc.engine.assemble import RowTable
from qasc.engine.cpu import cpu_has_int8_dot, cpu_has_native_bf16
from qasc.engine.errors import QascError
from qasc.engine.fill import PassageTier
from qasc.engine.heap import trim_heap
from qasc.engine.lexical import LexicalIndex
from qasc.engine.types import Sentences
from qasc.kernels.context import int8_heading_table
from qasc.kernels.extents import block_stats, neighbour_dots

STATS_BLOCK_ROWS = 16384  # store rows per block of the query-independent stats (cast to float32 per block)
BLOCK_ROWS_MAX = 32  # whole blocks brought into the candidate region: at most this many rows (and the token cap)
HEADING_SHORTLIST_MIN_PATHS = 4096  # below this many heading paths the float32 product is cheap: no shortlist


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


def row_path_dots(embeddings: torch.Tensor, heading_emb: torch.Tensor, row_heading: torch.Tensor) -> torch.Tensor:
    """embeddings (N, dim) any float dtype, heading_emb (H, dim) float32, row_heading (N,) int64 (-1: none) ->
    (N,) float32 each row's dot product with its heading path's embedding (0 without one), STATS_BLOCK_ROWS rows
    cast to float32 at a time."""
    n = embeddings.shape[0]
    dots = torch.zeros(n, dtype=torch.float32, device=heading_emb.device)
    for lo in range(0, n, STATS_BLOCK_ROWS):
        hi = min(lo + STATS_BLOCK_ROWS, n)
        path = row_heading[lo:hi]
        part = (embeddings[lo:hi].float() * heading_emb[path.clamp(min=0)]).sum(dim=1)
        dots[lo:hi] = torch.where(path >= 0, part, torch.zeros_like(part))
    return dots


def table(method):
    """The one caching rule: a table of the store (and of its arguments) is built on first use and kept for the
    engine's life, in the instance's `_tables` under (method name, arguments); the build's freed temporaries are
    handed back to the system (engine.heap)."""

    @functools.wraps(method)
    def cached(self, *args):
        key = (method.__name__, *args)
        if key not in self._tables:
            self._tables[key] = method(self, *args)
            trim_heap()
        return self._tables[key]

    return cached


class StoreTables:
    """A store's tables for querying (see the module docstring): `StoreTables(store, device)`."""

    def __init__(self, store, device: torch.device, partitions=None) -> None:
        self.store = store
        self.device = device
        # a collection served by its partitions (engine.partition.PartitionedVectors): the vectors and the tables
        # made from them stay with the partitions; None: the store's own vectors
        self.partitions = partitions
        docs: Sequence[Sentences] = store.docs
        offsets = np.asarray(store.doc_offsets, dtype=np.int64)
        self.n_total = int(offsets[-1])
        lengths = np.diff(offsets)
        doc_of_row = np.repeat(np.arange(len(docs), dtype=np.int64), lengths)
        if self.n_total >= 2**31:
            raise QascError(f"a store of {self.n_total} sentences: the engine's per-row arrays hold int32 rows")
        cat = store.row_array if hasattr(store, "row_array") else (  # a Store: mapped arrays or the docs'
            (lambda name: np.concatenate([getattr(d, name) for d in docs])) if docs else (
                lambda name: np.zeros(0, dtype=np.int32)))
        # per-row arrays in int32 (half the bytes: 4 MB each at 1M rows); gathered per slice, then widened to int64
        as_t = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int32), device=device)  # noqa: E731
        self.doc_of_row = as_t(doc_of_row)
        self.doc_first = as_t(offsets[doc_of_row])
        self.doc_last = as_t(offsets[doc_of_row + 1] - 1)
        self.paragraph = as_t(cat("paragraph"))
        self.section = as_t(cat("section"))
        self.n_tokens = as_t(cat("n_tokens"))
        del doc_of_row
        # (N_total, dim) float32 | float16: the store's own copy (None for a collection served by its partitions)
        self.embeddings = store_vectors(store, device) if partitions is None else None
        # (table, its arguments) -> the table (`table`); those saved at ingest to start with (engine.store.mapped)
        self._tables: dict[tuple, object] = dict(getattr(store, "saved_tables", lambda _: {})(device))

    def block_keys(self, kind: str) -> torch.Tensor:
        """kind paragraph | section -> (N_total,) int64 keys, equal for the rows of one block of one document."""
        ids = self.paragraph if kind == "paragraph" else self.section
        return self.doc_of_row.long() * (int(ids.max()) + 1 if ids.numel() else 1) + ids

    @table
    def block_bounds(self, kinds: tuple[str, ...], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """block kinds (paragraph / section), a chunk's token cap -> first, last (N_total,) int32: the rows of each
        row's block when it can be a whole-block extent (at most BLOCK_ROWS_MAX rows and `max_tokens` tokens), else
        the row itself; with several kinds, the widest of them. A hit brings these rows into its candidate region,
        so that a block extent is never missed because the neighbourhood around the hit was narrower than the
        block. None for no kinds. Computed once per (kinds, cap) and kept."""
        if not kinds:
            return None
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
        return lo.int(), hi.int()

    @table
    def block_stats(self, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """kind paragraph | section -> sizes (N_total,) int32, norms (N_total,) float32: each row's whole block
        in its document (rows, norm of the summed vectors); query independent, computed once and kept.

        Computed over row blocks cut at block boundaries, each cast to float32, so a float16 store gets float32
        sums and the temporary memory stays at about STATS_BLOCK_ROWS rows."""
        if self.partitions is not None:
            return self.partitions.block_stats(kind)
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
        return sizes, norms

    @table
    def neighbour_dots(self, width: int) -> torch.Tensor:
        """(N_total, >= width) float32: each row's dot products with its next width-1 rows (query independent,
        computed once and kept (`table`); rows of different documents never share a run, so their dots are unused).

        Computed over row blocks (plus the width-1 rows after each) cast to float32, so a float16 store gets
        float32 dots and the temporary memory stays at about STATS_BLOCK_ROWS rows."""
        if self.partitions is not None:
            return self.partitions.neighbour_dots(width)
        n = self.embeddings.shape[0]
        dots = torch.zeros((n, width), dtype=torch.float32, device=self.device)
        for lo in range(0, n, STATS_BLOCK_ROWS):
            hi = min(lo + STATS_BLOCK_ROWS, n)
            part = self.embeddings[lo : min(hi + width - 1, n)].float()
            dots[lo:hi] = neighbour_dots(part, width, block_rows=STATS_BLOCK_ROWS)[: hi - lo]
        return dots

    @table
    def heading_row_dots(self) -> torch.Tensor:
        """(N_total,) float32: each row's dot product with its own heading path's embedding (0 for rows without
        a heading); query independent, computed once and kept (blocks of STATS_BLOCK_ROWS rows cast to float32).
        Needs heading paths (`heading_tensors`)."""
        heading_emb, row_heading = self.heading_tensors()[:2]
        if self.partitions is not None:
            return self.partitions.heading_row_dots(heading_emb)
        return row_path_dots(self.embeddings, heading_emb, row_heading)

    @table
    def heading_tensors(self) -> tuple[torch.Tensor, ...] | None:
        """The store's heading paths on the engine's device, built once: heading_emb (H, dim) float32,
        row_heading (N_total,) int64 (-1: none), and the rows of each path as CSR: path_start (H,), path_count
        (H,), path_rows (rows with a heading,) int64. None when the store has no heading paths."""
        emb = np.asarray(getattr(self.store, "heading_emb", np.zeros((0, 1))), dtype=np.float32)
        if not len(emb):
            return None
        row_heading = np.asarray(self.store.row_heading, dtype=np.int64)
        order = np.argsort(row_heading, kind="stable")
        order = order[row_heading[order] >= 0]
        counts = np.bincount(row_heading[order], minlength=len(emb))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        return tuple(torch.as_tensor(a, device=self.device) for a in (
            emb, row_heading, starts.astype(np.int64), counts.astype(np.int64), order.astype(np.int64)))

    @table
    def heading_low(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The heading paths' table for `best_paths`' shortlist, built once, and its int8 scale: on a CPU with int8
        dot products the int8 codes and their (dim,) scale (`int8_heading_table`, ~2x the bf16 product there), on
        one with native bf16 instructions the bfloat16 table (~3x float32) and None, else (None, None): float32
        throughout (also below HEADING_SHORTLIST_MIN_PATHS paths and on CUDA)."""
        emb = self.heading_tensors()[0]
        if self.device.type == "cpu" and len(emb) > HEADING_SHORTLIST_MIN_PATHS:
            if cpu_has_int8_dot() and emb.shape[1] % 8 == 0:  # torch._int_mm's CPU kernel needs dim % 8 == 0
                return int8_heading_table(emb)
            if cpu_has_native_bf16():
                return emb.to(torch.bfloat16), None
        return None, None

    @table
    def titled_rows(self) -> torch.Tensor:
        """(N_total,) bool: the rows whose section is a title's (their heading path holds one heading, or none).
        A level-1 heading titles a document (an article, a paper, a policy); the text under it alone is that
        document's, not a section of it, so it is never a whole-block extent (bench/RESULTS.md, "One scoring
        model"). Built once."""
        from qasc.engine.splitter import PATH_SEP

        headings = self.heading_tensors()
        if headings is None:
            return torch.ones(self.n_total, dtype=torch.bool, device=self.device)
        depth = torch.tensor([p.count(PATH_SEP) + 1 for p in self.store.heading_paths], dtype=torch.long,
                             device=self.device)
        row_heading = headings[1]
        return (row_heading < 0) | (depth[row_heading.clamp(min=0)] < 2)

    @table
    def lexical_index(self) -> LexicalIndex:
        """The store rows' BM25 weights (`engine.lexical.LexicalIndex`) on the engine's device, made on first use
        and kept: from the term counts saved at ingest (`Store.row_term_counts`), else from the sentences' texts."""
        saved = getattr(self.store, "row_term_counts", lambda: None)()  # a file store's, saved at ingest
        return LexicalIndex.from_counts_or_texts(saved, lambda: (
            doc.text[a:b] for doc in self.store.docs
            for a, b in zip(doc.char_start.tolist(), doc.char_end.tolist(), strict=True)), self.device)

    @table
    def heading_terms(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The store's heading paths' terms in the lexical index's vocabulary, as CSR: path_ptr (H+1,), path_terms
        (nnz,) int64 (each path's distinct known terms, sorted). Built once."""
        ptr, ids, _ = self.lexical_index().query_terms(list(getattr(self.store, "heading_paths", [])))
        return ptr, ids

    @table
    def passage_tier(self) -> PassageTier | None:
        """The store's passages on the engine's device (engine.fill.PassageTier) with their texts, built on first
        use; None for a store without passages (written before format 3 or with --passage-tokens 0)."""
        passages = getattr(self.store, "passages", None)
        if passages is None or not len(passages.first):
            return None
        table = self.row_table
        first, last = passages.first, passages.first + passages.count - 1

        def texts() -> Iterator[str]:  # sliced when the tier's lexical index is built, not held
            return (table.texts[d][a:b] for d, a, b in zip(
                table.doc[first].tolist(), table.char_start[first].tolist(), table.char_end[last].tolist(),
                strict=True))

        return PassageTier(passages, texts, self.device, self.heading_tensors(),
                           list(getattr(self.store, "heading_paths", [])),
                           counts=getattr(self.store, "passage_term_counts", None), partitions=self.partitions)

    @property
    def row_table(self) -> RowTable:
        """Per global row its document, sentence index and character span (numpy, host)."""
        return self._row_table()

    @table
    def _row_table(self) -> RowTable:
        store = self.store
        if not hasattr(store, "row_array"):  # a store-like of documents alone
            return RowTable.from_docs(store.docs)
        return RowTable.from_arrays(store.doc_ids, np.diff(store.doc_offsets), store.row_array("char_start"),
                                    store.row_array("char_end"), store.doc_texts)  # texts not read here

    @property
    def row_tokens(self) -> np.ndarray:
        """(N_total,) int64 each row's model tokens (host), for the budget fill."""
        return self._row_tokens()

    @table
    def _row_tokens(self) -> np.ndarray:
        return self.n_tokens.cpu().numpy().astype(np.int64)

    @property
    def row_sections(self) -> np.ndarray:
        """(N_total,) int64 each row's section key (host; equal for the rows of one section of one document), for
        the budget fill's diversity (QascParams.fill_diversity)."""
        return self._row_sections()

    @table
    def _row_sections(self) -> np.ndarray:
        return self.block_keys("section").cpu().numpy().astype(np.int64)
