"""One GLMService's reconcile: observe -> decide -> apply -> status.

Observe (`observe_service`, once, before deciding): the service, its ModelVersions and
children from the indexes (indexes.py), with the operator's own writes the watch has not
shown yet (own_writes.py), parsed once; whether the Secrets it names exist, from the Secret
names (secrets.py). From the API server it reads only what cannot be watched safely: which
optional CRDs are served (cached for capabilityRecheckSeconds), the optional children it
owns once per service after a start (apply.py), LeaderWorkerSets of multi-node services,
the InferencePools of an inference-gateway service, an activity Lease when its idle
deadline passed; and the canary's analysis from Prometheus when a step is due. All of it
goes into one `ServiceObservation` (decide/observed.py).
Decide: decide/service.py (pure), from that observation alone. Apply: apply.py (which reads
an optional child when its intent changed or at a resync), then the scales to zero of an
idle pool. Status: a merge patch of what changed, guarded by the resourceVersion it was
decided from.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from glm_operator.api import ADMITTED, GLMService
from glm_operator.controllers import metrics
from glm_operator.controllers.analysis import canary_analysis
from glm_operator.controllers.apply import (
    INFERENCE_POOL,
    LEADER_WORKER_SET,
    drift_events,
    served_optional_kinds,
    sync_children,
)
from glm_operator.controllers.indexes import (
    SERVICE_CHILD_INDEXES,
    children,
    lookup,
    model_versions_of,
    namespace_model_versions,
)
from glm_operator.controllers.reconcile import emit, in_turn, namespace_terminating, retry_later
from glm_operator.controllers.runtime import Runtime, runtime
from glm_operator.decide.drift import merge_patch
from glm_operator.decide.long_context import ActivityReading
from glm_operator.decide.observed import ObservedChildren, ServiceObservation
from glm_operator.decide.references import secret_references
from glm_operator.decide.service import (
    decide_service,
    long_context_reading_due,
    main_pool_reading_due,
    namespace_model_versions_needed,
)
from glm_operator.kube.client import KubeClient, KubeError
from glm_operator.render.inference_pool import INFERENCE_POOL_CRD
from glm_operator.render.long_context import activity_lease_name
from glm_operator.render.names import MANAGED_BY, label_value
from glm_operator.wellknown import GROUP, MANAGED_BY_LABEL, SERVICE_LABEL, VERSION

# Writes replicas of an idle pool (scale subresource: the long-context pool, or a main pool
# that scales from zero), apart from the applied intent, which never holds their replicas.
IDLE_FIELD_MANAGER = "glm-operator-idle"
# LeaderWorkerSets are not watched (an optional CRD, see apply.py): while a service's groups
# are not all ready, its reconcile comes back this often to read them.
GROUPS_POLL_SECONDS = 10.0

log = logging.getLogger("glm_operator")

Obj = dict[str, Any]
Key = tuple[str, str]


def reconcile_service(namespace: str, name: str, indexes: Mapping[str, Any], *,
                      coalesce: bool = False) -> None:
    """Reconcile one GLMService; `coalesce` for events of its children and ModelVersions."""
    runtime().remember_indexes(indexes)
    in_turn("GLMService", (namespace, name),
            lambda: _reconcile_service(namespace, name, indexes), coalesce)


def _reconcile_service(namespace: str, name: str, indexes: Mapping[str, Any]) -> None:
    rt = runtime()
    key = (namespace, name)
    with metrics.RECONCILE_SECONDS.labels("GLMService").time():
        bodies = lookup(indexes["glmservices"], key)
        if not bodies or bodies[0]["metadata"].get("deletionTimestamp"):
            return
        body = rt.own_writes.with_own_status(key, bodies[0])
        # Admitted by the API server, perhaps before a newer rule (spec.gateway.access):
        # parsed as stored, the decision reports what the rule would refuse.
        service = GLMService.model_validate(body, context={ADMITTED: True})
        live = rt.own_writes.with_own_scales(namespace,
                                             children(indexes, SERVICE_CHILD_INDEXES, key))
        try:
            _observe_decide_apply(rt, key, body, service, live, indexes)
        except KubeError as exc:
            metrics.RECONCILES.labels("GLMService", "error").inc()
            if namespace_terminating(exc):
                return
            if exc.status == 409:
                rt.wakeups.schedule(key, 1.0)  # someone wrote first; look again at theirs
                return
            if exc.status == 404:
                rt.sweeper.request()  # the index showed something the API server has not
            raise retry_later(key, exc) from exc
        metrics.RECONCILES.labels("GLMService", "ok").inc()


def observe_service(rt: Runtime, key: Key, body: Obj, service: GLMService, live: list[Obj],
                    indexes: Mapping[str, Any], now: datetime) -> ServiceObservation:
    """Everything the decision reads, gathered before it decides: the indexes, the Secret
    names, and the few API reads that cannot be watched. The pure questions of decide/ say
    which of those are due (an activity Lease, the namespace's ModelVersions); nothing is
    read after this returns until the decision is made."""
    namespace, name = key
    uid = body["metadata"]["uid"]
    capabilities = rt.capabilities()
    # Not part of the observation: what the operator knows it applied of the optional
    # children (apply.py), so that one a previous process left behind is pruned.
    rt.optional.discover(rt.kube, uid, namespace, name, served_optional_kinds(capabilities))
    groups = (_live_leader_worker_sets(rt.kube, namespace, name)
              if capabilities.leader_worker_set and _multi_node(body) else [])
    children = ObservedChildren([*live, *groups])
    # Their status is the gateway's answer (decide/gateway.py); they are not watched.
    pools = (_owned(rt.kube.list(*INFERENCE_POOL, namespace, _children_selector(name)), uid)
             if service.spec.inference_gateway
             and INFERENCE_POOL_CRD in capabilities.inference_crds else [])
    activity = (_read_activity(rt.kube, namespace, activity_lease_name(name))
                if long_context_reading_due(service, children, now) else None)
    main_lease = main_pool_reading_due(service, children, now)
    main_activity = (_read_activity(rt.kube, namespace, main_lease)
                     if main_lease is not None else None)
    model_versions = model_versions_of(body, indexes["modelversions"], namespace)
    siblings = (namespace_model_versions(indexes["modelversions"], namespace)
                if namespace_model_versions_needed(service, model_versions, rt.profiles,
                                                   rt.config) else None)
    return ServiceObservation(
        service=service, model_versions=model_versions, live=live, groups=groups,
        capabilities=capabilities,
        secrets=rt.secrets.observed(namespace,
                                    (r.name for r in secret_references(service, rt.config))),
        inference_pools=pools, long_context_activity=activity, main_pool_activity=main_activity,
        analysis=canary_analysis(rt.config, service, now),
        namespace_model_versions=siblings, now=now)


def _observe_decide_apply(rt: Runtime, key: Key, body: Obj, service: GLMService,
                          live: list[Obj], indexes: Mapping[str, Any]) -> None:
    namespace, _ = key
    observation = observe_service(rt, key, body, service, live, indexes, datetime.now(UTC))
    decision = decide_service(observation, rt.config, rt.profiles)
    corrected: list[str] = []
    sync_children(rt.kube, body["metadata"]["uid"], decision.desired, list(observation.live),
                  rt.optional, decision.retained, corrected)
    for deployment, resource_version in decision.scale_to_zero:
        rt.kube.scale("apps/v1", "Deployment", namespace, deployment, 0,
                      resource_version, IDLE_FIELD_MANAGER)
        rt.own_writes.scaled(namespace, deployment, resource_version)
        metrics.CHILD_WRITES.labels(kind="Deployment", action="scale-to-zero").inc()
        log.info("pool %s/%s idle: scaled to zero", namespace, deployment)
    new_status = decision.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    old_status = service.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    if new_status != old_status:
        _write_status(rt, body, new_status, merge_patch(old_status, new_status))
        _count_status_change(old_status, new_status)
    emit(rt.kube, body, [*decision.events, *drift_events(corrected)])
    settling = _groups_settling(list(observation.groups), decision.desired)
    requeue = [t for t in (decision.requeue_after, GROUPS_POLL_SECONDS if settling else None)
               if t is not None]
    if requeue:
        rt.wakeups.schedule(key, min(requeue))
    else:
        rt.wakeups.cancel(key)


def _children_selector(service: str) -> str:
    return f"{SERVICE_LABEL}={label_value(service)},{MANAGED_BY_LABEL}={MANAGED_BY}"


def _owned(found: list[Obj], owner_uid: str) -> list[Obj]:
    return [o for o in found if any(r.get("uid") == owner_uid
                                    for r in o.get("metadata", {}).get("ownerReferences", []))]


def _multi_node(body: Mapping[str, Any]) -> bool:
    accelerator = body.get("spec", {}).get("accelerator") or {}
    return int(accelerator.get("nodes") or 1) > 1


def _live_leader_worker_sets(kube: KubeClient, namespace: str, service: str) -> list[Obj]:
    """The service's LeaderWorkerSets as they are now: their status (ready groups) is what
    Ready, rollouts and autoscaling count, and nothing else reports it."""
    return kube.list(*LEADER_WORKER_SET, namespace,
                     f"{SERVICE_LABEL}={label_value(service)},{MANAGED_BY_LABEL}={MANAGED_BY}")


def _groups_settling(live: list[Obj], desired: list[Obj]) -> bool:
    """A LeaderWorkerSet the operator wants has groups not yet created, updated or ready:
    judged against what this reconcile applied (`desired`), since `live` was read before."""
    by_name = {o["metadata"]["name"]: o for o in live}
    for want in desired:
        if want.get("kind") != LEADER_WORKER_SET[1]:
            continue
        lws = by_name.get(want["metadata"]["name"])
        if lws is None:
            return True  # created just now
        # An autoscaled set's replicas are the autoscaler's: the live spec says how many.
        wanted = want["spec"].get("replicas", lws.get("spec", {}).get("replicas", 1))
        status = lws.get("status") or {}
        if (status.get("readyReplicas", 0) < wanted or status.get("updatedReplicas", 0) < wanted
                or status.get("replicas", 0) != wanted):
            return True
    return False


def _read_activity(kube: KubeClient, namespace: str, lease_name: str) -> ActivityReading:
    lease = kube.get("coordination.k8s.io/v1", "Lease", namespace, lease_name)
    renewed = ((lease or {}).get("spec") or {}).get("renewTime")
    return ActivityReading(datetime.fromisoformat(renewed) if renewed else None)


def _write_status(rt: Runtime, body: Obj, status: Obj, patch: Obj) -> None:
    """Status patch guarded by the resourceVersion it was decided from: rollout state must
    never be written from a stale read (409: a fresh event, or the retry, decides again)."""
    meta = body["metadata"]
    base = meta["resourceVersion"]
    written = rt.kube.patch_merge(
        f"{GROUP}/{VERSION}", "GLMService", meta["namespace"], meta["name"],
        {"metadata": {"resourceVersion": base}, "status": patch}, "status")
    produced = written.get("metadata", {}).get("resourceVersion")
    if produced:
        rt.own_writes.status_written((meta["namespace"], meta["name"]), base, produced, status)


def _count_status_change(old: Obj, new: Obj) -> None:
    for reason in {c["reason"] for c in new.get("conditions", [])
                   if c["type"] == "Planned" and c["status"] == "False"}:
        metrics.PLAN_FAILURES.labels(reason=reason).inc()
    for record in new.get("rolloutHistory") or []:
        if record in (old.get("rolloutHistory") or []):
            continue
        metrics.ROLLOUTS.labels(strategy=record.get("strategy", "surge"),
                                result=record.get("result", "")).inc()
    last = (new.get("rollout") or {}).get("lastAnalysis")
    if last and last != (old.get("rollout") or {}).get("lastAnalysis"):
        metrics.ANALYSIS_CHECKS.labels(verdict=last.get("verdict", "")).inc()
