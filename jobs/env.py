"""Environment defaults of every qasc process, set once (the Makefile exports the same values)."""

from __future__ import annotations

import os

ENV_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
}
# OpenMP threads of torch and faiss (libgomp) spin this many rounds (~0.1 ms) for the next parallel region before
# they sleep, unless the environment chooses (OMP_WAIT_POLICY or GOMP_SPINCOUNT; libgomp reads them when torch /
# faiss load, so this is set before they are imported). The query path runs thousands of short regions: sleeping
# at once (OMP_WAIT_POLICY=PASSIVE) made 10k queries at 1M rows 1.4-1.6x slower on an idle 2-core machine; spinning
# on a machine whose cores other processes want cost 2-25x, which engine.threads.ThreadGovernor avoids by running
# one thread while the process waits for a core (bench/RESULTS.md "OpenMP waits and the thread governor").
OPENMP_SPIN_COUNT = "10000"


def set_env_defaults() -> None:
    """Sets each of ENV_DEFAULTS that the environment does not set already, and GOMP_SPINCOUNT when neither it nor
    OMP_WAIT_POLICY is set (a spin count would override the policy)."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT)
