"""When the long-context pool goes back to zero (pure).

The pool sleeps when the later of its last activity mark (the activity Lease's renewTime,
written by the pool's gateways while they serve and by a main-pool gateway when it wakes the
pool) and the moment the operator first saw it awake is older than `idleSeconds`. The
operator decides, not the pool: it already holds the state and the RBAC, and a pool that
scaled itself down would race with the gateway that wakes it and with its own HPA.

The Lease is read only when the deadline computed from what the status recorded has passed:
one read per idle period of an awake pool, none for a sleeping one. While a request is in
flight its gateway renews the Lease every max(15 s, idleSeconds / 4), so an in-flight request
always keeps the mark younger than idleSeconds. Both clocks are wall clocks (the gateway's
renewTime against the operator's now): skew between nodes shifts the sleep by the skew.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from glm_operator.api.glmservice import LongContext
from glm_operator.api.glmservice_status import PoolStatus


@dataclass(frozen=True)
class ActivityReading:
    """The activity Lease as just read: its renewTime (None: never renewed, or no Lease)."""

    renewed: datetime | None


@dataclass(frozen=True)
class IdleDecision:
    sleep: bool  # scale every long-context Deployment to zero now
    last_activity: datetime | None
    scale_to_zero_time: datetime | None  # None: asleep, or kept up by minReplicas
    requeue_after: float | None  # seconds until the next look


def may_sleep(spec: LongContext | None) -> bool:
    return spec is not None and spec.enabled and spec.min_replicas == 0


def _deadline(spec: LongContext, previous: PoolStatus | None) -> datetime | None:
    """The deadline the status implies for a pool already being watched, else None."""
    if previous is None or previous.scale_to_zero_time is None:
        return None
    if previous.last_activity_time is None:
        return previous.scale_to_zero_time
    return previous.last_activity_time + timedelta(seconds=spec.idle_seconds)


def needs_reading(spec: LongContext | None, awake: bool, previous: PoolStatus | None,
                  now: datetime) -> bool:
    """Whether the handler must read the activity Lease before `decide_idle` can decide."""
    if not awake or spec is None or not may_sleep(spec):
        return False
    deadline = _deadline(spec, previous)
    return deadline is not None and now >= deadline


def decide_idle(spec: LongContext | None, awake: bool, previous: PoolStatus | None,
                reading: ActivityReading | None, now: datetime) -> IdleDecision:
    """`awake`: some long-context Deployment wants a replica. `reading`: the Lease, when
    `needs_reading` asked for it (None otherwise)."""
    last = previous.last_activity_time if previous is not None else None
    if reading is not None and reading.renewed is not None and (
            last is None or reading.renewed > last):
        last = reading.renewed
    if spec is None or not awake or not may_sleep(spec):
        return IdleDecision(False, last, None, None)
    if _deadline(spec, previous) is None or last is None:
        # Newly awake (woken, scaled by hand, or minReplicas just lowered to 0): the wake is
        # activity, whether or not its mark was written.
        last = max(last, now) if last is not None else now
    deadline = last + timedelta(seconds=spec.idle_seconds)
    if now >= deadline:
        if reading is None:  # a shorter idleSeconds moved the deadline: read, then decide
            return IdleDecision(False, last, deadline, 0.0)
        return IdleDecision(True, last, None, None)
    return IdleDecision(False, last, deadline, (deadline - now).total_seconds())
