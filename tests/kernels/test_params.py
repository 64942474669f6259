"""QascParams / RetrievalConfig validation: non-finite numbers and sizes that cannot fit in memory are refused."""

from __future__ import annotations

import math

import pytest

from qasc.engine.config import MAX_DEPTH, MAX_NEIGHBOURHOOD, RetrievalConfig
from qasc.engine.embedder import resolve_device
from qasc.kernels.params import FLOAT_FIELDS, MAX_EXTENT_LIMIT, QascParams


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_field_must_be_finite(name, value):
    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        QascParams(**{name: value})


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
