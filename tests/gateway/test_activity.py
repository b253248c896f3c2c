"""The long-context activity mark: when a gateway renews the pool's Lease."""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime
from typing import Any

import pytest
from glm_operator.gateway.pools.activity import (
    ActivityMarker,
    renewal_interval,
    seconds_until_renewal,
)


@pytest.mark.parametrize(("now", "last", "pending", "in_flight", "expected"), [
    (100.0, None, False, 0, None),  # nothing happened: no write
    (100.0, None, True, 0, 0.0),  # the first request: at once
    (100.0, 95.0, True, 0, 10.0),  # throttled: once per interval
    (100.0, 80.0, True, 0, 0.0),
    (100.0, 95.0, False, 1, 10.0),  # a request in flight keeps renewing
    (100.0, 95.0, False, 0, None),  # all done and written
])
def test_when_the_next_renewal_is_due(now: float, last: float | None, pending: bool,
                                      in_flight: int, expected: float | None) -> None:
    assert seconds_until_renewal(now, last, 15.0, pending, in_flight) == expected


def test_the_interval_is_a_quarter_of_idle_seconds_and_at_least_15_s() -> None:
    assert renewal_interval(None) == 15.0
    assert renewal_interval(30) == 15.0
    assert renewal_interval(600) == 150.0


class FakeLease:
    def __init__(self, duration: int) -> None:
        self.duration = duration
        self.renewals: list[float] = []

    async def renew(self, moment: datetime) -> int:
        self.renewals.append(asyncio.get_running_loop().time())
        return self.duration


async def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_the_marker_renews_at_once_then_throttled_and_while_in_flight() -> None:
    lease = FakeLease(duration=1)  # a quarter is below the minimum: 0.3 s
    marker = ActivityMarker(lease, min_interval=0.3)  # type: ignore[arg-type]
    task = asyncio.create_task(marker.run())
    loop = asyncio.get_running_loop()
    try:
        marker.begin()
        marker.end()
        await until(lambda: len(lease.renewals) == 1)  # the first request: written at once
        first = loop.time()
        for _ in range(5):  # a burst: no write per request
            marker.begin()
            marker.end()
        await until(lambda: len(lease.renewals) == 2)  # its end, written one interval later
        assert lease.renewals[1] - lease.renewals[0] >= 0.29
        assert loop.time() - first >= 0.25
        marker.begin()  # a long request: renewed every interval while it runs
        await until(lambda: len(lease.renewals) >= 5)
        during: list[Any] = list(lease.renewals)
        gaps = [b - a for a, b in itertools.pairwise(during)]
        assert min(gaps) >= 0.29
        marker.end()
        await asyncio.sleep(0.7)
        after = len(lease.renewals)
        await asyncio.sleep(0.7)
        assert len(lease.renewals) == after  # quiet: nothing more
    finally:
        task.cancel()
