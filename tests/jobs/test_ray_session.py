"""Connecting to Ray (pure decisions, no Ray started): where to connect, what ray.init gets, how many GPUs a
query actor asks for."""

from __future__ import annotations

import pytest

from qasc.engine.errors import QascError
from qasc.jobs.ray_session import JOB_ENV, REPO, actor_placement, ray_init_kwargs, target_address

IN_JOB = {JOB_ENV: "{}", "RAY_ADDRESS": "127.0.0.1:6379"}


@pytest.mark.parametrize("flag,env,want", [
    (None, {}, None),                                     # nothing given: start a local instance
    ("10.0.0.1:6379", {}, "10.0.0.1:6379"),               # --ray-address
    ("auto", {"RAY_ADDRESS": "h:1"}, "auto"),             # the flag wins over RAY_ADDRESS
    (None, {"RAY_ADDRESS": "h:1"}, "h:1"),                # RAY_ADDRESS
    (None, IN_JOB, "127.0.0.1:6379"),                     # `ray job submit` sets RAY_ADDRESS for the driver
    (None, {JOB_ENV: "{}"}, "auto"),                      # a submitted driver without RAY_ADDRESS
])
def test_target_address(flag, env, want):
    assert target_address(flag, env) == want


@pytest.mark.parametrize("address", ["auto", "127.0.0.1:6379", "ray://h:10001"])
@pytest.mark.parametrize("env", [{}, IN_JOB], ids=["driver", "in-job"])
def test_connecting_never_passes_resources(address, env):
    kwargs = ray_init_kwargs(address, num_cpus=4, environ=env)
    assert kwargs["address"] == address
    refused = {"num_cpus", "num_gpus", "resources", "object_store_memory", "include_dashboard", "labels"}
    assert not refused & set(kwargs), kwargs


def test_starting_locally_passes_num_cpus_and_the_checkout():
    kwargs = ray_init_kwargs(None, num_cpus=3, environ={"PYTHONPATH": "/x"})
    assert "address" not in kwargs and kwargs["num_cpus"] == 3 and kwargs["include_dashboard"] is False
    assert kwargs["runtime_env"]["env_vars"]["PYTHONPATH"].split(":") == [REPO, "/x"]


def test_a_submitted_job_keeps_its_runtime_env():
    assert "runtime_env" not in ray_init_kwargs("auto", None, environ=IN_JOB)


@pytest.mark.parametrize("resources,device,want", [
    ({"CPU": 8.0}, "auto", (0, "cpu")),
    ({"CPU": 8.0, "GPU": 0.0}, "auto", (0, "cpu")),
    ({"CPU": 8.0, "GPU": 2.0}, "auto", (1, "cuda")),       # the cluster's GPUs, whatever the driver has
    ({"CPU": 8.0, "GPU": 2.0}, "cuda", (1, "cuda")),
    ({"CPU": 8.0, "GPU": 2.0}, "cuda:1", (1, "cuda")),     # Ray makes the actor's own GPU its cuda:0
    ({"CPU": 8.0, "GPU": 2.0}, "cpu", (0, "cpu")),         # --device cpu keeps actors off the GPUs
])
def test_actor_placement_from_cluster_resources(resources, device, want):
    assert actor_placement(resources, device) == want


def test_actor_placement_cuda_without_cluster_gpus_is_refused():
    with pytest.raises(QascError, match="has no GPU"):
        actor_placement({"CPU": 8.0}, "cuda")

