"""Leave-one-corpus-out cross-validation: choose a setting on the other corpora, report the held-out one.

For each corpus c, the candidate with the best mean criterion (F1) over the questions of every other
corpus is chosen (ties: the first candidate in declared order) and scored on the questions of c. The
held-out per-question values of all folds are pooled, so the reported mean is over every question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

PerQuestion = Mapping[str, np.ndarray]  # metric -> (Q,) values


@dataclass(frozen=True)
class Fold:
    corpus: str
    chosen: str  # candidate key
    train_score: float  # mean criterion on the other corpora
    heldout_score: float  # mean criterion on this corpus
    n_questions: int


@dataclass(frozen=True)
class CVResult:
    folds: tuple[Fold, ...]
    heldout: dict[str, np.ndarray]  # metric -> (Q,) held-out values, every question once
    chosen: np.ndarray  # (Q,) object: the candidate key that scored each question

    def chosen_for(self, corpus: str) -> str:
        return next(f.chosen for f in self.folds if f.corpus == corpus)


def leave_one_corpus_out(
    candidates: Mapping[str, PerQuestion], corpus_of: Sequence[str], criterion: str = "f1"
) -> CVResult:
    """candidates: key -> {metric: (Q,) values}; corpus_of (Q,) corpus ids -> CVResult.

    With a single corpus there is nothing to hold out against: the candidate is chosen and scored on
    the same questions (the fold says so with train_score == heldout_score).
    """
    if not candidates:
        raise ValueError("no candidates to choose from")
    keys = list(candidates)
    corpus = np.asarray(corpus_of, dtype=object)
    crit = np.stack([np.asarray(candidates[k][criterion], dtype=np.float64) for k in keys])  # (C, Q)
    metrics = list(next(iter(candidates.values())).keys())
    heldout = {m: np.zeros(len(corpus), dtype=np.float64) for m in metrics}
    chosen = np.empty(len(corpus), dtype=object)
    folds = []
    corpora = sorted(set(corpus.tolist()))
    for c in corpora:
        test = corpus == c
        train = ~test if len(corpora) > 1 else test
        train_means = crit[:, train].mean(axis=1)
        best = int(np.argmax(train_means))  # first maximum: declared order breaks ties
        key = keys[best]
        for m in metrics:
            heldout[m][test] = np.asarray(candidates[key][m], dtype=np.float64)[test]
        chosen[test] = key
        folds.append(Fold(c, key, float(train_means[best]), float(crit[best, test].mean()), int(test.sum())))
    return CVResult(tuple(folds), heldout, chosen)


def best_in_sample(candidates: Mapping[str, PerQuestion], criterion: str = "f1") -> str:
    """The candidate with the best mean criterion over all questions (not held out: for calibration only)."""
    keys = list(candidates)
    means = [float(np.mean(candidates[k][criterion])) for k in keys]
    return keys[int(np.argmax(means))]
