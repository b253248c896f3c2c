"""Who owns spec.replicas of a child: the managedFields surgery of the replica hand-over.

A pool sized by an autoscaler (an HPA, KEDA, or the gateway waking the long-context pool) is
created at its starting count, then another field manager (`INITIAL_FIELD_MANAGER`) co-owns
spec.replicas, so the operator's later applies, which omit replicas, never reset it, and
every other field stays the operator's alone (a field dropped from the intent is really
removed). Objects an older operator made with a plain create are brought to the same
ownership once (`retire_create_entry`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from glm_operator.controllers import metrics
from glm_operator.kube.client import FIELD_MANAGER, KubeClient
from glm_operator.kube.field_sets import merged_field_sets, without_replicas
from glm_operator.render.deployment import INITIAL_REPLICAS_ANNOTATION

INITIAL_FIELD_MANAGER = "glm-operator-initial-replicas"

log = logging.getLogger("glm_operator")

Obj = dict[str, Any]


def replicas_owners(entries: list[Obj]) -> list[Obj]:
    """Of managedFields, what a reconcile reads: who owns spec.replicas, and the create-time
    entry of an older operator's plain create (`created_by_plain_create`) even when an
    autoscaler has since taken replicas from it."""
    kept: list[Obj] = []
    for entry in entries:
        marker = {"manager": entry.get("manager"), "operation": entry.get("operation")}
        if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}):
            kept.append({**marker, "fieldsV1": {"f:spec": {"f:replicas": {}}}})
        elif marker == {"manager": INITIAL_FIELD_MANAGER, "operation": "Update"}:
            kept.append({**marker, "fieldsV1": {}})
    return kept


def hands_off_replicas(desired: Mapping[str, Any]) -> bool:
    """The intent leaves replicas to another manager (it carries the starting count)."""
    return INITIAL_REPLICAS_ANNOTATION in desired["metadata"].get("annotations", {})


def replicas_ours_alone(live: Mapping[str, Any]) -> bool:
    """Whether our own applied intent is the only owner of spec.replicas of this object."""
    owners = {(entry.get("manager"), entry.get("operation"))
              for entry in live.get("metadata", {}).get("managedFields") or []
              if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})}
    return owners == {(FIELD_MANAGER, "Apply")}


def created_by_plain_create(live: Mapping[str, Any]) -> bool:
    """Whether an older operator made this object with a plain create under the
    initial-replicas manager: that left an `Update` entry owning every field the object was
    created with, so a field later dropped from the intent would stay, co-owned by it."""
    return any(_is_create_entry(entry)
               for entry in live.get("metadata", {}).get("managedFields") or [])


def hand_over_replicas(kube: KubeClient, obj: Mapping[str, Any]) -> None:
    """The initial-replicas manager applies replicas alone, at the object's count."""
    kube.apply(replicas_only(obj), field_manager=INITIAL_FIELD_MANAGER)
    metrics.CHILD_WRITES.labels(kind=obj["kind"], action="handover").inc()


def retire_create_entry(kube: KubeClient, live: Mapping[str, Any]) -> int:
    """Bring an object from the plain-create path to today's ownership, once, the way
    kubectl's client-side-apply upgrade does: the initial-replicas manager applies replicas
    alone (at the live count, so nothing rescales), and the fields its create-time `Update`
    entry still owns move into the operator's own apply entry. The operator's next apply then
    drops what its intent no longer sets, as for any object it created itself. A patch that
    sets managedFields replaces the list (the API's documented way to edit ownership); the
    resourceVersion guards it against a concurrent write."""
    meta = live["metadata"]
    applied = kube.apply(replicas_only(live), field_manager=INITIAL_FIELD_MANAGER)
    entries = applied.get("metadata", {}).get("managedFields") or []
    moved = [entry for entry in entries if _is_create_entry(entry)]
    kept = [entry for entry in entries if not _is_create_entry(entry)]
    ours = next((entry for entry in kept if entry.get("manager") == FIELD_MANAGER
                 and entry.get("operation") == "Apply" and not entry.get("subresource")), None)
    if ours is None:
        ours = {"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": live["apiVersion"],
                "time": moved[0].get("time") if moved else None, "fieldsType": "FieldsV1",
                "fieldsV1": {}}
        kept.append(ours)
    for entry in moved:
        ours["fieldsV1"] = merged_field_sets(ours.get("fieldsV1") or {},
                                             without_replicas(entry.get("fieldsV1") or {}))
    kube.patch_merge(live["apiVersion"], live["kind"], meta.get("namespace"), meta["name"],
                     {"metadata": {"resourceVersion": applied["metadata"]["resourceVersion"],
                                   "managedFields": kept}})
    log.info("%s %s/%s: the fields an older operator's create owned are now the operator's "
             "applied fields (replicas stay the autoscaler's)", live["kind"],
             meta.get("namespace"), meta["name"])
    metrics.CHILD_WRITES.labels(kind=live["kind"], action="handover").inc()
    return 2


def _is_create_entry(entry: Mapping[str, Any]) -> bool:
    return entry.get("manager") == INITIAL_FIELD_MANAGER and entry.get("operation") == "Update"


def replicas_only(live: Mapping[str, Any]) -> Obj:
    meta = live["metadata"]
    return {"apiVersion": live["apiVersion"], "kind": live["kind"],
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "spec": {"replicas": int(live.get("spec", {}).get("replicas") or 0)}}


def with_initial_replicas(obj: Mapping[str, Any]) -> Obj:
    created = {**obj, "spec": {**obj["spec"]}}
    created["spec"]["replicas"] = int(obj["metadata"]["annotations"][INITIAL_REPLICAS_ANNOTATION])
    return created
