"""When the long-context pool goes back to zero (pure): decide/idle.py's decision, with the
pool's own policy (longContext.minReplicas 0, longContext.idleSeconds).

Its activity mark is written by the pool's gateways while they serve and by a main-pool
gateway (or the router) when it wakes the pool.
"""

from __future__ import annotations

from datetime import datetime

from glm_operator.api.glmservice import Pool
from glm_operator.api.glmservice_status import PoolStatus
from glm_operator.decide import idle
from glm_operator.decide.idle import ActivityReading as ActivityReading
from glm_operator.decide.idle import IdleDecision as IdleDecision


def may_sleep(spec: Pool | None) -> bool:
    return spec is not None and spec.enabled and spec.min_replicas == 0


def policy(spec: Pool | None) -> idle.IdlePolicy:
    return idle.IdlePolicy(may_sleep(spec), spec.idle_seconds if spec is not None else 0)


def needs_reading(spec: Pool | None, awake: bool, previous: PoolStatus | None,
                  now: datetime) -> bool:
    """Whether the handler must read the activity Lease before `decide_idle` can decide."""
    return idle.needs_reading(policy(spec), awake, previous, now)


def decide_idle(spec: Pool | None, awake: bool, previous: PoolStatus | None,
                reading: ActivityReading | None, now: datetime) -> IdleDecision:
    """`awake`: some long-context Deployment wants a replica. `reading`: the Lease, when
    `needs_reading` asked for it (None otherwise)."""
    return idle.decide_idle(policy(spec), awake, previous, reading, now)
