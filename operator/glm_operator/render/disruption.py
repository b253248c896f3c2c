"""The PodDisruptionBudget of one pool: a voluntary eviction (`kubectl drain`, a node
upgrade, the cluster autoscaler) never takes the pool's last ready replica.

    min replicas 0        no budget: the pool may have no pod (a sleeping long-context
                          pool, replicas: 0), so nothing is to keep
    min replicas 1        minAvailable 1: the only ready replica stays; more pods (an HPA
                          above its minimum) may go down to one
    min replicas > 1      maxUnavailable 1: one replica at a time
    multi-node groups     maxUnavailable 1 pod while more than one group runs, else 0: a
                          budget counts pods, and any pod of a group takes the whole group
                          down, so "the last replica" is the last group

A budget never blocks a scale-down or a scale to zero (those delete pods, they do not evict
them), and with no pods there is nothing it could refuse. unhealthyPodEvictionPolicy
AlwaysAllow: a pod that is not ready serves nothing, so a crash-looping or still-loading
pod never blocks a drain.

One budget per pool, across versions (during a rollout both versions' pods count), with
selectors that never overlap: the eviction API refuses a pod that two budgets select. The
main pool's selects its engine pods and a group's workers (which carry no pool label); the
long-context pool's selects its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glm_operator.api.glmservice import GLMService
from glm_operator.render.deployment import ENGINE_COMPONENT
from glm_operator.render.environment import render_object
from glm_operator.render.groups import WORKER_COMPONENT
from glm_operator.render.meta import object_meta
from glm_operator.render.names import (
    COMPONENT_LABEL,
    POOL_LABEL,
    SERVICE_LABEL,
    common_labels,
    dns_name,
    label_value,
)
from glm_operator.wellknown import LONG_CONTEXT_POOL

# Single-node pods and group leaders; a group's workers.
ENGINE_COMPONENTS = (ENGINE_COMPONENT, WORKER_COMPONENT)


@dataclass(frozen=True)
class Budget:
    min_available: int | None = None
    max_unavailable: int | None = None


def pool_min_replicas(service: GLMService, pool: str) -> int:
    """The fewest replicas (groups, for multi-node) the spec lets the pool run."""
    spec = service.spec
    if pool == LONG_CONTEXT_POOL:
        return spec.long_context.min_replicas if spec.long_context is not None else 0
    if spec.autoscaling is not None:
        return spec.autoscaling.min_replicas
    return spec.effective_replicas


def budget(min_replicas: int, groups_running: int | None = None) -> Budget | None:
    """`groups_running`: the groups a multi-node pool runs now (None: single-node pods)."""
    if min_replicas < 1:
        return None
    if groups_running is not None:
        return Budget(max_unavailable=1 if max(groups_running, min_replicas) > 1 else 0)
    if min_replicas == 1:
        return Budget(min_available=1)
    return Budget(max_unavailable=1)


def disruption_budget_name(service: str, pool: str) -> str:
    return dns_name(service, "lc") if pool == LONG_CONTEXT_POOL else dns_name(service)


def pool_pods_selector(service: str, pool: str) -> dict[str, Any]:
    if pool == LONG_CONTEXT_POOL:
        return {"matchLabels": {SERVICE_LABEL: label_value(service), POOL_LABEL: pool}}
    return {"matchLabels": {SERVICE_LABEL: label_value(service)},
            "matchExpressions": [
                {"key": COMPONENT_LABEL, "operator": "In", "values": list(ENGINE_COMPONENTS)},
                {"key": POOL_LABEL, "operator": "NotIn", "values": [LONG_CONTEXT_POOL]}]}


def build_pod_disruption_budget(service: str, namespace: str, pool: str, spec: Budget,
                                owner: dict[str, Any] | None) -> dict[str, Any]:
    labels = common_labels(service, "disruption-budget")
    labels[POOL_LABEL] = pool
    return render_object(
        "poddisruptionbudget.yaml.j2",
        metadata=object_meta(disruption_budget_name(service, pool), namespace, labels, owner),
        selector=pool_pods_selector(service, pool),
        min_available=spec.min_available,
        max_unavailable=spec.max_unavailable,
    )
