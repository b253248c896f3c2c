"""The operator at work on the local control plane: real API server, scheduler,
controller-manager (GC, ReplicaSets, PV binding) and kwok nodes with GPU/NPU capacity."""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubectl import Kubectl
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator, report_fetched

__all__ = ["glm_crds", "operator"]  # fixtures used by name

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SERVICE_LABEL = "glm-operator.dev/service"
Wait = Callable[..., Any]


def example(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = {p.stem: yaml.safe_load(p.read_text()) for p in (EXAMPLES / name).glob("*.yaml")}
    return docs["modelversion"], docs["glmservice"]


CPU_MV, CPU_SVC = example("cpu-llamacpp")
# The e2e volumes offer every access mode. The example's ReadWriteOnce cache would pin every
# pod of a version to the node its first pod took (render/pod.py cache_affinity), and tests
# that spread replicas, surge or roll two versions would then depend on which node that was;
# e2e/test_rwo_cache.py tests the pinning itself.
CPU_MV["spec"].setdefault("cache", {})["accessMode"] = "ReadWriteMany"


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_),
                None)


def glms(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return kubectl.get_json("glmservice", name, "-n", ns)


def deploy_model(kubectl: Kubectl, ns: str, mv: dict[str, Any], wait_for: Wait) -> str:
    """Apply a ModelVersion, wait for the operator's fetch Job, and report it fetched."""
    kubectl.apply(mv, namespace=ns)
    name = mv["metadata"]["name"]
    selector = f"glm-operator.dev/model-version={name}"
    wait_for(lambda: kubectl.items("jobs", "-n", ns, "-l", selector), timeout=60,
             what=f"the fetch Job of ModelVersion {name}")
    report_fetched(kubectl, ns, name)
    return name


def wait_condition(kubectl: Kubectl, ns: str, name: str, type_: str, status: str,
                   wait_for: Wait, timeout: float = 60) -> dict[str, Any]:
    """Wait until the GLMService's condition `type_` has `status`; return the condition."""
    def reached() -> dict[str, Any] | None:
        cond = condition(glms(kubectl, ns, name), type_)
        return cond if cond and cond["status"] == status else None
    result: dict[str, Any] = wait_for(reached, timeout=timeout,
                                      what=f"GLMService {name} {type_}={status}")
    return result


def wait_ready(kubectl: Kubectl, ns: str, name: str, wait_for: Wait,
               timeout: float = 120) -> dict[str, Any]:
    wait_condition(kubectl, ns, name, "Ready", "True", wait_for, timeout)
    return glms(kubectl, ns, name)


def serve_cpu_example(kubectl: Kubectl, ns: str, wait_for: Wait) -> str:
    """The CPU example fetched, applied and Ready; returns the GLMService name."""
    deploy_model(kubectl, ns, CPU_MV, wait_for)
    kubectl.apply(CPU_SVC, namespace=ns)
    name: str = CPU_SVC["metadata"]["name"]
    wait_ready(kubectl, ns, name, wait_for)
    return name


def service_pods(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    return kubectl.items("pods", "-n", ns, "-l", f"{SERVICE_LABEL}={name}")


def node_labels(kubectl: Kubectl, node: str) -> dict[str, str]:
    labels: dict[str, str] = kubectl.get_json("node", node)["metadata"]["labels"]
    return labels


def test_cpu_service_is_planned_scheduled_and_ready(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    mv_name = deploy_model(kubectl, namespace, CPU_MV, wait_for)
    kubectl.apply(CPU_SVC, namespace=namespace)
    name = CPU_SVC["metadata"]["name"]
    obj = wait_ready(kubectl, namespace, name, wait_for)

    status = obj["status"]
    assert status["stableModelVersion"] == mv_name
    assert status["readyReplicas"] == 1
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert condition(obj, "Planned")["status"] == "True"  # type: ignore[index]
    plan = status["plan"]
    assert plan["engine"] == "llamacpp" and plan["llamacpp"]["parallel"] == 2
    assert plan["llamacpp"]["ctxPerSlot"] * 2 >= 8192
    assert status["endpoint"].startswith("http://") and namespace in status["endpoint"]

    pods = service_pods(kubectl, namespace, name)
    assert len(pods) == 1
    node = pods[0]["spec"]["nodeName"]
    assert "nvidia.com/gpu.product" not in node_labels(kubectl, node)
    assert "accelerator" not in node_labels(kubectl, node)

    mv = kubectl.get_json("modelversion", mv_name, "-n", namespace)
    assert condition(mv, "Ready")["status"] == "True"  # type: ignore[index]
    assert kubectl.exists("pvc", "-n", namespace, "-l", f"glm-operator.dev/model-version={mv_name}")


def test_gpu_service_lands_on_a10_nodes_with_gpu_requests(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    mv, svc = example("nvidia-a10-llamacpp")
    kubectl("create", "secret", "generic", "glm-chat-api-keys", "-n", namespace,
            "--from-literal=key1=sk-test")
    deploy_model(kubectl, namespace, mv, wait_for)
    kubectl.apply(svc, namespace=namespace)
    name = svc["metadata"]["name"]
    wait_ready(kubectl, namespace, name, wait_for)
    pods = service_pods(kubectl, namespace, name)
    assert pods
    for pod in pods:
        labels = node_labels(kubectl, pod["spec"]["nodeName"])
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A10"
        engine = next(c for c in pod["spec"]["containers"] if "nvidia.com/gpu" in
                      c.get("resources", {}).get("limits", {}))
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # autoscaling is set: an HPA exists and the Deployment's replicas are not in our intent
    assert kubectl.exists("hpa", "-n", namespace, "-l", f"{SERVICE_LABEL}={name}")


def test_device_memory_target_below_the_plan_is_refused_with_the_numbers(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    """llama.cpp allocates its KV cache at load: a device-memory target at or below the
    plan's steady figure would pin the HPA at maxReplicas. The operator leaves it out of the
    HPA and says why; raised above the plan, it is kept as a guard."""
    mv, svc = example("nvidia-a10-llamacpp")
    deploy_model(kubectl, namespace, mv, wait_for)
    low = copy.deepcopy(svc)
    low["spec"]["autoscaling"]["targets"] = {"queueLength": 2,
                                             "acceleratorMemoryUtilization": 10}
    kubectl.apply(low, namespace=namespace)
    name = low["metadata"]["name"]
    cond = wait_condition(kubectl, namespace, name, "AutoscalingTargetsValid", "False",
                          wait_for)
    assert cond["reason"] == "MemoryTargetBelowPlan"
    for part in ("acceleratorMemoryUtilization 10 %", "GiB per device", "kvCacheUtilization"):
        assert part in cond["message"], cond["message"]

    def hpa_metrics() -> list[str] | None:
        hpas = kubectl.items("hpa", "-n", namespace, "-l", f"{SERVICE_LABEL}={name}")
        return [m["pods"]["metric"]["name"] for m in hpas[0]["spec"]["metrics"]] if hpas else None

    assert wait_for(hpa_metrics, timeout=30, what="the HPA") == ["glm_gateway_requests_queued"]

    # Above the plan's 51 % and within the HPA's reach (above 90 % nothing ever scales).
    low["spec"]["autoscaling"]["targets"]["acceleratorMemoryUtilization"] = 90
    kubectl.apply(low, namespace=namespace)
    cond = wait_condition(kubectl, namespace, name, "AutoscalingTargetsValid", "True", wait_for)
    assert "kept as a guard" in cond["message"]
    assert wait_for(lambda: len(hpa_metrics() or []) == 2 and hpa_metrics(), timeout=30,
                    what="the memory guard in the HPA") == [
        "glm_gateway_requests_queued", "glm_accelerator_memory_utilization_percent"]


def test_context_change_replaces_pods(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    name = serve_cpu_example(kubectl, namespace, wait_for)
    before = {p["metadata"]["name"] for p in service_pods(kubectl, namespace, name)}

    changed = copy.deepcopy(CPU_SVC)
    changed["spec"]["contextLength"] = 4096
    kubectl.apply(changed, namespace=namespace)

    def rolled() -> bool:
        pods = service_pods(kubectl, namespace, name)
        names = {p["metadata"]["name"] for p in pods}
        return bool(names) and not names & before and all(
            "4096" in json.dumps(p["spec"]["containers"]) for p in pods)
    wait_for(rolled, timeout=120, what="pods replaced with the new context length")
    obj = wait_ready(kubectl, namespace, name, wait_for)
    assert obj["status"]["plan"]["contextLength"] == 4096


def test_deleted_and_edited_children_are_restored(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    name = serve_cpu_example(kubectl, namespace, wait_for)

    services = kubectl.items("services", "-n", namespace, "-l", f"{SERVICE_LABEL}={name}")
    assert services
    svc_name = services[0]["metadata"]["name"]
    kubectl("delete", "service", svc_name, "-n", namespace, "--wait=true")
    wait_for(lambda: kubectl.exists("service", svc_name, "-n", namespace), timeout=60,
             what="the deleted Service restored")

    deployment = kubectl.items("deployments", "-n", namespace, "-l", f"{SERVICE_LABEL}={name}")[0]
    dep_name = deployment["metadata"]["name"]
    original = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    kubectl("patch", "deployment", dep_name, "-n", namespace, "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": ["x"]}]))
    wait_for(lambda: kubectl.get_json("deployment", dep_name, "-n", namespace)
             ["spec"]["template"]["spec"]["containers"][0]["args"] == original,
             timeout=60, what="the edited Deployment args restored")


def test_removed_overrides_leave_the_child_and_removed_keys_come_back(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    """Intent removals reach the child (server-side apply drops what the operator no longer
    sets); a key someone removes from the child comes back, with an Event naming it; a key
    another controller adds is left alone."""
    deploy_model(kubectl, namespace, CPU_MV, wait_for)
    svc = copy.deepcopy(CPU_SVC)
    name = svc["metadata"]["name"]
    svc["spec"]["podOverrides"] = {"labels": {"team": "search"},
                                   "annotations": {"example.com/owner": "search"}}
    kubectl.apply(svc, namespace=namespace)
    wait_ready(kubectl, namespace, name, wait_for)
    dep_name = kubectl.items("deployments", "-n", namespace,
                             "-l", f"{SERVICE_LABEL}={name}")[0]["metadata"]["name"]

    def template(key: str) -> dict[str, str]:
        meta = kubectl.get_json("deployment", dep_name, "-n", namespace)["spec"]["template"]
        found: dict[str, str] = meta["metadata"].get(key, {})
        return found
    assert template("labels")["team"] == "search"
    assert template("annotations")["example.com/owner"] == "search"

    kubectl("annotate", "deployment", dep_name, "-n", namespace, "other.example.com/keep=1")
    del svc["spec"]["podOverrides"]["labels"]
    kubectl.apply(svc, namespace=namespace)
    wait_for(lambda: "team" not in template("labels"), timeout=60,
             what="the label removed from podOverrides gone from the pod template")
    assert template("annotations")["example.com/owner"] == "search"

    kubectl("label", "deployment", dep_name, "-n", namespace, "glm-operator.dev/pool-")
    wait_for(lambda: kubectl.get_json("deployment", dep_name, "-n", namespace)
             ["metadata"]["labels"].get("glm-operator.dev/pool") == "main",
             timeout=60, what="the label removed from the Deployment restored")
    events = wait_for(lambda: kubectl.items("events", "-n", namespace, "--field-selector",
                                            "reason=DriftCorrected"),
                      timeout=30, what="a DriftCorrected Event")
    assert "glm-operator.dev/pool" in events[0]["message"], events[0]["message"]
    assert events[0]["involvedObject"]["kind"] == "GLMService"
    live = kubectl.get_json("deployment", dep_name, "-n", namespace)["metadata"]
    assert live["annotations"].get("other.example.com/keep") == "1"


def test_deleting_the_service_garbage_collects_children(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    name = serve_cpu_example(kubectl, namespace, wait_for)
    kubectl("delete", "glmservice", name, "-n", namespace, "--wait=true")

    def gone() -> bool:
        for kind in ("deployments", "replicasets", "pods", "services"):
            if kubectl.items(kind, "-n", namespace, "-l", f"{SERVICE_LABEL}={name}"):
                return False
        return True
    wait_for(gone, timeout=120, what="every child of the deleted GLMService garbage-collected")


def test_missing_model_version_is_a_condition_then_proceeds(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    kubectl.apply(CPU_SVC, namespace=namespace)
    name = CPU_SVC["metadata"]["name"]

    cond = wait_condition(kubectl, namespace, name, "ModelReady", "False", wait_for)
    assert cond["reason"] == "ModelVersionNotFound"
    assert CPU_MV["metadata"]["name"] in cond["message"]
    assert not kubectl.items("deployments", "-n", namespace, "-l", f"{SERVICE_LABEL}={name}")

    deploy_model(kubectl, namespace, CPU_MV, wait_for)
    wait_ready(kubectl, namespace, name, wait_for)


def test_two_services_never_select_each_others_pods(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    deploy_model(kubectl, namespace, CPU_MV, wait_for)
    first = copy.deepcopy(CPU_SVC)
    second = copy.deepcopy(CPU_SVC)
    second["metadata"]["name"] = "glm-cpu-b"
    kubectl.apply([first, second], namespace=namespace)
    for svc in (first, second):
        wait_ready(kubectl, namespace, svc["metadata"]["name"], wait_for)
    pods = kubectl.items("pods", "-n", namespace)
    for obj in kubectl.items("services", "-n", namespace) + kubectl.items("deployments", "-n",
                                                                            namespace):
        selector = obj["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        owner = obj["metadata"]["labels"][SERVICE_LABEL]
        selected = [p for p in pods
                    if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        assert selected, f"{obj['kind']} {obj['metadata']['name']} selects nothing"
        assert {p["metadata"]["labels"][SERVICE_LABEL] for p in selected} == {owner}


def test_infeasible_plan_is_a_condition_with_numbers_and_no_pods(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    mv, svc = example("nvidia-a10-llamacpp")
    deploy_model(kubectl, namespace, mv, wait_for)
    huge = copy.deepcopy(svc)
    huge["spec"]["contextLength"] = 32768  # the trained context, so only memory is short
    huge["spec"]["concurrency"] = 24
    kubectl.apply(huge, namespace=namespace)
    name = huge["metadata"]["name"]

    cond = wait_condition(kubectl, namespace, name, "Planned", "False", wait_for)
    assert cond["reason"] == "Infeasible"
    assert "GiB" in cond["message"] and "nvidia-a10" in cond["message"]
    assert "fits" in cond["message"]  # names the nearest configurations that fit
    time.sleep(2)
    assert not kubectl.items("deployments", "-n", namespace, "-l", f"{SERVICE_LABEL}={name}")
    ready = condition(glms(kubectl, namespace, name), "Ready")
    assert ready is not None and ready["status"] == "False"


@pytest.mark.parametrize("settle_seconds", [15])
def test_idle_operator_writes_nothing(
        glm_crds: list[str], kubectl: Kubectl, wait_for: Wait, settle_seconds: int) -> None:
    # An operator of its own on a namespace no other operator watches: the session operator's
    # periodic work for other tests' objects (a resync, a rollout's next step) cannot count.
    namespace = f"idle-{uuid.uuid4().hex[:6]}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    process = OperatorProcess(kubectl, namespaces=(namespace,))
    try:
        wait_for(process.alive, timeout=60, what="the idle test's operator")
        wait_for(lambda: kubectl.exists("serviceaccount", "default", "-n", namespace),
                 timeout=30, what="the default ServiceAccount")
        deploy_model(kubectl, namespace, CPU_MV, wait_for)
        kubectl.apply(CPU_SVC, namespace=namespace)
        wait_ready(kubectl, namespace, CPU_SVC["metadata"]["name"], wait_for)
        time.sleep(5)  # let the last pod events settle

        def writes() -> float:
            return sum(process.metric("glm_operator_api_requests_total", verb=v)
                       for v in ("apply", "patch", "create", "delete", "update"))
        before = writes()
        assert before > 0  # it did reconcile this service
        time.sleep(settle_seconds)
        assert writes() == before, process.tail()
        # A reconcile that finds nothing changed writes nothing either (every child kind is
        # read from the cache, the fetch Job's RBAC included).
        reconciles = process.metric("glm_operator_reconciles_total", kind="ModelVersion",
                                    result="ok")
        kubectl("label", "modelversion", CPU_MV["metadata"]["name"], "-n", namespace,
                "example.com/touched=1")
        wait_for(lambda: process.metric("glm_operator_reconciles_total", kind="ModelVersion",
                                        result="ok") > reconciles,
                 timeout=30, what="a ModelVersion reconcile after the label")
        time.sleep(2)
        assert writes() == before, process.tail()
    finally:
        process.stop()
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
