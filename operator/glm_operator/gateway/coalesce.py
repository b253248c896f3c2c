"""One call at a time to something behind the gateway, shared by every caller meanwhile.

The probe and metrics endpoints (/readyz, /enginez, /metrics/engine) ask the engine anew for
each request, and need no key: a client that sends them on many connections would make the
gateway call the engine as often (2,546 calls in 2.8 s, issue 36). Coalesced, the engine is
called at most once at a time, and what arrives while a call runs shares its answer, as
fresh as the call itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Coalesced(Generic[T]):
    """`await coalesced()` runs `fetch` unless a run is in progress, then shares its result
    (or its exception). A caller that is cancelled (its client left) does not cancel the run
    the others wait on."""

    def __init__(self, fetch: Callable[[], Awaitable[T]]) -> None:
        self._fetch = fetch
        self._running: asyncio.Future[T] | None = None
        self.calls = 0  # runs of `fetch` made

    async def __call__(self) -> T:
        running = self._running
        if running is None:
            self.calls += 1
            running = self._running = asyncio.ensure_future(self._fetch())
            running.add_done_callback(self._done)
        return await asyncio.shield(running)

    def _done(self, future: asyncio.Future[T]) -> None:
        if self._running is future:
            self._running = None
        if not future.cancelled():
            future.exception()  # retrieved: a failure nobody awaited is not logged as lost
