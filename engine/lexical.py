"""`LexicalIndex`: BM25 term weights of a store's sentence rows, for the gated lexical term (kernels.lexical).

Terms are lower-cased runs of letters and digits (any script: Python's `\\w` without the underscore), minus a
short list of English function words. A row's weight for term t is Okapi BM25's
idf(t) (k1 + 1) tf / (tf + k1 (1 - b + b dl / avgdl)) with idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)), k1 1.2,
b 0.75 (the usual values), dl the row's terms, avgdl their mean over the store. The index is built from the
store's texts when a query first needs it (Engine.lexical_index; about 1 s per 50k sentences on one core) and
held as CSR arrays: row_ptr (N+1,), row_terms (nnz,), row_weights (nnz,), nnz ~ 10 per sentence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import numpy as np
import torch

BM25_K1 = 1.2
BM25_B = 0.75
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
    return [t for t in TERM.findall(text.lower()) if t not in STOP_WORDS]


class LexicalIndex:
    """BM25 weights of N rows over a vocabulary of V terms, as CSR (numpy on the host, torch on `device`)."""

    def __init__(self, vocab: dict[str, int], idf: np.ndarray, row_ptr: np.ndarray, row_terms: np.ndarray,
                 row_weights: np.ndarray, device: torch.device | str = "cpu") -> None:
        self.vocab, self.idf = vocab, idf
        self.row_ptr = torch.as_tensor(row_ptr, dtype=torch.long, device=device)
        self.row_terms = torch.as_tensor(row_terms, dtype=torch.long, device=device)
        self.row_weights = torch.as_tensor(row_weights, dtype=torch.float32, device=device)

    @property
    def n_rows(self) -> int:
        return int(self.row_ptr.shape[0]) - 1

    @classmethod
    def build(cls, texts: Iterable[str], device: torch.device | str = "cpu") -> LexicalIndex:
        """texts (N) the rows' sentences, in row order -> their index."""
        vocab: dict[str, int] = {}
        ids: list[int] = []
        counts = []
        for text in texts:
            row = [vocab.setdefault(t, len(vocab)) for t in terms(text)]
            ids.extend(row)
            counts.append(len(row))
        n = len(counts)
        dl = np.asarray(counts, dtype=np.int64)
        row_of = np.repeat(np.arange(n, dtype=np.int64), dl)
        term_of = np.asarray(ids, dtype=np.int64)
        # distinct (row, term) pairs with their counts: rows ascending, terms ascending within a row
        key = np.unique(row_of * max(len(vocab), 1) + term_of, return_counts=True)
        pair, tf = key
        row_u, term_u = pair // max(len(vocab), 1), pair % max(len(vocab), 1)
        df = np.bincount(term_u, minlength=len(vocab))
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        avgdl = float(dl.mean()) if n and dl.sum() else 1.0
        norm = BM25_K1 * (1 - BM25_B + BM25_B * dl[row_u] / avgdl)
        weights = idf[term_u] * (BM25_K1 + 1) * tf / (tf + norm)
        row_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(row_u, minlength=n), out=row_ptr[1:])
        return cls(vocab, idf.astype(np.float32), row_ptr, term_u, weights.astype(np.float32), device)

    def query_terms(self, questions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """questions (Q) -> query_ptr (Q+1,) int64, query_terms (T,) int64 (each question's distinct known terms,
        sorted), best (Q,) float32: the most a row can score for it, sum of idf(t) (k1 + 1) over those terms
        (the limit of a row's weight as tf grows), 0 for a question with no known term."""
        ptr, flat, best = [0], [], []
        for q in questions:
            known = sorted({self.vocab[t] for t in terms(q) if t in self.vocab})
            flat.extend(known)
            ptr.append(len(flat))
            best.append(math.fsum(float(self.idf[t]) for t in known) * (BM25_K1 + 1))
        device = self.row_ptr.device
        return (torch.tensor(ptr, dtype=torch.long, device=device), torch.tensor(flat, dtype=torch.long, device=device),
                torch.tensor(best, dtype=torch.float32, device=device))

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
        weights = torch.sparse_coo_tensor(torch.stack([row_of, self.row_terms]), self.row_weights,
                                          (n, self.vocab_size), check_invariants=True)
        return torch.sparse.mm(weights, wanted).T.contiguous()
