"""Leave-one-corpus-out selection: chosen on the other corpora, scored on the held-out one."""

from __future__ import annotations

import numpy as np

from qasc.jobs.eval.crossval import best_in_sample, choose, leave_one_corpus_out


def test_choice_uses_only_the_other_corpora():
    corpus = ["a", "a", "b", "b", "c", "c"]
    # k=1 is best on a and b, k=2 best on c; held out on c the choice must come from a and b
    cands = {
        "k=1": {"f1": np.array([0.9, 0.9, 0.8, 0.8, 0.0, 0.0]), "recall": np.zeros(6)},
        "k=2": {"f1": np.array([0.1, 0.1, 0.1, 0.1, 0.5, 0.5]), "recall": np.ones(6)},
    }
    res = leave_one_corpus_out(cands, corpus)
    assert [f.chosen for f in res.folds] == ["k=1", "k=1", "k=1"]
    assert res.chosen_for("c") == "k=1"
    np.testing.assert_allclose(res.heldout["f1"], [0.9, 0.9, 0.8, 0.8, 0.0, 0.0])
    np.testing.assert_allclose(res.heldout["recall"], 0.0)
    assert best_in_sample(cands) == "k=1"
    fold_c = [f for f in res.folds if f.corpus == "c"][0]
    assert fold_c.train_score == np.float64(0.85) or abs(fold_c.train_score - 0.85) < 1e-12
    assert fold_c.heldout_score == 0.0
    assert fold_c.n_questions == 2


def test_folds_can_differ_and_ties_go_to_the_first():
    corpus = np.array(["a", "b", "c"])
    cands = {
        "x": {"f1": np.array([1.0, 0.0, 0.0])},
        "y": {"f1": np.array([0.0, 1.0, 0.0])},
        "z": {"f1": np.array([0.0, 0.0, 0.0])},
    }
    res = leave_one_corpus_out(cands, corpus)
    # held out a: train b, c -> y; held out b: train a, c -> x; held out c: x and y tie -> x (declared first)
    assert [f.chosen for f in res.folds] == ["y", "x", "x"]
    np.testing.assert_allclose(res.heldout["f1"], [0.0, 0.0, 0.0])


def test_single_corpus_scores_in_sample():
    res = leave_one_corpus_out({"k=1": {"f1": np.array([0.2, 0.4])}}, ["a", "a"])
    assert res.folds[0].chosen == "k=1"
    np.testing.assert_allclose(res.heldout["f1"], [0.2, 0.4])


def test_a_preference_breaks_near_ties_only():
    """Within `tie` of the best mean the preferred candidate wins (then the higher mean); outside it, the mean."""
    corpus = ["a", "a", "b", "b"]
    cands = {"narrow": {"f1": np.array([0.5000, 0.5000, 0.9, 0.9])},
             "wide": {"f1": np.array([0.4995, 0.4995, 0.1, 0.1])},
             "wider": {"f1": np.array([0.40, 0.40, 0.2, 0.2])}}
    prefer = {"narrow": 1.0, "wide": 2.0, "wider": 3.0}
    res = leave_one_corpus_out(cands, corpus, prefer=prefer, tie=0.001)
    assert res.chosen_for("b") == "wide"  # 0.0005 below the best on corpus a: tied, and preferred
    assert res.chosen_for("a") == "narrow"  # 0.9 vs 0.1 / 0.2 on corpus b: no tie
    assert leave_one_corpus_out(cands, corpus).chosen_for("b") == "narrow"  # no preference: the first maximum
    assert choose(np.array([0.3, 0.3, 0.3]), np.array([1.0, 2.0, 2.0]), 0.001) == 1  # equal preference: first
    assert best_in_sample(cands, "f1", prefer, 0.001) == "narrow"  # pooled 0.7 vs 0.2995: no tie
