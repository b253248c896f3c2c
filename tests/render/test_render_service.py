"""render_service: golden files for the engine x accelerator matrix, invariants, behaviour."""

from __future__ import annotations

import copy
from typing import Any

import pydantic
import pytest
from glm_operator.config import OperatorConfig
from glm_operator.render.deployment import INITIAL_REPLICAS_ANNOTATION, PLAN_HASH_ANNOTATION
from glm_operator.render.output import to_yaml
from glm_operator.render.pod import RenderInputError
from glm_operator.render.service import Capabilities, render_service

from render.cases import (
    GOLDEN_SPECS,
    INVALID,
    VALID_CASES,
    golden_inputs,
    inputs,
    model_key,
    model_version,
    service,
)
from render.golden import check_golden
from render.invariants import problems


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    pod = deployment["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def arg(c: dict[str, Any], flag: str) -> str:
    args: list[str] = c["args"]
    return args[args.index(flag) + 1]


@pytest.mark.parametrize(("engine", "accelerator"), VALID_CASES)
def test_golden(engine: str, accelerator: str) -> None:
    objects = render_service(golden_inputs(engine, accelerator))
    check_golden(f"{engine}-{accelerator}.yaml", to_yaml(objects))


@pytest.mark.parametrize(("engine", "accelerator"), VALID_CASES)
def test_invariants_hold_for_every_golden_case(engine: str, accelerator: str) -> None:
    assert problems(render_service(golden_inputs(engine, accelerator))) == []


@pytest.mark.parametrize(("engine", "accelerator"), sorted(INVALID))
def test_invalid_combinations_are_refused_with_the_field(engine: str, accelerator: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="vllm does not run on the cpu"):
        service(engine, accelerator)


def test_infeasible_plan_is_refused_with_the_numbers() -> None:
    svc = service("vllm", "a10", modelVersion="glm4-9b-bf16")
    with pytest.raises(RenderInputError, match=r"main pool's plan is not feasible: needs .* GiB"):
        render_service(inputs(svc, model_version("bf16")))


def test_render_is_deterministic() -> None:
    first = to_yaml(render_service(golden_inputs("llamacpp", "a100x2")))
    again = to_yaml(render_service(golden_inputs("llamacpp", "a100x2")))
    assert first == again


def test_replicas_fixed_without_autoscaling() -> None:
    objects = render_service(golden_inputs("llamacpp", "a10"))
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert INITIAL_REPLICAS_ANNOTATION not in deployment["metadata"].get("annotations", {})
    assert by_kind(objects, "HorizontalPodAutoscaler") == []


def test_autoscaling_and_long_context_leave_replicas_to_their_owners() -> None:
    objects = render_service(golden_inputs("llamacpp", "a100x2"))
    main, lc = by_kind(objects, "Deployment")
    assert "replicas" not in main["spec"] and "replicas" not in lc["spec"]
    assert main["metadata"]["annotations"][INITIAL_REPLICAS_ANNOTATION] == "1"
    assert lc["metadata"]["annotations"][INITIAL_REPLICAS_ANNOTATION] == "0"
    hpa, lc_hpa = by_kind(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == main["metadata"]["name"]
    assert lc_hpa["spec"]["scaleTargetRef"]["name"] == lc["metadata"]["name"]
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"]
               for m in hpa["spec"]["metrics"]}
    assert targets == {"glm_gateway_requests_per_second": "2500m",
                       "glm_gateway_requests_queued": "4"}
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 600


def test_user_behavior_overrides_only_what_it_sets() -> None:
    (hpa,) = by_kind(render_service(golden_inputs("vllm", "a100x2")), "HorizontalPodAutoscaler")
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] == 1800
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


