"""decide_service with spec.routing.mode InferenceGateway: the pools and the route follow the
rollout's weights as the VirtualService does, Istio's VirtualService is not written beside
them, missing CRDs are a condition, and the gateway's word on each pool is GatewayAccepted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from glm_operator.api import AnalysisResult
from glm_operator.controllers.apply import Step, optional_ref, plan_writes
from glm_operator.decide.gateway import GATEWAY_POLL_SECONDS
from glm_operator.render.inference_pool import INFERENCE_GATEWAY_CRDS, pool_name
from glm_operator.render.service import Capabilities
from test_service_state import (  # tests/controllers is on sys.path
    as_ready,
    cond,
    decide,
    dump,
    load,
    ready_mv,
    settled_on,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GATEWAY = {"mode": "InferenceGateway", "gatewayRef": {"name": "inference-gw",
                                                       "namespace": "infra"}}
BOTH = Capabilities(istio=True, inference_crds=frozenset(INFERENCE_GATEWAY_CRDS))


def has_condition(decision: Any, type_: str) -> bool:
    return any(c.type == type_ for c in decision.status.conditions)


def by_version(objs: list[dict[str, Any]], version: str) -> list[dict[str, Any]]:
    """The version's engine Deployments (not the pickers)."""
    return [o for o in objs if o["kind"] == "Deployment"
            and o["metadata"]["labels"].get("glm-operator.dev/version") == version]


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def route_weights(objs: list[dict[str, Any]]) -> dict[str, int]:
    [route] = of_kind(objs, "HTTPRoute")
    return {b["name"]: b["weight"] for b in route["spec"]["rules"][-1]["backendRefs"]}


def canary_service() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any],
                              list[dict[str, Any]]]:
    mv, svc = load("cpu-llamacpp")
    v1, v2 = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"].update(modelVersion="v1", replicas=4, routing=dict(GATEWAY))
    svc, live = settled_on(svc, v1, BOTH)
    svc["spec"]["modelVersion"] = "v2"
    svc["spec"]["rollout"] = {"strategy": "canary", "steps": [25, 50], "interval": "30s",
                              "analysis": {"failureThreshold": 1}}
    return svc, v1, v2, live


def test_a_canary_drives_the_route_weights_and_a_failing_one_loses_its_pool() -> None:
    svc, v1, v2, live = canary_service()
    p1, p2 = pool_name("glm-cpu", "v1"), pool_name("glm-cpu", "v2")
    start = decide(svc, [v1, v2], live, now=T0, capabilities=BOTH)
    assert route_weights(start.desired) == {p1: 100, p2: 0}
    assert [p["metadata"]["name"] for p in of_kind(start.desired, "InferencePool")] == [p1, p2]
    # One writer of the weights: no VirtualService, no version DestinationRule, no router.
    assert not of_kind(start.desired, "VirtualService")
    assert {r["metadata"]["name"] for r in of_kind(start.desired, "DestinationRule")} == {
        "glm-cpu-epp-v1", "glm-cpu-epp-v2"}  # the pickers' TLS, for Istio's gateway
    assert not [d for d in of_kind(start.desired, "Deployment")
                if d["metadata"]["name"] == "glm-cpu-router"]

    svc["status"] = dump(start)
    [canary] = by_version(start.desired, "v2")
    live2 = [*live, as_ready(canary, 1)]
    step = decide(svc, [v1, v2], live2, now=T0 + timedelta(seconds=1), capabilities=BOTH)
    assert route_weights(step.desired) == {p1: 75, p2: 25}
    split = cond(step, "TrafficSplit")
    assert (split.status, split.reason) == ("True", "InferenceGateway")
    assert "Gateway infra/inference-gw" in split.message
    # No pool status yet: the gateway has not answered, the pools are read again soon.
    accepted = cond(step, "GatewayAccepted")
    assert (accepted.status, accepted.reason) == ("Unknown", "Pending")
    assert step.requeue_after == GATEWAY_POLL_SECONDS

    svc["status"] = dump(step)
    bad = AnalysisResult(time=T0, verdict="Failed", message="error rate 40% > 1%",
                         failed_gates=["error rate 40% > 1%"])
    rolled = decide(svc, [v1, v2], live2, now=T0 + timedelta(seconds=32), capabilities=BOTH,
                    analysis=bad)
    assert route_weights(rolled.desired) == {p1: 100}
    assert [p["metadata"]["name"] for p in of_kind(rolled.desired, "InferencePool")] == [p1]
    assert cond(rolled, "CanaryProgressing").reason == "RolledBack"
    # The canary's pool, applied at the step, is deleted with the rolled-back intent.
    known = {optional_ref(o): o for o in step.desired
             if o["kind"] in ("InferencePool", "HTTPRoute")}
    plan = plan_writes("uid", rolled.desired, [], frozenset(), known)
    deletes = [(w.obj["kind"], w.obj["metadata"]["name"]) for w in plan
               if w.step is Step.DELETE_OPTIONAL]
    assert ("InferencePool", p2) in deletes and ("InferencePool", p1) not in deletes


