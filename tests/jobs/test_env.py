"""jobs.env: the environment defaults every qasc process sets before torch / faiss load."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qasc.jobs.env import ENV_DEFAULTS, OPENMP_SPIN_COUNT, set_env_defaults
from tests.conftest import REPO


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


def _make(target: str, tmp_path: Path, **env: str) -> dict:
    """What `make TARGET` runs, with the environment it runs it in: PY is a script that prints both as JSON
    instead of running pytest, the install step is taken as done (-o), and the shell's own values of the
    variables the Makefile exports are removed unless given here."""
    probe = tmp_path / "probe.py"
    probe.write_text("import json, os, sys\nprint(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))\n")
    clean = {k: v for k, v in os.environ.items()
             if k not in {*ENV_DEFAULTS, "OMP_WAIT_POLICY", "KERNELS_HYPOTHESIS_SCALE", "HF_HUB_OFFLINE",
                          "TEST_WORKERS", "MAKEFLAGS", "MAKELEVEL", "VENV", "PY"}}
    done = subprocess.run(["make", "-s", "-C", str(REPO), "-o", ".venv/.installed", target, "VENV=.venv",
                           f"PY={sys.executable} {probe}"],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_test_runs_every_test_with_the_same_defaults(tmp_path):
    run = _make("test", tmp_path)
    assert run["argv"] == ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           "--durations=15"]  # every marker: no -m
    for key, value in {**ENV_DEFAULTS, "HF_HUB_OFFLINE": "1"}.items():
        assert run["env"].get(key) == value, key
    # the test suite runs Ray workers beside pytest on 2 cores: its OpenMP threads sleep at once
    assert run["env"].get("OMP_WAIT_POLICY") == "PASSIVE"
    assert "KERNELS_HYPOTHESIS_SCALE" not in run["env"]  # full property-test budgets


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_test_fast_deselects_slow_and_scales_the_property_tests(tmp_path):
    run = _make("test-fast", tmp_path)
    assert run["argv"] == ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-m",
                           "not slow and not gpu"]
    assert run["env"].get("KERNELS_HYPOTHESIS_SCALE") == "0.25" and run["env"].get("OMP_WAIT_POLICY") == "PASSIVE"
    assert all(run["env"].get(key) == value for key, value in ENV_DEFAULTS.items())


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_keeps_values_the_user_set(tmp_path):
    run = _make("test-fast", tmp_path, OMP_WAIT_POLICY="ACTIVE", KERNELS_HYPOTHESIS_SCALE="1",
                TOKENIZERS_PARALLELISM="true", TEST_WORKERS="1")
    assert run["argv"][run["argv"].index("-n") + 1] == "1"
    assert (run["env"]["OMP_WAIT_POLICY"], run["env"]["KERNELS_HYPOTHESIS_SCALE"],
            run["env"]["TOKENIZERS_PARALLELISM"]) == ("ACTIVE", "1", "true")
