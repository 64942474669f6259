"""Connecting a qasc job to Ray, shared by the ingest and query jobs.

Where Ray runs: an explicit `--ray-address` first, then `RAY_ADDRESS`, then the cluster of the Ray job this
process is the driver of (`ray job submit` sets RAY_JOB_CONFIG_JSON_ENV_VAR); only when none applies is a
local instance started. Ray refuses num_cpus / num_gpus when connecting to an existing cluster, so those
are passed only to a local start (`ray_init_kwargs`). Actors take GPUs from the cluster's resources, never
from what the driver's torch sees (`actor_placement`): a CPU head node can drive a GPU cluster.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping

from qasc.engine.errors import QascError
from qasc.jobs.env import set_env_defaults

JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor in the environment of a submitted driver
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def target_address(ray_address: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """--ray-address, else RAY_ADDRESS, else 'auto' inside a submitted Ray job; None = start a local instance."""
    env = os.environ if environ is None else environ
    if ray_address:
        return ray_address
    if env.get("RAY_ADDRESS"):
        return env["RAY_ADDRESS"]
    return "auto" if env.get(JOB_ENV) else None


def ray_init_kwargs(address: str | None, num_cpus: int | None, environ: Mapping[str, str] | None = None) -> dict:
    """The keyword arguments of ray.init: connecting to `address` (never num_cpus / num_gpus / dashboard
    settings, which Ray refuses for an existing cluster), or starting a local instance of num_cpus CPUs
    (address None). Outside a submitted job, workers get this checkout on PYTHONPATH (a job's own
    runtime env, e.g. `ray job submit --working-dir`, is left alone)."""
    env = os.environ if environ is None else environ
    kwargs: dict = {"logging_level": logging.WARNING, "log_to_driver": False}
    if not env.get(JOB_ENV):
        path = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
    if address is not None:
        return {"address": address, **kwargs}
    return {"num_cpus": num_cpus or os.cpu_count() or 1, "include_dashboard": False, **kwargs}


def actor_placement(resources: Mapping[str, float], device: str) -> tuple[int, str]:
    """ray.cluster_resources(), --device -> (GPUs per actor, the device the actor opens the engine on).

    One GPU per actor when the cluster has GPUs and the device is not cpu (Ray then makes the actor's GPU its
    cuda:0); CPU actors otherwise. QascError when --device asks for CUDA and the cluster has no GPU."""
    kind = (device or "auto").split(":")[0]
    gpus = float(resources.get("GPU", 0) or 0)
    if kind == "cpu":
        return 0, "cpu"
    if gpus >= 1:
        return 1, "cuda"
    if kind == "cuda":
        raise QascError(f"--device {device} but the Ray cluster has no GPU")
    return 0, "cpu"


def probe(address: str) -> None:
    """HOST:PORT or ray://HOST:PORT that nothing answers -> QascError now (ray.init would wait minutes)."""
    m = re.fullmatch(r"(?:ray://)?\[?([\w.:-]+?)\]?:(\d+)", address)
    if not m:
        return  # "auto", "local" and the like: ray.init decides
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=5).close()
    except OSError as exc:
        raise QascError(f"cannot connect to Ray at {address}: {exc.strerror or exc}") from None


def connect(ray_address: str | None, num_cpus: int | None = None) -> bool:
    """Connects to Ray (see `target_address`), else starts a local instance of num_cpus CPUs (default: all);
    -> True if this call did it (the caller then shuts it down)."""
    set_env_defaults()
    import ray

    if ray_address:
        probe(ray_address)  # an explicit address nothing answers is an error, even inside a running session
    if ray.is_initialized():
        return False  # the caller's session (tests, notebooks) is used as it is
    address = target_address(ray_address)
    try:
        if address:
            probe(address)
        ray.init(**ray_init_kwargs(address, num_cpus))
    except QascError:
        raise
    except Exception as exc:  # ConnectionError, RuntimeError, ValueError depending on the address
        text = str(exc).strip().splitlines()
        raise QascError(f"cannot {'connect to Ray at ' + address if address else 'start a local Ray instance'}: "
                        f"{text[0] if text else type(exc).__name__}") from None
    return True


def die_once(marker: str | None) -> None:
    """Test hook (QASC_RAY_FAULT_MARKER): the first call in any process with a marker path that does not exist yet
    writes its pid there and SIGKILLs its own process (an actor killed mid-job); later calls do nothing."""
    import os
    import signal

    if marker and not os.path.exists(marker):
        with open(marker, "w") as fh:
            fh.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
