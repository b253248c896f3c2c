"""Smoke tests that prove the local control plane is a real Kubernetes: the real scheduler
places pods by extended resources, selectors and taints; the real controller-manager runs
ReplicaSets, garbage collection and PV binding; the real API server validates built-in
objects and CRD schemas."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from e2e import cluster as local_cluster
from e2e import toolchain
from e2e.kubectl import Kubectl, KubectlError

A100_PRODUCT = "NVIDIA-A100-SXM4-80GB"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"

Wait = Callable[..., Any]
Apply = Callable[..., subprocess.CompletedProcess[str]]


def deployment(
    name: str,
    replicas: int = 1,
    *,
    limits: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": PAUSE_IMAGE,
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
    }
    if limits:
        container["resources"]["limits"] = limits
        container["resources"]["requests"].update(limits)
    pod_spec: dict[str, Any] = {"containers": [container]}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
        },
    }


def pods_of(kubectl: Kubectl, namespace: str, app: str) -> list[dict[str, Any]]:
    return kubectl.items("pods", "-n", namespace, "-l", f"app={app}")


def nodes_with_label(kubectl: Kubectl, selector: str) -> set[str]:
    return {node["metadata"]["name"] for node in kubectl.items("nodes", "-l", selector)}


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def failed_scheduling_messages(kubectl: Kubectl, namespace: str, pod: str) -> list[str]:
    events = kubectl.items(
        "events", "-n", namespace,
        "--field-selector", f"involvedObject.name={pod},reason=FailedScheduling",
    )
    return [event.get("message", "") for event in events]


def available_replicas(kubectl: Kubectl, namespace: str, name: str) -> int:
    status = kubectl.get_json("deployment", name, "-n", namespace).get("status", {})
    return int(status.get("availableReplicas", 0))


def test_gpu_pods_land_only_on_a100_nodes_and_become_ready(
    kubectl: Kubectl, namespace: str, apply: Apply, wait_for: Wait
) -> None:
    apply(
        deployment(
            "a100", replicas=4, limits={"nvidia.com/gpu": "1"},
            node_selector={"nvidia.com/gpu.product": A100_PRODUCT}, tolerations=[GPU_TOLERATION],
        ),
        namespace=namespace,
    )

    wait_for(lambda: available_replicas(kubectl, namespace, "a100") == 4, timeout=90,
             what="4 available replicas of the A100 deployment")

    a100_nodes = nodes_with_label(kubectl, f"nvidia.com/gpu.product={A100_PRODUCT}")
    assert len(a100_nodes) == 2
    pods = pods_of(kubectl, namespace, "a100")
    assert len(pods) == 4
    assert {pod["spec"]["nodeName"] for pod in pods} <= a100_nodes
    assert all(is_ready(pod) and pod["status"]["phase"] == "Running" for pod in pods)


def test_pod_asking_for_more_gpus_than_any_node_has_stays_pending(
    kubectl: Kubectl, namespace: str, apply: Apply, wait_for: Wait
) -> None:
    apply(
        deployment("nine-gpus", limits={"nvidia.com/gpu": "9"}, tolerations=[GPU_TOLERATION]),
        namespace=namespace,
    )

    pod = wait_for(lambda: pods_of(kubectl, namespace, "nine-gpus"), timeout=60,
                   what="the ReplicaSet controller to create the pod")[0]
    name = pod["metadata"]["name"]
    messages = wait_for(lambda: failed_scheduling_messages(kubectl, namespace, name),
                        timeout=60, what=f"a FailedScheduling event for pod {name}")

    assert any("Insufficient nvidia.com/gpu" in message for message in messages), messages
    pod = kubectl.get_json("pod", name, "-n", namespace)
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]


def test_pods_without_the_gpu_toleration_never_land_on_accelerator_nodes(
    kubectl: Kubectl, namespace: str, apply: Apply, wait_for: Wait
) -> None:
    apply(deployment("plain", replicas=6), namespace=namespace)
    apply(
        deployment("a100-no-toleration", limits={"nvidia.com/gpu": "1"},
                   node_selector={"nvidia.com/gpu.product": A100_PRODUCT}),
        namespace=namespace,
    )

    wait_for(lambda: available_replicas(kubectl, namespace, "plain") == 6, timeout=90,
             what="6 available replicas of the untolerating deployment")
    untainted = {
        node["metadata"]["name"]
        for node in kubectl.items("nodes")
        if not node["spec"].get("taints")
    }
    # The loopback-pod-IP nodes (nodes.yaml) are tainted CPU nodes.
    assert untainted == nodes_with_label(
        kubectl, "!nvidia.com/gpu.present,!accelerator,!e2e.glm-operator.dev/pod-ips")
    assert {pod["spec"]["nodeName"] for pod in pods_of(kubectl, namespace, "plain")} <= untainted

    pinned = wait_for(lambda: pods_of(kubectl, namespace, "a100-no-toleration"), timeout=60,
                      what="the pod pinned to A100 without a toleration")[0]
    messages = wait_for(
        lambda: failed_scheduling_messages(kubectl, namespace, pinned["metadata"]["name"]),
        timeout=60, what="a FailedScheduling event for the untolerating A100 pod",
    )
    assert any("untolerated taint" in message for message in messages), messages


def test_deleting_a_deployment_garbage_collects_its_replicaset_and_pods(
    kubectl: Kubectl, namespace: str, apply: Apply, wait_for: Wait
) -> None:
    apply(deployment("collected", replicas=2), namespace=namespace)
    wait_for(lambda: available_replicas(kubectl, namespace, "collected") == 2, timeout=90,
             what="2 available replicas")
    replicasets = kubectl.items("replicasets", "-n", namespace, "-l", "app=collected")
    assert len(replicasets) == 1
    assert replicasets[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    pods = pods_of(kubectl, namespace, "collected")
    assert {p["metadata"]["ownerReferences"][0]["name"] for p in pods} == {
        replicasets[0]["metadata"]["name"]
    }

    # --wait=false: the API server only deletes the Deployment; the garbage collector in
    # kube-controller-manager must remove the ReplicaSet and then the Pods.
    kubectl("delete", "deployment", "collected", "-n", namespace, "--wait=false")

    wait_for(
        lambda: not kubectl.items("replicasets", "-n", namespace, "-l", "app=collected")
        and not pods_of(kubectl, namespace, "collected"),
        timeout=90, what="the garbage collector to delete the ReplicaSet and its Pods",
    )


def test_api_server_rejects_an_invalid_deployment(kubectl: Kubectl, namespace: str) -> None:
    invalid = deployment("mismatch")
    invalid["spec"]["selector"]["matchLabels"] = {"app": "something-else"}

    with pytest.raises(KubectlError) as error:
        kubectl.run("create", "-n", namespace, "-f", "-",
                    input=yaml.safe_dump(invalid))

    assert "spec.template.metadata.labels" in error.value.stderr
    assert "does not match" in error.value.stderr
    assert not kubectl.exists("deployment", "mismatch", "-n", namespace)


def virtual_service(hosts: object) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "glm"},
        "spec": {
            "hosts": hosts,
            "http": [{"route": [{"destination": {"host": "glm", "subset": "v1"}, "weight": 100}]}],
        },
    }


def test_istio_crd_schema_rejects_a_virtualservice_with_a_wrong_field_type(
    kubectl: Kubectl, namespace: str
) -> None:
    with pytest.raises(KubectlError) as error:
        kubectl.run("create", "-n", namespace, "-f", "-",
                    input=yaml.safe_dump(virtual_service(hosts="glm.example.com")))
    assert "spec.hosts" in error.value.stderr
    assert "must be of type array" in error.value.stderr

    # The same object with the right type is accepted: the rejection came from the schema.
    kubectl.run("create", "-n", namespace, "-f", "-",
                input=yaml.safe_dump(virtual_service(hosts=["glm.example.com"])))
    assert kubectl.exists("virtualservice", "glm", "-n", namespace)


def test_claim_binds_to_a_pre_provisioned_volume_and_its_pod_runs(
    kubectl: Kubectl, namespace: str, apply: Apply, wait_for: Wait
) -> None:
    apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "model-cache"},
            "spec": {"accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": "40Gi"}}},
        },
        namespace=namespace,
    )

    claim = wait_for(
        lambda: (c := kubectl.get_json("pvc", "model-cache", "-n", namespace))
        and c.get("status", {}).get("phase") == "Bound" and c,
        timeout=60, what="the PV controller to bind model-cache",
    )
    # The DefaultStorageClass admission plugin filled in the class; the binder picked a PV.
    assert claim["spec"]["storageClassName"] == "local-models"
    volume = kubectl.get_json("pv", claim["spec"]["volumeName"])
    assert volume["spec"]["claimRef"]["name"] == "model-cache"
    assert volume["spec"]["capacity"]["storage"] == "50Gi"

    pod_deployment = deployment("with-cache")
    pod_deployment["spec"]["template"]["spec"]["volumes"] = [
        {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}}
    ]
    pod_deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "cache", "mountPath": "/models"}
    ]
    apply(pod_deployment, namespace=namespace)
    wait_for(lambda: available_replicas(kubectl, namespace, "with-cache") == 1, timeout=90,
             what="the pod mounting model-cache to run")


def test_fake_nodes_advertise_their_accelerators(kubectl: Kubectl) -> None:
    def allocatable(selector: str, resource: str) -> list[str]:
        return [node["status"]["allocatable"].get(resource, "0")
                for node in kubectl.items("nodes", "-l", selector)]

    assert allocatable("nvidia.com/gpu.product=NVIDIA-A10", "nvidia.com/gpu") == ["1", "1"]
    assert allocatable(f"nvidia.com/gpu.product={A100_PRODUCT}", "nvidia.com/gpu") == ["8", "8"]
    assert allocatable("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu") == ["8"]
    assert allocatable("accelerator-type=module-910b-8", "huawei.com/Ascend910") == ["8", "8"]
    # Nodes the reconcile benchmark adds while it runs carry glm-operator.dev/bench; the
    # loopback-pod-IP nodes (nodes.yaml) are CPU nodes of their own.
    cpu_nodes = kubectl.items("nodes", "-l", "!nvidia.com/gpu.present,!accelerator,"
                              "!glm-operator.dev/bench,!e2e.glm-operator.dev/pod-ips")
    assert [(n["status"]["allocatable"]["cpu"], n["status"]["allocatable"]["memory"])
            for n in cpu_nodes] == [("32", "128Gi")] * 2


def test_third_party_crds_are_established(kubectl: Kubectl) -> None:
    for crd in (
        "virtualservices.networking.istio.io",
        "destinationrules.networking.istio.io",
        "servicemonitors.monitoring.coreos.com",
        "applications.argoproj.io",
    ):
        conditions = kubectl.get_json("crd", crd)["status"]["conditions"]
        assert {"type": "Established", "status": "True"}.items() <= next(
            c for c in conditions if c["type"] == "Established"
        ).items(), crd


def test_control_plane_runs_the_pinned_kubernetes_version(kubectl: Kubectl) -> None:
    pinned = toolchain.versions()["kubernetes"]
    binaries = local_cluster.Binaries.from_cache()

    printed = subprocess.run([str(binaries.kube_apiserver), "--version"],
                             capture_output=True, text=True, check=True).stdout
    assert printed.strip() == f"Kubernetes {pinned}"

    server = json.loads(kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert server["gitVersion"] == pinned
