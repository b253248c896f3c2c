"""Per-key token buckets.

`RateLimiter`: requests, `rate` per second on average, `burst` at once.
`TokenBudget`: model tokens (prompt + completion), `tokens_per_minute` refill, one minute's
worth at most. What a request costs is known only once it is answered, so admission needs
just a positive balance and the actual usage is charged afterwards: a big answer can drive
the balance below zero, and the key then waits until the deficit is paid back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

# Buckets idle this long are full again and can be forgotten (bounds memory with many keys).
IDLE_EVICT_SECONDS = 600.0


def default_burst(rate: float) -> float:
    """A request bucket's size when none is set: one second's worth, at least one."""
    return float(max(1, math.ceil(rate)))


class RateLimiter:
    def __init__(self, rate: float, burst: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive; use no limiter for unlimited")
        self.rate = rate
        self.burst = float(burst) if burst > 0 else default_burst(rate)
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


class TokenBudget:
    """Model tokens per key: admit on a positive balance, charge the real usage afterwards."""

    def __init__(self, tokens_per_minute: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if tokens_per_minute <= 0:
            raise ValueError("tokens_per_minute must be positive; use no budget for unlimited")
        self.tokens_per_minute = tokens_per_minute
        self.rate = tokens_per_minute / 60.0  # refill per second
        self.capacity = float(tokens_per_minute)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (balance, updated_at)
        self._last_sweep = clock()

    def _balance(self, key: str, now: float) -> float:
        balance, updated = self._buckets.get(key, (self.capacity, now))
        return min(self.capacity, balance + (now - updated) * self.rate)

    def balance(self, key: str) -> float:
        return self._balance(key, self._clock())

    def admit(self, key: str) -> int:
        """0 when `key` may send a request now, else the seconds until its balance is back
        to one token (>= 1): the deficit divided by the refill rate."""
        now = self._clock()
        balance = self._balance(key, now)
        if balance >= 1.0:
            return 0
        return max(1, math.ceil((1.0 - balance) / self.rate))

    def charge(self, key: str, tokens: int) -> None:
        """Take `tokens` (a reservation, or what a request used beyond it; the balance may go
        below zero), or give them back when negative (a reservation not used; never above a
        full bucket)."""
        if tokens == 0:
            return
        now = self._clock()
        self._buckets[key] = (min(self.capacity, self._balance(key, now) - tokens), now)
        if now - self._last_sweep > IDLE_EVICT_SECONDS:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        # Forget only buckets that have refilled completely: forgetting one in deficit
        # would forgive the debt.
        self._last_sweep = now
        full = [k for k in self._buckets if self._balance(k, now) >= self.capacity]
        for key in full:
            del self._buckets[key]