def test_long_context_wiring_and_narrow_rbac() -> None:
    objects = render_service(golden_inputs("llamacpp", "a100x2"))
    main, lc = by_kind(objects, "Deployment")
    gateway = container(main, "gateway")
    lc_service = by_kind(objects, "Service")[1]
    assert arg(gateway, "--long-context-deployment") == lc["metadata"]["name"]
    assert arg(gateway, "--long-context-url") == (
        f"http://{lc_service['metadata']['name']}.models.svc.cluster.local:8080")
    assert "--long-context-url" not in container(lc, "gateway")["args"]
    assert arg(container(lc, "engine"), "--ctx-size") == "131072"  # one slot of 128k
    assert arg(container(lc, "gateway"), "--pool") == "long-context"
    (lease,) = by_kind(objects, "Lease")
    lease_name = lease["metadata"]["name"]
    assert lease_name == "chat-lc" and lease["spec"] == {"leaseDurationSeconds": 600}
    assert arg(gateway, "--activity-lease") == lease_name
    assert arg(container(lc, "gateway"), "--activity-lease") == lease_name
    sa, lc_sa = by_kind(objects, "ServiceAccount")
    role, lc_role = by_kind(objects, "Role")
    binding, lc_binding = by_kind(objects, "RoleBinding")
    lease_rule = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                  "resourceNames": [lease_name], "verbs": ["patch"]}
    # The main pool's gateway wakes its version's pool and marks the wake; the pool's own
    # gateways may only mark activity: neither may touch any other object.
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments/scale"],
                              "resourceNames": [lc["metadata"]["name"]],
                              "verbs": ["get", "patch"]}, lease_rule]
    assert lc_role["rules"] == [lease_rule]
    for b, r, account in ((binding, role, sa), (lc_binding, lc_role, lc_sa)):
        assert b["roleRef"]["name"] == r["metadata"]["name"]
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                  "namespace": "models"}]
    main_pod, lc_pod = main["spec"]["template"]["spec"], lc["spec"]["template"]["spec"]
    assert main_pod["serviceAccountName"] == sa["metadata"]["name"]
    assert lc_pod["serviceAccountName"] == lc_sa["metadata"]["name"] != sa["metadata"]["name"]
    assert main_pod["automountServiceAccountToken"] is True
    assert lc_pod["automountServiceAccountToken"] is True


def test_long_context_pool_has_its_own_hpa_from_one_replica() -> None:
    objects = render_service(golden_inputs("llamacpp", "a100x2"))
    _, lc = by_kind(objects, "Deployment")
    (hpa,) = [h for h in by_kind(objects, "HorizontalPodAutoscaler")
              if h["metadata"]["labels"]["glm-operator.dev/pool"] == "long-context"]
    assert hpa["metadata"]["name"] == lc["metadata"]["name"] == "chat-glm4-9b-q4-lc"
    # 0 is never a target (the HPA leaves a Deployment at 0 alone: the wake and the idle
    # scale-down own that edge); queued long requests per pod grow it to maxReplicas.
    assert hpa["spec"]["minReplicas"] == 1 and hpa["spec"]["maxReplicas"] == 2
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "glm_gateway_requests_queued"},
        "target": {"type": "AverageValue", "averageValue": "1"}}}]
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleUp"]["policies"] == [{"type": "Pods", "value": 2, "periodSeconds": 120}]
    # the main pool's scaleDown override (1800 s in this spec) is not the pool's
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 900
    assert "replicas" not in lc["spec"]


@pytest.mark.parametrize(("long_context", "expected"), [
    ({"maxReplicas": 1}, None),  # one replica at most: nothing for an HPA to do
    ({"maxReplicas": 3, "minReplicas": 3}, None),
    ({"maxReplicas": 3, "minReplicas": 2, "queueLength": 5}, (2, 3, "5")),
    ({"maxReplicas": 4}, (1, 4, "1")),
])
def test_long_context_hpa_bounds(long_context: dict[str, int],
                                 expected: tuple[int, int, str] | None) -> None:
    svc = service("llamacpp", "a100x2", longContext={"enabled": True, "contextLength": 65536,
                                                     **long_context})
    hpas = [h for h in by_kind(render_service(inputs(svc, model_version("gguf"))),
                               "HorizontalPodAutoscaler")
            if h["metadata"]["labels"]["glm-operator.dev/pool"] == "long-context"]
    if expected is None:
        assert hpas == []
        return
    (hpa,) = hpas
    spec = hpa["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"],
            spec["metrics"][0]["pods"]["target"]["averageValue"]) == expected


def test_wake_timeout_follows_the_pools_planned_load_time() -> None:
    from glm_operator.render.long_context import WAKE_MARGIN_SECONDS

    timeouts = []
    for size in (5 * 2**30, 60 * 2**30):
        mv = model_version("gguf", sizeBytes=size)
        svc = service("llamacpp", "a100x2",
                      longContext={"enabled": True, "contextLength": 65536})
        main, lc = by_kind(render_service(inputs(svc, mv)), "Deployment")
        probe = container(lc, "engine")["startupProbe"]
        allowance = probe["periodSeconds"] * probe["failureThreshold"]
        timeout = int(arg(container(main, "gateway"), "--wake-timeout"))
        assert abs(allowance - (timeout - WAKE_MARGIN_SECONDS)) < probe["periodSeconds"]
        timeouts.append(timeout)
    assert timeouts[0] < timeouts[1]
    assert timeouts[1] > 700  # 60 GiB at the default 100 MiB/s: no fixed 300 s


