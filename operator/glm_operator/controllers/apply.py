"""Writing a reconcile's children: a plan of writes, each with its reason, then its execution.

`plan_writes` is pure: from the children desired, the watched children live and what the
operator remembers of its optional children, it lists every write in the order they must
happen (kubeai's pod plan), and `execute` carries it out. The order, stated once:

  1. optional children no longer desired are deleted: a ScaledObject goes before the HPA
     that replaces it is created (two autoscalers on one Deployment fight);
  2. the optional children desired are checked and applied, except those in
     APPLIED_AFTER_PRUNE;
  3. the watched children are applied where they drifted, with the replica hand-over
     (ownership.py) for pools whose replicas an autoscaler or the gateway owns;
  4. owned watched children neither desired nor retained are deleted;
  5. the APPLIED_AFTER_PRUNE kinds are checked and applied: KEDA's admission webhook refuses
     a ScaledObject for a Deployment that another HPA (ours, before a switch to KEDA) scales.

Optional children are not watched: their CRDs may be missing or come and go (Istio, the
Prometheus Operator, KEDA, LeaderWorkerSet, the Inference Extension's InferencePool and
Gateway API's HTTPRoute; kopf stops the whole operator when a watched resource's CRD is
deleted), and the long-context activity Lease would stream every node's heartbeat. The
operator remembers what it applied (`OptionalChildren`), reads them only when
its intent changed, and reads them again at every resync to undo edits and deletions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from glm_operator.controllers import metrics
from glm_operator.controllers.ownership import (
    created_by_plain_create,
    hand_over_replicas,
    hands_off_replicas,
    replicas_ours_alone,
    retire_create_entry,
    with_initial_replicas,
)
from glm_operator.decide.drift import Drift, DriftReason, drift, with_intent_hash
from glm_operator.kube.client import KubeClient, KubeError
from glm_operator.render.inference_pool import HTTP_ROUTE_CRD, INFERENCE_POOL_CRD
from glm_operator.render.names import MANAGED_BY, label_value
from glm_operator.render.service import Capabilities
from glm_operator.wellknown import MANAGED_BY_LABEL, SERVICE_LABEL

SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")
LEADER_WORKER_SET = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
INFERENCE_POOL = ("inference.networking.k8s.io/v1", "InferencePool")
HTTP_ROUTE = ("gateway.networking.k8s.io/v1", "HTTPRoute")
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")
VIRTUAL_SERVICE = ("networking.istio.io/v1", "VirtualService")
DESTINATION_RULE = ("networking.istio.io/v1", "DestinationRule")
LEASE = ("coordination.k8s.io/v1", "Lease")
OPTIONAL_CHILD_KINDS = frozenset({
    SERVICE_MONITOR,
    VIRTUAL_SERVICE,
    DESTINATION_RULE,
    SCALED_OBJECT,
    LEASE,
    LEADER_WORKER_SET,
    INFERENCE_POOL,
    HTTP_ROUTE,
})
APPLIED_AFTER_PRUNE = frozenset({SCALED_OBJECT})


def served_optional_kinds(capabilities: Capabilities) -> frozenset[tuple[str, str]]:
    """The optional kinds whose API the cluster serves now (a Lease always)."""
    served = {LEASE}
    if capabilities.service_monitor:
        served.add(SERVICE_MONITOR)
    if capabilities.istio:
        served |= {VIRTUAL_SERVICE, DESTINATION_RULE}
    if capabilities.keda:
        served.add(SCALED_OBJECT)
    if capabilities.leader_worker_set:
        served.add(LEADER_WORKER_SET)
    if INFERENCE_POOL_CRD in capabilities.inference_crds:
        served.add(INFERENCE_POOL)
    if HTTP_ROUTE_CRD in capabilities.inference_crds:
        served.add(HTTP_ROUTE)
    return frozenset(served)

log = logging.getLogger("glm_operator")

Obj = dict[str, Any]
Ref = tuple[str, str]  # kind, name
OptionalRef = tuple[str, str, str, str]  # apiVersion, kind, namespace, name


class Step(StrEnum):
    DELETE_OPTIONAL = "delete an optional child no longer desired"
    CHECK_OPTIONAL = "read an optional child, apply it if it drifted"
    CREATE_HANDED_OVER = "create at the starting replicas, then hand replicas over"
    RETIRE_CREATE_ENTRY = "retire an older operator's create entry, then apply"
    HAND_OVER_REPLICAS = "hand replicas over at the live count"
    APPLY = "apply"
    DELETE = "delete an owned child no longer desired"


@dataclass(frozen=True)
class Write:
    step: Step
    obj: Obj  # the desired object; the live one for a hand-over or a delete
    why: Drift | str  # the first difference, or why this write is planned
    live: Obj | None = None  # the live object whose create entry is retired


def _kind(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["apiVersion"], obj["kind"]


def _ref(obj: Mapping[str, Any]) -> Ref:
    return obj["kind"], obj["metadata"]["name"]


def optional_ref(obj: Mapping[str, Any]) -> OptionalRef:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]


class OptionalChildren:
    """Optional children as last applied or seen holding the intent: owner uid -> ref ->
    object (None: known, to be read again)."""

    def __init__(self) -> None:
        self._applied: dict[str, dict[OptionalRef, Obj | None]] = {}
        # owner uid -> the optional kinds listed for it since start (discover)
        self._listed: dict[str, set[tuple[str, str]]] = {}
        self._lock = threading.Lock()

    def known(self, owner_uid: str) -> dict[OptionalRef, Obj | None]:
        with self._lock:
            return dict(self._applied.get(owner_uid, {}))

    def applied(self, owner_uid: str, obj: Obj) -> None:
        with self._lock:
            self._applied.setdefault(owner_uid, {})[optional_ref(obj)] = obj

    def deleted(self, owner_uid: str, ref: OptionalRef) -> None:
        with self._lock:
            self._applied.get(owner_uid, {}).pop(ref, None)

    def discover(self, kube: KubeClient, owner_uid: str, namespace: str, service: str,
                 kinds: frozenset[tuple[str, str]]) -> None:
        """Once per service and optional kind after start (`kinds`: those served now): the
        children of that kind it owns join what the operator knows it applied. One the
        previous operator process applied and the intent no longer holds (a version's Lease,
        ScaledObject or group after a rollout it did not finish, a VirtualService after a
        switch to the router, a scaler switch) would otherwise never be pruned: a stale
        ScaledObject's HPA would fight ours, a stale Lease or route would linger."""
        with self._lock:
            listed = self._listed.setdefault(owner_uid, set())
            todo = sorted(kinds - listed)
        if not todo:
            return
        selector = f"{SERVICE_LABEL}={label_value(service)},{MANAGED_BY_LABEL}={MANAGED_BY}"
        found: list[Obj] = []
        for kind in todo:
            try:
                found += kube.list(*kind, namespace, selector)
            except KubeError as exc:
                # The reconcile goes on: only what a previous process left stays unpruned.
                # Not asked again until the next start (the chart grants list).
                log.warning("cannot list %s in %s (%s): one the previous operator process "
                            "left behind is not pruned; grant list on it", kind[1],
                            namespace, exc)
        with self._lock:
            known = self._applied.setdefault(owner_uid, {})
            for obj in found:
                if any(r.get("uid") == owner_uid
                       for r in obj["metadata"].get("ownerReferences", [])):
                    known.setdefault(optional_ref(obj), None)
            self._listed.setdefault(owner_uid, set()).update(todo)

    def forget(self, live_owners: set[str]) -> None:
        """Resync: the next reconciles read the optional children again (to undo edits and
        deletions), and owners that are gone are dropped."""
        with self._lock:
            for uid in list(self._applied):
                if uid in live_owners:
                    self._applied[uid] = dict.fromkeys(self._applied[uid])
                else:
                    del self._applied[uid]
            for uid in set(self._listed) - live_owners:
                del self._listed[uid]


