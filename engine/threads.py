"""Torch's CPU threads while a batch of queries runs: all of them while the process has its cores, one while it
waits for a core.

The query path is thousands of short torch operations, each a parallel region of torch's OpenMP pool. When a
region ends, the pool's threads either spin for the next one (OpenMP's default) or sleep (OMP_WAIT_POLICY=PASSIVE)
and are woken again. On cores of its own, sleeping costs the wake-ups between regions: at 1M rows on 2 cores,
10k queries end to end ran at ~1,050 q/s with PASSIVE and ~1,650 with a short spin (GOMP_SPINCOUNT=10000, the
qasc default, jobs/env.py) or libgomp's own default. On a machine where other processes want the same cores,
spinning takes their time slices: three such processes on 2 cores ran at ~245 q/s each with 2 spinning threads,
~590 with PASSIVE and ~600 with one thread (bench/RESULTS.md, "OpenMP waits and the thread governor").

`ThreadGovernor` reads how long the calling thread waited for a core (the run delay of /proc/thread-self/schedstat,
Linux) over each slice: above BUSY_SHARE of the slice's wall time it drops torch to one thread (no parallel
regions, so nothing spins); once a slice waits under CALM_SHARE it gives the threads back. The thread count the
caller had is restored when the batch ends. Where schedstat is missing, or torch runs one thread already, it
does nothing. QASC_THREAD_GOVERNOR=0 turns it off. Torch's thread count is process-wide: batches run at the same
time from several Python threads of one process share it (run them in processes of their own, or turn this off).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

BUSY_SHARE = 0.10  # the thread waited this share of a slice for a core: another process wants the cores
CALM_SHARE = 0.02  # ... under this share at one thread: the cores are free again
SCHEDSTAT = "/proc/thread-self/schedstat"  # "<ns on a cpu> <ns waiting on a run queue> <time slices>"
LOADAVG = "/proc/loadavg"  # "<1 min> <5 min> <15 min> <runnable>/<threads> <last pid>"
TASKS = "/proc/self/task"  # one folder per thread of this process, each with its "stat" (field 3: the state)
HISTORY_STEPS = 64  # steps kept in ThreadGovernor.history (a batch of any length holds no more)


def runnable_others(samples: int = 3, gap_s: float = 0.0005) -> int | None:
    """Runnable threads of other processes (the fewest of `samples` reads of /proc/loadavg's "running/total" less
    this process's own runnable threads, `gap_s` apart, so that a passing kernel thread does not count); None where
    /proc/loadavg is missing. The process's own threads never count: torch's OpenMP workers spin runnable for a
    while after each parallel region, so counting them made a batch started right after other torch work think
    the cores were taken (bench/RESULTS.md, "The thread governor's start check")."""
    counts = []
    for i in range(samples):
        try:
            with open(LOADAVG) as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(running - max(own_runnable(), 1))  # the calling thread runs, whatever /proc/self says
        if i + 1 < samples:
            time.sleep(gap_s)
    return max(0, min(counts))


def own_runnable(tasks: str | None = None) -> int:
    """This process's threads in state R (running or runnable) per <tasks>/*/stat (default TASKS, read when
    called); 0 where unreadable."""
    count, tasks = 0, TASKS if tasks is None else tasks
    try:
        names = os.listdir(tasks)
    except OSError:
        return 0
    for name in names:
        try:
            with open(f"{tasks}/{name}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 1 :].split()  # after "pid (comm)": the comm may hold spaces and parens
        count += fields[:1] == ["R"]
    return count


def run_delay_ns() -> int | None:
    """Nanoseconds the calling thread has waited on a run queue since it started; None where the kernel does not
    say (no /proc/thread-self/schedstat)."""
    try:
        with open(SCHEDSTAT) as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


class ThreadGovernor:
    """One batch of queries: `step()` after each slice picks torch's threads for the next; `close()` (or the end
    of a `with` block) restores the count the batch started with.

    At the start, when other processes already run more threads than the cores left beside this batch's
    (`runnable_others`: this process's own threads, such as torch's spinning OpenMP workers, do not count), the
    batch starts at one thread. read_delay, clock, set_threads, read_others: the run delay (ns), a wall clock
    (s), torch.set_num_threads and the runnable count, injectable for tests."""

    def __init__(self, read_delay: Callable[[], int | None] = run_delay_ns,
                 clock: Callable[[], float] = time.perf_counter,
                 set_threads: Callable[[int], None] = torch.set_num_threads, threads: int | None = None,
                 read_others: Callable[[], int | None] = runnable_others) -> None:
        self.read_delay, self.clock, self.set_threads = read_delay, clock, set_threads
        self.base = torch.get_num_threads() if threads is None else threads
        self.threads = self.base
        self.enabled = (self.base > 1 and os.environ.get("QASC_THREAD_GOVERNOR", "1") != "0"
                        and read_delay() is not None)
        self.history: list[tuple[float, int]] = []  # the last steps: (the slice's run-delay share, threads chosen)
        if self.enabled:  # the first slice's search is long: start at one thread if the cores are taken already
            others = read_others()
            if others is not None and others + self.base > (os.cpu_count() or 1):
                self.set_threads(1)
                self.threads = 1
        self._mark = self._now()

    def _now(self) -> tuple[float, int] | None:
        if not self.enabled:
            return None
        delay = self.read_delay()
        return None if delay is None else (self.clock(), delay)

    def step(self) -> int:
        """After a slice: its run-delay share decides the threads for the next one -> that thread count."""
        now = self._now()
        if now is None or self._mark is None:
            self._mark = now
            return self.threads
        wall, waited = now[0] - self._mark[0], (now[1] - self._mark[1]) / 1e9
        self._mark = now
        if wall <= 0:
            return self.threads
        share = waited / wall
        want = 1 if share > BUSY_SHARE else self.base if share < CALM_SHARE else self.threads
        if want != self.threads:
            self.set_threads(want)
            self.threads = want
        self.history.append((share, want))
        del self.history[:-HISTORY_STEPS]
        return self.threads

    def close(self) -> None:
        if self.threads != self.base:
            self.set_threads(self.base)
            self.threads = self.base

    def __enter__(self) -> ThreadGovernor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
