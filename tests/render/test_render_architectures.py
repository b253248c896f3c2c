"""The kubernetes.io/arch pin on every pod the operator renders (render/node_architecture.py):
the profile's nodes' architectures narrowed by each image's builds."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from glm_operator.config import OperatorConfig
from glm_operator.render.modelversion import render_model_version
from glm_operator.render.node_architecture import pin_architectures
from glm_operator.render.pod import RenderInputError
from glm_operator.render.service import Capabilities, render_service

from render.cases import (
    VALID_CASES,
    inputs,
    model_key,
    model_version,
    multi_node_inputs,
    service,
)
from render.invariants import architecture_problems, problems

ARCH = "kubernetes.io/arch"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
ROUTING = {"mode": "EndpointPicker"}
CONFIG = OperatorConfig(imageTag="0.1.0")
CANN = "ghcr.io/glm-operator/llama-server-cann"


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """'Kind name[/leader|/worker]' -> pod spec, of every pod template."""
    out = {}
    for obj in objects:
        where = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            out[where] = obj["spec"]["template"]["spec"]
        elif obj["kind"] == "LeaderWorkerSet":
            lwt = obj["spec"]["leaderWorkerTemplate"]
            out[f"{where}/leader"] = lwt["leaderTemplate"]["spec"]
            out[f"{where}/worker"] = lwt["workerTemplate"]["spec"]
    return out


def pins(pod: dict[str, Any]) -> list[list[str]]:
    """The kubernetes.io/arch In values of each required node selector term."""
    terms = pod["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    return [[v for e in t["matchExpressions"] if e["key"] == ARCH for v in e["values"]]
            for t in terms]


def render(engine: str, accelerator: str, config: OperatorConfig = CONFIG,
           **spec: Any) -> list[dict[str, Any]]:
    svc = service(engine, accelerator, **spec)
    return render_service(inputs(svc, model_version(model_key(engine, accelerator)), config))


@pytest.mark.parametrize(("engine", "accelerator"), VALID_CASES)
def test_every_pod_kind_is_pinned(engine: str, accelerator: str) -> None:
    objects = render(engine, accelerator, routing=ROUTING,
                     longContext={"enabled": True, "contextLength": 65536})
    pods = pod_specs(objects)
    kinds = {where.split("-")[-1] for where in pods}
    assert {"router", "epp"} <= kinds, sorted(pods)  # the router and picker are there too
    assert problems(objects) == []  # the invariant: every term of every pod is pinned
    for where, pod in pods.items():
        assert all(pins(pod)), where


def test_group_pods_and_the_fetch_job_are_pinned() -> None:
    for capabilities in (None, Capabilities(leader_worker_set=True)):
        objects = render_service(multi_node_inputs("vllm-910bx8x2", capabilities=capabilities))
        pods = pod_specs(objects)
        assert len(pods) == 2, sorted(pods)  # leader and worker
        assert all(pins(pod) == [["arm64"]] for pod in pods.values()), pods
    (job,) = pod_specs(render_model_version(model_version("gguf"), CONFIG)).values()
    assert pins(job) == [["amd64", "arm64"]]


def test_the_pin_is_the_profiles_nodes_narrowed_by_the_images() -> None:
    def engine_pins(engine: str, accelerator: str) -> list[list[str]]:
        pods = pod_specs(render(engine, accelerator))
        return pins(pods["Deployment chat-" + model_version(
            model_key(engine, accelerator)).metadata.name.replace(".", "-")])

    assert engine_pins("llamacpp", "ascend910b") == [["arm64"]]  # Kunpeng hosts, CANN arm64
    assert engine_pins("vllm", "ascend910b") == [["arm64"]]  # the nodes narrow vllm-ascend
    assert engine_pins("llamacpp", "a10") == [["amd64"]]  # the CUDA image is amd64 only
    # control: the same profile with vLLM (both builds) keeps both
    assert engine_pins("vllm", "a10") == [["amd64", "arm64"]]
    assert engine_pins("llamacpp", "cpu") == [["amd64", "arm64"]]


def test_an_image_the_table_does_not_know_adds_no_constraint() -> None:
    own = "registry.example.com/team/llama-server:7"
    (pod, *_) = pod_specs(render("llamacpp", "a10", podOverrides={"image": own})).values()
    assert pins(pod) == [["amd64", "arm64"]]  # the nvidia profile's, nothing taken away
    narrowed = OperatorConfig(imageTag="0.1.0",
                              imageArchitectures={"registry.example.com/team/llama-server":
                                                  ["arm64"]})
    (pod, *_) = pod_specs(render("llamacpp", "a10", narrowed,
                                 podOverrides={"image": own})).values()
    assert pins(pod) == [["arm64"]]  # control: once listed, its builds count


def test_operator_config_narrows_the_components_too() -> None:
    config = OperatorConfig(imageTag="0.1.0",
                            imageArchitectures={"ghcr.io/glm-operator/glm-operator": ["arm64"],
                                                "ghcr.io/glm-operator/endpoint-picker":
                                                ["amd64"]})
    pods = pod_specs(render("vllm", "a10", config, routing=ROUTING))
    assert pins(pods["Deployment chat-router"]) == [["arm64"]]
    assert pins(pods["Deployment chat-epp"]) == [["amd64"]]
    assert pins(pods["Deployment chat-glm4-9b-awq"]) == [["arm64"]]  # its gateway sidecar
    (job,) = pod_specs(render_model_version(model_version("gguf"), config)).values()
    assert pins(job) == [["arm64"]]
    defaults = pod_specs(render("vllm", "a10", routing=ROUTING))  # control: the defaults
    assert pins(defaults["Deployment chat-router"]) == [["amd64", "arm64"]]


def test_the_users_affinity_keeps_the_pin_in_every_term() -> None:
    own = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    given = copy.deepcopy(own)
    (pod, *_) = pod_specs(render("llamacpp", "ascend910b",
                                 podOverrides={"affinity": given})).values()
    terms = pod["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0] == {"key": "pool", "operator": "In", "values": ["a"]}
    assert terms[1]["matchFields"] == own["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][1][
        "matchFields"]
    assert pins(pod) == [["arm64"], ["arm64"]]  # ANDed into both ORed terms
    assert "podAntiAffinity" in pod["affinity"]
    assert given == own  # the spec's own dict is not changed
    # an affinity with no required node terms gets one of the pin alone
    pinned = pin_architectures({"podAntiAffinity": {}}, ["arm64"])
    assert pinned["nodeAffinity"][REQUIRED]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": ARCH, "operator": "In", "values": ["arm64"]}]}]


def test_no_common_architecture_is_refused_by_the_renderer() -> None:
    config = OperatorConfig(imageTag="0.1.0", imageArchitectures={CANN: ["amd64"]})
    with pytest.raises(RenderInputError) as refused:
        render("llamacpp", "ascend910b", config)
    message = str(refused.value)
    assert "the nodes of accelerator profile ascend-910b are arm64" in message
    assert f"{CANN}:0.1.0 is built for amd64 only" in message
    assert "imageArchitectures" in message and "another accelerator profile" in message
    render("vllm", "ascend910b", config)  # control: vllm-ascend has an arm64 build


def test_the_invariant_catches_a_missing_pin() -> None:
    (pod, *_) = pod_specs(render("llamacpp", "a10")).values()
    assert architecture_problems("pod", pod) == []
    stripped = copy.deepcopy(pod)
    for term in stripped["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]:
        term["matchExpressions"] = [e for e in term["matchExpressions"] if e["key"] != ARCH]
    assert architecture_problems("pod", stripped) != []
    assert architecture_problems("pod", {"containers": []}) != []