def plan_writes(owner_uid: str, desired: list[Obj], live: list[Obj],
                retained: frozenset[Ref], known: Mapping[OptionalRef, Obj | None]) -> list[Write]:
    """Every write that brings the children to `desired`, in order (see the module's
    docstring); `known`: the owner's optional children as last applied."""
    desired = [with_intent_hash(o) for o in desired]
    optional = [o for o in desired if _kind(o) in OPTIONAL_CHILD_KINDS]
    watched = [o for o in desired if _kind(o) not in OPTIONAL_CHILD_KINDS]
    wanted_optional = {optional_ref(o) for o in optional}
    plan = [Write(Step.DELETE_OPTIONAL, _optional_stub(ref), "no longer desired")
            for ref in known if ref not in wanted_optional]
    plan += _check_optional([o for o in optional if _kind(o) not in APPLIED_AFTER_PRUNE], known)
    live_by_ref = {_ref(o): o for o in live}
    for obj in watched:
        plan += _watched_writes(obj, live_by_ref.get(_ref(obj)))
    wanted = {_ref(o) for o in watched} | retained
    for obj in live:
        meta = obj.get("metadata", {})
        owned = any(r.get("uid") == owner_uid for r in meta.get("ownerReferences", []))
        if owned and _ref(obj) not in wanted and not meta.get("deletionTimestamp"):
            plan.append(Write(Step.DELETE, obj, "owned, neither desired nor retained"))
    return plan + _check_optional([o for o in optional if _kind(o) in APPLIED_AFTER_PRUNE],
                                  known)


def _optional_stub(ref: OptionalRef) -> Obj:
    api_version, kind, namespace, name = ref
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"namespace": namespace, "name": name}}


def _check_optional(desired: list[Obj], known: Mapping[OptionalRef, Obj | None]) -> list[Write]:
    writes = []
    for obj in desired:
        last = known.get(optional_ref(obj))
        if last == obj:
            continue  # unchanged intent, and it held when last looked at
        why = "not applied yet" if optional_ref(obj) not in known else (
            "not read since the last resync" if last is None else "intent changed")
        writes.append(Write(Step.CHECK_OPTIONAL, obj, why))
    return writes


