"""Chroma's character-level metric on merged intervals, checked against per-character sets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qasc.jobs.eval.metrics import (
    bootstrap_ci,
    intersection_length,
    merge_intervals,
    score_spans,
    total_length,
)

spans_st = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 30)).map(lambda t: (t[0], t[0] + t[1])),
                    max_size=8)


def chars(spans):
    return {i for s, e in spans for i in range(s, e)}


@given(spans_st)
@settings(max_examples=200, deadline=None)
def test_merge_is_the_union(spans):
    merged = merge_intervals(spans)
    assert chars(merged) == chars(spans)
    assert total_length(merged) == len(chars(spans))
    for (_s0, e0), (s1, _e1) in zip(merged, merged[1:], strict=False):
        assert e0 < s1, "merged intervals must be disjoint and not touching"


@given(spans_st, spans_st)
@settings(max_examples=200, deadline=None)
def test_intersection_matches_sets(a, b):
    assert intersection_length(merge_intervals(a), merge_intervals(b)) == len(chars(a) & chars(b))


@given(spans_st, spans_st, spans_st)
@settings(max_examples=200, deadline=None)
def test_score_matches_set_definition(ret_a, ret_b, evidence):
    """Spans in corpus 'a' can be evidence; spans in 'b' only count as retrieved."""
    retrieved = [("a", s, e) for s, e in ret_a] + [("b", s, e) for s, e in ret_b]
    s = score_spans(retrieved, "a", evidence)
    ra, rb, ev = chars(ret_a), chars(ret_b), chars(evidence)
    inter = len(ra & ev)
    n_ret = len(ra) + len(rb)
    p = inter / n_ret if n_ret else 0.0
    r = inter / len(ev) if ev else 0.0
    iou = inter / (n_ret + len(ev - ra)) if (n_ret + len(ev - ra)) else 0.0
    assert s.precision == pytest.approx(p)
    assert s.recall == pytest.approx(r)
    assert s.iou == pytest.approx(iou)
    assert s.f1 == pytest.approx(2 * p * r / (p + r) if p + r else 0.0)


def test_hand_examples():
    perfect = score_spans([("c", 10, 20)], "c", [(10, 20)])
    assert (perfect.precision, perfect.recall, perfect.iou, perfect.f1) == (1.0, 1.0, 1.0, 1.0)
    # the same span returned twice is retrieved once
    twice = score_spans([("c", 10, 20), ("c", 10, 20)], "c", [(10, 20)])
    assert twice.precision == 1.0
    # half the evidence, twice the text: P = 5/10... retrieved [15, 25) vs evidence [10, 20)
    half = score_spans([("c", 15, 25)], "c", [(10, 20)])
    assert (half.precision, half.recall, half.iou) == (0.5, 0.5, pytest.approx(5 / 15))
    # the right offsets in the wrong corpus are not evidence
    wrong = score_spans([("other", 10, 20)], "c", [(10, 20)])
    assert (wrong.precision, wrong.recall, wrong.f1) == (0.0, 0.0, 0.0)
    empty = score_spans([], "c", [(0, 5)])
    assert (empty.precision, empty.recall, empty.iou, empty.f1, empty.retrieved_chars) == (0, 0, 0, 0, 0)


def test_bootstrap_interval():
    assert bootstrap_ci(np.full(50, 0.3)) == pytest.approx((0.3, 0.3))
    rng = np.random.default_rng(1)
    v = rng.random(400)
    lo, hi = bootstrap_ci(v, n_boot=500, seed=3)
    assert lo < v.mean() < hi
    assert hi - lo < 0.1
    assert bootstrap_ci(v, n_boot=500, seed=3) == (lo, hi), "seeded: reproducible"
