"""spec.routing.mode EndpointPicker: the router, the endpoint picker and the route table
(render/routing.py), and scale from zero of the main pool (its activity Lease, the HPA floor)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import yaml
from glm_operator.gateway.config import add_arguments
from glm_operator.gateway.flags import ROUTER_FLAGS
from glm_operator.render.names import label_value
from glm_operator.render.output import to_yaml
from glm_operator.render.routing import (
    LongContextRoute,
    RouteEntry,
    endpoint_picker_config,
    routes_document,
)
from glm_operator.render.service import Capabilities, render_service
from glm_operator.router import config as router_config
from glm_operator.router import table as router_table

from render.cases import inputs, model_version, service
from render.golden import check_golden
from render.invariants import problems

SCALE_FROM_ZERO = {"minReplicas": 0, "maxReplicas": 4, "targets": {"queueLength": 4}}
ROUTING_OBJECTS = {("ConfigMap", "chat-routes"), ("ConfigMap", "chat-epp"),
                   ("Deployment", "chat-epp"), ("Service", "chat-epp"),
                   ("ServiceAccount", "chat-epp"), ("Role", "chat-epp"),
                   ("RoleBinding", "chat-epp"), ("Deployment", "chat-router"),
                   ("ServiceAccount", "chat-router"), ("Role", "chat-router"),
                   ("RoleBinding", "chat-router"), ("PodDisruptionBudget", "chat-router"),
                   ("Service", "chat-engines")}


def rendered(capabilities: Capabilities | None = None, **spec: Any) -> list[dict[str, Any]]:
    svc = service("llamacpp", "a100x2", **spec)
    return render_service(inputs(svc, model_version("gguf"), capabilities=capabilities))


def picker_service(**spec: Any) -> list[dict[str, Any]]:
    """An autoscaled service that scales from zero, with a long-context pool."""
    return rendered(Capabilities(service_monitor=True),
                    routing={"mode": "EndpointPicker", "idleSeconds": 300,
                             "failureMode": "FailClose", "routerReplicas": 3,
                             "maxWaitingRequests": 64},
                    autoscaling=SCALE_FROM_ZERO,
                    longContext={"enabled": True, "contextLength": 131072, "maxReplicas": 2},
                    **spec)


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def refs(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                if c["name"] == name)


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_golden_endpoint_picker_with_scale_from_zero() -> None:
    check_golden("routing-llamacpp-a100x2.yaml", to_yaml(picker_service()))


def test_invariants_hold_with_the_router_and_the_picker() -> None:
    assert problems(picker_service()) == []
    assert problems(rendered(routing={"mode": "EndpointPicker"}, replicas=3)) == []


def test_mode_service_renders_none_of_the_routing_objects() -> None:
    # The control of every test here: the default mode is the Service, as before.
    for objects in (rendered(replicas=2), rendered(routing={"mode": "Service"}, replicas=2)):
        assert not refs(objects) & ROUTING_OBJECTS
        main = find(objects, "Service", "chat")
        assert main["spec"]["selector"] == {"glm-operator.dev/service": "chat",
                                            "glm-operator.dev/pool": "main"}
        assert not [o for o in objects if o["kind"] == "Lease"]


def test_endpoint_picker_renders_the_contracts_objects_and_moves_the_service() -> None:
    objects = picker_service()
    assert refs(objects) >= ROUTING_OBJECTS
    client = find(objects, "Service", "chat")
    assert client["spec"]["selector"] == {"glm-operator.dev/service": "chat",
                                          "app.kubernetes.io/component": "router"}
    router = find(objects, "Deployment", "chat-router")
    assert router["spec"]["template"]["metadata"]["labels"].items() >= \
        client["spec"]["selector"].items()
    assert router["spec"]["replicas"] == 3
    # The engine pods keep a Service, the one the ServiceMonitor scrapes (component endpoint).
    engines = find(objects, "Service", "chat-engines")
    assert engines["spec"]["selector"] == {"glm-operator.dev/service": "chat",
                                           "glm-operator.dev/pool": "main"}
    monitor = find(objects, "ServiceMonitor", "chat")["spec"]["selector"]["matchLabels"]
    assert engines["metadata"]["labels"].items() >= monitor.items()
    assert not client["metadata"]["labels"].items() >= monitor.items()
    for obj in objects:
        if (obj["kind"], obj["metadata"]["name"]) in ROUTING_OBJECTS:
            assert obj["metadata"]["ownerReferences"][0]["kind"] == "GLMService"


def test_the_router_runs_the_operator_image_with_the_contracts_flags() -> None:
    objects = picker_service()
    router = container(find(objects, "Deployment", "chat-router"), "router")
    gateway = container(find(objects, "Deployment", "chat-glm4-9b-q4"), "gateway")
    assert router["image"] == gateway["image"]
    args = router["args"]
    # `glm-operator router`; `gateway --router`, its old name, is no longer rendered.
    assert args[0] == "router" and "--router" not in args
    assert option(args, "--routes-configmap") == "chat-routes"
    assert option(args, "--picker-address") == "chat-epp.models.svc.cluster.local:9002"
    assert option(args, "--picker-failure-mode") == "closed"  # FailClose
    assert option(args, "--max-waiting") == "64"
    assert option(args, "--pod-port") == "8080"
    # What the router's own parser makes of them (router/config.py).
    parser = argparse.ArgumentParser()
    add_arguments(parser, ROUTER_FLAGS)
    parsed = router_config.from_args(parser.parse_args(args[1:]))
    assert (parsed.service_name, parsed.namespace, parsed.picker_failure_mode,
            parsed.max_waiting, parsed.picker_timeout_seconds) == ("chat", "models", "closed",
                                                                   64, 0.1)
    assert router["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert router["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert router["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}


def test_a_keyed_services_router_mounts_the_pods_keys_and_an_open_ones_none() -> None:
    """The router checks the keys the pods' gateways check, before a wake: the same Secret,
    mounted read-only at the same path as a directory (rotations reach it), passed as
    --api-keys, read back by the router's own parser. An Open service's router gets neither,
    and a mounted Secret adds no RBAC rule."""
    objects = picker_service()
    deployment = find(objects, "Deployment", "chat-router")
    router = container(deployment, "router")
    gateway = container(find(objects, "Deployment", "chat-glm4-9b-q4"), "gateway")
    pod = deployment["spec"]["template"]["spec"]
    engine_pod = find(objects, "Deployment", "chat-glm4-9b-q4")["spec"]["template"]["spec"]
    keys_mount = next(m for m in gateway["volumeMounts"] if m["name"] == "api-keys")
    assert keys_mount in router["volumeMounts"] and keys_mount["readOnly"]
    assert "subPath" not in keys_mount
    keys_volume = next(v for v in engine_pod["volumes"] if v["name"] == "api-keys")
    assert keys_volume in pod["volumes"]
    assert keys_volume["secret"]["secretName"] == "chat-keys"
    assert option(router["args"], "--api-keys") == option(gateway["args"], "--api-keys") \
        == keys_mount["mountPath"]
    parser = argparse.ArgumentParser()
    add_arguments(parser, ROUTER_FLAGS)
    parsed = router_config.from_args(parser.parse_args(router["args"][1:]))
    assert str(parsed.api_keys_path) == keys_mount["mountPath"]
    assert not any("secrets" in rule["resources"]
                   for rule in find(objects, "Role", "chat-router")["rules"])

    open_objects = picker_service(gateway={"access": "Open"})
    open_deployment = find(open_objects, "Deployment", "chat-router")
    open_router = container(open_deployment, "router")
    assert "--api-keys" not in open_router["args"]
    assert [m["name"] for m in open_router["volumeMounts"]] == ["tmp"]
    assert [v["name"] for v in open_deployment["spec"]["template"]["spec"]["volumes"]] \
        == ["tmp"]
    parsed = router_config.from_args(parser.parse_args(open_router["args"][1:]))
    assert parsed.api_keys_path is None
    assert problems(open_objects) == []


def test_fail_open_is_the_default() -> None:
    objects = rendered(routing={"mode": "EndpointPicker"}, replicas=2)
    args = container(find(objects, "Deployment", "chat-router"), "router")["args"]
    assert option(args, "--picker-failure-mode") == "open"


def test_the_route_table_is_what_the_router_parses() -> None:
    objects = picker_service()
    text = find(objects, "ConfigMap", "chat-routes")["data"]["routes.json"]
    assert json.loads(text) == {
        "versions": [{"name": "glm4-9b-q4", "weight": 100, "deployment": "chat-glm4-9b-q4",
                      "minReplicas": 0, "wakeTimeoutSeconds": 360.0,
                      "activityLease": "chat-glm4-9b-q4-activity"}],
        "mainContextTokens": 32768,
        "longContext": {"url": "http://chat-lc.models.svc.cluster.local:8080",
                        "contextTokens": 131072,
                        "deployments": {"glm4-9b-q4": "chat-glm4-9b-q4-lc"},
                        "minReplicas": 0, "wakeTimeoutSeconds": 360.0,
                        "activityLease": "chat-lc"},
    }
    table = router_table.parse(text)
    assert [v.name for v in table.versions] == ["glm4-9b-q4"]
    assert table.versions[0].activity_lease == "chat-glm4-9b-q4-activity"
    assert table.long_context is not None


def test_without_scale_from_zero_or_long_context_the_table_says_so() -> None:
    objects = rendered(routing={"mode": "EndpointPicker"}, replicas=3)
    table = json.loads(find(objects, "ConfigMap", "chat-routes")["data"]["routes.json"])
    assert table["versions"][0]["minReplicas"] == 3
    assert table["versions"][0]["activityLease"] is None
    assert table["longContext"] is None


def test_route_weights_must_sum_to_100() -> None:
    entry = RouteEntry("v1", 60, "chat-v1", 1, 300.0, None)
    with pytest.raises(ValueError, match="sum to 100"):
        routes_document([entry], 8192, None)
    both = routes_document([entry, RouteEntry("v2", 40, "chat-v2", 1, 300.0, None)], 8192, None)
    assert [v["weight"] for v in both["versions"]] == [60, 40]


def test_the_picker_selects_the_main_pools_engine_pods_and_scores_on_gateway_metrics() -> None:
    objects = picker_service()
    epp = find(objects, "Deployment", "chat-epp")
    c = container(epp, "epp")
    assert c["image"] == "ghcr.io/glm-operator/endpoint-picker:0.1.0"  # our build, our registry
    args = c["args"]
    assert option(args, "--endpoint-selector") == \
        "glm-operator.dev/service=chat,glm-operator.dev/pool=main"
    assert option(args, "--endpoint-target-ports") == "8080"
    assert option(args, "--config-file") == "/etc/epp/config.yaml"
    assert option(args, "--pool-namespace") == "models"
    assert "--pool-name" not in args  # v1.5.0 refuses it beside --endpoint-selector
    # v1.5.0 refuses the metric flags: the names are in the config's engineConfigs.
    assert not [a for a in args if a.endswith("-metric") or "-metric=" in a], args
    assert {p["containerPort"] for p in c["ports"]} == {9002, 9003, 9090}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == 9003
    assert c["resources"]["requests"] == {"cpu": "200m", "memory": "256Mi"}
    assert epp["spec"]["replicas"] == 1 and epp["spec"]["strategy"] == {"type": "Recreate"}
    config = yaml.safe_load(find(objects, "ConfigMap", "chat-epp")["data"]["config.yaml"])
    assert config == endpoint_picker_config()
    weights = {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}
    assert weights == {"prefix-cache-scorer": 3, "queue-scorer": 2,
                       "kv-cache-utilization-scorer": 2, "max-score-picker": None}
    # The pods are read on the gateway's series, through an engine type of our own that is
    # the default for pods without the engine-type label (ours carry none).
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    assert extractor["parameters"] == {
        "defaultEngine": "glm-gateway",
        "engineConfigs": [{"name": "glm-gateway",
                           "queuedRequestsSpec": "glm_gateway_requests_queued",
                           "kvUsageSpec": "glm_gateway_kv_cache_usage_ratio"}]}
    assert config["dataLayer"] == {"sources": [{
        "pluginRef": "metrics-data-source",
        "extractors": [{"pluginRef": "core-metrics-extractor"}]}]}
    assert "featureGates" not in config and "flowControl" not in config  # docs/routing.md
    # A changed config rolls the picker (it reads the file once).
    assert epp["spec"]["template"]["metadata"]["annotations"]["glm-operator.dev/config-hash"]


def test_the_operator_config_chooses_the_picker_image() -> None:
    from glm_operator.config import OperatorConfig

    svc = service("llamacpp", "a100x2", routing={"mode": "EndpointPicker"}, replicas=2)
    config = OperatorConfig(imageTag="0.1.0", eppImage="mirror.example/epp:v1.5.0")
    objects = render_service(inputs(svc, model_version("gguf"), config=config))
    assert container(find(objects, "Deployment", "chat-epp"), "epp")["image"] == \
        "mirror.example/epp:v1.5.0"


def test_router_and_picker_rbac_is_narrow() -> None:
    objects = picker_service()
    epp_rules = find(objects, "Role", "chat-epp")["rules"]
    assert epp_rules == [{"apiGroups": [""], "resources": ["pods"],
                          "verbs": ["get", "list", "watch"]}]
    by_resource = {r["resources"][0]: r for r in find(objects, "Role", "chat-router")["rules"]}
    assert set(by_resource) == {"pods", "configmaps", "deployments", "deployments/scale",
                                "leases"}
    assert by_resource["configmaps"]["resourceNames"] == ["chat-routes"]
    # Both pools of the version: the router wakes the long-context pool too.
    assert by_resource["deployments/scale"]["resourceNames"] == ["chat-glm4-9b-q4",
                                                                 "chat-glm4-9b-q4-lc"]
    assert by_resource["deployments/scale"]["verbs"] == ["get", "patch", "update"]
    assert by_resource["leases"]["resourceNames"] == ["chat-glm4-9b-q4-activity", "chat-lc"]
    for name in ("chat-epp", "chat-router"):
        binding = find(objects, "RoleBinding", name)
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"][0]["name"] == name
        pod = find(objects, "Deployment", name)["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == name and pod["automountServiceAccountToken"]


def test_scale_from_zero_gives_each_version_a_lease_the_router_renews() -> None:
    """Every request passes the router, so it renews the version's Lease (routes.json names
    it, its Role allows it); the pods' gateways keep the long-context pool's Lease, which
    their own overflow marks when it wakes that pool."""
    objects = picker_service()
    lease = find(objects, "Lease", "chat-glm4-9b-q4-activity")
    assert lease["spec"]["leaseDurationSeconds"] == 300  # routing.idleSeconds
    table = json.loads(find(objects, "ConfigMap", "chat-routes")["data"]["routes.json"])
    assert table["versions"][0]["activityLease"] == "chat-glm4-9b-q4-activity"
    leases = [rule for rule in find(objects, "Role", "chat-router")["rules"]
              if rule["resources"] == ["leases"]]
    assert "chat-glm4-9b-q4-activity" in leases[0]["resourceNames"]
    deployment = find(objects, "Deployment", "chat-glm4-9b-q4")
    gateway = container(deployment, "gateway")
    assert option(gateway["args"], "--activity-lease") == "chat-lc"
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding")
                and o["metadata"]["name"] == "chat-glm4-9b-q4-activity"]
    # Created awake (the first version must load to be promoted); the HPA's floor is 1: it
    # leaves a Deployment at 0 alone, and the operator's idle clock puts it to sleep.
    assert deployment["metadata"]["annotations"]["glm-operator.dev/initial-replicas"] == "1"
    hpa = find(objects, "HorizontalPodAutoscaler", "chat-glm4-9b-q4")
    assert hpa["spec"]["minReplicas"] == 1


def test_scale_from_zero_without_long_context_needs_no_gateway_account() -> None:
    objects = rendered(routing={"mode": "EndpointPicker"}, autoscaling=SCALE_FROM_ZERO)
    assert not [o for o in objects if o["kind"] == "ServiceAccount"
                and o["metadata"]["name"] == "chat-gateway"]
    assert find(objects, "Lease", "chat-glm4-9b-q4-activity")
    gateway = container(find(objects, "Deployment", "chat-glm4-9b-q4"), "gateway")
    assert "--activity-lease" not in gateway["args"]
    assert problems(objects) == []


def test_min_replicas_one_renders_no_main_lease() -> None:
    # The control: an EndpointPicker service that never sleeps has no activity wiring.
    objects = rendered(routing={"mode": "EndpointPicker"},
                       autoscaling={**SCALE_FROM_ZERO, "minReplicas": 1})
    assert not [o for o in objects if o["kind"] == "Lease"]
    gateway = container(find(objects, "Deployment", "chat-glm4-9b-q4"), "gateway")
    assert "--activity-lease" not in gateway["args"]
    table = json.loads(find(objects, "ConfigMap", "chat-routes")["data"]["routes.json"])
    assert table["versions"][0]["activityLease"] is None
    assert table["versions"][0]["minReplicas"] == 1


def test_auto_scaler_takes_the_hpa_for_scale_from_zero_even_with_keda() -> None:
    from glm_operator.config import OperatorConfig, PrometheusSettings

    svc = service("llamacpp", "a100x2", routing={"mode": "EndpointPicker"},
                  autoscaling=SCALE_FROM_ZERO)
    config = OperatorConfig(imageTag="0.1.0",
                            prometheus=PrometheusSettings(url="http://prometheus:9090"))
    objects = render_service(inputs(svc, model_version("gguf"), config=config,
                                    capabilities=Capabilities(keda=True)))
    kinds = {o["kind"] for o in objects}
    assert "HorizontalPodAutoscaler" in kinds and "ScaledObject" not in kinds
    # The control: minReplicas 1 with the same cluster takes KEDA.
    svc = service("llamacpp", "a100x2", routing={"mode": "EndpointPicker"},
                  autoscaling={**SCALE_FROM_ZERO, "minReplicas": 1})
    objects = render_service(inputs(svc, model_version("gguf"), config=config,
                                    capabilities=Capabilities(keda=True)))
    assert "ScaledObject" in {o["kind"] for o in objects}


def _empty_maps(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict):
        here = [path] if not node and path else []
        return here + [p for k, v in node.items() for p in _empty_maps(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _empty_maps(v, f"{path}[{i}]")]
    return []


def test_no_routing_object_holds_an_empty_map() -> None:
    # The API server does not store an empty map: the live object would never hold it, and
    # the operator would apply the object again at every reconcile (decide/drift.py).
    for obj in picker_service():
        if (obj["kind"], obj["metadata"]["name"]) in ROUTING_OBJECTS:
            assert _empty_maps(obj) == [], obj["metadata"]["name"]


def test_a_drain_takes_one_router_at_a_time() -> None:
    objects = picker_service()  # routerReplicas 3
    pdb = find(objects, "PodDisruptionBudget", "chat-router")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == {"matchLabels": find(
        objects, "Deployment", "chat-router")["spec"]["selector"]["matchLabels"]}
    # The engine pool's budget does not count the routers (nor they its pods).
    engines = [o for o in objects if o["kind"] == "PodDisruptionBudget"
               and o["metadata"]["name"] != "chat-router"]
    for other in engines:
        expressions = other["spec"]["selector"].get("matchExpressions", [])
        assert all("router" not in e.get("values", []) for e in expressions)


def test_the_routers_series_are_scraped_beside_the_gateways() -> None:
    objects = picker_service()  # with the ServiceMonitor CRD
    monitor = find(objects, "ServiceMonitor", "chat-router")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert find(objects, "Service", "chat")["metadata"]["labels"].items() >= selector.items()
    assert not find(objects, "Service", "chat-engines")["metadata"]["labels"].items() >= \
        selector.items()
    # /metrics only, its own `service` label kept: no engine behind a router.
    assert [(e["path"], e.get("honorLabels")) for e in monitor["spec"]["endpoints"]] == [
        ("/metrics", True)]
    # The control: without the router, one ServiceMonitor as before.
    assert [o["metadata"]["name"] for o in rendered(Capabilities(service_monitor=True),
                                                    replicas=2)
            if o["kind"] == "ServiceMonitor"] == ["chat"]


def test_a_version_name_longer_than_a_label_gets_its_pods_label_beside_it() -> None:
    long_name = "glm-4-9b-0414-q4-k-m-from-the-team-model-registry-with-a-very-long-name-v2"
    assert len(long_name) > 63
    entry = RouteEntry(long_name, 100, "chat-x", 1, 300.0, None, "chat-x-lc")
    lc = LongContextRoute("http://chat-lc:8080", 131072, 0, 300.0, "chat-lc")
    document = routes_document([entry], 8192, lc)
    (version,) = document["versions"]
    assert version["name"] == long_name  # what x-glm-version names
    assert version["podLabel"] == label_value(long_name) and len(version["podLabel"]) <= 63
    assert document["longContext"]["deployments"] == {long_name: "chat-x-lc"}
    table = router_table.parse(json.dumps(document))
    assert table.versions[0].pod_label == label_value(long_name)
    assert table.long_context is not None
    assert table.long_context.route_for(table.versions[0]) is not None
    # The control: a short name needs no podLabel.
    short = routes_document([RouteEntry("v1", 100, "chat-v1", 1, 300.0, None)], 8192, None)
    assert "podLabel" not in short["versions"][0]
