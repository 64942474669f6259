"""Chroma's character-level retrieval metric, on sorted merged intervals (never per-character sets).

Per question: retrieved = the union of the returned spans (spans in another corpus count as retrieved and
never as evidence), evidence = the union of the reference spans;
precision = |retrieved ∩ evidence| / |retrieved|, recall = |retrieved ∩ evidence| / |evidence|,
IoU = |∩| / (|retrieved| + |evidence not retrieved|), F1 = 2PR / (P + R) (0 when P + R = 0).
Means over questions come with percentile-bootstrap 95% intervals (resampling questions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

Span = tuple[int, int]
DocSpan = tuple[str, int, int]  # (corpus or document id, start, end), end exclusive

METRICS = ("precision", "recall", "iou", "f1")


def merge_intervals(spans: Iterable[Span]) -> list[Span]:
    """spans [(s, e)) in any order -> sorted, disjoint, non-touching union."""
    out: list[list[int]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total_length(merged: Sequence[Span]) -> int:
    return sum(e - s for s, e in merged)


def intersection_length(a: Sequence[Span], b: Sequence[Span]) -> int:
    """Two merged interval lists -> length of their intersection (two pointers, O(len a + len b))."""
    i = j = 0
    total = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class Score:
    precision: float
    recall: float
    iou: float
    f1: float
    retrieved_chars: int
    evidence_chars: int
    overlap_chars: int


def score_spans(retrieved: Iterable[DocSpan], corpus_id: str, evidence: Iterable[Span]) -> Score:
    """One question: returned spans (doc, s, e) and its evidence spans in `corpus_id` -> Score."""
    by_doc: dict[str, list[Span]] = {}
    for doc, s, e in retrieved:
        by_doc.setdefault(doc, []).append((s, e))
    merged = {doc: merge_intervals(spans) for doc, spans in by_doc.items()}
    n_ret = sum(total_length(m) for m in merged.values())
    ev = merge_intervals(evidence)
    n_ev = total_length(ev)
    inter = intersection_length(merged.get(corpus_id, []), ev)
    p = inter / n_ret if n_ret else 0.0
    r = inter / n_ev if n_ev else 0.0
    union = n_ret + n_ev - inter
    iou = inter / union if union else 0.0
    f1 = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return Score(p, r, iou, f1, n_ret, n_ev, inter)


def bootstrap_ci(values: np.ndarray, n_boot: int = 1000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float]:
    """values (Q,) -> (lo, hi) percentile-bootstrap interval of the mean, resampling the Q entries."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for lo in range(0, n_boot, 200):  # chunks of resamples keep the index matrix small
        hi = min(n_boot, lo + 200)
        means[lo:hi] = v[rng.integers(0, v.size, size=(hi - lo, v.size))].mean(axis=1)
    return float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))


def summarize(per_question: dict[str, np.ndarray], n_boot: int = 1000, seed: int = 0) -> dict:
    """{metric: (Q,) values} -> {metric: {mean, lo, hi}} (means and bootstrap intervals, in [0, 1] units)."""
    out = {}
    for name, values in per_question.items():
        v = np.asarray(values, dtype=np.float64)
        lo, hi = bootstrap_ci(v, n_boot, seed)
        out[name] = {"mean": float(v.mean()) if v.size else float("nan"), "lo": lo, "hi": hi}
    return out
