"""When a scaled-from-zero main pool goes back to zero (pure): decide/idle.py's decision for
the main pool of a service with autoscaling.minReplicas 0 (routing.mode EndpointPicker).

One version at a time: the one running alone with its autoscaler, no rollout in flight (a
rollout sizes the new version itself and compares the two under load; putting either to
sleep meanwhile would leave the analysis nothing to judge). Its activity Lease is renewed by
its gateways while they serve and by the router when it wakes the version; the status
(status.mainPool) records which version its idle clock is for, so a new version starts its
own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from glm_operator.api import GLMService, PoolStatus
from glm_operator.decide import idle
from glm_operator.decide.observed import ObservedChildren
from glm_operator.render.long_context import main_activity_lease_name
from glm_operator.wellknown import MAIN_POOL

Obj = dict[str, object]


def policy(service: GLMService) -> idle.IdlePolicy:
    return idle.IdlePolicy(service.spec.main_pool_may_sleep, service.spec.idle_seconds)


def awake_deployments(observed: ObservedChildren, version: str) -> list[dict[str, object]]:
    """The version's main-pool Deployments that want a replica."""
    return [w for w in observed.workloads(MAIN_POOL, version)
            if w.get("kind") == "Deployment"
            and int((w.get("spec") or {}).get("replicas") or 0) > 0]


def _previous(service: GLMService, version: str) -> PoolStatus | None:
    previous = service.status.main_pool
    return previous if previous is not None and previous.model_version == version else None


def reading_due(service: GLMService, observed: ObservedChildren, now: datetime) -> str | None:
    """The activity Lease to read before deciding (its idle deadline passed), or None. Only
    the version the status already watches can be due: a newly watched one starts its clock."""
    previous = service.status.main_pool
    if previous is None or previous.model_version is None:
        return None
    version = previous.model_version
    if version != service.spec.model_version or service.status.stable_model_version != version:
        return None
    if not idle.needs_reading(policy(service), bool(awake_deployments(observed, version)),
                              previous, now):
        return None
    return main_activity_lease_name(service.metadata.name or "", version)


@dataclass(frozen=True)
class MainPoolIdle:
    status: PoolStatus | None  # status.mainPool (None: the pool never sleeps)
    scale_to_zero: tuple[tuple[str, str], ...]  # (Deployment, resourceVersion decided on)
    requeue_after: float | None
    events: list[tuple[str, str, str]]


def decide(service: GLMService, observed: ObservedChildren, version: str | None,
           reading: idle.ActivityReading | None, now: datetime) -> MainPoolIdle:
    """`version`: the one version that may sleep now (None: a rollout is in flight, or the
    pool never sleeps). `reading`: the Lease `reading_due` named, when it was read."""
    rules = policy(service)
    if not rules.may_sleep:
        return MainPoolIdle(None, (), None, [])
    if version is None:  # keep the clock as it was; it starts again after the rollout
        return MainPoolIdle(service.status.main_pool, (), None, [])
    awake = awake_deployments(observed, version)
    previous = _previous(service, version)
    decision = idle.decide_idle(rules, bool(awake), previous, reading, now)
    replicas, ready = observed.version_replicas(version)
    status = PoolStatus(replicas=replicas, ready_replicas=ready, model_version=version,
                        last_activity_time=decision.last_activity,
                        scale_to_zero_time=decision.scale_to_zero_time)
    if not decision.sleep:
        return MainPoolIdle(status, (), decision.requeue_after, [])
    scale = tuple((str(_meta(d).get("name")), str(_meta(d).get("resourceVersion", "")))
                  for d in awake)
    last = f"{decision.last_activity:%Y-%m-%dT%H:%M:%SZ}" if decision.last_activity else "never"
    event = ("Normal", "MainPoolIdle",
             f"no request for {rules.idle_seconds} s (last {last}): scaling the main pool of "
             f"{version} to zero; the router wakes it on the next request")
    return MainPoolIdle(status, scale, None, [event])


def asleep(idle_state: MainPoolIdle, observed: ObservedChildren) -> bool:
    """The watched version's main pool sleeps, or is put to sleep by this decision."""
    status = idle_state.status
    if status is None or status.model_version is None:
        return False
    if idle_state.scale_to_zero:
        return True
    workloads = observed.workloads(MAIN_POOL, status.model_version)
    return bool(workloads) and not awake_deployments(observed, status.model_version)


def _meta(obj: dict[str, object]) -> dict[str, object]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}
