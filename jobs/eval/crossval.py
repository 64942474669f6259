"""Leave-one-corpus-out cross-validation: choose a setting on the other corpora, report the held-out one.

For each corpus c, the candidate with the best mean criterion (F1) over the questions of every other
corpus is chosen (ties: the first candidate in declared order) and scored on the questions of c. The
held-out per-question values of all folds are pooled, so the reported mean is over every question.

With `prefer` (key -> value), candidates within `tie` (default CHOICE_TIE) of the best mean count as tied and the one
with the highest preference wins among them (then the best mean, then declared order): QASC prefers the wider
candidate region (README "Development suite": two settings 0.0001 apart, the wider one better on multi-region
questions).
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


CHOICE_TIE = 0.001  # criterion units (fractions): 0.1 F1 points, far inside every interval we report


def choose(means: np.ndarray, prefer: np.ndarray | None = None, tie: float = 0.0) -> int:
    """means (C,), prefer (C,) or None -> the chosen index: the first maximum, or with `prefer` and tie > 0 the
    most preferred candidate within `tie` of the maximum (then the higher mean, then the first)."""
    if prefer is None or tie <= 0:
        return int(np.argmax(means))
    tied = np.flatnonzero(means >= means.max() - tie)
    return int(tied[np.lexsort((np.arange(len(tied)), -means[tied], -prefer[tied]))[0]])


def leave_one_corpus_out(
    candidates: Mapping[str, PerQuestion], corpus_of: Sequence[str], criterion: str = "f1",
    prefer: Mapping[str, float] | None = None, tie: float = CHOICE_TIE,
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
    pref = np.asarray([prefer[k] for k in keys], dtype=np.float64) if prefer is not None else None
    metrics = list(next(iter(candidates.values())).keys())
    heldout = {m: np.zeros(len(corpus), dtype=np.float64) for m in metrics}
    chosen = np.empty(len(corpus), dtype=object)
    folds = []
    corpora = sorted(set(corpus.tolist()))
    for c in corpora:
        test = corpus == c
        train = ~test if len(corpora) > 1 else test
        train_means = crit[:, train].mean(axis=1)
        best = choose(train_means, pref, tie)  # first maximum unless a preference breaks near-ties
        key = keys[best]
        for m in metrics:
            heldout[m][test] = np.asarray(candidates[key][m], dtype=np.float64)[test]
        chosen[test] = key
        folds.append(Fold(c, key, float(train_means[best]), float(crit[best, test].mean()), int(test.sum())))
    return CVResult(tuple(folds), heldout, chosen)


def best_in_sample(candidates: Mapping[str, PerQuestion], criterion: str = "f1",
                   prefer: Mapping[str, float] | None = None, tie: float = CHOICE_TIE) -> str:
    """The candidate with the best mean criterion over all questions (not held out: the shipped default and
    calibration), near-ties broken by `prefer` as in `leave_one_corpus_out`."""
    keys = list(candidates)
    means = np.asarray([float(np.mean(candidates[k][criterion])) for k in keys])
    pref = np.asarray([prefer[k] for k in keys], dtype=np.float64) if prefer is not None else None
    return keys[choose(means, pref, tie)]
