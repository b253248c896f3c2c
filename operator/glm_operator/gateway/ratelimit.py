"""Per-key token buckets: `rate` requests per second on average, `burst` at once."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

# Buckets idle this long are full again and can be forgotten (bounds memory with many keys).
IDLE_EVICT_SECONDS = 600.0


class RateLimiter:
    def __init__(self, rate: float, burst: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive; use no limiter for unlimited")
        self.rate = rate
        self.burst = float(burst if burst > 0 else max(1, math.ceil(rate)))
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, updated_at)
        self._last_sweep = clock()

    def acquire(self, key: str) -> int:
        """Take one token for `key`: 0 when allowed, else the seconds to wait (>= 1)."""
        now = self._clock()
        tokens, updated = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - updated) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            allowed = 0
        else:
            self._buckets[key] = (tokens, now)
            allowed = max(1, math.ceil((1.0 - tokens) / self.rate))
        if now - self._last_sweep > IDLE_EVICT_SECONDS:
            self._sweep(now)
        return allowed

    def _sweep(self, now: float) -> None:
        self._last_sweep = now
        stale = [k for k, (_, at) in self._buckets.items() if now - at > IDLE_EVICT_SECONDS]
        for key in stale:
            del self._buckets[key]
