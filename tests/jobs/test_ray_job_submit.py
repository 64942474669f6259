"""`qasc query --ray` submitted with `ray job submit` to a one-node cluster started with `ray start --head`:
the driver joins the job's cluster (no num_cpus passed to ray.init) and its output equals the local path's.

The cluster is this test's own: its own ports and temp dir, started with `--block` in a new process group
that the test ends by its id (never `ray stop`, which stops every Ray on the machine)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from qasc.jobs.cli import main
from tests.conftest import REPO

pytestmark = pytest.mark.slow

QUESTIONS = ["How long should sourdough dough proof?", "Who invented the lens used in lighthouses?",
             "How big a solar array do I need?", "Why does the crust darken?"]
RAY = Path(sys.executable).with_name("ray")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="module")
def cluster():
    """-> the dashboard URL of a fresh `ray start --head --num-cpus 2` cluster; ended after the module."""
    if not RAY.exists():
        pytest.skip(f"no `ray` command beside {sys.executable}")
    probe = subprocess.run([str(RAY), "job", "submit", "--help"], capture_output=True, text=True, env=_env())
    if probe.returncode != 0:
        pytest.skip("`ray job` CLI unavailable (install the `cluster` extra, ray[default]): "
                    + (probe.stderr.strip().splitlines() or ["?"])[-1])
    gcs, dash, client, agent = _free_ports(4)
    temp = tempfile.mkdtemp(prefix="qr", dir="/tmp")  # short: Ray's unix socket paths must stay < 108 chars
    cmd = [str(RAY), "start", "--head", "--block", "--num-cpus", "2", "--port", str(gcs),
           "--dashboard-host", "127.0.0.1", "--include-dashboard=true", "--dashboard-port", str(dash),
           "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
           "--object-store-memory", str(300 * 2**20), "--temp-dir", temp, "--disable-usage-stats"]
    log = open(Path(temp) / "ray-start.log", "w")  # noqa: SIM115 (closed in teardown)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.skip(f"`ray start --head` exited with {proc.returncode}: "
                            f"{(Path(temp) / 'ray-start.log').read_text()[-800:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/version", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.skip("the Ray dashboard (job server) did not come up within 180 s")
            time.sleep(2)
        yield url
    finally:
        # the group of the process we started: its Ray processes take ~60 s to end on SIGTERM (measured: they all
        # went at once after 61 s), so after a short grace the group is killed, as it always was after the 30 s
        # this waited before
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            time.sleep(2)  # let the raylet's children go with it
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.own_ray
def test_ray_job_submit_query_equals_local(cluster, demo_store, tmp_path):
    queries = tmp_path / "q.csv"
    queries.write_text("id,question\n" + "".join(f"q{i},{q}\n" for i, q in enumerate(QUESTIONS)))
    local, remote = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    args = ["query", "--store", str(demo_store), "--queries", str(queries), "--device", "cpu"]
    assert main([*args, "--out", str(local)]) == 0  # the local path in process; the job below is a process

    runtime_env = {"env_vars": {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                "RAY_USAGE_STATS_ENABLED": "0"}}
    submit = [str(RAY), "job", "submit", "--address", cluster, "--runtime-env-json", json.dumps(runtime_env), "--",
              sys.executable, "-m", "qasc.jobs.cli", *args, "--ray", "--workers", "1", "--out", str(remote)]
    job = subprocess.run(submit, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    logs = (job.stdout + job.stderr)[-4000:]
    assert job.returncode == 0 and "succeeded" in logs, logs
    assert "num_cpus and num_gpus must not be provided" not in logs
    assert remote.exists(), logs

    a, b = _rows(local), _rows(remote)
    assert a and len(a) == len(b)
    assert [{k: v for k, v in r.items() if k != "score"} for r in b] == [
        {k: v for k, v in r.items() if k != "score"} for r in a]
    np.testing.assert_allclose([r["score"] for r in b], [r["score"] for r in a], rtol=1e-5, atol=1e-6)
