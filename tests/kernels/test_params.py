"""QascParams / RetrievalConfig: the groups and their flat names; non-finite numbers and sizes that cannot fit in
memory are refused."""

from __future__ import annotations

import copy
import math
import pickle
from dataclasses import FrozenInstanceError, fields

import pytest

from qasc.engine.config import MAX_DEPTH, MAX_NEIGHBOURHOOD, RetrievalConfig
from qasc.engine.embedder import resolve_device
from qasc.kernels.params import FIELD_NAMES, FLAT, GROUPS, MAX_EXTENT_LIMIT, REMOVED_FIELDS, QascParams, Seeding
from qasc.kernels.signals import ScoringModel

FLOAT_FIELDS = [n for n in FIELD_NAMES if isinstance(getattr(QascParams(), n), float)] + ["score_margin", "far_margin"]


@pytest.mark.parametrize("name", sorted(set(FLOAT_FIELDS)))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_field_must_be_finite(name, value):
    signal = FLAT[name][0] == "signals"  # the scoring model's own checks name the weight in words
    with pytest.raises(ValueError, match=None if signal else f"{name} must be a finite number"):
        QascParams(**{name: value})


def test_at_most_twenty_fields_in_small_frozen_groups():
    """Issue 43, item 4: at most 20 parameter fields (with RetrievalConfig's), a few small frozen groups; the flat
    names read and replace each group's field; a removed setting is refused by name."""
    groups = [*GROUPS.values(), ScoringModel]
    assert sum(len(fields(g)) for g in groups) + len(fields(RetrievalConfig)) <= 20
    assert len(FIELD_NAMES) == sum(len(fields(g)) for g in groups) and all(len(fields(g)) <= 5 for g in groups)
    p = QascParams(percentile=95.0, top_k=None, lexical_weight=0.0)
    assert p == QascParams(seeding=Seeding(percentile=95.0), selection=QascParams().selection.__class__(top_k=None),
                           signals=ScoringModel(lexical=0.0))
    assert p.percentile == p.seeding.percentile == 95.0 and p.scoring.lexical == 0.0
    assert p.replace(percentile=90.0) == QascParams(top_k=None, lexical_weight=0.0)
    assert QascParams(**p.to_dict()) == p and list(p.to_dict()) == list(FIELD_NAMES)
    assert pickle.loads(pickle.dumps(p)) == p == copy.deepcopy(p)  # Ray ships settings pickled
    with pytest.raises(FrozenInstanceError):
        p.seeding.percentile = 50.0  # type: ignore[misc]
    for name in REMOVED_FIELDS:
        with pytest.raises(ValueError, match="unknown QASC parameter"):
            p.replace(**{name: 0})
        with pytest.raises(TypeError, match="unknown QASC parameter"):
            QascParams(**{name: 0})


def test_size_bounds():
    assert QascParams(max_extent=MAX_EXTENT_LIMIT).max_extent == MAX_EXTENT_LIMIT
    with pytest.raises(ValueError, match=r"max_extent must be in \[1, 64\], got 65"):
        QascParams(max_extent=MAX_EXTENT_LIMIT + 1)
    RetrievalConfig(depth=MAX_DEPTH, neighbourhood=MAX_NEIGHBOURHOOD)
    with pytest.raises(ValueError, match="depth must be in"):
        RetrievalConfig(depth=MAX_DEPTH + 1)
    with pytest.raises(ValueError, match="neighbourhood must be in"):
        RetrievalConfig(neighbourhood=MAX_NEIGHBOURHOOD + 1)


@pytest.mark.parametrize("name", ["tpu", "cuda:abc", "", "cpu:x"])
def test_unknown_devices_are_value_errors(name):
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device(name)