def test_no_api_access_without_long_context() -> None:
    objects = render_service(golden_inputs("llamacpp", "a10"))
    assert not by_kind(objects, "Role") and not by_kind(objects, "ServiceAccount")
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_services_select_every_version_of_their_pool_only() -> None:
    main_svc, lc_svc = by_kind(render_service(golden_inputs("llamacpp", "a100x2")), "Service")
    assert main_svc["spec"]["selector"] == {"glm-operator.dev/service": "chat",
                                            "glm-operator.dev/pool": "main"}
    assert lc_svc["spec"]["selector"]["glm-operator.dev/pool"] == "long-context"
    assert main_svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http",
                                          "protocol": "TCP"}]


def test_service_monitor_only_with_its_crd() -> None:
    assert by_kind(render_service(golden_inputs("llamacpp", "a10")), "ServiceMonitor") == []
    (sm,) = by_kind(render_service(golden_inputs("llamacpp", "a100x2")), "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "http"


def test_two_services_never_select_each_others_pods() -> None:
    a = render_service(golden_inputs("llamacpp", "a10"))
    svc_b = service("llamacpp", "a10")
    svc_b.metadata.name = "chat-b"
    b = render_service(inputs(svc_b, model_version("gguf")))
    pods_a = by_kind(a, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    for selector in [by_kind(b, "Deployment")[0]["spec"]["selector"]["matchLabels"],
                     by_kind(b, "Service")[0]["spec"]["selector"]]:
        assert any(pods_a.get(k) != v for k, v in selector.items())


def test_accelerator_resources_affinity_and_tolerations() -> None:
    objects = render_service(golden_inputs("vllm", "a100x2"))
    deployment = by_kind(objects, "Deployment")[0]
    engine = container(deployment, "engine")
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert arg(engine, "--tensor-parallel-size") == "2"
    pod = deployment["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expression = terms["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expression["key"] == "nvidia.com/gpu.product"
    assert "NVIDIA-A100-SXM4-80GB" in expression["values"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
        pod["tolerations"])
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    ascend = by_kind(render_service(golden_inputs("llamacpp", "ascend910b")), "Deployment")[0]
    assert container(ascend, "engine")["resources"]["limits"]["huawei.com/Ascend910"] == "1"


def test_cpu_profile_threads_match_the_cpu_request_and_overrides_apply() -> None:
    deployment = by_kind(render_service(golden_inputs("llamacpp", "cpu")), "Deployment")[0]
    engine = container(deployment, "engine")
    assert arg(engine, "--threads") == engine["resources"]["requests"]["cpu"]
    assert not any("gpu" in k or "Ascend" in k for k in engine["resources"]["limits"])
    pod = deployment["spec"]["template"]["spec"]
    # no accelerator labels (any node with CPUs will do), only the architecture pin; the RWO
    # cache's pod affinity remains
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}]}]
    assert "podAffinity" in pod["affinity"]
    assert pod["nodeSelector"] == {"node-pool": "cpu-large"}
    assert pod["priorityClassName"] == "llm-serving"
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "search"
    assert {"name": "LLAMA_LOG_VERBOSITY", "value": "1"} in engine["env"]
    assert arg(container(deployment, "gateway"), "--audit") == "off"


@pytest.mark.parametrize(("resources", "threads"), [
    ({"limits": {"cpu": "2500m"}}, "2"),  # whole cores of the limit
    ({"requests": {"cpu": 6}}, "6"),  # no limit: the request
    ({"requests": {"cpu": "8"}, "limits": {"cpu": "3"}}, "3"),  # the limit caps
    ({"limits": {"cpu": "500m"}}, "1"),  # never fewer than one
])
def test_threads_follow_a_cpu_override(resources: dict[str, Any], threads: str) -> None:
    spec = copy.deepcopy(GOLDEN_SPECS[("llamacpp", "cpu")])
    spec["podOverrides"]["resources"] = resources
    svc = service("llamacpp", "cpu", **spec)
    deployment = by_kind(render_service(inputs(svc, model_version("gguf"))), "Deployment")[0]
    assert arg(container(deployment, "engine"), "--threads") == threads


