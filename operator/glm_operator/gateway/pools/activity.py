"""Mark long-context activity: renew the pool's activity Lease, throttled.

The long-context pool's gateways renew the Lease while they serve: at once for the first
request after a quiet spell, then at most once per interval while a request is in flight or
one has finished since the last renewal (so the mark also says when the last one ended). The
interval is max(15 s, leaseDurationSeconds / 4), learnt from the Lease itself (the operator
sets leaseDurationSeconds to the pool's idleSeconds), so an in-flight request always keeps
the mark younger than idleSeconds and editing idleSeconds restarts no pod.

A failed renewal is logged and retried at the next interval; requests never wait on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp

from glm_operator.gateway.config import ActivityConfig
from glm_operator.kube.activity import ActivityLease, LeaseRef
from glm_operator.kube.pod_api import ApiCallError

log = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 15.0


def renewal_interval(lease_duration_seconds: int | None,
                     minimum: float = MIN_INTERVAL_SECONDS) -> float:
    if not lease_duration_seconds:
        return minimum
    return max(minimum, lease_duration_seconds / 4)


def seconds_until_renewal(now: float, last_renewal: float | None, interval: float,
                          pending: bool, in_flight: int) -> float | None:
    """When the next renewal is due (0: now), or None: nothing to mark."""
    if not pending and in_flight == 0:
        return None
    if last_renewal is None:
        return 0.0
    return max(0.0, last_renewal + interval - now)


async def renew_logged(lease: ActivityLease) -> int | None:
    """Renew now; the Lease's leaseDurationSeconds, or None when the call failed (logged)."""
    try:
        return await lease.renew(datetime.now(UTC))
    except (ApiCallError, aiohttp.ClientError, TimeoutError, OSError) as exc:
        log.warning("could not renew the activity Lease %s/%s: %s",
                    lease.lease.namespace, lease.lease.name, exc)
        return None


class ActivityMarker:
    def __init__(self, lease: ActivityLease, clock: Callable[[], float] = time.monotonic,
                 min_interval: float = MIN_INTERVAL_SECONDS) -> None:
        self.lease = lease
        self._clock = clock
        self._min_interval = min_interval
        self._in_flight = 0
        self._pending = False
        self._last_renewal: float | None = None
        self.interval = min_interval
        self.renewals = 0
        self._kick = asyncio.Event()

    def begin(self) -> None:
        self._in_flight += 1
        self._pending = True
        self._kick.set()

    def end(self) -> None:
        self._in_flight -= 1
        self._pending = True
        self._kick.set()

    def pending_or_in_flight(self) -> bool:
        """Activity not renewed yet: a request in flight, or one ended since the last."""
        return self._pending or self._in_flight > 0

    async def run(self) -> None:
        """The renewal loop; runs until cancelled (the gateway's shutdown)."""
        while True:
            wait = seconds_until_renewal(self._clock(), self._last_renewal, self.interval,
                                         self._pending, self._in_flight)
            if wait is None:
                self._kick.clear()
                await self._kick.wait()
                continue
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self._pending = False
            self._last_renewal = self._clock()
            duration = await renew_logged(self.lease)
            if duration is not None:
                self.renewals += 1
                self.interval = renewal_interval(duration, self._min_interval)


def activity_lease(config: ActivityConfig, session: aiohttp.ClientSession) -> ActivityLease:
    """The pool's activity Lease as this gateway renews it, with the gateway's session."""
    return ActivityLease(LeaseRef(config.api_server, config.namespace, config.lease),
                         config.identity, config.token_path, config.ca_path, session)
