"""How far a download has got, measured as bytes land and reported at a bounded rate (pure).

    meter = ProgressMeter(sink=reporter.progress, min_interval_s=15)
    meter.declare(key, size, present)    a file whose size is known before it is opened (a
                                         snapshot's listing), with the bytes already on disk
    meter.started(key, total, present)   the response headers came: the file's total (None
                                         while the server does not say) and where it resumes
    meter.advance(n)                     n more bytes written
    meter.final()                        the final figures (None when nothing was fetched),
                                         for the caller to write with the result

Bytes found on disk (a resumed `.partial`, files an earlier attempt finished) count as done
from the first report on, so a resumed download starts at its real percentage; the rate and
the ETA count only the bytes this process moved, over the last `RATE_WINDOW_S` seconds.

`sink` gets a `Progress` at most once every `min_interval_s` (the first one as soon as the
total is known; the final figures go out with the result, `final`): a status write of a few
hundred bytes every 15 s costs the API server nothing while a download of hours stays
watchable.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from glm_operator.download_progress import (
    format_amounts,
    format_bytes,
    format_duration,
    format_rate,
)

DEFAULT_STATUS_INTERVAL_S = 15.0
RATE_WINDOW_S = 30.0
_RATE_SAMPLE_S = 1.0


@dataclass(frozen=True)
class Progress:
    """One report: bytes done and expected, the recent rate, and the time left."""

    done_bytes: int
    total_bytes: int | None  # None until every file's size is known
    bytes_per_second: float | None  # None before a second's worth of samples
    eta_seconds: float | None
    resumed_bytes: int  # of done_bytes, what was already on disk when this process started
    elapsed_seconds: float
    finished: bool = False

    @property
    def percent(self) -> int | None:
        """Whole percent, rounded down: 100 only once every byte is there."""
        if not self.total_bytes:
            return None
        return min(100, self.done_bytes * 100 // self.total_bytes)

    @property
    def summary(self) -> str:
        return progress_summary(self)


def progress_summary(p: Progress) -> str:
    """`Downloading 37% 152/410Gi 210MiB/s ETA 22m` (the ModelVersion's Progress column)."""
    if p.finished:
        parts = [f"Downloaded {format_bytes(p.done_bytes)} in {format_duration(p.elapsed_seconds)}"]
        if p.resumed_bytes:
            parts.append(f"(resumed at {format_bytes(p.resumed_bytes)})")
        return " ".join(parts)
    parts = ["Downloading"]
    if p.total_bytes:
        parts += [f"{p.percent}%", format_amounts(p.done_bytes, p.total_bytes)]
    else:
        parts.append(format_bytes(p.done_bytes))
    if p.bytes_per_second:
        parts.append(format_rate(p.bytes_per_second))
    if p.eta_seconds is not None:
        parts.append(f"ETA {format_duration(p.eta_seconds)}")
    return " ".join(parts)


@dataclass
class _File:
    total: int | None
    done: int


class ProgressMeter:
    """Counts bytes per file and hands `sink` a throttled stream of `Progress` reports."""

    def __init__(self, sink: Callable[[Progress], None],
                 min_interval_s: float = DEFAULT_STATUS_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sink, self._interval, self._clock = sink, min_interval_s, clock
        self._files: dict[str, _File] = {}
        self._current: str | None = None
        self._started = clock()
        self._moved = 0  # bytes this process wrote
        self._resumed = 0
        self._samples: deque[tuple[float, int]] = deque([(self._started, 0)])
        self._last_report: float | None = None
        self._finished = False  # no more reports once the final figures were taken

    def declare(self, key: str, size: int | None, present: int = 0) -> None:
        """A file known before it is opened (a listing), with `present` bytes on disk."""
        if key not in self._files:
            self._files[key] = _File(size, present)
            self._resumed += present

    def started(self, key: str, total: int | None, present: int) -> None:
        """The response for `key` came: its total, and the offset it continues from."""
        known = self._files.get(key)
        if known is None:
            self._files[key] = _File(total, present)
            self._resumed += present
        else:
            if present < known.done:  # the server ignored Range: the file starts over
                self._resumed -= min(self._resumed, known.done - present)
            known.done = present
            if total is not None:
                known.total = total
        self._current = key
        self._maybe_report(force=self._last_report is None and self.total is not None)

    def advance(self, n: int) -> None:
        if self._current is not None:
            self._files[self._current].done += n
        self._moved += n
        now = self._clock()
        if now - self._samples[-1][0] >= _RATE_SAMPLE_S:
            self._samples.append((now, self._moved))
            while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
                self._samples.popleft()
        self._maybe_report()

    def final(self) -> Progress | None:
        """The finished download's figures; None when no file was fetched (all cached)."""
        if self._current is None:
            return None
        self._finished = True
        return self.snapshot()

    @property
    def done(self) -> int:
        return sum(f.done for f in self._files.values())

    @property
    def total(self) -> int | None:
        totals = [f.total for f in self._files.values()]
        if not totals or any(t is None for t in totals):
            return None
        return sum(t for t in totals if t is not None)

    def snapshot(self) -> Progress:
        now = self._clock()
        rate = self._rate(now)
        total, done = self.total, self.done
        eta = (max(0, total - done) / rate) if total is not None and rate else None
        return Progress(done_bytes=done, total_bytes=total, bytes_per_second=rate,
                        eta_seconds=eta, resumed_bytes=self._resumed,
                        elapsed_seconds=now - self._started, finished=self._finished)

    def _rate(self, now: float) -> float | None:
        oldest_time, oldest_moved = self._samples[0]
        if now - oldest_time < _RATE_SAMPLE_S:
            return None
        return (self._moved - oldest_moved) / (now - oldest_time)

    def _maybe_report(self, force: bool = False) -> None:
        if self._finished:
            return
        now = self._clock()
        if force or (self._last_report is not None and now - self._last_report >= self._interval):
            self._report(now)
        elif self._last_report is None and now - self._started >= self._interval:
            self._report(now)  # a total that never comes must not silence the reports

    def _report(self, now: float) -> None:
        self._last_report = now
        self._sink(self.snapshot())
