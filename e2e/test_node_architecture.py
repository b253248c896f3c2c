"""The kubernetes.io/arch pin, with the real kube-scheduler and the kwok nodes of
e2e/nodes.yaml: the two npu-910b nodes are arm64 (Atlas 800T A2, Kunpeng CPUs), every other
node amd64.

- A llama.cpp service on ascend-910b (the CANN image is built for arm64 only) gets pods
  pinned `kubernetes.io/arch In [arm64]`, which the scheduler binds to the npu-910b nodes.
- Control: an operator whose config says the CANN image is amd64 only
  (`imageArchitectures`) refuses the same service, Planned=False NoImageForNodeArchitecture
  with the facts, and creates no Deployment and no pod.
"""

from __future__ import annotations

import copy
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubectl import Kubectl, wait_for
from e2e.operator_fixtures import (
    OperatorProcess,
    glm_crds,
    operator,
    prefixed_namespace,
    report_fetched,
    wait_serving,
)
from e2e.test_operator import CPU_MV, CPU_SVC, condition, node_labels, wait_condition

__all__ = ["glm_crds", "operator"]  # fixtures used by name

Wait = Callable[..., Any]
PREFIX = "archx-"  # namespaces only this module's operator watches
ARCH = "kubernetes.io/arch"
CANN = "ghcr.io/glm-operator/llama-server-cann"
SERVICE_LABEL = "glm-operator.dev/service"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def on_910b() -> tuple[dict[str, Any], dict[str, Any]]:
    """The CPU example's GGUF (glm-4-9b Q4_K_M) on one 910B NPU."""
    mv, svc = copy.deepcopy(CPU_MV), copy.deepcopy(CPU_SVC)
    svc["metadata"]["name"] = "glm-910b"
    svc["spec"]["accelerator"] = {"profile": "ascend-910b", "count": 1}
    return mv, svc


def fetched(kubectl: Kubectl, ns: str, mv: dict[str, Any]) -> None:
    name = mv["metadata"]["name"]
    kubectl.apply(mv, namespace=ns)
    wait_for(lambda: kubectl.items("jobs", "-n", ns, "-l",
                                   f"glm-operator.dev/model-version={name}"),
             timeout=60, what=f"the fetch Job of {name}")
    report_fetched(kubectl, ns, name)


def pods_of(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    return [p for p in kubectl.items("pods", "-n", ns, "-l", f"{SERVICE_LABEL}={name}")
            if not p["metadata"].get("deletionTimestamp")]


def arch_pins(pod_spec: dict[str, Any]) -> list[list[str]]:
    terms = pod_spec["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    return [[v for e in t.get("matchExpressions", []) if e["key"] == ARCH for v in e["values"]]
            for t in terms]


def test_llamacpp_on_910b_is_pinned_to_arm64_and_bound_to_the_npu_nodes(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    ns = namespace
    mv, svc = on_910b()
    fetched(kubectl, ns, mv)
    # The fetch Job's pod (our image, both builds) is pinned too.
    (job,) = kubectl.items("jobs", "-n", ns)
    assert arch_pins(job["spec"]["template"]["spec"]) == [["amd64", "arm64"]]
    kubectl.apply(svc, namespace=ns)
    name = svc["metadata"]["name"]

    def bound() -> list[dict[str, Any]]:
        pods = pods_of(kubectl, ns, name)
        return pods if pods and all(p["spec"].get("nodeName") for p in pods) else []

    pods = wait_for(bound, timeout=120, what="the engine pod bound to a node")
    (deployment,) = kubectl.items("deployments", "-n", ns, "-l", f"{SERVICE_LABEL}={name}")
    assert arch_pins(deployment["spec"]["template"]["spec"]) == [["arm64"]]
    for pod in pods:
        assert arch_pins(pod["spec"]) == [["arm64"]]
        labels = node_labels(kubectl, pod["spec"]["nodeName"])
        assert labels[ARCH] == "arm64", labels
        assert labels["accelerator-type"] == "module-910b-8", labels
        assert pod["spec"]["nodeName"].startswith("npu-910b"), pod["spec"]["nodeName"]
        (engine,) = [c for c in pod["spec"]["containers"] if c["name"] == "engine"]
        assert engine["image"].rsplit(":", 1)[0] == CANN, engine["image"]
    planned = wait_condition(kubectl, ns, name, "Planned", "True", wait_for)
    assert planned["reason"] != "NoImageForNodeArchitecture", planned
    kubectl("delete", "glmservice", name, "-n", ns, "--wait=true")


@pytest.fixture(scope="module")
def amd64_cann_operator(glm_crds: list[str], kubectl: Kubectl) -> Iterator[OperatorProcess]:
    """An operator whose config says the CANN image has an amd64 build only."""
    with tempfile.NamedTemporaryFile("w", prefix="glm-operator-arch-", suffix=".yaml",
                                     delete=False) as handle:
        yaml.safe_dump({"imageArchitectures": {CANN: ["amd64"]}}, handle)
    process = OperatorProcess(kubectl, namespaces=(f"{PREFIX}*",),
                              extra_args=("--config", handle.name))
    probe = f"{PREFIX}ready-{uuid.uuid4().hex[:5]}"
    try:
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": probe}})
        wait_serving(process, kubectl, probe)
        kubectl.run("delete", "namespace", probe, "--wait=false", check=False)
        yield process
    finally:
        process.stop()
        Path(handle.name).unlink(missing_ok=True)


@pytest.fixture
def ns(request: pytest.FixtureRequest, kubectl: Kubectl,
       amd64_cann_operator: OperatorProcess) -> Iterator[str]:
    def explain(name: str) -> None:
        print(f"\n--- glm-operator log ---\n{amd64_cann_operator.tail(80)}")

    with prefixed_namespace(request, kubectl, PREFIX, explain) as name:
        yield name


def test_an_amd64_only_cann_image_is_refused_with_no_deployment_and_no_pod(
        kubectl: Kubectl, ns: str) -> None:
    mv, svc = on_910b()
    fetched(kubectl, ns, mv)
    kubectl.apply(svc, namespace=ns)
    name = svc["metadata"]["name"]
    planned = wait_condition(kubectl, ns, name, "Planned", "False", wait_for)
    assert planned["reason"] == "NoImageForNodeArchitecture", planned
    message = planned["message"]
    assert "the nodes of accelerator profile ascend-910b are arm64" in message, message
    assert f"image {CANN}:" in message and "is built for amd64 only" in message, message
    assert "imageArchitectures" in message and "another accelerator profile" in message
    obj = kubectl.get_json("glmservice", name, "-n", ns)
    assert condition(obj, "Ready")["status"] == "False"  # type: ignore[index]
    assert kubectl.items("deployments", "-n", ns) == []
    assert pods_of(kubectl, ns, name) == []
