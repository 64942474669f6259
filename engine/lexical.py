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

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import count, filterfalse

import numpy as np
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
        terms_u, tf_u, per_row, dl = [], [], [], []  # per block: distinct terms, their counts, per row, row lengths
        block_sizes: list[int] = []
        block_lens: list[int] = []
        block_terms: list[str] = []  # the block's terms, row after row

        def flush() -> None:
            lens = np.array(block_lens, dtype=np.int64)
            flat = np.array(list(map(vocab.__getitem__, block_terms)), dtype=np.int64)
            width = max(len(vocab), 1)
            key, tf = np.unique(np.repeat(np.arange(len(block_lens), dtype=np.int64), lens) * width + flat,
                                return_counts=True)  # distinct (row, term): rows ascending, terms ascending
            terms_u.append((key % width).astype(np.int32))
            tf_u.append(tf.astype(np.int32))
            per_row.append(np.bincount(key // width, minlength=len(block_lens)))
            dl.append(lens)
            block_sizes.append(len(block_lens))
            block_lens.clear()
            block_terms.clear()

        for text in texts:
            row = terms(text)
            block_lens.append(len(row))
            block_terms.extend(row)
            if len(block_lens) >= block_rows:
                flush()
        if block_lens:
            flush()
        vocab = dict(vocab)  # a plain dict from here on: a lookup of an unknown term must not add it
        lengths = np.concatenate(dl) if dl else np.zeros(0, np.int64)
        counts = np.concatenate(per_row) if per_row else np.zeros(0, np.int64)
        dl.clear()
        per_row.clear()
        n = len(lengths)
        row_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=row_ptr[1:])
        df = np.zeros(len(vocab), dtype=np.int64)
        for t in terms_u:
            df += np.bincount(t, minlength=len(vocab))
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        avgdl = float(lengths.mean()) if n and lengths.sum() else 1.0
        # the index's two arrays filled one block at a time, each block's counts dropped once used, so that the
        # build holds the blocks or the index but not both, plus one block's temporaries
        row_terms = np.empty(int(row_ptr[-1]), dtype=np.int32)
        weights = np.empty(int(row_ptr[-1]), dtype=np.float32)
        at, row = 0, 0
        while terms_u:
            t, tf, k = terms_u.pop(0), tf_u.pop(0), block_sizes.pop(0)
            row_dl = np.repeat(lengths[row : row + k], counts[row : row + k]).astype(np.float32)
            weights[at : at + len(t)] = (
                idf[t].astype(np.float32) * np.float32(BM25_K1 + 1) * tf
                / (tf + np.float32(BM25_K1) * (np.float32(1 - BM25_B) + np.float32(BM25_B / avgdl) * row_dl)))
            row_terms[at : at + len(t)] = t
            at, row = at + len(t), row + k
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
