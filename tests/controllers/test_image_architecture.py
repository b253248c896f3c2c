"""A service whose pods would have no image build for their nodes' architecture is refused
before any pod (decide/image_architecture.py): Planned=False NoImageForNodeArchitecture."""

from __future__ import annotations

from typing import Any

from glm_operator.api import GLMService
from glm_operator.config import OperatorConfig
from glm_operator.decide.observed import ServiceObservation
from glm_operator.decide.service import ServiceDecision, decide_service
from glm_operator.render.service import Capabilities
from test_service_state import cond, load, ready_mv

CANN = "ghcr.io/glm-operator/llama-server-cann"
CANN_AMD64_ONLY = OperatorConfig(imageArchitectures={CANN: ["amd64"]})
ENGINE_KINDS = ("Deployment", "StatefulSet", "LeaderWorkerSet")


def decide(svc: dict[str, Any], mv: dict[str, Any], config: OperatorConfig) -> ServiceDecision:
    return decide_service(ServiceObservation(service=GLMService.model_validate(svc),
                                             model_versions={mv["metadata"]["name"]: mv},
                                             capabilities=Capabilities()),
                          config, config.profiles)


def on_910b(**spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    mv, svc = load("cpu-llamacpp")
    svc["spec"]["accelerator"] = {"profile": "ascend-910b", "count": 1}
    svc["spec"].update(spec)
    return ready_mv(mv), svc


def engines(decision: ServiceDecision) -> list[dict[str, Any]]:
    return [o for o in decision.desired if o["kind"] in ENGINE_KINDS]


def test_llamacpp_on_910b_is_pinned_to_arm64_by_default() -> None:
    mv, svc = on_910b()
    decision = decide(svc, mv, OperatorConfig())
    assert cond(decision, "Planned").status == "True"
    (deployment,) = engines(decision)
    terms = deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]} in terms[0][
        "matchExpressions"]


def test_an_amd64_only_cann_image_on_arm64_nodes_is_refused_with_the_facts() -> None:
    mv, svc = on_910b()
    decision = decide(svc, mv, CANN_AMD64_ONLY)
    planned = cond(decision, "Planned")
    assert (planned.status, planned.reason) == ("False", "NoImageForNodeArchitecture")
    assert planned.message.startswith("the main pool's pods cannot run anywhere: the "
                                      "nodes of accelerator profile ascend-910b are arm64, but "
                                      f"image {CANN}:")
    assert "is built for amd64 only: build or mirror it for arm64" in planned.message
    assert f"imageArchitectures ({CANN}: [arm64])" in planned.message
    assert engines(decision) == []
    # control: vLLM on the same nodes has an arm64 build (vllm-ascend), so it is planned
    mv, svc = load("ascend-910b-vllm")
    assert cond(decide(svc, ready_mv(mv), CANN_AMD64_ONLY), "Planned").status == "True"


def test_the_long_context_pool_is_checked_too() -> None:
    mv, svc = load("cpu-llamacpp")
    svc["spec"]["longContext"] = {"contextLength": 32768,
                                  "accelerator": {"profile": "ascend-910b", "count": 1}}
    decision = decide(svc, ready_mv(mv), CANN_AMD64_ONLY)
    planned = cond(decision, "Planned")
    assert (planned.status, planned.reason) == ("False", "NoImageForNodeArchitecture")
    assert planned.message.startswith("the long-context pool's pods cannot run anywhere")
    assert engines(decision) == []
    # control: without the narrowing both pools are planned
    assert cond(decide(svc, ready_mv(mv), OperatorConfig()), "Planned").status == "True"


def test_a_node_selector_for_an_architecture_the_pin_leaves_out_is_refused() -> None:
    mv, svc = on_910b(podOverrides={"nodeSelector": {"kubernetes.io/arch": "amd64"}})
    planned = cond(decide(svc, mv, OperatorConfig()), "Planned")
    assert (planned.status, planned.reason) == ("False", "NoImageForNodeArchitecture")
    assert "spec.podOverrides.nodeSelector asks for kubernetes.io/arch=amd64" in planned.message
    assert "share arm64 only" in planned.message
    # control: the architecture the pin allows is planned (and rendered as asked)
    mv, svc = on_910b(podOverrides={"nodeSelector": {"kubernetes.io/arch": "arm64"}})
    decision = decide(svc, mv, OperatorConfig())
    assert cond(decision, "Planned").status == "True"
    (deployment,) = engines(decision)
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/arch": "arm64"}