def _watched_writes(obj: Obj, current: Obj | None) -> list[Write]:
    if hands_off_replicas(obj):
        if current is None:
            # replicas belong to the HPA or the gateway, not to our applied intent.
            return [Write(Step.CREATE_HANDED_OVER, obj, Drift(DriftReason.MISSING, "."))]
        if created_by_plain_create(current):
            return [Write(Step.RETIRE_CREATE_ENTRY, obj,
                          Drift(DriftReason.INTENT_CHANGED, "metadata.managedFields"), current)]
    writes = []
    if hands_off_replicas(obj) and current is not None and replicas_ours_alone(current):
        # A pool whose size a rollout set is handed to its autoscaler: another manager takes
        # replicas at the live count first, else dropping the field from our apply would
        # reset the Deployment to 1 replica.
        writes.append(Write(Step.HAND_OVER_REPLICAS, current, "replicas are ours alone"))
    difference = drift(obj, current)
    if difference is not None:
        writes.append(Write(Step.APPLY, obj, difference))
    return writes


def execute(kube: KubeClient, owner_uid: str, plan: list[Write], optional: OptionalChildren,
            corrected: list[str] | None = None) -> int:
    """Carry out the plan; return the writes made. Children restored after someone else's
    edit are named in `corrected`."""
    writes = 0
    for write in plan:
        obj = write.obj
        if write.step is Step.DELETE_OPTIONAL or write.step is Step.DELETE:
            meta = obj["metadata"]
            log.info("deleting %s %s/%s (%s)", obj["kind"], meta.get("namespace"), meta["name"],
                     write.why)
            kube.delete(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
            metrics.CHILD_WRITES.labels(kind=obj["kind"], action="delete").inc()
            if write.step is Step.DELETE_OPTIONAL:
                optional.deleted(owner_uid, optional_ref(obj))
            writes += 1
        elif write.step is Step.CHECK_OPTIONAL:
            meta = obj["metadata"]
            difference = drift(obj, kube.get(obj["apiVersion"], obj["kind"], meta["namespace"],
                                             meta["name"]))
            if difference is not None:
                _apply(kube, obj, difference, corrected)
                writes += 1
            optional.applied(owner_uid, obj)
        elif write.step is Step.CREATE_HANDED_OVER:
            # Create with the starting count, then let another manager co-own it: later
            # applies (which omit replicas) then never reset it, and every other field stays
            # ours alone, so a field dropped from the intent is really removed.
            created = with_initial_replicas(obj)
            _apply(kube, created, _drift(write))
            hand_over_replicas(kube, created)
            writes += 2
        elif write.step is Step.RETIRE_CREATE_ENTRY:
            assert write.live is not None
            writes += retire_create_entry(kube, write.live)
            _apply(kube, obj, _drift(write))
            writes += 1
        elif write.step is Step.HAND_OVER_REPLICAS:
            hand_over_replicas(kube, obj)
            writes += 1
        else:
            _apply(kube, obj, _drift(write), corrected)
            writes += 1
    return writes


def _drift(write: Write) -> Drift:
    assert isinstance(write.why, Drift)
    return write.why


def _apply(kube: KubeClient, obj: Obj, why: Drift, corrected: list[str] | None = None) -> None:
    """Server-side apply, saying why: the log has the first differing field, the metrics
    count by reason, and an edit by someone else is reported to the owner's Events."""
    meta = obj["metadata"]
    log.info("applying %s %s/%s (%s)", obj["kind"], meta.get("namespace"), meta["name"], why)
    kube.apply(obj)
    metrics.CHILD_WRITES.labels(kind=obj["kind"], action="apply").inc()
    metrics.CHILD_DRIFT.labels(kind=obj["kind"], reason=why.reason.value).inc()
    if why.reason is DriftReason.LIVE_CHANGED and corrected is not None:
        corrected.append(f"{obj['kind']} {meta['name']}: {why.path}")


def sync_children(kube: KubeClient, owner_uid: str, desired: list[Obj], live: list[Obj],
                  optional: OptionalChildren, retained: frozenset[Ref] = frozenset(),
                  corrected: list[str] | None = None) -> int:
    """Plan the writes and execute them; return the writes made."""
    plan = plan_writes(owner_uid, desired, live, retained, optional.known(owner_uid))
    return execute(kube, owner_uid, plan, optional, corrected)


def drift_events(corrected: list[str]) -> list[tuple[str, str, str]]:
    """One Event per reconcile that undid someone else's edits to the children."""
    if not corrected:
        return []
    shown = "; ".join(corrected[:5]) + (f"; and {len(corrected) - 5} more"
                                        if len(corrected) > 5 else "")
    return [("Warning", "DriftCorrected", f"restored what the operator sets: {shown}")]

