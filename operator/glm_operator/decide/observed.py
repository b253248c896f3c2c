"""What one GLMService reconcile observed, gathered before it decides (pure values): the
`ServiceObservation` (CloudNativePG's `managedResources`), built once by the controllers
(controllers/reconcile_service.py `observe_service`) from the indexes and the few API reads,
and the live children in it (`ObservedChildren`), with the questions the decision asks of
them. `decide_service` reads this value, never the raw lists again, and asks for nothing
more while it decides: no callback, no read.

The workloads that count a pool's replicas: Deployments, and for multi-node replicas the
leader StatefulSet or the LeaderWorkerSet (one replica = one group; the worker StatefulSets
carry no pool label). All report replicas, updatedReplicas and readyReplicas alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from glm_operator.api import AnalysisResult, GLMService
from glm_operator.decide.idle import ActivityReading
from glm_operator.decide.references import UNOBSERVED, SecretsObserved
from glm_operator.render.groups import GROUP_ROLE_LABEL, LEADER
from glm_operator.render.names import label_value
from glm_operator.render.service import Capabilities
from glm_operator.wellknown import LONG_CONTEXT_POOL, MAIN_POOL, POOL_LABEL, VERSION_LABEL

Obj = dict[str, Any]
Ref = tuple[str, str]  # (kind, name)

POOL_WORKLOADS = frozenset({"Deployment", "StatefulSet", "LeaderWorkerSet"})


def caught_up(workload: Obj) -> bool:
    """Its status describes its current spec. LeaderWorkerSet (v0.7) reports no
    observedGeneration: its updatedReplicas, counted against the current template's revision,
    is what says so (a new version is a new object, whose status starts empty)."""
    meta, status = workload.get("metadata", {}), workload.get("status") or {}
    if workload.get("kind") == "LeaderWorkerSet" and "observedGeneration" not in status:
        return True
    return bool(status.get("observedGeneration", 0) >= meta.get("generation", 1))


def rolled_out(workload: Obj, wanted: int) -> bool:
    """The workload has caught up with its spec and has `wanted` ready pods."""
    status = workload.get("status") or {}
    return bool(
        caught_up(workload)
        and status.get("updatedReplicas", 0) >= wanted
        and status.get("readyReplicas", 0) >= wanted
        and status.get("replicas", 0) == status.get("updatedReplicas", 0)
    )


def ready_pods(workloads: Sequence[Obj]) -> int:
    """Ready pods of the current pod template (0 while a workload has not caught up)."""
    total = 0
    for w in workloads:
        status = w.get("status") or {}
        if caught_up(w):
            total += min(status.get("updatedReplicas", 0), status.get("readyReplicas", 0))
    return total


def _labels(obj: Obj) -> dict[str, str]:
    labels: dict[str, str] = obj.get("metadata", {}).get("labels", {})
    return labels


class ObservedChildren:
    """The service's live children, grouped by pool once."""

    def __init__(self, children: Sequence[Obj]) -> None:
        self.children = children
        self._pools: dict[str, list[Obj]] = {}
        for child in children:
            if child.get("kind") in POOL_WORKLOADS:
                pool = _labels(child).get(POOL_LABEL)
                if pool is not None:
                    self._pools.setdefault(pool, []).append(child)

    def workloads(self, pool: str, version: str | None = None) -> list[Obj]:
        """A pool's workloads, of one version or (None) of every version."""
        found = self._pools.get(pool, [])
        if version is None:
            return list(found)
        value = label_value(version)
        return [w for w in found if w["metadata"]["labels"].get(VERSION_LABEL) == value]

    def ready_pods(self, version: str, pool: str = MAIN_POOL) -> int:
        return ready_pods(self.workloads(pool, version))

    def replicas(self, pool: str = MAIN_POOL) -> tuple[int, int]:
        """(replicas, ready replicas) the pool's workloads report, every version counted."""
        found = self._pools.get(pool, [])
        return (sum(w.get("status", {}).get("replicas", 0) for w in found),
                sum(w.get("status", {}).get("readyReplicas", 0) for w in found))

    def version_replicas(self, version: str, pool: str = MAIN_POOL) -> tuple[int, int]:
        """(replicas, ready replicas) one version's workloads of the pool report."""
        found = self.workloads(pool, version)
        return (sum(w.get("status", {}).get("replicas", 0) for w in found),
                sum(w.get("status", {}).get("readyReplicas", 0) for w in found))

    def spec_replicas(self, version: str, pool: str = MAIN_POOL) -> int:
        """The replicas one version's pool asks for now (an autoscaler may have set them)."""
        return sum(int(w.get("spec", {}).get("replicas") or 0)
                   for w in self.workloads(pool, version))

    def awake_long_context(self) -> list[Obj]:
        """Long-context workloads that want a replica."""
        return [w for w in self._pools.get(LONG_CONTEXT_POOL, [])
                if int(w.get("spec", {}).get("replicas") or 0) > 0]

    def of_version(self, version: str) -> set[Ref]:
        """Every child labelled with that version (kind, name)."""
        value = label_value(version)
        return {(c["kind"], c["metadata"]["name"]) for c in self.children
                if _labels(c).get(VERSION_LABEL) == value}

    def live_groups(self, version: str) -> int | None:
        """Groups a version's multi-node main pool runs now: its leader set's replicas, which
        an autoscaler sets (None while the set does not exist)."""
        value = label_value(version)
        for child in self._pools.get(MAIN_POOL, []):
            labels = _labels(child)
            if (child.get("kind") in ("StatefulSet", "LeaderWorkerSet")
                    and labels.get(GROUP_ROLE_LABEL) == LEADER
                    and labels.get(VERSION_LABEL) == value):
                replicas = child.get("spec", {}).get("replicas")
                return int(replicas) if replicas is not None else None
        return None


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class ServiceObservation:
    """Everything one GLMService reconcile read, from the indexes and the API server, before
    it decides. `children` is derived: the watched children and the groups, grouped by pool.
    A field left at its default is what a cluster with nothing of it says (render builds one
    from its inputs that way)."""

    # The GLMService as stored, with the operator's own status write the watch has not shown
    # yet, parsed once.
    service: GLMService
    # The ModelVersions it wants (spec.modelVersion) or serves (status.stableModelVersion),
    # by name; one missing is not there.
    model_versions: Mapping[str, Obj] = field(default_factory=dict)
    # Watched children (the indexes, with the operator's own scales to zero the watch has
    # not shown yet): the apply compares the intent with these.
    live: Sequence[Obj] = ()
    # LeaderWorkerSets of a multi-node service, read from the API server (not watched).
    groups: Sequence[Obj] = ()
    # The optional CRDs the cluster serves.
    capabilities: Capabilities = field(default_factory=Capabilities)
    # Whether the Secrets the service names exist (the Secret names' watch).
    secrets: SecretsObserved = UNOBSERVED
    # The service's InferencePools, read for their status: the gateway's answer
    # (decide/gateway.py). Only with spec.routing InferenceGateway and the CRD served.
    inference_pools: Sequence[Obj] = ()
    # The activity Leases, read only when a pool's idle deadline passed (see
    # long_context_reading_due, main_pool_reading_due in decide/service.py); None: not read.
    long_context_activity: ActivityReading | None = None
    main_pool_activity: ActivityReading | None = None
    # The canary's verdict from Prometheus, when its step was due for a check.
    analysis: AnalysisResult | None = None
    # Every ModelVersion of the namespace, read only when the wanted version's plan does not
    # fit (its advice may point at another: decide/service.py
    # namespace_model_versions_needed); None: not read, the advice weighs model_versions.
    namespace_model_versions: Mapping[str, Obj] | None = None
    # The time the decision is made for.
    now: datetime = field(default_factory=_now)
    children: ObservedChildren = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "children", ObservedChildren([*self.live, *self.groups]))
