"""A GLM-5-class model on Ascend 910B: W8A8 on vllm-ascend and GGUF on llama.cpp's CANN build,
one node and across nodes. What the pods carry is what the Ascend device plugin and the
vllm-ascend guides expect (render/ascend.py says where each comes from)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from glm_operator.api import GLMService, ModelVersion
from glm_operator.planning.from_api import plan_request_for
from glm_operator.planning.planner import plan
from glm_operator.render.ascend import (
    DEVICE_PLUGIN_ENV,
    DRIVER_PATHS,
    HCCL_IF_IP,
    VLLM_ASCEND_QUANTIZATION,
)
from glm_operator.render.service import render_service

from render.cases import NAMESPACE, inputs, multi_node_inputs

# GLM-5 (GlmMoeDsaForCausalLM, GGUF glm-dsa): 78 layers + 1 nextn, hidden 6144, 64 heads,
# MLA cached as one latent head (kv_lora_rank 512 + rope 64), 744B parameters, 256 experts
# of which 8 are used, 202752 tokens of context (docs/planning.md, the design references).
GLM5_FACTS = {
    "architecture": "glm-dsa", "blockCount": 78, "nextnPredictLayers": 1,
    "embeddingLength": 6144, "headCount": 64, "headCountKv": 1, "keyLength": 576,
    "valueLength": 512, "contextLength": 202752, "vocabSize": 154880,
    "expertCount": 256, "expertUsedCount": 8, "parameterCount": 744_000_000_000,
}  # fmt: skip
W8A8 = ("glm-5-w8a8", "safetensors", "w8a8", "hf://Eco-Tech/GLM-5-w8a8?revision=main",
        744_000_000_000)
Q2_K = ("glm-5-q2k", "gguf", "Q2_K", "hf://unsloth/GLM-5-GGUF/GLM-5-Q2_K.gguf",
        279_000_000_000)


def glm5(artifact: tuple[str, str, str, str, int]) -> ModelVersion:
    name, fmt, quantization, uri, size = artifact
    return ModelVersion.model_validate({
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": "0" * 8},
        "spec": {"source": {"uri": uri}, "format": fmt, "quantization": quantization,
                 "architecture": "glm-dsa", **({"sha256": "c" * 64} if fmt == "gguf" else {}),
                 "facts": {**GLM5_FACTS, "sizeBytes": size},
                 "cache": {"size": "800Gi", "accessMode": "ReadWriteMany"}},
    })


def rendered(artifact: tuple[str, str, str, str, int], engine: str, nodes: int
             ) -> list[dict[str, Any]]:
    mv = glm5(artifact)
    svc = GLMService.model_validate({
        "apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "GLMService",
        "metadata": {"name": "glm5", "namespace": NAMESPACE, "uid": "1" * 8},
        "spec": {"modelVersion": mv.metadata.name, "engine": {engine: {}},
                 "accelerator": {"profile": "ascend-910b", "count": 8, "nodes": nodes},
                 "contextLength": 32768, "concurrency": 2, "gateway": {"access": "Open"}},
    })
    return render_service(inputs(svc, mv))


def pod_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objects
            if o["kind"] in ("Deployment", "StatefulSet")]


def engines(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["containers"] if c["name"] in ("engine", "worker")]


def check_ascend_pod(pod: dict[str, Any]) -> None:
    assert {"key": "huawei.com/Ascend910", "operator": "Exists",
            "effect": "NoSchedule"} in pod["tolerations"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert {"key": "accelerator", "operator": "In",
            "values": ["huawei-Ascend910"]} in term["matchExpressions"]
    hosts = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert hosts == {n: {"path": p, "type": t} for n, p, t in DRIVER_PATHS}
    (engine,) = engines(pod)
    resources = engine["resources"]
    assert resources["requests"]["huawei.com/Ascend910"] == "8"
    assert resources["limits"]["huawei.com/Ascend910"] == "8"
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    for _, path, _ in DRIVER_PATHS:
        assert mounts[path]["readOnly"] is True
    names = {e["name"] for e in engine["env"]}
    assert not names & set(DEVICE_PLUGIN_ENV), "the device plugin decides which NPUs"


def test_w8a8_on_vllm_ascend_is_served_with_vllm_ascend_s_own_quantization_method() -> None:
    objects = rendered(W8A8, "vllm", nodes=2)
    leader, worker = pod_specs(objects)
    for pod in (leader, worker):
        check_ascend_pod(pod)
    (engine,) = engines(leader)
    args = engine["args"]
    assert args[args.index("--quantization") + 1] == VLLM_ASCEND_QUANTIZATION
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    assert args[args.index("--tensor-parallel-size") + 1] == "8"


def test_every_pod_of_an_ascend_vllm_group_binds_hccl_to_its_own_address() -> None:
    for pod in pod_specs(rendered(W8A8, "vllm", nodes=2)):
        (engine,) = engines(pod)
        (hccl,) = [e for e in engine["env"] if e["name"] == HCCL_IF_IP]
        assert hccl == {"name": HCCL_IF_IP,
                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def test_llamacpp_cann_pods_get_no_hccl_and_no_vllm_quantization() -> None:
    for nodes in (1, 2):
        for pod in pod_specs(rendered(Q2_K, "llamacpp", nodes=nodes)):
            check_ascend_pod(pod)
            for c in engines(pod):
                assert HCCL_IF_IP not in {e["name"] for e in c["env"]}
                assert "--quantization" not in c["args"]


def test_a_single_node_ascend_deployment_has_no_group_environment() -> None:
    objects = rendered(Q2_K, "llamacpp", nodes=1)
    assert [o["kind"] for o in objects if o["kind"] in ("Deployment", "StatefulSet")] == [
        "Deployment"]


def test_quantizations_other_than_modelslim_s_keep_vllm_s_own_detection() -> None:
    bf16 = ("glm-5-bf16", "safetensors", "bf16", "hf://zai-org/GLM-5?revision=main",
            1_488_000_000_000)
    # BF16 GLM-5 needs 4 nodes of 8 x 910B; the argv is what matters here.
    for pod in pod_specs(rendered(bf16, "vllm", nodes=4))[:1]:
        (engine,) = engines(pod)
        assert "--quantization" not in engine["args"]


def test_w8a8_is_planned_for_ascend_only_so_no_alternative_sends_it_to_a_gpu() -> None:
    mv = glm5(W8A8)
    svc = GLMService.model_validate({
        "metadata": {"name": "glm5", "namespace": NAMESPACE},
        "spec": {"modelVersion": mv.metadata.name, "engine": {"vllm": {}},
                 "accelerator": {"profile": "ascend-910b", "count": 8},
                 "contextLength": 32768, "concurrency": 2, "gateway": {"access": "Open"}},
    })
    one_node = plan(plan_request_for(svc, mv))
    assert not one_node.feasible
    assert one_node.alternatives, "two nodes of 910B fit"
    for alternative in one_node.alternatives:
        assert alternative.plan.profile.vendor == "huawei", alternative.change
    gpu = plan(replace(plan_request_for(svc, mv), accelerator="nvidia-h200"))
    assert not gpu.feasible
    assert "nvidia-h200 cannot run w8a8 (ModelSlim) weights" in gpu.reason, gpu.reason


def test_gpu_groups_get_no_hccl_environment() -> None:
    for pod in pod_specs(render_service(multi_node_inputs("vllm-h100x8x2"))):
        for c in engines(pod):
            assert HCCL_IF_IP not in {e["name"] for e in c["env"]}
            assert "--quantization" not in c["args"]


def test_an_ascend_vllm_group_renders_no_mtp_speculative_decoding() -> None:
    """vllm-ascend v0.23.0.post1 refuses MTP speculative decoding with pipeline parallelism
    (NPUPlatform._validate_pd_pp_mtp_config: "PP+MTP is only supported on PD-disaggregated P
    nodes"), and a vLLM group spans its nodes by pipeline parallelism: GLM-5's nextn layer must
    not turn into --speculative-config there, or every group crash-loops at start."""
    leader = pod_specs(rendered(W8A8, "vllm", nodes=2))[0]
    (engine,) = engines(leader)
    assert engine["args"][engine["args"].index("--pipeline-parallel-size") + 1] == "2"
    speculative = [a for a in engine["args"] if a.startswith("--speculative-config")]
    assert not speculative, (
        f"{speculative} with --pipeline-parallel-size 2 on Ascend: vllm-ascend v0.23 refuses "
        "PP+MTP at start; plan no MTP for a multi-node group on a huawei profile (or refuse "
        "it with a condition)")
