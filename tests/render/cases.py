"""Inputs shared by the render tests: one GLM-4-9B-class model as GGUF and as safetensors,
and GLMServices for the golden matrix {llamacpp, vllm} x {a10, 2 x a100-80gb, 910b, cpu}."""

from __future__ import annotations

from typing import Any

from glm_operator.api import API_VERSION, GLMService, ModelVersion
from glm_operator.api.conversion import convert
from glm_operator.config import OperatorConfig
from glm_operator.planning.from_api import plan_request_for
from glm_operator.planning.planner import Plan, plan
from glm_operator.render.service import Capabilities, ServiceInputs

NAMESPACE = "models"
SERVICE_UID = "5f0c7a52-3b1e-4d3f-9a57-0d6f3c1e2a10"
MV_UID = "8b2d6e1a-7c4f-4e0b-b1d2-3f9a8c7e6d54"

GLM4_9B_FACTS = {
    "architecture": "glm4",
    "blockCount": 40,
    "embeddingLength": 4096,
    "headCount": 32,
    "headCountKv": 2,
    "keyLength": 128,
    "valueLength": 128,
    "contextLength": 131072,
    "parameterCount": 9_400_000_000,
}

MODEL_VERSIONS: dict[str, dict[str, Any]] = {
    "gguf": {
        "name": "glm4-9b-q4",
        "spec": {
            "source": {"uri": "hf://THUDM/GLM-4-9B-0414-GGUF/glm-4-9b-0414-Q4_K_M.gguf"},
            "format": "gguf",
            "quantization": "Q4_K_M",
            "architecture": "glm4",
            "sha256": "a" * 64,
            "facts": {**GLM4_9B_FACTS, "sizeBytes": 6_170_000_000},
        },
    },
    "bf16": {
        "name": "glm4-9b-bf16",
        "spec": {
            "source": {"uri": "hf://THUDM/GLM-4-9B-0414?revision=main",
                       "credentialsSecret": "hf-token"},
            "format": "safetensors",
            "quantization": "bf16",
            "architecture": "glm4",
            "facts": {**GLM4_9B_FACTS, "sizeBytes": 18_800_000_000},
            "cache": {"size": "40Gi", "storageClassName": "fast-rwx",
                      "accessMode": "ReadWriteMany"},
        },
    },
    # 9B bf16 does not fit a 24 GB A10 under vLLM; AWQ (4 bit) does.
    "awq": {
        "name": "glm4-9b-awq",
        "spec": {
            "source": {"uri": "s3://models/glm-4-9b-0414-awq"},
            "format": "safetensors",
            "quantization": "awq",
            "architecture": "glm4",
            "facts": {**GLM4_9B_FACTS, "sizeBytes": 6_900_000_000},
        },
    },
}

# accelerator case -> (profile, count)
ACCELERATORS: dict[str, tuple[str, int]] = {
    "a10": ("nvidia-a10", 1),
    "a100x2": ("nvidia-a100-80gb", 2),
    "ascend910b": ("ascend-910b", 1),
    "cpu": ("cpu", 1),
}
ENGINES = ("llamacpp", "vllm")
INVALID = {("vllm", "cpu")}
VALID_CASES = [(e, a) for e in ENGINES for a in ACCELERATORS if (e, a) not in INVALID]


def model_key(engine: str, accelerator: str) -> str:
    if engine == "llamacpp":
        return "gguf"
    return "awq" if accelerator == "a10" else "bf16"


def model_version(key: str, **status: Any) -> ModelVersion:
    data = MODEL_VERSIONS[key]
    return ModelVersion.model_validate({
        "metadata": {"name": data["name"], "namespace": NAMESPACE, "uid": MV_UID},
        "spec": data["spec"],
        "status": status,
    })


def service_manifest(engine: str, accelerator: str, **spec: Any) -> dict[str, Any]:
    profile, count = ACCELERATORS[accelerator]
    body: dict[str, Any] = {
        "modelVersion": MODEL_VERSIONS[model_key(engine, accelerator)]["name"],
        "engine": engine,
        "accelerator": {"profile": profile, "count": count},
        "contextLength": 32768,
        "concurrency": 4,
        "gateway": {"apiKeysSecret": "chat-keys", "rateLimit": {"requestsPerMinute": 600}},
    }
    body.update(spec)
    # Written at v1alpha1 and converted as the API server would: every golden rendered from
    # these cases holds v1alpha1 objects to the children they had before v1alpha2.
    return convert({
        "apiVersion": "serving.glm-operator.dev/v1alpha1",
        "kind": "GLMService",
        "metadata": {"name": "chat", "namespace": NAMESPACE, "uid": SERVICE_UID},
        "spec": body,
    }, API_VERSION)


def service(engine: str, accelerator: str, **spec: Any) -> GLMService:
    return GLMService.model_validate(service_manifest(engine, accelerator, **spec))


def plans(svc: GLMService, mv: ModelVersion, config: OperatorConfig) -> tuple[Plan, Plan | None]:
    main = plan(plan_request_for(svc, mv), config.profiles)
    lc = svc.spec.long_context
    long_plan = (
        plan(plan_request_for(svc, mv, long_context=True), config.profiles)
        if lc is not None and lc.enabled else None
    )
    return main, long_plan


def inputs(
    svc: GLMService,
    mv: ModelVersion,
    config: OperatorConfig | None = None,
    capabilities: Capabilities | None = None,
) -> ServiceInputs:
    config = config or OperatorConfig(imageTag="0.1.0")
    main, long_plan = plans(svc, mv, config)
    return ServiceInputs(
        service=svc, model_version=mv, plan=main, long_context_plan=long_plan, config=config,
        capabilities=capabilities or Capabilities(),
    )