def test_startup_probe_grows_with_the_model() -> None:
    small = golden_inputs("llamacpp", "a100x2")
    big_mv = model_version("gguf", sizeBytes=120 * 1024**3)
    big = inputs(small.service, big_mv, capabilities=small.capabilities)

    def budget(objects: list[dict[str, Any]]) -> int:
        probe = container(by_kind(objects, "Deployment")[0], "engine")["startupProbe"]
        return int(probe["failureThreshold"] * probe["periodSeconds"])

    # 120 GiB at the assumed 100 MiB/s is 1229 s, plus the 120 s margin.
    assert budget(render_service(big)) >= 1229 + 120
    assert budget(render_service(small)) >= 300


def test_plan_change_changes_the_pod_template_hash() -> None:
    a = golden_inputs("llamacpp", "a10")
    b = inputs(service("llamacpp", "a10", replicas=2, contextLength=16384),
               model_version(model_key("llamacpp", "a10")))

    def plan_hash(i: Any) -> str:
        deployment = by_kind(render_service(i), "Deployment")[0]
        value: str = deployment["spec"]["template"]["metadata"]["annotations"][
            PLAN_HASH_ANNOTATION]
        return value

    assert plan_hash(a) != plan_hash(b)


def test_quantities_are_canonical() -> None:
    engine = container(by_kind(render_service(golden_inputs("vllm", "a100x2")), "Deployment")[0],
                       "engine")
    assert engine["resources"]["requests"]["memory"] == "8Gi"  # 4 GiB + 2 GiB x 2 GPUs
    assert engine["resources"]["requests"]["cpu"] == "6"


def test_measured_cache_path_and_claim_are_used() -> None:
    mv = model_version("gguf", cache={"claimName": "shared-cache", "path": "glm/m.gguf"})
    i = inputs(service("llamacpp", "a10"), mv)
    deployment = by_kind(render_service(i), "Deployment")[0]
    assert arg(container(deployment, "engine"), "--model") == "/models/glm/m.gguf"
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"] == {"claimName": "shared-cache", "readOnly": True}


def test_missing_uid_is_a_clear_error_unless_rendering_offline() -> None:
    from dataclasses import replace

    from glm_operator.render.meta import MissingMetadata
    i = golden_inputs("llamacpp", "a10")
    i.service.metadata.uid = None
    with pytest.raises(MissingMetadata, match=r"metadata\.uid"):
        render_service(i)
    objects = render_service(replace(i, with_owner_references=False))
    assert all("ownerReferences" not in o["metadata"] for o in objects)


