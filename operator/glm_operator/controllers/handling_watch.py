"""Liveness for an operator that sees its objects but never handles them.

kopf holds every handler until each of its watches has listed once. If a watch never reports
(kopf 1.45: a watched namespace deleted while its watch first lists), the hold never lifts:
the indexes fill, no handler runs, and kopf's liveness endpoint still answers 200. Namespace
globs no longer get there (controllers/scope.py); exact names still can. So the liveness
probe fails once objects have been indexed for STUCK_AFTER_SECONDS without a single handler
having run since the start, and the kubelet restarts the operator, whose fresh watches list
what exists now.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

STUCK_AFTER_SECONDS = 300.0  # far above a start-up's first handler, even with many objects


class HandlingWatch:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first_indexed_at: float | None = None
        self._handled = False

    def indexed(self, body: Any) -> None:
        """An index saw an object its handlers will be called for (one not being deleted:
        kopf calls no resume handler for those)."""
        if self._handled or self._first_indexed_at is not None:
            return
        if not (body.get("metadata") or {}).get("deletionTimestamp"):
            self._first_indexed_at = self._clock()

    def handled(self) -> None:
        self._handled = True

    def stuck_for(self) -> float | None:
        """Seconds objects have waited for the first handler, or None when not waiting."""
        if self._handled or self._first_indexed_at is None:
            return None
        return self._clock() - self._first_indexed_at

    def check(self) -> str:
        """The liveness probe's verdict: raises once handling is stuck."""
        waited = self.stuck_for()
        if waited is not None and waited > STUCK_AFTER_SECONDS:
            raise HandlingStuck(
                f"objects indexed {waited:.0f} s ago and no handler has run since the start: "
                "a watch never finished its first listing (restart to list again)")
        return "handling" if self._handled else "waiting for objects"


class HandlingStuck(Exception):
    pass


WATCH = HandlingWatch()