# Each golden case also switches on a different set of features, so together they cover
# fixed replicas, autoscaling, the long-context pool, ServiceMonitor and pod overrides.
GOLDEN_SPECS: dict[tuple[str, str], dict[str, Any]] = {
    ("llamacpp", "a10"): {"replicas": 2},
    ("llamacpp", "a100x2"): {
        "autoscaling": {"minReplicas": 1, "maxReplicas": 4,
                        "targets": {"requestsPerSecond": 2.5, "queueLength": 4}},
        "longContext": {"enabled": True, "contextLength": 131072, "maxReplicas": 2},
    },
    ("llamacpp", "ascend910b"): {
        "longContext": {"enabled": True, "contextLength": 65536},
        "engineArgs": ["--jinja", "--reasoning-format", "deepseek"],
    },
    ("llamacpp", "cpu"): {
        "concurrency": 2,
        "contextLength": 8192,
        "podOverrides": {
            "nodeSelector": {"node-pool": "cpu-large"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm",
                             "effect": "NoSchedule"}],
            "labels": {"team": "search"},
            "annotations": {"example.com/owner": "search"},
            "env": [{"name": "LLAMA_LOG_VERBOSITY", "value": "1"}],
            "priorityClassName": "llm-serving",
        },
        "gateway": {"access": "Open", "audit": {"enabled": False}},
    },
    ("vllm", "a10"): {},
    ("vllm", "a100x2"): {
        "autoscaling": {"maxReplicas": 3,
                        "targets": {"kvCacheUtilization": 75, "acceleratorMemoryUtilization": 95},
                        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 1800}}},
    },
    ("vllm", "ascend910b"): {
        "gateway": {"access": "Open",
                    "rateLimit": {"requestsPerMinute": 120, "burst": 5,
                                  "tokensPerMinute": 100000,
                                  "store": {"redis": {"address": "redis.cache.svc:6379",
                                                      "tls": True,
                                                      "passwordSecret": {"name": "redis-auth",
                                                                         "key": "password"}},
                                            "onUnavailable": "Deny"}},
                    "audit": {"includePrompts": True}},
    },
}
GOLDEN_CAPABILITIES: dict[tuple[str, str], Capabilities] = {
    ("llamacpp", "a100x2"): Capabilities(service_monitor=True),
    ("vllm", "a100x2"): Capabilities(service_monitor=True),
}


def golden_inputs(engine: str, accelerator: str) -> ServiceInputs:
    svc = service(engine, accelerator, **GOLDEN_SPECS[(engine, accelerator)])
    return inputs(svc, model_version(model_key(engine, accelerator)),
                  capabilities=GOLDEN_CAPABILITIES.get((engine, accelerator)))


# ---------------------------------------------------------------- multi-node (groups)

# GLM-4.6-class MoE (glm4moe, 355B): one node of A10s cannot hold it in Q4_K_M, nor one node
# of H100s in BF16.
GLM46_FACTS = {
    "architecture": "glm4moe",
    "blockCount": 92,
    "nextnPredictLayers": 1,
    "embeddingLength": 5120,
    "headCount": 96,
    "headCountKv": 8,
    "keyLength": 128,
    "valueLength": 128,
    "contextLength": 202752,
    "parameterCount": 355_000_000_000,
    "expertCount": 160,
    "expertUsedCount": 8,
}
MODEL_VERSIONS["glm46-q4"] = {
    "name": "glm46-q4",
    "spec": {
        "source": {"uri": "hf://unsloth/GLM-4.6-GGUF/GLM-4.6-Q4_K_M.gguf"},
        "format": "gguf",
        "quantization": "Q4_K_M",
        "architecture": "glm4moe",
        "sha256": "b" * 64,
        "facts": {**GLM46_FACTS, "sizeBytes": 216_000_000_000},
        "cache": {"size": "250Gi", "storageClassName": "fast-rwx", "accessMode": "ReadWriteMany"},
    },
}
MODEL_VERSIONS["glm46-bf16"] = {
    "name": "glm46-bf16",
    "spec": {
        "source": {"uri": "hf://zai-org/GLM-4.6?revision=main"},
        "format": "safetensors",
        "quantization": "bf16",
        "architecture": "glm4moe",
        "facts": GLM46_FACTS,
        "cache": {"size": "800Gi", "storageClassName": "fast-rwx", "accessMode": "ReadWriteMany"},
    },
}

# case -> (engine, ModelVersion key, profile, devices per node, nodes, extra spec)
MULTI_NODE_CASES: dict[str, tuple[str, str, str, int, int, dict[str, Any]]] = {
    "llamacpp-a10x4x3": ("llamacpp", "glm46-q4", "nvidia-a10", 4, 3,
                         {"contextLength": 16384, "concurrency": 2, "replicas": 2}),
    "vllm-h100x8x2": ("vllm", "glm46-bf16", "nvidia-h100-80gb", 8, 2,
                      {"contextLength": 131072, "concurrency": 4}),
    "vllm-910bx8x2": ("vllm", "glm46-bf16", "ascend-910b", 8, 2,
                      {"contextLength": 65536, "concurrency": 2}),
}


def multi_node_inputs(case: str, capabilities: Capabilities | None = None,
                      **spec: Any) -> ServiceInputs:
    engine, key, profile, count, nodes, extra = MULTI_NODE_CASES[case]
    body = {**service_manifest(engine, "a10", **{**extra, **spec})}
    body["spec"]["modelVersion"] = MODEL_VERSIONS[key]["name"]
    body["spec"]["accelerator"] = {"profile": profile, "count": count, "nodes": nodes}
    return inputs(GLMService.model_validate(body), model_version(key),
                  capabilities=capabilities)
