"""Process memory for the benchmarks: /proc/self/status fields, an RSS high-water mark over a block (or a call,
bench.kernels), and a child process run with its wall time and peak RSS (bench.scale, bench.ingest_memory). Sizes
in GiB are 2^30 bytes."""

from __future__ import annotations

import gc
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import REPO

GiB = float(1 << 30)


def proc_status(key: str) -> int:
    """Bytes of a /proc/self/status field (VmRSS, VmHWM); 0 where unavailable."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_growth(fn: Callable[[], object]) -> int:
    """Bytes: how far the RSS high-water mark (VmHWM, reset via /proc/self/clear_refs) rises above the RSS before
    fn() (Linux). Buffers above glibc's mmap threshold (<= 32 MiB) are fresh mappings, so large tensors count."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        fn()
        return -1
    before = proc_status("VmRSS")
    fn()
    return max(0, proc_status("VmHWM") - before)


class PeakRss:
    """RSS high-water mark over a `with` block: VmHWM after resetting it (/proc/self/clear_refs), and a sampling
    thread as the fallback where the reset is refused. `.before`, `.peak`, `.after` in bytes."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s, self.peak, self._stop = every_s, 0, threading.Event()

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, proc_status("VmRSS"))

    def __enter__(self) -> PeakRss:
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.before = self.peak = proc_status("VmRSS")
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.after = proc_status("VmRSS")
        self.peak = max(self.peak, self.after, proc_status("VmHWM") if self.hwm_reset else 0)


def run_child(cmd: list[str], log: Path, env: dict | None = None) -> tuple[float, int]:
    """Runs cmd (cwd: the repository, output to log) -> (wall seconds, the child's peak RSS in bytes, from wait4).
    SystemExit with the log's tail when it fails."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        raise SystemExit(f"{Path(cmd[0]).name} {' '.join(cmd[1:4])} ... failed (rc {proc.returncode}); {log}:\n{tail}")
    return wall, usage.ru_maxrss * 1024  # ru_maxrss is in KiB on Linux
