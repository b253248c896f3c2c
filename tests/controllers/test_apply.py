"""The plan of child writes (controllers/apply.py): its order and the reason of each write."""

from __future__ import annotations

from typing import Any

from glm_operator.controllers.apply import Step, optional_ref, plan_writes
from glm_operator.decide.drift import DriftReason, with_intent_hash
from glm_operator.render.deployment import INITIAL_REPLICAS_ANNOTATION

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
