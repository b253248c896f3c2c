"""The long-context pool's scale-to-zero wiring: its activity Lease, how often the gateways
renew it, and how long a gateway waits for the pool to wake. A main pool that scales from
zero (autoscaling.minReplicas 0, with the router) gets the same: a Lease per version, the
router in the waking gateway's place (render/routing.py).

The pool goes 0 -> 1 when a main-pool gateway wakes it (scale subresource), 1 -> N by its own
HPA (render/autoscaling.py), and N -> 0 when the operator finds the activity Lease older than
`idleSeconds` (decide/long_context.py). The Lease is the signal because it outlives
every process: the pool's gateways renew it while they serve long requests (and the waking
gateway before it scales), the operator only reads it. A Lease rather than an annotation on
the Deployment: the gateways may then patch one Lease, not the Deployment (whose pod template
they could otherwise rewrite), and a renewal is no Deployment event for the operator to
reconcile.
"""

from __future__ import annotations

from typing import Any

from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.names import dns_name

# A renewal at most this often, and at least four per idle period: a pool serving a request
# longer than idleSeconds keeps a mark younger than idleSeconds.
MIN_ACTIVITY_INTERVAL_SECONDS = 15
# Beyond the engine's startup-probe allowance: scheduling, the readiness period, warm-up.
WAKE_MARGIN_SECONDS = 60


def activity_lease_name(service: str) -> str:
    """One Lease per GLMService, named like its long-context Service (`<service>-lc`)."""
    return dns_name(service, "lc")


def main_activity_lease_name(service: str, version: str) -> str:
    """A main pool that scales from zero (autoscaling.minReplicas 0): one Lease per version,
    since each version's Deployment sleeps on its own. Renewed by the version's gateways
    while they serve and by the router when it wakes the version."""
    return dns_name(service, version, "activity")


def activity_interval_seconds(idle_seconds: int) -> int:
    return max(MIN_ACTIVITY_INTERVAL_SECONDS, idle_seconds // 4)


def wake_timeout_seconds(pool_startup_seconds: int) -> int:
    """How long a long request waits for the pool to wake: the time its engine may take to
    load (the startup probe's allowance, planned from the model's size) plus a margin."""
    return pool_startup_seconds + WAKE_MARGIN_SECONDS


def build_activity_lease(name: str, namespace: str, labels: dict[str, str],
                         owner: dict[str, Any] | None, idle_seconds: int) -> dict[str, Any]:
    """The Lease the gateways renew (spec.renewTime, spec.holderIdentity: theirs, never in
    this intent). leaseDurationSeconds says how long a renewal keeps the pool awake."""
    return render_object("lease.yaml.j2", metadata=object_meta(name, namespace, labels, owner),
                         lease_duration_seconds=idle_seconds)
