"""jobs.env: the environment defaults every qasc process sets before torch / faiss load."""

from __future__ import annotations

import os
from pathlib import Path

from qasc.jobs.env import ENV_DEFAULTS, OPENMP_SPIN_COUNT, set_env_defaults


def test_env_defaults_set_missing_keep_given(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    set_env_defaults()

    assert os.environ["GOMP_SPINCOUNT"] == OPENMP_SPIN_COUNT  # a short spin: no wake-up per parallel region
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"  # a value the user set is kept


def test_a_wait_policy_the_user_set_is_not_overridden_by_a_spin_count(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    set_env_defaults()

    assert "GOMP_SPINCOUNT" not in os.environ  # libgomp would take it over the policy


def test_makefile_exports_the_same_defaults():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    for key, value in ENV_DEFAULTS.items():
        assert f"export {key} ?= {value}" in makefile, key
    # the test suite runs Ray workers beside pytest on 2 cores: its OpenMP threads sleep at once
    assert "test: export OMP_WAIT_POLICY ?= PASSIVE" in makefile
