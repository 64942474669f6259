"""`LexicalIndex`: BM25 term weights of a store's sentence rows, for the gated lexical term (kernels.lexical).

Terms are lower-cased runs of letters and digits (any script: Python's `\\w` without the underscore), minus a
short list of English function words. A row's weight for term t is Okapi BM25's
idf(t) (k1 + 1) tf / (tf + k1 (1 - b + b dl / avgdl)) with idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)), k1 1.2,
b 0.75 (the usual values), dl the row's terms, avgdl their mean over the store. The index is built from the
store's texts when a query first needs it (Engine.lexical_index; about 1 s per 100k sentences on one core) and
held as CSR arrays: row_ptr (N+1,) int64, row_terms (nnz,) int32, row_weights (nnz,) float32, nnz ~ 10-20
per sentence (1M sentences of the scale bench: 20.6M, ~9 s and ~0.17 GiB).
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import count, filterfalse
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

BM25_K1 = 1.2
BM25_B = 0.75
BUILD_BLOCK_ROWS = 65536  # rows counted at a time while building
TERM = re.compile(r"[^\W_]+")
# English function words: they match everywhere and carry no evidence (a question's "what", "the", "of")
STOP_WORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below between both
but by can could did do does doing down during each either else few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me might more most must my myself no nor
not now of off on once only or other our ours ourselves out over own same shall she should so some such than that
the their theirs them themselves then there these they this those through to too under until up upon very was we
were what when where whether which while who whom whose why will with within without would you your yours
yourself yourselves
""".split())


def terms(text: str) -> list[str]:
    """text -> its terms in order (lower-cased letter/digit runs, stop words dropped)."""
    return list(filterfalse(STOP_WORDS.__contains__, TERM.findall(text.lower())))


def term_rule() -> str:
    """The term rule's fingerprint (TERM's pattern and the stop words): saved term counts are used only where they
    were counted by the same rule (engine.store.lexical), else the index is built from the texts."""
    text = TERM.pattern + "\n" + " ".join(sorted(STOP_WORDS))
    return "terms-" + hashlib.sha256(text.encode()).hexdigest()[:16]


class TermCounts(NamedTuple):
    """The terms of n rows with their own vocabulary of v terms: vocab (v) the terms in order of first use (row
    after row, in text order; a list or an Arrow string array), row_ptr (n+1,) int64, terms (nnz,) int32 each
    row's distinct term ids ascending, tf (nnz,) int32 their counts in the row (>= 1). A row's length in terms
    (BM25's dl) is its tf summed."""

    vocab: Sequence[str] | pa.Array
    row_ptr: np.ndarray
    terms: np.ndarray
    tf: np.ndarray

    @property
    def n_rows(self) -> int:
        return len(self.row_ptr) - 1

    def terms_list(self) -> list[str]:
        return self.vocab.to_pylist() if isinstance(self.vocab, pa.Array) else list(self.vocab)

    def equals(self, other: TermCounts) -> bool:
        """The same terms in the same order and the same arrays."""
        return self.terms_list() == other.terms_list() and all(
            np.array_equal(getattr(self, n), getattr(other, n)) for n in ("row_ptr", "terms", "tf"))


class _Block(NamedTuple):
    """Rows counted against the index's vocabulary: terms (nnz,) int32 ids ascending within each row, tf (nnz,)
    int32, per_row (n,) int64 distinct terms per row, lengths (n,) int64 terms per row."""

    terms: np.ndarray
    tf: np.ndarray
    per_row: np.ndarray
    lengths: np.ndarray


