"""What an inference gateway reads (spec.routing.mode InferenceGateway): an InferencePool and
a picker per version, and the HTTPRoute with the rollout's weights over the pools."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from glm_operator.api.glmservice import FailureMode, GatewayRef
from glm_operator.config import OperatorConfig
from glm_operator.render.inference_pool import (
    GatewayInputs,
    build_http_route,
    build_inference_gateway,
    check_route,
    pool_epp_name,
    pool_name,
)
from glm_operator.render.output import to_yaml
from glm_operator.render.traffic import VersionRoute

from render.golden import check_golden
from render.invariants import problems

# The picker's image pinned here, so the golden does not follow the operator's default.
CONFIG = OperatorConfig.model_validate(
    {"eppImage": "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"})
CANARY = (VersionRoute("glm-4-9b-q4", 90), VersionRoute("glm-4.6-q4", 10))


def gateway_inputs(routes: tuple[VersionRoute, ...] = CANARY, istio: bool = False,
                   **gateway: Any) -> GatewayInputs:
    return GatewayInputs(
        service="chat", namespace="team", gateway=GatewayRef(name="inference-gw", **gateway),
        hostnames=["chat.team.svc.cluster.local"], routes=routes,
        failure_mode=FailureMode.FAIL_CLOSE, config=CONFIG,
        owner={"apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "GLMService",
               "name": "chat", "uid": "u-1", "controller": True, "blockOwnerDeletion": True},
        istio=istio)


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_golden_canary_behind_an_istio_inference_gateway() -> None:
    check_golden("inference-gateway-canary.yaml",
                 to_yaml(build_inference_gateway(gateway_inputs(istio=True,
                                                                namespace="infra",
                                                                section_name="http"))))


def test_invariants_hold_for_the_pickers_and_pools() -> None:
    assert problems(build_inference_gateway(gateway_inputs(istio=True))) == []


def test_a_pool_per_version_selects_its_main_pool_pods_behind_their_gateway_port() -> None:
    pools = of_kind(build_inference_gateway(gateway_inputs()), "InferencePool")
    assert [p["metadata"]["name"] for p in pools] == [pool_name("chat", r.model_version)
                                                      for r in CANARY]
    stable, canary = pools
    assert stable["apiVersion"] == "inference.networking.k8s.io/v1"
    assert stable["spec"]["selector"] == {"matchLabels": {
        "glm-operator.dev/service": "chat", "glm-operator.dev/version": "glm-4-9b-q4",
        "glm-operator.dev/pool": "main"}}
    assert canary["spec"]["selector"]["matchLabels"]["glm-operator.dev/version"] == "glm-4.6-q4"
    assert stable["spec"]["targetPorts"] == [{"number": CONFIG.gateway_port}]
    assert stable["spec"]["appProtocol"] == "http"  # the gateway's HTTP/1.1, as read back
    assert stable["spec"]["endpointPickerRef"] == {
        "group": "", "kind": "Service", "name": pool_epp_name("chat", "glm-4-9b-q4"),
        "port": {"number": 9002}, "failureMode": "FailClose"}
    assert stable["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_each_pool_has_its_own_picker_bound_to_it_by_name() -> None:
    objects = build_inference_gateway(gateway_inputs())
    for route in CANARY:
        pool, epp = pool_name("chat", route.model_version), pool_epp_name("chat",
                                                                         route.model_version)
        [deployment] = [d for d in of_kind(objects, "Deployment")
                        if d["metadata"]["name"] == epp]
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--pool-name") + 1] == pool
        assert args[args.index("--pool-namespace") + 1] == "team"
        # v1.5.0 refuses --endpoint-selector beside --pool-name; the gateways connect over
        # TLS, the picker's default.
        assert "--endpoint-selector" not in args and "--secure-serving=false" not in args
        [service] = [s for s in of_kind(objects, "Service") if s["metadata"]["name"] == epp]
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        assert service["spec"]["selector"]["glm-operator.dev/inference-pool"] == pool
        # Not the version label: that one marks engine pods and workloads.
        assert "glm-operator.dev/version" not in deployment["metadata"]["labels"]
        [role] = [r for r in of_kind(objects, "Role") if r["metadata"]["name"] == epp]
        pools_rule = next(r for r in role["rules"] if r["resources"] == ["inferencepools"])
        assert pools_rule["resourceNames"] == [pool]
        assert pools_rule["verbs"] == ["get", "list", "watch"]
        assert any(r["resources"] == ["inferenceobjectives", "inferencemodelrewrites"]
                   for r in role["rules"])
    # Every picker before its pool, the route last: the route names the pools.
    assert objects[-1]["kind"] == "HTTPRoute"


def test_the_route_pins_by_header_first_then_splits_by_the_rollouts_weights() -> None:
    route = build_http_route(gateway_inputs(namespace="infra", section_name="http"))
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io",
                                            "kind": "Gateway", "name": "inference-gw",
                                            "namespace": "infra", "sectionName": "http"}]
    assert route["spec"]["hostnames"] == ["chat.team.svc.cluster.local"]
    rules = route["spec"]["rules"]
    assert [r["matches"][0]["headers"] for r in rules[:2]] == [
        [{"type": "Exact", "name": "x-glm-version", "value": v.model_version}] for v in CANARY]
    assert [r["backendRefs"][0]["name"] for r in rules[:2]] == [
        pool_name("chat", v.model_version) for v in CANARY]
    assert rules[-1]["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert [(b["kind"], b["name"], b["weight"]) for b in rules[-1]["backendRefs"]] == [
        ("InferencePool", pool_name("chat", v.model_version), v.weight) for v in CANARY]


def test_a_gateway_in_the_services_namespace_is_named_without_one() -> None:
    route = build_http_route(gateway_inputs())
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io",
                                            "kind": "Gateway", "name": "inference-gw"}]


@pytest.mark.parametrize("routes", [(), (VersionRoute("v1", 90),),
                                    (VersionRoute("v1", 101), VersionRoute("v2", 0))])
def test_weights_must_be_percentages_summing_to_100(routes: tuple[VersionRoute, ...]) -> None:
    with pytest.raises(ValueError, match=r"weights|at least one"):
        build_http_route(gateway_inputs(routes))


def test_check_route_refuses_what_the_httproute_crd_would_take() -> None:
    route = build_http_route(gateway_inputs())
    check_route(route)  # the control: what the operator renders passes
    over = copy.deepcopy(route)
    over["spec"]["rules"][-1]["backendRefs"][0]["weight"] = 101
    with pytest.raises(ValueError, match=r"weights must be 0..100 and sum to 100, got \[101, 10\]"):
        check_route(over)
    unknown = copy.deepcopy(route)
    unknown["spec"]["rules"][0]["backendRefs"][0].update(group="", kind="Service")
    with pytest.raises(ValueError, match="is /Service, not an InferencePool"):
        check_route(unknown)


def test_istio_gets_a_tls_rule_for_each_picker_and_no_virtual_service() -> None:
    objects = build_inference_gateway(gateway_inputs(istio=True))
    rules = of_kind(objects, "DestinationRule")
    assert [r["metadata"]["name"] for r in rules] == [pool_epp_name("chat", v.model_version)
                                                      for v in CANARY]
    assert rules[0]["spec"] == {
        "host": f"{pool_epp_name('chat', 'glm-4-9b-q4')}.team.svc.cluster.local",
        "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}}}
    assert not of_kind(objects, "VirtualService")
    # The control: without Istio no DestinationRule at all.
    assert not of_kind(build_inference_gateway(gateway_inputs()), "DestinationRule")