@pytest.mark.parametrize(("engine", "accelerator"), VALID_CASES)
def test_engine_is_reachable_only_through_the_gateway(engine: str, accelerator: str) -> None:
    config = OperatorConfig(imageTag="0.1.0", gatewayPort=9000, enginePort=9001)
    i = golden_inputs(engine, accelerator)
    objects = render_service(inputs(i.service, i.model_version, config, i.capabilities))
    for deployment in by_kind(objects, "Deployment"):
        engine_c, gateway = container(deployment, "engine"), container(deployment, "gateway")
        socket = "@glm-engine.sock" if engine == "llamacpp" else None
        assert arg(engine_c, "--host").split(",") == ["127.0.0.1", *([socket] if socket else [])]
        assert arg(engine_c, "--port") == "9001"
        assert "ports" not in engine_c
        assert arg(gateway, "--engine-url") == "http://127.0.0.1:9001"
        assert (arg(gateway, "--engine-socket") if socket else None) == socket
        assert socket or "--engine-socket" not in gateway["args"]
        for probe in ("startupProbe", "livenessProbe"):
            # The gateway's number: a named port resolves among the engine's own ports.
            assert engine_c[probe]["httpGet"] == {"path": "/enginez", "port": 9000}
        assert "readinessProbe" not in engine_c
        assert gateway["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    for svc in by_kind(objects, "Service"):
        assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"]
    assert problems(objects) == []


def _engine_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return container(by_kind(objects, "Deployment")[0], "engine")


@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
def test_invariants_catch_an_engine_reachable_from_other_pods(engine: str) -> None:
    """The invariants that every golden case and example passes must fail on an engine that
    listens beyond loopback, declares a port, or is probed directly."""
    objects = render_service(golden_inputs(engine, "a10"))
    args = _engine_of(objects)["args"]
    args[args.index("--host") + 1] = "0.0.0.0"
    assert any("loopback" in p for p in problems(objects))

    objects = render_service(golden_inputs(engine, "a10"))
    args = _engine_of(objects)["args"]
    at = args.index("--host")
    del args[at:at + 2]  # vLLM's default is 0.0.0.0: a missing --host is no better
    assert any("loopback" in p for p in problems(objects))

    objects = render_service(golden_inputs(engine, "a10"))
    _engine_of(objects)["args"].append("--host=10.0.0.5")
    assert any("loopback" in p for p in problems(objects))

    objects = render_service(golden_inputs(engine, "a10"))
    args = _engine_of(objects)["args"]
    args[args.index("--host") + 1] = "127.0.0.1,/models/engine.sock"  # a file others mount
    assert any("loopback" in p for p in problems(objects))

    objects = render_service(golden_inputs(engine, "a10"))
    _engine_of(objects)["ports"] = [{"name": "engine", "containerPort": 8081}]
    assert any("keep it out of Services" in p for p in problems(objects))

    objects = render_service(golden_inputs(engine, "a10"))
    _engine_of(objects)["livenessProbe"]["httpGet"] = {"path": "/health", "port": 8081}
    assert any("livenessProbe" in p for p in problems(objects))

    objects = render_service(golden_inputs(engine, "a10"))
    by_kind(objects, "Service")[0]["spec"]["ports"][0]["targetPort"] = 8081
    assert any("only the gateway port" in p for p in problems(objects))


def test_operator_config_sets_images_and_ports() -> None:
    config = OperatorConfig(imageRegistry="registry.example.com/ml", imageTag="1.2.3",
                            gatewayPort=9000, enginePort=9001)
    i = inputs(service("llamacpp", "a10"), model_version("gguf"), config, Capabilities())
    deployment = by_kind(render_service(i), "Deployment")[0]
    gateway, engine = container(deployment, "gateway"), container(deployment, "engine")
    assert gateway["image"] == "registry.example.com/ml/glm-operator:1.2.3"
    assert engine["image"] == "registry.example.com/ml/llama-server-cuda:1.2.3"
    assert arg(gateway, "--engine-url") == "http://127.0.0.1:9001"
    assert arg(engine, "--port") == "9001"
    assert gateway["ports"][0]["containerPort"] == 9000


def test_plan_summary_is_the_status_type_with_its_sources() -> None:
    from glm_operator.render.service import plan_summary

    i = golden_inputs("llamacpp", "a10")
    summary = plan_summary(i.plan, i.service, None, i.model_version)
    assert summary.feasible is True
    assert summary.model_version == "glm4-9b-q4"
    assert summary.facts_source == "declared"
    assert summary.llamacpp is not None and summary.llamacpp.parallel == 4
    assert summary.resources is not None
    assert summary.resources.memory_request_bytes == i.plan.resources.memory_request_bytes
    dumped = summary.model_dump(by_alias=True, exclude_none=True)
    assert dumped["llamacpp"]["ctxPerSlot"] == 32768


def test_gateway_args_parse_with_the_gateways_own_parser() -> None:
    import argparse

    from glm_operator.gateway import config as gateway_config

    objects = render_service(golden_inputs("llamacpp", "a100x2"))
    main, lc = by_kind(objects, "Deployment")
    gateway = container(main, "gateway")
    assert gateway["command"] == ["glm-operator"] and gateway["args"][0] == "gateway"
    parser = argparse.ArgumentParser()
    gateway_config.add_arguments(parser)
    parsed = gateway_config.from_args(parser.parse_args(gateway["args"][1:]))
    assert parsed.engine_url == "http://127.0.0.1:8081"
    assert parsed.engine_socket == "@glm-engine.sock"
    assert parsed.port == 8080
    assert (parsed.service_name, parsed.model_version, parsed.pool) == (
        "chat", "glm4-9b-q4", "main")
    assert parsed.context_length == 32768 and parsed.engine_slots == 4
    assert parsed.wake is not None
    assert parsed.wake.deployment == lc["metadata"]["name"]
    assert parsed.wake.namespace == "models"
    assert str(parsed.api_keys_path) == "/etc/glm-operator/api-keys"
    assert parsed.rate_limit_rps == 10.0 and parsed.rate_limit_burst == 100
    assert parsed.rate_limit_tokens_per_minute == 0  # no tokensPerMinute in this spec
    assert parsed.audit == "stdout"
    lc_parsed = gateway_config.from_args(
        parser.parse_args(container(lc, "gateway")["args"][1:]))
    assert lc_parsed.pool == "long-context" and lc_parsed.wake is None
    for parsed_config in (parsed, lc_parsed):
        assert parsed_config.activity is not None
        assert parsed_config.activity.lease == "chat-lc"
        assert parsed_config.activity.namespace == "models"
    assert parsed.wake.timeout_seconds > 300


@pytest.mark.parametrize(("rate_limit", "expected"), [
    ({"requestsPerMinute": 120, "burst": 5, "tokensPerMinute": 100000},
     (2.0, 5, 100000)),
    ({"tokensPerMinute": 30000}, (0.0, 0, 30000)),  # tokens only: no request bucket
    ({"requestsPerMinute": 600}, (10.0, 100, 0)),
])
def test_rate_limits_reach_the_gateway(rate_limit: dict[str, int],
                                       expected: tuple[float, int, int]) -> None:
    import argparse

    from glm_operator.gateway import config as gateway_config

    svc = service("llamacpp", "a10", gateway={"apiKeysSecret": "chat-keys",
                                              "rateLimit": rate_limit})
    deployment = by_kind(render_service(inputs(svc, model_version("gguf"))), "Deployment")[0]
    parser = argparse.ArgumentParser()
    gateway_config.add_arguments(parser)
    parsed = gateway_config.from_args(
        parser.parse_args(container(deployment, "gateway")["args"][1:]))
    assert (parsed.rate_limit_rps, parsed.rate_limit_burst,
            parsed.rate_limit_tokens_per_minute) == expected


def test_long_names_stay_within_63_characters() -> None:
    long_name = "a-very-long-service-name-that-someone-picked-for-a-model-endpoint-x"
    mv = model_version("gguf")
    mv.metadata.name = "glm-4-9b-0414-q4-k-m-from-bartowski-with-a-long-suffix-v2"
    svc = service("llamacpp", "a100x2",
                  longContext={"enabled": True, "contextLength": 65536},
                  autoscaling={"maxReplicas": 2, "targets": {"queueLength": 2}},
                  modelVersion=mv.metadata.name)
    svc.metadata.name = long_name
    objects = render_service(inputs(svc, mv, capabilities=Capabilities(service_monitor=True)))
    assert problems(objects) == []
    assert all(len(v) <= 63 for o in objects for v in o["metadata"]["labels"].values())


def test_the_shared_store_reaches_the_gateway_and_its_password_only_from_the_secret() -> None:
    import argparse

    from glm_operator.gateway import config as gateway_config

    store = {"redis": {"address": "redis.cache.svc:6379", "tls": True,
                       "passwordSecret": {"name": "redis-auth", "key": "password"}},
             "onUnavailable": "Deny", "timeout": "80ms"}
    svc = service("llamacpp", "a10", longContext={"enabled": True, "contextLength": 65536},
                  gateway={"apiKeysSecret": "chat-keys",
                           "rateLimit": {"requestsPerMinute": 60, "store": store}})
    deployments = by_kind(render_service(inputs(svc, model_version("gguf"))), "Deployment")
    assert len(deployments) == 2  # both pools share the store
    for deployment in deployments:
        gateway = container(deployment, "gateway")
        assert gateway["env"] == [{
            "name": gateway_config.REDIS_PASSWORD_ENV,
            "valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "password"}}}]
        assert "password" not in " ".join(gateway["args"]).lower()
        parser = argparse.ArgumentParser()
        gateway_config.add_arguments(parser)
        parsed = gateway_config.from_args(parser.parse_args(gateway["args"][1:]))
        assert parsed.rate_limit_store == gateway_config.RateLimitStoreConfig(
            address="redis.cache.svc:6379", namespace=svc.metadata.namespace or "",
            tls=True, on_unavailable="deny", timeout_seconds=0.08)


def test_without_a_store_the_gateway_counts_per_pod() -> None:
    svc = service("llamacpp", "a10",
                  gateway={"apiKeysSecret": "chat-keys", "rateLimit": {"requestsPerMinute": 60}})
    deployment = by_kind(render_service(inputs(svc, model_version("gguf"))), "Deployment")[0]
    gateway = container(deployment, "gateway")
    assert "env" not in gateway and "--rate-limit-redis" not in gateway["args"]
