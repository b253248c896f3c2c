"""The plan of child writes (controllers/apply.py): its order and the reason of each write."""

from __future__ import annotations

from typing import Any

from glm_operator.controllers.apply import (
    OPTIONAL_CHILD_KINDS,
    OptionalChildren,
    Step,
    optional_ref,
    plan_writes,
    served_optional_kinds,
)
from glm_operator.decide.drift import DriftReason, with_intent_hash
from glm_operator.kube.client import KubeError
from glm_operator.render.deployment import INITIAL_REPLICAS_ANNOTATION
from glm_operator.render.inference_pool import HTTP_ROUTE_CRD, INFERENCE_POOL_CRD
from glm_operator.render.service import Capabilities

OWNER = "svc-uid"


def obj(api_version: str, kind: str, name: str, **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns",
            "ownerReferences": [{"uid": OWNER}], **extra.pop("metadata", {})}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": {}, **extra}


def hpa(name: str) -> dict[str, Any]:
    return obj("autoscaling/v2", "HorizontalPodAutoscaler", name)


def scaled_object(name: str) -> dict[str, Any]:
    return obj("keda.sh/v1alpha1", "ScaledObject", name)


def steps(plan: list[Any]) -> list[tuple[Step, str, str]]:
    return [(w.step, w.obj["kind"], w.obj["metadata"]["name"]) for w in plan]


def test_a_switch_to_keda_deletes_the_hpa_before_the_scaled_object_is_applied() -> None:
    old_hpa = with_intent_hash(hpa("pool"))
    plan = plan_writes(OWNER, [scaled_object("pool")], [old_hpa], frozenset(), {})
    assert steps(plan) == [(Step.DELETE, "HorizontalPodAutoscaler", "pool"),
                           (Step.CHECK_OPTIONAL, "ScaledObject", "pool")]
    assert plan[1].why == "not applied yet"


def test_a_switch_from_keda_deletes_the_scaled_object_before_the_hpa_is_applied() -> None:
    known = {optional_ref(scaled_object("pool")): with_intent_hash(scaled_object("pool"))}
    plan = plan_writes(OWNER, [hpa("pool")], [], frozenset(), known)
    assert steps(plan) == [(Step.DELETE_OPTIONAL, "ScaledObject", "pool"),
                           (Step.APPLY, "HorizontalPodAutoscaler", "pool")]
    assert plan[1].why.reason is DriftReason.MISSING  # type: ignore[union-attr]


def test_unchanged_children_plan_no_write() -> None:
    live = with_intent_hash(hpa("pool"))
    known = {optional_ref(scaled_object("other")): with_intent_hash(scaled_object("other"))}
    assert plan_writes(OWNER, [hpa("pool"), scaled_object("other")], [live], frozenset(),
                       known) == []


def test_a_pool_whose_replicas_an_autoscaler_owns_is_created_then_handed_over() -> None:
    pool = obj("apps/v1", "Deployment", "pool",
               metadata={"annotations": {INITIAL_REPLICAS_ANNOTATION: "2"}})
    (write,) = plan_writes(OWNER, [pool], [], frozenset(), {})
    assert write.step is Step.CREATE_HANDED_OVER


def test_retained_and_foreign_children_are_never_deleted() -> None:
    kept, foreign = hpa("kept"), obj("v1", "Service", "theirs", metadata={"ownerReferences": []})
    assert plan_writes(OWNER, [], [kept, foreign], frozenset({("HorizontalPodAutoscaler",
                                                               "kept")}), {}) == []


class ListingKube:
    """Only `list`, by kind: what OptionalChildren.discover reads."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects
        self.calls: list[tuple[str, str, str, str]] = []

    def list(self, api_version: str, kind: str, namespace: str, selector: str
             ) -> list[dict[str, Any]]:
        self.calls.append((api_version, kind, namespace, selector))
        return [o for o in self.objects if (o["apiVersion"], o["kind"]) == (api_version, kind)]


LEASE = ("coordination.k8s.io/v1", "Lease")
VIRTUAL_SERVICE = ("networking.istio.io/v1", "VirtualService")


def test_a_new_process_learns_its_optional_children_once_per_kind_and_prunes_stale_ones(
) -> None:
    stale = obj(*LEASE, "chat-v1-activity")
    foreign = obj(*LEASE, "chat-lookalike", metadata={"ownerReferences": [{"uid": "other"}]})
    kube = ListingKube([stale, foreign])
    children = OptionalChildren()
    children.discover(kube, OWNER, "ns", "chat", frozenset({LEASE}))  # type: ignore[arg-type]
    assert [c[:2] for c in kube.calls] == [LEASE]
    assert "glm-operator.dev/service=chat" in kube.calls[0][3]
    known = children.known(OWNER)
    assert known == {optional_ref(stale): None}  # not the one another owner holds
    plan = plan_writes(OWNER, [], [], frozenset(), known)
    assert steps(plan) == [(Step.DELETE_OPTIONAL, "Lease", "chat-v1-activity")]
    # Control: without the listing the new process would plan nothing for it.
    assert plan_writes(OWNER, [], [], frozenset(), OptionalChildren().known(OWNER)) == []

    # Listed once per kind: a kind served later (Istio installed) is listed then, once.
    children.discover(kube, OWNER, "ns", "chat", frozenset({LEASE}))  # type: ignore[arg-type]
    children.discover(kube, OWNER, "ns", "chat",  # type: ignore[arg-type]
                      frozenset({LEASE, VIRTUAL_SERVICE}))
    assert [c[:2] for c in kube.calls] == [LEASE, VIRTUAL_SERVICE]
    # An owner that is gone is forgotten, listings included.
    children.forget(set())
    children.discover(kube, OWNER, "ns", "chat", frozenset({LEASE}))  # type: ignore[arg-type]
    assert [c[:2] for c in kube.calls] == [LEASE, VIRTUAL_SERVICE, LEASE]


def test_the_kinds_listed_follow_the_served_apis() -> None:
    assert served_optional_kinds(Capabilities()) == {LEASE}
    everything = served_optional_kinds(Capabilities(
        service_monitor=True, istio=True, keda=True, leader_worker_set=True,
        inference_crds=frozenset({INFERENCE_POOL_CRD, HTTP_ROUTE_CRD})))
    assert everything == OPTIONAL_CHILD_KINDS  # no optional kind is never listed


class RefusingKube(ListingKube):
    def list(self, api_version: str, kind: str, namespace: str, selector: str
             ) -> list[dict[str, Any]]:
        if kind == "Lease":
            raise KubeError("leases is forbidden", status=403)
        return super().list(api_version, kind, namespace, selector)


def test_a_kind_it_may_not_list_is_skipped_not_a_failed_reconcile() -> None:
    route = obj(*VIRTUAL_SERVICE, "chat")
    kube = RefusingKube([obj(*LEASE, "chat-v1-activity"), route])
    children = OptionalChildren()
    children.discover(kube, OWNER, "ns", "chat",  # type: ignore[arg-type]
                      frozenset({LEASE, VIRTUAL_SERVICE}))
    assert children.known(OWNER) == {optional_ref(route): None}
    children.discover(kube, OWNER, "ns", "chat",  # type: ignore[arg-type]
                      frozenset({LEASE, VIRTUAL_SERVICE}))
    assert len(kube.calls) == 1  # the refused kind is not asked again until a restart
