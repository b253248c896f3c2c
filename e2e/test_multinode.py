"""Multi-node replicas on the local control plane: a GLMService too large for one node
becomes groups of pods (leader StatefulSet, one worker StatefulSet per group, a headless
Service), which the real kube-scheduler places one pod per node on the profile's fake nodes
and the real kube-controller-manager scales and garbage-collects.

kwok plays the kubelet: no engine runs. What is checked is placement, names, argv and
lifecycle; the engines' own multi-node runtime is not run here (docs/planning.md says what is
and is not proven).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from e2e.kubectl import Kubectl
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator, report_fetched
from e2e.test_operator import condition, glms, node_labels, wait_condition

__all__ = ["glm_crds", "operator"]  # fixtures used by name

Wait = Callable[..., Any]
SERVICE_LABEL = "glm-operator.dev/service"
ROLE_LABEL = "glm-operator.dev/group-role"
L4 = "NVIDIA-L4"  # e2e/nodes.yaml: 3 nodes of 8 L4, used by this test alone
NAME = "glm-big"
VERSION = "glm-4-6-q4"
SET = f"{NAME}-{VERSION}"
# GLM-4.6-class MoE in Q4_K_M (216 GB): more than one node of eight 22.5 GiB L4s holds.
MODEL_VERSION = {
    "apiVersion": "serving.glm-operator.dev/v1alpha2",
    "kind": "ModelVersion",
    "metadata": {"name": VERSION},
    "spec": {
        "source": {"uri": "hf://unsloth/GLM-4.6-GGUF/GLM-4.6-Q4_K_M.gguf"},
        "format": "gguf",
        "quantization": "Q4_K_M",
        "architecture": "glm4moe",
        "sha256": "ab" * 32,
        # Every node of a group mounts the weights: a ReadWriteOnce cache (one node) would be
        # refused (CacheNotShareable, e2e/test_rwo_cache.py).
        "cache": {"size": "250Gi", "accessMode": "ReadWriteMany"},
        "facts": {"blockCount": 92, "nextnPredictLayers": 1, "embeddingLength": 5120,
                  "headCount": 96, "headCountKv": 8, "keyLength": 128, "valueLength": 128,
                  "contextLength": 202752, "vocabSize": 151552, "expertCount": 160,
                  "expertUsedCount": 8, "parameterCount": 355_000_000_000,
                  "sizeBytes": 216_000_000_000},
    },
}
SERVICE = {
    "apiVersion": "serving.glm-operator.dev/v1alpha2",
    "kind": "GLMService",
    "metadata": {"name": NAME},
    "spec": {"modelVersion": VERSION, "engine": {"llamacpp": {}},
             "accelerator": {"profile": "nvidia-l4", "count": 8},
             "contextLength": 8192, "concurrency": 1, "replicas": 1,
             "gateway": {"access": "Open"}},
}


def group_pods(kubectl: Kubectl, ns: str, version: str = VERSION) -> list[dict[str, Any]]:
    return kubectl.items("pods", "-n", ns, "-l",
                         f"{SERVICE_LABEL}={NAME},glm-operator.dev/version={version}")


def fetched(kubectl: Kubectl, ns: str, wait_for: Wait, name: str) -> None:
    mv = {**MODEL_VERSION, "metadata": {"name": name}}
    kubectl.apply(mv, namespace=ns)
    wait_for(lambda: kubectl.items("jobs", "-n", ns, "-l",
                                   f"glm-operator.dev/model-version={name}"),
             timeout=60, what=f"the fetch Job of {name}")
    report_fetched(kubectl, ns, name, size=MODEL_VERSION["spec"]["facts"]["sizeBytes"])


def running(pods: list[dict[str, Any]]) -> bool:
    return all(p.get("status", {}).get("phase") == "Running" and p["spec"].get("nodeName")
               for p in pods)


def wait_groups(kubectl: Kubectl, ns: str, wait_for: Wait, groups: int, size: int,
                version: str = VERSION) -> list[dict[str, Any]]:
    """Wait for `groups` ready groups of `size` running pods; return the pods."""
    def settled() -> list[dict[str, Any]] | None:
        pods = [p for p in group_pods(kubectl, ns, version)
                if not p["metadata"].get("deletionTimestamp")]
        status = glms(kubectl, ns, NAME).get("status", {})
        if (len(pods) == groups * size and running(pods)
                and status.get("readyReplicas") == groups and status.get("replicas") == groups):
            return pods
        return None
    pods: list[dict[str, Any]] = wait_for(settled, timeout=120,
                                          what=f"{groups} groups of {size} running pods")
    return pods


def check_groups(kubectl: Kubectl, ns: str, pods: list[dict[str, Any]], groups: int,
                 set_name: str = SET) -> None:
    """Every group: its leader and workers on distinct L4 nodes, under stable names."""
    by_name = {p["metadata"]["name"]: p for p in pods}
    for g in range(groups):
        leader = by_name[f"{set_name}-{g}"]
        workers = [by_name[f"{set_name}-{g}-{w}"] for w in (1, 2)]
        nodes = [p["spec"]["nodeName"] for p in (leader, *workers)]
        assert len(set(nodes)) == 3, f"group {g} shares a node: {nodes}"
        for node in nodes:
            assert node_labels(kubectl, node)["nvidia.com/gpu.product"] == L4
        for pod in (leader, *workers):
            # The StatefulSet controller gives each pod its stable DNS name.
            assert pod["spec"]["hostname"] == pod["metadata"]["name"]
            assert pod["spec"]["subdomain"] == set_name
        assert leader["metadata"]["labels"][ROLE_LABEL] == "leader"
        assert {c["name"] for c in leader["spec"]["containers"]} == {"engine", "gateway"}
        engine = next(c for c in leader["spec"]["containers"] if c["name"] == "engine")
        args = engine["args"]
        rpc = args[args.index("--rpc") + 1].replace("$(GLM_POD_NAME)", leader["metadata"]["name"])
        assert rpc.split(",") == [f"{w['metadata']['name']}.{set_name}.{ns}.svc.cluster.local:50052"
                                  for w in workers]
        for worker in workers:
            (container,) = worker["spec"]["containers"]
            assert [*container["command"], *container["args"][:4]] == [
                "ggml-rpc-server", "--host", "0.0.0.0", "--port", "50052"]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
            # Spread also comes from the scheduler's default topology spreading; the group's
            # required anti-affinity is what makes it a rule.
            terms = worker["spec"]["affinity"]["podAntiAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]
            assert {t["topologyKey"] for t in terms} == {"kubernetes.io/hostname"}


def endpoint_hostnames(kubectl: Kubectl, ns: str) -> set[str]:
    slices = kubectl.items("endpointslices", "-n", ns,
                           "-l", f"kubernetes.io/service-name={SET}")
    return {e.get("hostname", "") for s in slices for e in s.get("endpoints") or []}


def test_a_service_too_big_for_one_node_runs_as_groups_placed_one_pod_per_node(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    ns = namespace
    fetched(kubectl, ns, wait_for, VERSION)
    kubectl.apply(SERVICE, namespace=ns)
    # One node of eight L4 cannot hold it: the plan says so and proposes more nodes.
    planned = wait_condition(kubectl, ns, NAME, "Planned", "False", wait_for)
    assert planned["reason"] == "Infeasible"
    assert "nodes x 8 x nvidia-l4 fits" in planned["message"], planned["message"]
    assert group_pods(kubectl, ns) == []

    # Three nodes of four L4 each per replica: a node could hold two such pods, so only the
    # group's anti-affinity keeps them apart.
    kubectl("patch", "glmservice", NAME, "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"accelerator": {"count": 4, "nodes": 3}}}))
    pods = wait_groups(kubectl, ns, wait_for, groups=1, size=3)
    check_groups(kubectl, ns, pods, groups=1)
    obj = glms(kubectl, ns, NAME)
    assert condition(obj, "Ready")["status"] == "True"  # type: ignore[index]
    plan = obj["status"]["plan"]
    assert (plan["nodes"], plan["count"], plan["llamacpp"]["rpcWorkers"]) == (3, 4, 2)
    assert [n["role"] for n in plan["perNode"]] == ["leader", "worker", "worker"]
    # The pool's Service reaches the leader only; the headless Service names every pod.
    main = kubectl.items("endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={NAME}")
    targets = {e["targetRef"]["name"] for s in main for e in s.get("endpoints") or []}
    assert targets == {f"{SET}-0"}
    wait_for(lambda: endpoint_hostnames(kubectl, ns) == {f"{SET}-0", f"{SET}-0-1", f"{SET}-0-2"},
             timeout=30, what="the headless Service's endpoints with the pods' hostnames")
    # Settled groups cost no writes: what the API server defaults in a StatefulSet and a
    # NetworkPolicy is not taken for drift.
    def group_writes() -> float:
        return sum(operator.metric("glm_operator_child_writes_total", kind=kind)
                   for kind in ("StatefulSet", "NetworkPolicy"))
    before = group_writes()
    time.sleep(8)
    assert group_writes() == before, operator.tail()

    # Scaling adds and removes whole groups, as replicas of a Deployment.
    kubectl("patch", "glmservice", NAME, "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"replicas": 2}}))
    pods = wait_groups(kubectl, ns, wait_for, groups=2, size=3)
    check_groups(kubectl, ns, pods, groups=2)
    kubectl("patch", "glmservice", NAME, "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"replicas": 1}}))
    wait_groups(kubectl, ns, wait_for, groups=1, size=3)
    wait_for(lambda: not kubectl.exists("statefulset", f"{SET}-1", "-n", ns),
             timeout=60, what="the second group's worker StatefulSet removed")

    # A new version rolls out by whole groups (surge): its group comes up beside the old
    # one (each L4 node has room for one more pod of four), then the old group goes.
    v2 = f"{VERSION}-v2"
    fetched(kubectl, ns, wait_for, v2)
    kubectl("patch", "glmservice", NAME, "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"modelVersion": v2}}))
    wait_for(lambda: glms(kubectl, ns, NAME).get("status", {}).get("stableModelVersion") == v2,
             timeout=120, what=f"{v2} promoted")
    pods = wait_groups(kubectl, ns, wait_for, groups=1, size=3, version=v2)
    check_groups(kubectl, ns, pods, groups=1, set_name=f"{NAME}-{v2}")
    wait_for(lambda: not group_pods(kubectl, ns, VERSION)
             and not kubectl.exists("statefulset", SET, "-n", ns),
             timeout=120, what="the old version's group removed")

    # Deleting the service takes every child with it (owner references, the real GC).
    kubectl("delete", "glmservice", NAME, "-n", ns, "--wait=true")

    def gone() -> bool:
        return not any(kubectl.items(kind, "-n", ns, "-l", f"{SERVICE_LABEL}={NAME}")
                       for kind in ("statefulsets", "pods", "services", "networkpolicies"))
    wait_for(gone, timeout=120, what="every child of the deleted GLMService garbage-collected")


def test_autoscaled_groups_are_added_and_removed_whole_by_the_hpa(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    """The HPA resizes the leader StatefulSet through its scale subresource; the operator
    follows with one worker StatefulSet per group and never resets the size. The real HPA
    controller (kube-controller-manager) holds the set within its bounds."""
    ns = namespace
    fetched(kubectl, ns, wait_for, VERSION)
    svc = json.loads(json.dumps(SERVICE))
    del svc["spec"]["replicas"]
    svc["spec"]["accelerator"] = {"profile": "nvidia-l4", "count": 4, "nodes": 3}
    svc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2,
                                  "targets": {"queueLength": 4}}
    kubectl.apply(svc, namespace=ns)
    check_groups(kubectl, ns, wait_groups(kubectl, ns, wait_for, groups=1, size=3), groups=1)
    (hpa,) = kubectl.items("hpa", "-n", ns, "-l", f"{SERVICE_LABEL}={NAME}")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                             "name": SET}
    autoscaling = condition(glms(kubectl, ns, NAME), "Autoscaling")
    assert autoscaling is not None and autoscaling["reason"] == "HPA", autoscaling

    def replicas() -> int:
        return int(kubectl.get_json("statefulset", SET, "-n", ns)["spec"]["replicas"])

    # What the HPA does when the load grows: a second group, whose workers the operator adds.
    kubectl("scale", "statefulset", SET, "-n", ns, "--replicas=2")
    check_groups(kubectl, ns, wait_groups(kubectl, ns, wait_for, groups=2, size=3), groups=2)
    # The reconciles that every pod and set event brings leave the autoscaler's size alone.
    time.sleep(5)
    assert replicas() == 2

    # Beyond maxReplicas: the real HPA controller brings the set back to 2, and no third
    # group's workers are made meanwhile.
    kubectl("scale", "statefulset", SET, "-n", ns, "--replicas=3")
    wait_for(lambda: replicas() == 2, timeout=60,
             what="the HPA controller holding the leader set at maxReplicas")
    assert not kubectl.exists("statefulset", f"{SET}-2", "-n", ns)

    # Load gone: the HPA removes a group, the operator its workers.
    kubectl("scale", "statefulset", SET, "-n", ns, "--replicas=1")
    wait_groups(kubectl, ns, wait_for, groups=1, size=3)
    wait_for(lambda: not kubectl.exists("statefulset", f"{SET}-1", "-n", ns),
             timeout=60, what="the second group's worker StatefulSet removed")
    kubectl("delete", "glmservice", NAME, "-n", ns, "--wait=true")
