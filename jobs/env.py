"""Environment defaults of every qasc process, set once (the Makefile exports the same values)."""

from __future__ import annotations

import os

ENV_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
}


def set_env_defaults() -> None:
    """Sets each of ENV_DEFAULTS that the environment does not set already."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
