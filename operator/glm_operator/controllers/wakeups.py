"""Reconciles asked for at a later time: a canary's next check, the end of a drain, a
progress deadline. kopf's own timers would put a finalizer on every GLMService (see
`scheduled.resync_forever`), so one thread keeps a heap of due times instead."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Hashable


class Wakeups:
    def __init__(self, fire: Callable[[Hashable], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fire = fire
        self._clock = clock
        self._due: dict[Hashable, float] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._counter = 0
        self._wake = threading.Condition()

    def schedule(self, key: Hashable, delay: float) -> None:
        """Reconcile `key` in `delay` seconds; replaces what was asked for it before (the
        latest reconcile knows best)."""
        with self._wake:
            due = self._clock() + max(0.0, delay)
            self._due[key] = due
            self._counter += 1
            heapq.heappush(self._heap, (due, self._counter, key))
            self._wake.notify()

    def cancel(self, key: Hashable) -> None:
        with self._wake:
            self._due.pop(key, None)

    def pending(self) -> dict[Hashable, float]:
        with self._wake:
            return dict(self._due)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            ready: list[Hashable] = []
            with self._wake:
                now = self._clock()
                while self._heap and self._heap[0][0] <= now:
                    due, _, key = heapq.heappop(self._heap)
                    if self._due.get(key) == due:  # not replaced or cancelled since
                        del self._due[key]
                        ready.append(key)
                if not ready:
                    timeout = (self._heap[0][0] - now) if self._heap else 1.0
                    self._wake.wait(min(max(timeout, 0.01), 1.0))
            for key in ready:
                self._fire(key)
