"""jobs.env: the environment defaults every qasc process sets before torch / faiss load."""

from __future__ import annotations

import os
from pathlib import Path

from jobs.env import ENV_DEFAULTS, set_env_defaults


def test_env_defaults_set_missing_keep_given(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    set_env_defaults()

    assert os.environ["OMP_WAIT_POLICY"] == ENV_DEFAULTS["OMP_WAIT_POLICY"] == "PASSIVE"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"  # a value the user set is kept


def test_makefile_exports_the_same_defaults():

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    for key, value in ENV_DEFAULTS.items():
        assert f"export {key} ?= {value}" in makefile, key
