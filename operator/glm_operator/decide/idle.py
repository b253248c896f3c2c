"""When a pool that may sleep goes back to zero (pure): the long-context pool, and the main
pool of a service that scales from zero (autoscaling.minReplicas 0 with the router).

A pool sleeps when the later of its last activity mark (its activity Lease's renewTime,
written by its gateways while they serve and by whoever wakes it) and the moment the operator
first saw it awake is older than its idle period. The operator decides, not the pool: it
already holds the state and the RBAC, and a pool that scaled itself down would race with
whoever wakes it and with its own HPA.

The Lease is read only when the deadline computed from what the status recorded has passed:
one read per idle period of an awake pool, none for a sleeping one. While a request is in
flight its gateway renews the Lease every max(15 s, idle / 4), so an in-flight request always
keeps the mark younger than the idle period. Both clocks are wall clocks (the gateway's
renewTime against the operator's now): skew between nodes shifts the sleep by the skew.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol


@dataclass(frozen=True)
class ActivityReading:
    """The activity Lease as just read: its renewTime (None: never renewed, or no Lease)."""

    renewed: datetime | None


@dataclass(frozen=True)
class IdlePolicy:
    """Whether the pool may sleep at all, and after how long without activity."""

    may_sleep: bool
    idle_seconds: int


class IdleMarks(Protocol):
    """What the status recorded at the last look (PoolStatus)."""

    @property
    def last_activity_time(self) -> datetime | None: ...

    @property
    def scale_to_zero_time(self) -> datetime | None: ...


@dataclass(frozen=True)
class IdleDecision:
    sleep: bool  # scale the pool's Deployments to zero now
    last_activity: datetime | None
    scale_to_zero_time: datetime | None  # None: asleep, or kept up by minReplicas
    requeue_after: float | None  # seconds until the next look


def _deadline(policy: IdlePolicy, previous: IdleMarks | None) -> datetime | None:
    """The deadline the status implies for a pool already being watched, else None."""
    if previous is None or previous.scale_to_zero_time is None:
        return None
    if previous.last_activity_time is None:
        return previous.scale_to_zero_time
    return previous.last_activity_time + timedelta(seconds=policy.idle_seconds)


def needs_reading(policy: IdlePolicy, awake: bool, previous: IdleMarks | None,
                  now: datetime) -> bool:
    """Whether the handler must read the activity Lease before `decide_idle` can decide."""
    if not awake or not policy.may_sleep:
        return False
    deadline = _deadline(policy, previous)
    return deadline is not None and now >= deadline


def decide_idle(policy: IdlePolicy, awake: bool, previous: IdleMarks | None,
                reading: ActivityReading | None, now: datetime) -> IdleDecision:
    """`awake`: some Deployment of the pool wants a replica. `reading`: the Lease, when
    `needs_reading` asked for it (None otherwise)."""
    last = previous.last_activity_time if previous is not None else None
    if reading is not None and reading.renewed is not None and (
            last is None or reading.renewed > last):
        last = reading.renewed
    if not awake or not policy.may_sleep:
        return IdleDecision(False, last, None, None)
    if _deadline(policy, previous) is None or last is None:
        # Newly awake (woken, scaled by hand, or minReplicas just lowered to 0): the wake is
        # activity, whether or not its mark was written.
        last = max(last, now) if last is not None else now
    deadline = last + timedelta(seconds=policy.idle_seconds)
    if now >= deadline:
        if reading is None:  # a shorter idle period moved the deadline: read, then decide
            return IdleDecision(False, last, deadline, 0.0)
        return IdleDecision(True, last, None, None)
    return IdleDecision(False, last, deadline, (deadline - now).total_seconds())
