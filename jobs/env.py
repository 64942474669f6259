"""Environment defaults of every qasc process, set once (the Makefile exports the same values)."""

from __future__ import annotations

import os

ENV_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    # OpenMP threads that wait sleep instead of spinning: torch's and faiss's thread pools (2 threads on 2 cores)
    # otherwise spin against the other processes of a busy machine; measured at load ~11 on 2 cores, the query
    # kernels ran 5-25x slower with the default (bench/RESULTS.md "OpenMP wait policy"). Read when torch / faiss
    # load, so it must be set before they are imported.
    "OMP_WAIT_POLICY": "PASSIVE",
}


def set_env_defaults() -> None:
    """Sets each of ENV_DEFAULTS that the environment does not set already."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
