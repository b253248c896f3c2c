"""Voluntary disruption on the local control plane: the operator's PodDisruptionBudget makes
the real API server's eviction check (the eviction subresource, which `kubectl drain` uses)
refuse to evict the last ready replica of a pool with 429, and let one of two go.

The budget's status is the real kube-controller-manager's disruption controller's; the pods
are kwok's (Running and Ready without containers)."""

from __future__ import annotations

import copy
import json
from typing import Any

from e2e.kubectl import Kubectl
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator
from e2e.test_operator import CPU_MV, CPU_SVC, Wait, deploy_model, service_pods, wait_ready

__all__ = ["glm_crds", "operator"]  # fixtures used by name

SERVICE_LABEL = "glm-operator.dev/service"


def evict(kubectl: Kubectl, namespace: str, pod: str) -> tuple[int, str]:
    """POST the pod's eviction subresource, as `kubectl drain` does: (exit code, output)."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": namespace}}
    result = kubectl.run("create", "--raw",
                         f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", "-f", "-",
                         input=json.dumps(eviction), check=False)
    return result.returncode, result.stdout + result.stderr


def budget_settled(kubectl: Kubectl, namespace: str, name: str, healthy: int,
                   allowed: int) -> Any:
    """The disruption controller has counted the pods: (currentHealthy, disruptionsAllowed)."""
    def settled() -> dict[str, Any] | None:
        pdb = kubectl.get_json("pdb", name, "-n", namespace)
        status = pdb.get("status") or {}
        if (status.get("observedGeneration") == pdb["metadata"]["generation"]
                and status.get("currentHealthy") == healthy
                and status.get("disruptionsAllowed") == allowed):
            return pdb
        return None
    return settled


def ready_pods(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    return [p for p in service_pods(kubectl, namespace, name)
            if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True"
                    for c in p.get("status", {}).get("conditions", []))]


def test_draining_the_node_of_the_last_ready_replica_is_refused(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    deploy_model(kubectl, namespace, CPU_MV, wait_for)
    kubectl.apply(CPU_SVC, namespace=namespace)  # replicas: 1
    name = CPU_SVC["metadata"]["name"]
    wait_ready(kubectl, namespace, name, wait_for)
    pdb = wait_for(budget_settled(kubectl, namespace, name, healthy=1, allowed=0), timeout=60,
                   what="the PodDisruptionBudget counted by the disruption controller")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["metadata"]["ownerReferences"][0]["name"] == name
    [pod] = ready_pods(kubectl, namespace, name)
    node = pod["spec"]["nodeName"]

    # The eviction subresource refuses: 429 TooManyRequests, naming the budget.
    code, output = evict(kubectl, namespace, pod["metadata"]["name"])
    assert code != 0, output
    assert "TooManyRequests" in output and "disruption budget" in output, output

    # kubectl drain of its node: retries the eviction until its timeout, then gives up.
    try:
        drained = kubectl.run("drain", node, "--pod-selector", f"{SERVICE_LABEL}={name}",
                              "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=15s",
                              check=False)
        assert drained.returncode != 0, drained.stdout
        assert "disruption budget" in drained.stdout + drained.stderr, drained.stderr
    finally:
        kubectl.run("uncordon", node, check=False)
    assert [p["metadata"]["name"] for p in ready_pods(kubectl, namespace, name)] == [
        pod["metadata"]["name"]]  # still serving, on the same pod


def test_of_two_replicas_one_may_be_evicted(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    deploy_model(kubectl, namespace, CPU_MV, wait_for)
    two = copy.deepcopy(CPU_SVC)
    two["spec"]["replicas"] = 2
    kubectl.apply(two, namespace=namespace)
    name = two["metadata"]["name"]
    wait_for(lambda: len(ready_pods(kubectl, namespace, name)) == 2, timeout=120,
             what="two ready pods")
    pdb = wait_for(budget_settled(kubectl, namespace, name, healthy=2, allowed=1), timeout=60,
                   what="the PodDisruptionBudget at two healthy pods")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    victim = ready_pods(kubectl, namespace, name)[0]["metadata"]["name"]
    code, output = evict(kubectl, namespace, victim)
    assert code == 0, output
    # The Deployment replaces it; the budget counts two healthy pods again.
    wait_for(budget_settled(kubectl, namespace, name, healthy=2, allowed=1), timeout=90,
             what="the evicted replica replaced")
