"""Progress of an ingest: a tqdm bar (sentences, rate, ETA) on a terminal, else a log line per shard; PhaseClock,
the seconds an ingest spends per phase."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

LOG_EVERY_S = 5.0


def log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class IngestProgress:
    """The progress callback of `ingest`: start(), split(), advance(), shard_done(), finish(), close().

    start() gets the input size in bytes and an estimate of the shard count (shards are cut by the workers).

    bar: True / False forces the bar / the log lines; None (default) shows the bar on a TTY only.
    """

    def __init__(self, bar: bool | None = None, log: Callable[[str], None] | None = None) -> None:
        self.want_bar = bar
        self.log = log or log_stderr
        self.bar = None
        self.use_bar = False
        self.logged: tuple[int, int] | None = None

    def start(self, total_chars: int, shards: int, done_chars: int, done_shards: int) -> None:
        self.total_chars, self.shards = max(total_chars, 1), shards
        self.done_chars, self.done_shards = done_chars, done_shards
        self.split_chars = self.split_sents = 0
        self.sentences = self.chars_here = 0
        self.t0 = self.last = time.perf_counter()
        self.use_bar = self.want_bar if self.want_bar is not None else sys.stderr.isatty()

    def _bar(self):
        """The bar, drawn once the first shard is split (a bad input found while reading it prints only its
        error line)."""
        if self.bar is None and self.use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=self._estimate(), unit="sent", desc="qasc ingest", file=sys.stderr,
                            dynamic_ncols=True, smoothing=0.05)
        return self.bar

    def _estimate(self) -> int:
        per_char = self.split_sents / self.split_chars if self.split_chars else 1 / 120
        return int(round((self.total_chars - self.done_chars) * per_char))

    def split(self, chars: int, sentences: int) -> None:
        self.split_chars += chars
        self.split_sents += sentences
        if self._bar() is not None:
            self.bar.total = max(self._estimate(), self.bar.n)
            self.bar.refresh()

    def advance(self, n: int) -> None:
        if self._bar() is not None:
            self.bar.update(n)

    def shard_done(self, chars: int, sentences: int, embedded_here: bool) -> None:
        self.done_shards += 1
        self.sentences += sentences
        self.chars_here += chars
        if self._bar() is not None:
            if not embedded_here:
                self.bar.update(sentences)
            return
        now = time.perf_counter()
        if now - self.last >= LOG_EVERY_S:
            self.last = now
            self._line(max(self.shards, self.done_shards), now)

    def _line(self, shards: int, now: float, eta: float | None = None) -> None:
        elapsed = max(now - self.t0, 1e-9)
        if eta is None:
            eta = elapsed * (self.total_chars - self.done_chars - self.chars_here) / max(self.chars_here, 1)
        self.logged = (self.done_shards, shards)
        self.log(f"qasc ingest: shard {self.done_shards}/{shards}, {self.sentences} sentences, "
                 f"{self.sentences / elapsed:.1f} sentences/s, eta {max(eta, 0):.0f} s")

    def finish(self, shards: int) -> None:
        """Every unit is done: the shard count is now known (start() had an estimate); the last log line."""
        self.shards = shards
        if not self.use_bar and self.sentences and self.logged != (self.done_shards, shards):
            self._line(shards, time.perf_counter(), eta=0.0)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class PhaseClock:
    """Seconds spent per named phase, summed over calls: `with clock("embed sentences"): ...` (or start/stop
    around a block); `seconds` maps each phase to its total. bench.ingest reads it; nothing else depends on it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._open: tuple[str, float] | None = None

    def start(self, name: str) -> None:
        self._open = (name, time.perf_counter())

    def stop(self) -> None:
        name, t0 = self._open
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
        self._open = None

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