def _count_block(lens: list[int], flat: list[str], vocab: defaultdict[str, int]) -> _Block:
    """lens (n) each row's number of terms, flat (sum lens) the rows' terms row after row, vocab (a missing term
    gets the next id) -> the rows' _Block."""
    lengths = np.array(lens, dtype=np.int64)
    ids = np.fromiter(map(vocab.__getitem__, flat), dtype=np.int64, count=len(flat))
    width = max(len(vocab), 1)
    key, tf = np.unique(np.repeat(np.arange(len(lens), dtype=np.int64), lengths) * width + ids,
                        return_counts=True)  # distinct (row, term): rows ascending, terms ascending
    return _Block((key % width).astype(np.int32), tf.astype(np.int32),
                  np.bincount(key // width, minlength=len(lens)).astype(np.int64), lengths)


def _term_rows(texts: Iterable[str], block_rows: int) -> Iterator[tuple[list[int], list[str]]]:
    """texts -> (lens, flat) per block of up to block_rows rows: each row's number of terms, their terms."""
    lens: list[int] = []
    flat: list[str] = []
    for text in texts:
        row = terms(text)
        lens.append(len(row))
        flat.extend(row)
        if len(lens) >= block_rows:
            yield lens, flat
            lens, flat = [], []
    if lens:
        yield lens, flat


def count_terms(texts: Iterable[str]) -> TermCounts:
    """texts (n) -> their TermCounts (a vocabulary of their own: what a store shard saves at ingest)."""
    vocab: defaultdict[str, int] = defaultdict(count().__next__)
    lens, flat = next(_term_rows(texts, 2**62), ([], []))
    block = _count_block(lens, flat, vocab)
    row_ptr = np.zeros(len(block.per_row) + 1, dtype=np.int64)
    np.cumsum(block.per_row, out=row_ptr[1:])
    return TermCounts(list(vocab), row_ptr, block.terms, block.tf)


def stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """keys (n,) ints in [0, bound) -> (n,) int64 the stable sorting order: a radix sort (O(n)) on 16-bit keys
    where bound <= 2^16 (a shard's rows or terms), numpy's stable sort otherwise."""
    return np.argsort(keys.astype(np.uint16 if bound <= 1 << 16 else np.int64), kind="stable")


def _as_block(part: TermCounts, remap: np.ndarray) -> _Block:
    """part, remap (v,) int64 the store id of each of its terms -> part's rows with store ids, re-sorted within
    each row (two stable radix passes: by store id, then by row) where remap does not keep the order -> _Block."""
    ids = remap[part.terms]
    per_row = np.diff(part.row_ptr)
    tf = np.asarray(part.tf, dtype=np.int32)
    if len(remap) > 1 and not bool(np.all(remap[1:] > remap[:-1])):
        rank = np.empty(len(remap), dtype=np.int64)  # each local term's place in store-id order
        rank[np.argsort(remap)] = np.arange(len(remap))
        by_term = stable_order(rank[part.terms], len(remap))  # then by row, stably: (row, store id) order
        order = by_term[stable_order(np.repeat(np.arange(part.n_rows), per_row)[by_term], part.n_rows)]
        ids, tf = ids[order], tf[order]
    cum = np.concatenate([[0], np.cumsum(tf, dtype=np.int64)])
    return _Block(ids.astype(np.int32), tf, per_row, cum[part.row_ptr[1:]] - cum[part.row_ptr[:-1]])


def merge_vocabs(vocabs: Sequence[Sequence[str] | pa.Array]) -> tuple[pa.Array, list[np.ndarray]]:
    """Parts' vocabularies (each in its order of first use) -> (the merged vocabulary (V) in order of first use,
    per part (v_i,) int64 the merged id of each of its terms): Arrow's hash kernels, no Python loop per term
    (`pc.unique` lists values in order of first appearance)."""
    words = pa.chunked_array([(v if isinstance(v, pa.Array) else pa.array(v, pa.string())).cast(pa.large_string())
                              for v in vocabs], pa.large_string())
    merged = pc.unique(words)
    ids = pc.index_in(words, value_set=merged).to_numpy().astype(np.int64) if len(words) else np.zeros(0, np.int64)
    bounds = np.cumsum([0, *(len(v) for v in vocabs)])
    return merged, [ids[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


class LexicalIndex:
    """BM25 weights of N rows over a vocabulary of V terms, as CSR (numpy on the host, torch on `device`)."""

    def __init__(self, vocab: dict[str, int], idf: np.ndarray, row_ptr: np.ndarray, row_terms: np.ndarray,
                 row_weights: np.ndarray, device: torch.device | str = "cpu") -> None:
        self.vocab, self.idf = vocab, idf
        self.row_ptr = torch.as_tensor(row_ptr, dtype=torch.long, device=device)
        self.row_terms = torch.as_tensor(row_terms, dtype=torch.int32, device=device)  # ids < 2^31
        self.row_weights = torch.as_tensor(row_weights, dtype=torch.float32, device=device)

    @property
    def n_rows(self) -> int:
        return int(self.row_ptr.shape[0]) - 1

    @classmethod
    def build(cls, texts: Iterable[str], device: torch.device | str = "cpu",
              block_rows: int = BUILD_BLOCK_ROWS) -> LexicalIndex:
        """texts (N) the rows' sentences, in row order -> their index. Rows are counted `block_rows` at a time
        (their distinct terms and counts as int32), then each block's weights are written into the index's arrays
        and the block dropped, so the build never holds the blocks and the whole index together with the full-size
        temporaries of one vectorised pass (1M rows of the scale bench, an index of 0.16 GiB: the engine's high-water
        mark rose 0.40 GiB over the open store, 0.84 GiB with the one pass)."""
        # term ids in order of first use: a missing term gets the next id (C-level lookups, no Python loop per term)
        vocab: defaultdict[str, int] = defaultdict(count().__next__)
        blocks = [_count_block(lens, flat, vocab) for lens, flat in _term_rows(texts, block_rows)]
        return cls._from_blocks(dict(vocab), blocks, device)

    @classmethod
    def from_counts(cls, parts: Iterable[TermCounts], device: torch.device | str = "cpu") -> LexicalIndex:
        """parts: TermCounts of consecutive row ranges (a store's shards, in order) -> the index of all their rows,
        equal to `build` over the same texts (the same vocab ids, idf and CSR arrays): the vocabularies are merged
        in order of first use and each part's ids mapped into it (a numpy gather, re-sorted within rows)."""
        parts = list(parts)  # each dropped once mapped: this holds the parts or their blocks, not both
        merged, remaps = merge_vocabs([part.vocab for part in parts])
        blocks = []
        for i, remap in enumerate(remaps):
            blocks.append(_as_block(parts[i], remap))
            parts[i] = None
        vocab = dict(zip(merged.to_pylist(), range(len(merged)), strict=True))
        return cls._from_blocks(vocab, blocks, device)

    @classmethod
    def from_counts_or_texts(cls, counts: Iterable[TermCounts] | None, texts: Callable[[], Iterable[str]],
                             device: torch.device | str = "cpu") -> LexicalIndex:
        """`from_counts(counts)` where counts are given (a store's, saved at ingest), else `build(texts())`: the
        same index either way."""
        return cls.from_counts(counts, device) if counts is not None else cls.build(texts(), device)

    @classmethod
    def _from_blocks(cls, vocab: dict[str, int], blocks: list[_Block], device: torch.device | str) -> LexicalIndex:
        """Counted blocks of consecutive rows (ids of `vocab`) -> the index: df and idf over all rows, avgdl, and
        each block's weights written into the CSR arrays, the block dropped once used (the list is emptied), so
        that this holds the blocks or the index but not both, plus one block's temporaries."""
        if not blocks:  # no rows
            blocks = [_count_block([], [], defaultdict(count().__next__))]
        lengths = np.concatenate([b.lengths for b in blocks])
        counts = np.concatenate([b.per_row for b in blocks])
        n = len(lengths)
        row_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=row_ptr[1:])
        df = np.zeros(len(vocab), dtype=np.int64)
        for b in blocks:
            df += np.bincount(b.terms, minlength=len(vocab))
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        avgdl = float(lengths.mean()) if n and lengths.sum() else 1.0
        row_terms = np.empty(int(row_ptr[-1]), dtype=np.int32)
        weights = np.empty(int(row_ptr[-1]), dtype=np.float32)
        at, row = 0, 0
        while blocks:
            b = blocks.pop(0)
            t, tf, k = b.terms, b.tf, len(b.lengths)
            row_dl = np.repeat(lengths[row : row + k], counts[row : row + k]).astype(np.float32)
            weights[at : at + len(t)] = (
                idf[t].astype(np.float32) * np.float32(BM25_K1 + 1) * tf
                / (tf + np.float32(BM25_K1) * (np.float32(1 - BM25_B) + np.float32(BM25_B / avgdl) * row_dl)))
            row_terms[at : at + len(t)] = t
            at, row = at + len(t), row + k
            del b, t, tf
        return cls(vocab, idf.astype(np.float32), row_ptr, row_terms, weights, device)

    def query_terms(self, questions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """questions (Q) -> query_ptr (Q+1,) int64, query_terms (T,) int64 (each question's distinct known terms,
        sorted), best (Q,) float32: the most a row can score for it, sum of idf(t) (k1 + 1) over those terms
        (the limit of a row's weight as tf grows), 0 for a question with no known term."""
        ptr, flat = [0], []
        vocab = self.vocab
        for q in questions:
            flat.extend(sorted({vocab[t] for t in terms(q) if t in vocab}))
            ptr.append(len(flat))
        ids, bounds = np.asarray(flat, dtype=np.int64), np.asarray(ptr, dtype=np.int64)
        owner = np.repeat(np.arange(len(questions)), np.diff(bounds))
        # each question's idf sum in float64 (one bincount, not a Python sum per question), then x (k1 + 1)
        best = np.bincount(owner, weights=self.idf[ids].astype(np.float64), minlength=len(questions)) * (BM25_K1 + 1)
        device = self.row_ptr.device
        return (torch.as_tensor(bounds, device=device), torch.as_tensor(ids, device=device),
                torch.as_tensor(best.astype(np.float32), device=device))

    @property
    def vocab_size(self) -> int:
        return max(len(self.vocab), 1)

    def dense_scores(self, query_ptr: torch.Tensor, query_terms: torch.Tensor) -> torch.Tensor:
        """query_ptr (Q+1,), query_terms (T,) (`query_terms`) -> (Q, N) float32: every row's BM25 for every
        query, one sparse product (for small N: the evaluation's baseline chunks)."""
        n_q, n = int(query_ptr.shape[0]) - 1, self.n_rows
        device = self.row_ptr.device
        if n_q == 0 or n == 0:
            return torch.zeros((n_q, n), dtype=torch.float32, device=device)
        owner = torch.repeat_interleave(torch.arange(n_q, device=device), query_ptr[1:] - query_ptr[:-1])
        wanted = torch.zeros((self.vocab_size, n_q), dtype=torch.float32, device=device)
        wanted[query_terms, owner] = 1.0
        row_of = torch.repeat_interleave(torch.arange(n, device=device), self.row_ptr[1:] - self.row_ptr[:-1])
        weights = torch.sparse_coo_tensor(torch.stack([row_of, self.row_terms.long()]), self.row_weights,
                                          (n, self.vocab_size), check_invariants=True)
        return torch.sparse.mm(weights, wanted).T.contiguous()
