"""GLM-5 on Ascend 910B, placed by the real kube-scheduler on the kwok 910B nodes of
e2e/nodes.yaml (2 Atlas 800T A2 nodes, 8 x `huawei.com/Ascend910` each, tainted
`huawei.com/Ascend910:NoSchedule`, labelled as the Ascend device plugin labels them).

A GLM-5-class ModelVersion (glm-dsa, declared facts: nothing is downloaded; the fetch Job's
report is written as test_operator.py does) is served
- W8A8 (a ModelSlim checkpoint) on vllm-ascend: refused on one node with the numbers, placed
  as a group across both nodes; BF16 refused on one node with the numbers;
- GGUF on llama.cpp's CANN build: Q2_K on one node (a Deployment), Q8_0 across both (a
  group of llama-server + ggml-rpc-server).
Each pod is checked for what the Ascend device plugin and runtime expect (render/ascend.py):
the NPU count as an extended resource (request = limit), the taint's toleration, the
driver's host paths read-only, the device group, CANN's writable paths, no device
environment of its own (the plugin decides which NPUs), HCCL on the pod address across nodes;
and the scheduler's own accounting of the NPUs is probed with a pod of our own. kwok plays
the kubelet, so no engine runs (docs/install.md, "Ascend nodes", says what is not proven).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from e2e import cluster as local_cluster
from e2e.kubectl import Kubectl
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator, report_fetched
from e2e.test_operator import condition, node_labels, wait_condition, wait_ready

__all__ = ["glm_crds", "operator"]  # fixtures used by name

Wait = Callable[..., Any]
NPU = "huawei.com/Ascend910"
NPU_NODE_LABEL = "accelerator-type=module-910b-8"
SERVICE_LABEL = "glm-operator.dev/service"
# Paths the vllm-ascend installation guide and GLM-5 tutorial mount into the container
# (docs/source/installation.md, tutorials/models/GLM5.md of vllm-ascend v0.23.0.post1); the
# operator mounts the whole driver directory, which holds lib64/, version.info and
# tools/hccn_tool.
DRIVER_HOST_PATHS = {
    "/usr/local/Ascend/driver": "Directory",
    "/usr/local/dcmi": "Directory",
    "/usr/local/bin/npu-smi": "File",
    "/etc/ascend_install.info": "File",
}
# The device plugin's answer to the kubelet (Allocate): device nodes, or with Ascend Docker
# Runtime ASCEND_VISIBLE_DEVICES / ASCEND_RUNTIME_OPTIONS. A pod setting any of these, or
# ASCEND_RT_VISIBLE_DEVICES, would see other NPUs than the scheduler counted for it.
DEVICE_PLUGIN_ENV = {"ASCEND_VISIBLE_DEVICES", "ASCEND_RUNTIME_OPTIONS",
                     "ASCEND_RT_VISIBLE_DEVICES"}

# GLM-5 / GLM-5.1 (GlmMoeDsaForCausalLM; GGUF glm-dsa): 78 trunk layers + 1 nextn (MTP)
# layer, hidden 6144, 64 heads, 744B parameters (~40B active), 256 routed experts of which
# 8 per token, 202752 tokens of context (shared/design/references.md, docs/planning.md,
# vllm-ascend's GLM-5 guide: --max-model-len 202752). MLA caches one latent head per token:
# kv_lora_rank 512 + qk_rope_head_dim 64 as key, 512 as value (llama.cpp's layout).
GLM5_FACTS = {
    "blockCount": 78, "nextnPredictLayers": 1, "embeddingLength": 6144, "headCount": 64,
    "headCountKv": 1, "keyLength": 576, "valueLength": 512, "contextLength": 202752,
    "vocabSize": 154880, "expertCount": 256, "expertUsedCount": 8,
    "parameterCount": 744_000_000_000, "activeParameterCount": 40_000_000_000,
}  # fmt: skip


def glm5_version(name: str, fmt: str, quantization: str, uri: str, size: int, cache: str
                 ) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"uri": uri}, "format": fmt, "quantization": quantization,
        "architecture": "glm-dsa", "facts": {**GLM5_FACTS, "sizeBytes": size},
        # Every pod of a group reads the cache (vLLM ranks their shards): ReadWriteMany.
        "cache": {"size": cache, "accessMode": "ReadWriteMany"},
    }
    if fmt == "gguf":
        spec["sha256"] = "cd" * 32
    return {"apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
            "metadata": {"name": name}, "spec": spec}


# Eco-Tech's ModelSlim W8A8 of GLM-5 (vllm-ascend's GLM-5 guide): int8 weights, 8 bits each.
W8A8 = glm5_version("glm-5-w8a8", "safetensors", "w8a8", "hf://Eco-Tech/GLM-5-w8a8",
                    744_000_000_000, "750Gi")
BF16 = glm5_version("glm-5-bf16", "safetensors", "bf16", "hf://zai-org/GLM-5",
                    1_488_000_000_000, "1400Gi")
Q2_K = glm5_version("glm-5-q2-k", "gguf", "Q2_K", "hf://unsloth/GLM-5-GGUF/GLM-5-Q2_K.gguf",
                    279_000_000_000, "300Gi")
Q8_0 = glm5_version("glm-5-q8-0", "gguf", "Q8_0", "hf://unsloth/GLM-5-GGUF/GLM-5-Q8_0.gguf",
                    790_500_000_000, "800Gi")


def glm_service(name: str, version: str, engine: str, nodes: int) -> dict[str, Any]:
    return {"apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "GLMService",
            "metadata": {"name": name},
            "spec": {"modelVersion": version, "engine": {engine: {}},
                     "accelerator": {"profile": "ascend-910b", "count": 8, "nodes": nodes},
                     "contextLength": 32768, "concurrency": 2, "replicas": 1,
                     "gateway": {"access": "Open"}}}


# ---------------------------------------------------------------- helpers


def npu_nodes(kubectl: Kubectl) -> set[str]:
    return {n["metadata"]["name"] for n in kubectl.items("nodes", "-l", NPU_NODE_LABEL)}


def npu_nodes_free(kubectl: Kubectl) -> bool:
    """No pod holds an NPU of the 910B nodes (an earlier test's pods are gone)."""
    nodes = npu_nodes(kubectl)
    return not any(
        pod["spec"].get("nodeName") in nodes
        and pod.get("status", {}).get("phase") in ("Pending", "Running")
        and any(NPU in (c.get("resources", {}).get("requests") or {})
                for c in pod["spec"]["containers"])
        for pod in kubectl.items("pods", "-A"))


def big_volume_available(kubectl: Kubectl, size: str) -> bool:
    """A PV of `size` is Available (recycling the Released ones of earlier tests first: the
    cluster has two 2Ti volumes, and GLM-5 artifacts need one each)."""
    local_cluster.recycle_released_volumes(kubectl)
    return any(pv["spec"]["capacity"]["storage"] == size
               and pv.get("status", {}).get("phase") == "Available"
               for pv in kubectl.items("pv"))


def fetched(kubectl: Kubectl, ns: str, wait_for: Wait, mv: dict[str, Any]) -> str:
    """The ModelVersion applied, its fetch Job created, and the Job's report written."""
    name: str = mv["metadata"]["name"]
    kubectl.apply(mv, namespace=ns)
    wait_for(lambda: kubectl.items("jobs", "-n", ns, "-l",
                                   f"glm-operator.dev/model-version={name}"),
             timeout=60, what=f"the fetch Job of {name}")
    report_fetched(kubectl, ns, name, size=mv["spec"]["facts"]["sizeBytes"])
    return name


def service_pods(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    return [p for p in kubectl.items("pods", "-n", ns, "-l", f"{SERVICE_LABEL}={name}")
            if not p["metadata"].get("deletionTimestamp")]


def running_pods(kubectl: Kubectl, ns: str, name: str, count: int) -> list[dict[str, Any]]:
    pods = service_pods(kubectl, ns, name)
    if len(pods) == count and all(p.get("status", {}).get("phase") == "Running"
                                  and p["spec"].get("nodeName") for p in pods):
        return pods
    return []


def engine_container(pod: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] in ("engine", "worker")]
    return container


def check_placed_as_the_device_plugin_expects(kubectl: Kubectl, pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    labels = node_labels(kubectl, spec["nodeName"])
    assert labels["accelerator"] == "huawei-Ascend910", labels
    assert labels["accelerator-type"] == "module-910b-8", labels
    # The node's taint is tolerated; nothing else lands there.
    assert {"key": NPU, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    engine = engine_container(pod)
    resources = engine["resources"]
    assert resources["requests"][NPU] == resources["limits"][NPU] == "8", resources
    # The gateway (and a llama.cpp leader's wait-for-workers) hold no NPU.
    for c in [*spec["containers"], *spec.get("initContainers", [])]:
        if c is not engine:
            assert NPU not in (c.get("resources", {}).get("limits") or {}), c["name"]
    host_paths = {v["hostPath"]["path"]: v["hostPath"]["type"]
                  for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == DRIVER_HOST_PATHS, host_paths
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    for path in DRIVER_HOST_PATHS:
        assert mounts[path].get("readOnly") is True, mounts.get(path)
    # /dev/davinciN are the driver's, mode 0660 group HwHiAiUser: a non-root engine joins it.
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["supplementalGroups"] == [1000]
    env = {e["name"]: e for e in engine["env"]}
    assert not DEVICE_PLUGIN_ENV & set(env), sorted(DEVICE_PLUGIN_ENV & set(env))
    for name in ("ASCEND_PROCESS_LOG_PATH", "ASCEND_CACHE_PATH", "ASCEND_WORK_PATH"):
        assert env[name]["value"].startswith("/tmp/"), env[name]  # root filesystem read-only
    assert engine["securityContext"]["readOnlyRootFilesystem"] is True


def npu_probe(kubectl: Kubectl, ns: str, npus: int) -> str:
    """A pod of our own asking the scheduler for `npus` NPUs on a 910B node."""
    name = f"npu-probe-{npus}"
    kubectl.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"accelerator": "huawei-Ascend910"},
            "tolerations": [{"key": NPU, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {NPU: str(npus)}}}],
        },
    }, namespace=ns)
    return name


