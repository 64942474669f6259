"""engine.threads.ThreadGovernor: one torch thread while the process waits for a core, all of them otherwise, the
caller's count restored; the Engine's query path runs under it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qasc.engine.threads as threads
from qasc.engine.threads import ThreadGovernor


class FakeMachine:
    """A wall clock and a run delay that the test advances: `slice(wall_s, waited_s)`."""

    def __init__(self) -> None:
        self.now, self.delay_ns, self.set_calls = 0.0, 0, []

    def slice(self, wall_s: float, waited_s: float) -> None:
        self.now += wall_s
        self.delay_ns += int(waited_s * 1e9)

    def governor(self, base: int = 4, others: int | None = 0) -> ThreadGovernor:
        return ThreadGovernor(read_delay=lambda: self.delay_ns, clock=lambda: self.now,
                              set_threads=self.set_calls.append, threads=base, read_others=lambda: others)


def test_busy_slices_drop_to_one_thread_and_calm_ones_give_the_threads_back(monkeypatch):
    monkeypatch.delenv("QASC_THREAD_GOVERNOR", raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 16)
    m = FakeMachine()
    g = m.governor(base=4)
    assert g.enabled and g.threads == 4
    m.slice(1.0, 0.01)
    assert g.step() == 4 and m.set_calls == []  # 1% waiting: the cores are ours
    m.slice(1.0, 0.30)
    assert g.step() == 1 and m.set_calls == [1]  # 30%: another process wants them
    m.slice(1.0, 0.05)
    assert g.step() == 1  # between the two shares: no change either way
    m.slice(2.0, 0.01)
    assert g.step() == 4 and m.set_calls == [1, 4]
    m.slice(1.0, 0.05)
    assert g.step() == 4 and [t for _, t in g.history] == [4, 1, 1, 4, 4]
    assert g.history[1][0] == pytest.approx(0.30)


def test_close_restores_the_callers_threads(monkeypatch):
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 16)
    m = FakeMachine()
    with m.governor(base=3) as g:
        m.slice(1.0, 0.5)
        g.step()
        assert g.threads == 1
    assert m.set_calls == [1, 3] and g.threads == 3


def test_a_machine_busy_at_the_start_begins_at_one_thread(monkeypatch):
    """4 cores: 2 runnable threads elsewhere leave room for a batch of 2 threads, 3 do not."""
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    m = FakeMachine()
    assert m.governor(base=2, others=2).threads == 2 and m.set_calls == []
    g = m.governor(base=2, others=3)
    assert g.threads == 1 and m.set_calls == [1]
    m.slice(1.0, 0.0)
    assert g.step() == 2  # the first slice found the cores free


@pytest.mark.parametrize("case", ["one thread", "no schedstat", "turned off"])
def test_nothing_changes_where_it_cannot_help_or_is_turned_off(case, monkeypatch):
    monkeypatch.setenv("QASC_THREAD_GOVERNOR", "0" if case == "turned off" else "1")
    m = FakeMachine()
    g = ThreadGovernor(read_delay=(lambda: None) if case == "no schedstat" else (lambda: m.delay_ns),
                       clock=lambda: m.now, set_threads=m.set_calls.append, threads=1 if case == "one thread" else 4,
                       read_others=lambda: 99)
    m.slice(1.0, 0.9)
    g.step()
    g.close()
    assert not g.enabled and m.set_calls == [] and g.history == []


def test_the_kernel_reports_run_delay_and_runnable_threads_on_linux():
    delay, others = threads.run_delay_ns(), threads.runnable_others(samples=2, gap_s=0.0)
    if delay is None:
        pytest.skip("no /proc/thread-self/schedstat here")
    assert delay >= 0 and others is not None and others >= 0


def _fake_proc(tmp_path, running: int, states: list[str]) -> tuple[str, str]:
    """A /proc/loadavg with `running` runnable threads and a /proc/self/task with one thread per state."""
    (tmp_path / "loadavg").write_text(f"0.50 0.40 0.30 {running}/300 4242\n")
    for i, state in enumerate(states):
        (tmp_path / "task" / str(100 + i)).mkdir(parents=True)
        (tmp_path / "task" / str(100 + i) / "stat").write_text(f"{100 + i} (py (x) t) {state} 1 2 3 4\n")
    return str(tmp_path / "loadavg"), str(tmp_path / "task")


@pytest.mark.parametrize("running, states, want", [
    (3, ["R", "R", "S"], 1),  # 3 runnable on the machine, 2 of them ours: 1 other
    (2, ["R", "R", "S", "S"], 0),  # ours alone (the caller and a spinning OpenMP worker): the cores are free
    (1, ["S"], 0),  # the caller itself reads as sleeping here: it still counts as one of the running
    (5, ["R"], 4),
    (0, ["R", "R"], 0),  # never negative
])
def test_runnable_others_leaves_out_this_processs_own_threads(tmp_path, monkeypatch, running, states, want):
    loadavg, tasks = _fake_proc(tmp_path, running, states)
    monkeypatch.setattr(threads, "LOADAVG", loadavg)
    monkeypatch.setattr(threads, "TASKS", tasks)
    assert threads.own_runnable(tasks) == states.count("R")
    assert threads.runnable_others(samples=2, gap_s=0.0) == want


def test_own_runnable_is_zero_where_proc_is_missing(tmp_path):
    assert threads.own_runnable(str(tmp_path / "missing")) == 0


def test_engine_batches_run_under_the_governor_and_restore_torch_threads(monkeypatch):
    """Every slice counted as busy: the slices after the first run at one thread, and the caller's count is back
    once the batch ends, also when the consumer stops early; small batches are left alone."""
    import qasc.engine.query as query
    from qasc.engine.config import EngineConfig
    from tests.engine.test_store_memory import memory_store

    if threads.run_delay_ns() is None:
        pytest.skip("no /proc/thread-self/schedstat here")
    monkeypatch.setattr(threads, "BUSY_SHARE", -1.0)  # any share counts as busy
    monkeypatch.delenv("QASC_THREAD_GOVERNOR", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        eng = query.Engine(memory_store("float32", n=600), None, EngineConfig(), torch.device("cpu"))
        q = torch.nn.functional.normalize(eng.embeddings[::7][:40] + 0.01, dim=1)
        seen = []
        for _ in eng.query_columns(q, slice_size=8):  # 40 queries: under GOVERNED_MIN_QUERIES, never governed
            seen.append(torch.get_num_threads())
        assert seen == [2] * 5
        monkeypatch.setattr(query, "GOVERNED_MIN_QUERIES", 1)
        seen, want = [], eng.query_embedded(q, slice_size=40)
        for i, _ in enumerate(eng.query_columns(q, slice_size=8)):
            seen.append(torch.get_num_threads())
            if i == 2:
                break  # the generator is closed early: its finally restores the threads
        assert seen[1:] == [1, 1] and torch.get_num_threads() == 2
        got = eng.query_embedded(q, slice_size=8)  # one thread or two: the same chunks
        assert [[(c.doc_id, c.char_start, c.char_end) for c in r] for r in got] == \
            [[(c.doc_id, c.char_start, c.char_end) for c in r] for r in want] and any(want)
        assert torch.get_num_threads() == 2
        np.testing.assert_allclose([c.score for r in got for c in r], [c.score for r in want for c in r], atol=1e-6)
    finally:
        torch.set_num_threads(before)