def test_istio_alone_still_gets_its_virtual_service() -> None:
    # The control of the test above: the same canary in mode Service writes the VirtualService.
    svc, v1, v2, live = canary_service()
    svc["spec"]["routing"] = {"mode": "Service"}
    start = decide(svc, [v1, v2], live, now=T0, capabilities=BOTH)
    assert of_kind(start.desired, "VirtualService")
    assert not of_kind(start.desired, "HTTPRoute") and not of_kind(start.desired,
                                                                    "InferencePool")
    # Set while the service was settled in mode InferenceGateway, removed now.
    assert not has_condition(start, "GatewayAccepted")


def test_without_the_crds_nothing_is_written_for_the_gateway_and_a_condition_says_so() -> None:
    svc, v1, v2, live = canary_service()
    some = Capabilities(istio=True, inference_crds=frozenset(INFERENCE_GATEWAY_CRDS[1:]))
    start = decide(svc, [v1, v2], live, now=T0, capabilities=some)
    for kind in ("InferencePool", "HTTPRoute", "VirtualService"):
        assert not of_kind(start.desired, kind), kind
    split = cond(start, "TrafficSplit")
    assert (split.status, split.reason) == ("False", "InferenceGatewayCRDsMissing")
    assert "inferencepools.inference.networking.k8s.io" in split.message
    assert "httproutes" not in split.message  # only what is missing is named
    assert not has_condition(start, "GatewayAccepted")


def pool_status(name: str, gateway: str, **conditions: tuple[str, str, str]) -> dict[str, Any]:
    namespace, gw = gateway.split("/")
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": "default"},
            "status": {"parents": [{
                "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                              "name": gw, "namespace": namespace},
                "conditions": [{"type": t, "status": s, "reason": r, "message": m}
                               for t, (s, r, m) in conditions.items()]}]}}


def settled_gateway_service() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    mv, svc = load("cpu-llamacpp")
    v1 = ready_mv(mv, "v1")
    svc["spec"].update(modelVersion="v1", routing=dict(GATEWAY))
    svc, live = settled_on(svc, v1, BOTH)
    return svc, live, v1


def decide_with_pools(pools: list[dict[str, Any]]) -> Any:
    from glm_operator.api import GLMService
    from glm_operator.decide.observed import ServiceObservation
    from glm_operator.decide.service import decide_service
    from test_service_state import CONFIG

    svc, live, v1 = settled_gateway_service()
    return decide_service(ServiceObservation(
        service=GLMService.model_validate(svc), model_versions={"v1": v1}, live=live,
        capabilities=BOTH, now=T0, inference_pools=pools), CONFIG, CONFIG.profiles)


def test_a_pool_the_gateway_accepted_is_gateway_accepted() -> None:
    pool = pool_status(pool_name("glm-cpu", "v1"), "infra/inference-gw",
                       Accepted=("True", "Accepted", ""),
                       ResolvedRefs=("True", "ResolvedRefs", ""))
    decision = decide_with_pools([pool])
    accepted = cond(decision, "GatewayAccepted")
    assert (accepted.status, accepted.reason) == ("True", "Accepted")
    assert decision.requeue_after is None  # nothing to wait for


def test_a_pool_the_gateway_refused_carries_the_gateways_own_message() -> None:
    pool = pool_status(pool_name("glm-cpu", "v1"), "infra/inference-gw",
                       Accepted=("True", "Accepted", ""),
                       ResolvedRefs=("False", "InvalidExtensionRef",
                                     "Service default/glm-cpu-epp-v1 not found"))
    accepted = cond(decide_with_pools([pool]), "GatewayAccepted")
    assert (accepted.status, accepted.reason) == ("False", "InvalidExtensionRef")
    assert "Service default/glm-cpu-epp-v1 not found" in accepted.message
    assert "Gateway infra/inference-gw says ResolvedRefs=False" in accepted.message


def test_another_gateways_acceptance_does_not_count() -> None:
    pool = pool_status(pool_name("glm-cpu", "v1"), "infra/other-gw",
                       Accepted=("True", "Accepted", ""),
                       ResolvedRefs=("True", "ResolvedRefs", ""))
    decision = decide_with_pools([pool])
    assert cond(decision, "GatewayAccepted").status == "Unknown"
    assert decision.requeue_after == GATEWAY_POLL_SECONDS