def unschedulable_message(kubectl: Kubectl, ns: str, pod: str) -> str:
    obj = kubectl.get_json("pod", pod, "-n", ns)
    scheduled = condition(obj, "PodScheduled")
    if scheduled and scheduled["status"] == "False" and scheduled.get("reason") == "Unschedulable":
        return str(scheduled.get("message", ""))
    return ""


def numbers_of(message: str) -> tuple[float, float, float]:
    """(needed per device, the device's memory, short by) from an Infeasible message."""
    found = re.search(r"needs ([\d.]+) GiB per device .*?ascend-910b has ([\d.]+) GiB: "
                      r"short by ([\d.]+) GiB", message)
    assert found, message
    needed, has, short = (float(g) for g in found.groups())
    return needed, has, short


def delete_and_wait(kubectl: Kubectl, ns: str, wait_for: Wait, kind: str, name: str) -> None:
    kubectl("delete", kind, name, "-n", ns, "--wait=true")
    wait_for(lambda: not service_pods(kubectl, ns, name), timeout=120,
             what=f"the pods of {name} gone")


# ---------------------------------------------------------------- vllm-ascend


def test_glm5_w8a8_on_vllm_ascend_refused_on_one_910b_node_placed_across_two(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    ns = namespace
    wait_for(lambda: npu_nodes_free(kubectl), timeout=120, what="the 910B nodes free")
    assert len(npu_nodes(kubectl)) == 2

    # BF16 GLM-5 on one node of eight 64 GB NPUs: 1.49 TB of weights over 512 GiB.
    wait_for(lambda: big_volume_available(kubectl, "2Ti"), timeout=120,
             what="a 2Ti volume Available")
    fetched(kubectl, ns, wait_for, BF16)
    kubectl.apply(glm_service("glm5-bf16", BF16["metadata"]["name"], "vllm", 1), namespace=ns)
    planned = wait_condition(kubectl, ns, "glm5-bf16", "Planned", "False", wait_for)
    assert planned["reason"] == "Infeasible", planned
    needed, has, short = numbers_of(planned["message"])
    # 744B x 2 bytes / 8 NPUs = 173.2 GiB of weights on each before any KV cache.
    assert needed > 173 and has == 64.0 and short == round(needed - has, 1), planned["message"]
    assert service_pods(kubectl, ns, "glm5-bf16") == []
    kubectl("delete", "glmservice", "glm5-bf16", "-n", ns, "--wait=true")
    kubectl("delete", "modelversion", BF16["metadata"]["name"], "-n", ns, "--wait=true")

    # W8A8 on one node: half the bytes, still more than eight NPUs hold.
    wait_for(lambda: big_volume_available(kubectl, "2Ti"), timeout=120,
             what="a 2Ti volume Available")
    version = fetched(kubectl, ns, wait_for, W8A8)
    kubectl.apply(glm_service("glm5", version, "vllm", 1), namespace=ns)
    planned = wait_condition(kubectl, ns, "glm5", "Planned", "False", wait_for)
    assert planned["reason"] == "Infeasible", planned
    needed, has, short = numbers_of(planned["message"])
    assert 86.6 < needed < 173 and has == 64.0 and short > 0, planned["message"]
    assert "2 nodes x 8 x ascend-910b fits" in planned["message"], planned["message"]
    # A ModelSlim checkpoint runs on vllm-ascend only: no GPU is proposed for it.
    assert "nvidia" not in planned["message"], planned["message"]
    assert service_pods(kubectl, ns, "glm5") == []

    # The advice applied: one group of two pods, one per 910B node.
    kubectl("patch", "glmservice", "glm5", "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"accelerator": {"nodes": 2}}}))
    pods = wait_for(lambda: running_pods(kubectl, ns, "glm5", 2), timeout=120,
                    what="the group's two pods running")
    obj = wait_ready(kubectl, ns, "glm5", wait_for)
    plan = obj["status"]["plan"]
    assert (plan["nodes"], plan["count"], plan["vllm"]["pipelineParallelSize"]) == (2, 8, 2)
    assert {p["spec"]["nodeName"] for p in pods} == npu_nodes(kubectl)
    for pod in pods:
        check_placed_as_the_device_plugin_expects(kubectl, pod)
        # HCCL's host socket on this pod's own address (vllm-ascend's multi-node HCCL_IF_IP).
        hccl = {e["name"]: e for e in engine_container(pod)["env"]}["HCCL_IF_IP"]
        assert hccl["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", hccl
    (leader,) = [p for p in pods if "engine" in {c["name"] for c in p["spec"]["containers"]}]
    args = engine_container(leader)["args"]
    # A ModelSlim W8A8 checkpoint through vllm-ascend's own quantization method.
    assert args[args.index("--quantization") + 1] == "ascend", args
    assert args[args.index("--tensor-parallel-size") + 1] == "8", args
    # vllm-ascend v0.23 refuses MTP speculative decoding with pipeline parallelism
    # (NPUPlatform._validate_pd_pp_mtp_config): GLM-5's nextn layer is not drafted here.
    assert not [a for a in args if a.startswith("--speculative-config")], args

    # The scheduler counted the sixteen NPUs as taken: one more does not fit anywhere.
    probe = npu_probe(kubectl, ns, 1)
    message = wait_for(lambda: unschedulable_message(kubectl, ns, probe), timeout=60,
                       what="the probe pod refused by the scheduler")
    assert f"Insufficient {NPU}" in message, message
    kubectl("delete", "pod", probe, "-n", ns, "--wait=true")
    delete_and_wait(kubectl, ns, wait_for, "glmservice", "glm5")


# ---------------------------------------------------------------- llama.cpp (CANN)


def test_glm5_gguf_on_llamacpp_cann_on_one_910b_node_and_across_two(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    ns = namespace
    wait_for(lambda: npu_nodes_free(kubectl), timeout=120, what="the 910B nodes free")

    # Q2_K (279 GB) fits the eight NPUs of one node: a Deployment of one pod.
    version = fetched(kubectl, ns, wait_for, Q2_K)
    kubectl.apply(glm_service("glm5-q2", version, "llamacpp", 1), namespace=ns)
    (pod,) = wait_for(lambda: running_pods(kubectl, ns, "glm5-q2", 1), timeout=120,
                      what="the engine pod running")
    obj = wait_ready(kubectl, ns, "glm5-q2", wait_for)
    assert condition(obj, "Planned")["status"] == "True"  # type: ignore[index]
    assert obj["status"]["plan"]["engine"] == "llamacpp"
    check_placed_as_the_device_plugin_expects(kubectl, pod)
    engine = engine_container(pod)
    assert engine["image"].rsplit(":", 1)[0].endswith("/llama-server-cann"), engine["image"]
    assert "HCCL_IF_IP" not in {e["name"] for e in engine["env"]}  # one node, no HCCL
    # Its node's eight NPUs are taken, the other node's are free: a probe asking for eight
    # lands on the other node.
    probe = npu_probe(kubectl, ns, 8)
    probed = wait_for(lambda: kubectl.get_json("pod", probe, "-n", ns)["spec"].get("nodeName"),
                      timeout=60, what="the probe pod scheduled")
    assert probed in npu_nodes(kubectl) and probed != pod["spec"]["nodeName"]
    kubectl("delete", "pod", probe, "-n", ns, "--wait=true")
    delete_and_wait(kubectl, ns, wait_for, "glmservice", "glm5-q2")

    # Q8_0 (790 GB) needs both nodes: llama-server on one, ggml-rpc-server on the other.
    wait_for(lambda: big_volume_available(kubectl, "2Ti"), timeout=120,
             what="a 2Ti volume Available")
    version = fetched(kubectl, ns, wait_for, Q8_0)
    kubectl.apply(glm_service("glm5-q8", version, "llamacpp", 1), namespace=ns)
    planned = wait_condition(kubectl, ns, "glm5-q8", "Planned", "False", wait_for)
    assert planned["reason"] == "Infeasible", planned
    numbers_of(planned["message"])
    kubectl("patch", "glmservice", "glm5-q8", "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"accelerator": {"nodes": 2}}}))
    pods = wait_for(lambda: running_pods(kubectl, ns, "glm5-q8", 2), timeout=120,
                    what="the group's two pods running")
    obj = wait_ready(kubectl, ns, "glm5-q8", wait_for)
    assert obj["status"]["plan"]["llamacpp"]["rpcWorkers"] == 1
    assert {p["spec"]["nodeName"] for p in pods} == npu_nodes(kubectl)
    for pod in pods:
        check_placed_as_the_device_plugin_expects(kubectl, pod)
        assert "HCCL_IF_IP" not in {e["name"] for e in engine_container(pod)["env"]}
    (worker,) = [p for p in pods if p["spec"]["containers"][0]["name"] == "worker"]
    assert engine_container(worker)["command"] == ["ggml-rpc-server"]
    probe = npu_probe(kubectl, ns, 1)
    message = wait_for(lambda: unschedulable_message(kubectl, ns, probe), timeout=60,
                       what="the probe pod refused by the scheduler")
    assert f"Insufficient {NPU}" in message, message
    kubectl("delete", "pod", probe, "-n", ns, "--wait=true")
    delete_and_wait(kubectl, ns, wait_for, "glmservice", "glm5-q8")
