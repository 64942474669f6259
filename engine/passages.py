"""Passages: a store's second, coarser tier of embedded units, and the budget fill that uses them.

A passage is a run of consecutive sentence rows of one paragraph, packed greedily up to `passage_tokens` model
tokens (a longer sentence is a passage alone), embedded as one text at ingest (format 3 stores). QASC's own
chunks are focused (a sentence, a run, a section); when a query asks for a token budget, the budget fill adds the
best units after them (passages, scored by cosine with the heading context and the gated lexical term like the
sentences, and the best single sentences of the query's pre-retrieval ranking; engine.fill), cut where they
overlap what is already returned, until the budget is spent. A passage's vector is the model's view of the whole
run, which a mean of its sentences' vectors is not: on the development suite, at 400 tokens, QASC's answer then
these units recovers more of the evidence than more sentence-level chunks do (bench/RESULTS.md,
"The budget fill").
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

DEFAULT_PASSAGE_TOKENS = 128  # passage size of a new store (ingest --passage-tokens; 0: no passages)


class Passages(NamedTuple):
    """The passages of a set of sentence rows (a shard, a store): first (P,) int64 first row, count (P,) int32
    rows, n_tokens (P,) int32 the rows' summed tokens, emb (P, dim) float32 | float16 (may be (0, dim))."""

    first: np.ndarray
    count: np.ndarray
    n_tokens: np.ndarray
    emb: np.ndarray

    @classmethod
    def empty(cls, dim: int) -> Passages:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros((0, dim), np.float32))


def pack_passages(paragraph: np.ndarray, n_tokens: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """One document's sentences: paragraph (N,) ids, n_tokens (N,) -> first (P,) int64 and count (P,) int32 of its
    passages: consecutive rows of one paragraph, a passage closing before a row that would take it past
    max_tokens (a longer row stands alone). Every row lies in exactly one passage."""
    first: list[int] = []
    count: list[int] = []
    start, used = 0, 0
    for i in range(len(paragraph)):
        tokens = int(n_tokens[i])
        if i > start and (paragraph[i] != paragraph[i - 1] or used + tokens > max_tokens):
            first.append(start)
            count.append(i - start)
            start, used = i, 0
        used += tokens
    if len(paragraph):
        first.append(start)
        count.append(len(paragraph) - start)
    return np.asarray(first, np.int64), np.asarray(count, np.int32)


def fill_budget(taken: Sequence[tuple[int, int]], used: int, budget: int, ranked: Sequence[int],
                scores: Sequence[float], first: np.ndarray, count: np.ndarray, n_tokens: np.ndarray,
                groups: np.ndarray | None = None, diversity: float = 0.0) -> list[tuple[int, int, int, float]]:
    """One query: taken = its chunks' global rows (start, end inclusive), used = their tokens, budget, ranked
    passage ids (best first) with their scores; per passage its first row and row count (one document's rows);
    per row its tokens -> the pieces to add, in order: (start row, end row inclusive, tokens, score).

    Units are taken best first; with `groups` (N,) (a group id per row: its section) and `diversity` d > 0, a unit
    whose first row's group already holds a returned chunk or an earlier unit counts d less when the next unit is
    chosen (ties: rank order), so the budget reaches other sections before it repeats one. Each unit gives the runs
    of its rows that no earlier chunk or piece holds; a run that does not fit the budget left is cut to the rows
    that fit, as the budget cuts QASC's own chunks, and the fill goes on with the next units (a shorter one may
    still fit) until the budget is spent or the units run out."""
    covered: set[int] = set()
    seen: set[int] = set()
    for a, b in taken:
        covered.update(range(a, b + 1))
        if groups is not None:
            seen.add(int(groups[a]))
    firsts, counts = np.asarray(first).tolist(), np.asarray(count).tolist()  # Python ints: no numpy scalars
    units = [(p, float(s), firsts[p], firsts[p] + counts[p] - 1) for p, s in zip(ranked, scores, strict=True)]
    if not units:
        return []
    group = (np.asarray(groups)[[a for _, _, a, _ in units]].tolist() if groups is not None else None)
    # units in the order they are taken: rank order, or (diversity) a lazy greedy over a heap keyed by
    # (-(score - diversity if the unit's group is seen), rank): penalties only grow, so an entry whose key is
    # still current when it comes out is the best unit now
    diverse = group is not None and diversity > 0
    heap = [(-s + (diversity if diverse and group[k] in seen else 0.0), k) for k, (_, s, _, _) in enumerate(units)]
    heapq.heapify(heap)
    out: list[tuple[int, int, int, float]] = []
    while heap and used < budget:
        key, k = heapq.heappop(heap)
        if diverse and group[k] in seen and key == -units[k][1]:  # its section was answered since: re-key
            heapq.heappush(heap, (key + diversity, k))
            continue
        _, score, a, b = units[k]
        if group is not None:
            seen.add(group[k])
        row = a
        while row <= b and used < budget:
            if row in covered:
                row += 1
                continue
            start, tokens = row, 0
            while row <= b and row not in covered and used + tokens + int(n_tokens[row]) <= budget:
                tokens += int(n_tokens[row])
                row += 1
            if row == start:  # the next row does not fit: this unit gives no more
                break
            out.append((start, row - 1, tokens, score))
            covered.update(range(start, row))
            used += tokens
            if row <= b and row not in covered:  # cut by the budget
                break
    return out
