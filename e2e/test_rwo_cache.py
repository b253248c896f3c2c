"""A ReadWriteOnce model cache on the local control plane: one node mounts it, so the real
kube-scheduler must put every pod serving the version on that node, and what cannot sit there
is refused with a condition before any pod waits.

- two replicas on the two 8-GPU A100 nodes of e2e/nodes.yaml: without the operator's
  required pod affinity, the scheduler's spreading (the pool's ScheduleAnyway topology spread
  and least-allocated scoring) puts them on different nodes; with it, on one;
- more replicas than that node's GPUs: Planned=False (CacheNotShareable) with the numbers,
  and the two running replicas stay as they are;
- a node the replicas fill has no room for a rolling update's surge pod: the pods are
  replaced one at a time there, and the update completes;
- a multi-node group (accelerator.nodes 2) with that cache: Planned=False, and no pod,
  StatefulSet or LeaderWorkerSet is created at all; the same service with a ReadWriteMany
  cache is rendered.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from e2e.kubectl import Kubectl
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator
from e2e.test_operator import deploy_model, example, glms, node_labels, wait_condition

__all__ = ["glm_crds", "operator"]  # fixtures used by name

Wait = Callable[..., Any]
A100 = "NVIDIA-A100-SXM4-80GB"
SERVICE_LABEL = "glm-operator.dev/service"

_MV, _ = example("nvidia-a10-llamacpp")
RWO_MV = copy.deepcopy(_MV)
RWO_MV["metadata"] = {"name": "glm4-rwo"}
RWO_MV["spec"]["source"].pop("credentialsSecret", None)
RWO_MV["spec"]["cache"]["accessMode"] = "ReadWriteOnce"


def _service(name: str, version: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "GLMService",
            "metadata": {"name": name},
            "spec": {"modelVersion": version, "engine": {"llamacpp": {}},
                     "accelerator": {"profile": "nvidia-a100-80gb", "count": 1},
                     "contextLength": 8192, "concurrency": 1, "replicas": 2,
                     "gateway": {"access": "Open"}, **spec}}


def _pods(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    return [p for p in kubectl.items("pods", "-n", ns, "-l", f"{SERVICE_LABEL}={name}")
            if not p["metadata"].get("deletionTimestamp")]


def test_replicas_with_a_rwo_cache_land_on_one_node_and_too_many_are_refused(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    ns, name = namespace, "rwo-two"
    deploy_model(kubectl, ns, RWO_MV, wait_for)
    kubectl.apply(_service(name, "glm4-rwo"), namespace=ns)

    def placed() -> list[dict[str, Any]] | None:
        pods = _pods(kubectl, ns, name)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        return bound if len(pods) == 2 and len(bound) == 2 else None
    pods = wait_for(placed, timeout=120, what="two replicas bound by the scheduler")
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 1, f"replicas of a ReadWriteOnce cache on {nodes}"
    assert node_labels(kubectl, nodes.pop())["nvidia.com/gpu.product"] == A100
    terms = pods[0]["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == [{"labelSelector": {"matchLabels": {"glm-operator.dev/version": "glm4-rwo"}},
                      "topologyKey": "kubernetes.io/hostname"}]
    assert {v["persistentVolumeClaim"]["claimName"] for p in pods
            for v in p["spec"]["volumes"] if "persistentVolumeClaim" in v} == {"glm4-rwo-cache"}
    wait_condition(kubectl, ns, name, "Ready", "True", wait_for, timeout=120)

    # Nine replicas of one GPU cannot share one node of eight: refused with the numbers,
    # and the two that run are left alone (no seven pods waiting on the other node).
    kubectl("patch", "glmservice", name, "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"replicas": 9}}))
    planned = wait_condition(kubectl, ns, name, "Planned", "False", wait_for)
    assert planned["reason"] == "CacheNotShareable", planned
    message = planned["message"]
    assert "ReadWriteOnce" in message and "9 replicas x 1 nvidia.com/gpu = 9" in message, message
    assert "a nvidia-a100-80gb node has 8 (at most 8 replicas fit)" in message, message
    assert "ReadWriteMany" in message
    pods_after = _pods(kubectl, ns, name)
    assert len(pods_after) == 2, [p["metadata"]["name"] for p in pods_after]


def test_an_update_on_a_full_pinned_node_replaces_pods_in_place(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    """2 replicas x 4 GPUs fill the A100 node the cache pins them to: a surge pod could never
    be placed there, so the Deployment replaces its pods one at a time, and the update ends."""
    ns, name = namespace, "rwo-full"
    deploy_model(kubectl, ns, RWO_MV, wait_for)
    kubectl.apply(_service(name, "glm4-rwo",
                           accelerator={"profile": "nvidia-a100-80gb", "count": 4}),
                  namespace=ns)
    wait_condition(kubectl, ns, name, "Ready", "True", wait_for, timeout=120)
    (deployment,) = kubectl.items("deployments", "-n", ns, "-l", f"{SERVICE_LABEL}={name}")
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0,
                                                               "maxUnavailable": 1}
    before = {p["metadata"]["name"] for p in _pods(kubectl, ns, name)}
    node = {p["spec"]["nodeName"] for p in _pods(kubectl, ns, name)}
    assert len(before) == 2 and len(node) == 1

    kubectl("patch", "glmservice", name, "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"contextLength": 4096}}))  # a new pod template

    def replaced() -> list[dict[str, Any]] | None:
        pods = _pods(kubectl, ns, name)
        fresh = [p for p in pods if p["metadata"]["name"] not in before
                 and p["spec"].get("nodeName") and p["status"].get("phase") == "Running"]
        return fresh if len(fresh) == 2 and len(pods) == 2 else None
    fresh = wait_for(replaced, timeout=120, what="both replicas replaced on the pinned node")
    assert {p["spec"]["nodeName"] for p in fresh} == node
    wait_condition(kubectl, ns, name, "Ready", "True", wait_for, timeout=120)


def test_a_multi_node_group_with_a_rwo_cache_is_refused_and_never_pending(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    ns, name = namespace, "rwo-group"
    deploy_model(kubectl, ns, RWO_MV, wait_for)
    group = {"accelerator": {"profile": "nvidia-a100-80gb", "count": 8, "nodes": 2},
             "replicas": 1}
    kubectl.apply(_service(name, "glm4-rwo", **group), namespace=ns)
    planned = wait_condition(kubectl, ns, name, "Planned", "False", wait_for)
    assert planned["reason"] == "CacheNotShareable", planned
    assert "spans 2 nodes" in planned["message"], planned["message"]
    assert "ReadWriteMany" in planned["message"]
    assert condition_status(glms(kubectl, ns, name), "Ready") == "False"
    assert _pods(kubectl, ns, name) == []
    assert kubectl.items("statefulsets", "-n", ns, "-l", f"{SERVICE_LABEL}={name}") == []

    # The same group on a ReadWriteMany copy is what the message asks for: it is planned
    # and rendered (its pods are the scheduler's to place).
    rwx = copy.deepcopy(RWO_MV)
    rwx["metadata"] = {"name": "glm4-rwx"}
    rwx["spec"]["cache"]["accessMode"] = "ReadWriteMany"
    deploy_model(kubectl, ns, rwx, wait_for)
    kubectl("patch", "glmservice", name, "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"modelVersion": "glm4-rwx"}}))
    wait_condition(kubectl, ns, name, "Planned", "True", wait_for)
    wait_for(lambda: kubectl.items("statefulsets", "-n", ns, "-l", f"{SERVICE_LABEL}={name}"),
             timeout=60, what="the ReadWriteMany group's StatefulSets")


def condition_status(obj: dict[str, Any], type_: str) -> str | None:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", [])
                 if c["type"] == type_), None)
