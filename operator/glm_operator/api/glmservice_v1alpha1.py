"""GLMService v1alpha1: the shape served before v1alpha2, kept for conversion.

Objects stored at v1alpha1 and manifests written for it keep working: the API server serves
this version too and converts through the operator's webhook (api/conversion.py). Only what
v1alpha2 changed lives here (engine settings at the top level, the long-context pool's own
shape, the rate-limit store in the service, routing.idleSeconds); every other type is
v1alpha2's, so a field added to a shared type reaches both versions and converts as it is.
Frozen: new fields go to v1alpha2 only.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, StrictBool, ValidationInfo, model_validator

from glm_operator.api import glmservice as v1alpha2
from glm_operator.api import rules
from glm_operator.api.base import (
    GROUP,
    ObjectMeta,
    ObjectName,
    SpecModel,
)
from glm_operator.api.glmservice import (
    ACCESS_CONTRADICTS_KEYS,
    ACCESS_NOT_CHOSEN,
    ADMITTED,
    DEFAULT_CONCURRENCY,
    DEFAULT_CONTEXT_LENGTH,
    FLASH_ATTENTION_NEEDED,
    FLASH_ATTENTION_OFF,
    KV_TYPE_FOR_ENGINE,
    LLAMACPP_KV_CACHE_TYPES,
    MAX_CONTEXT_LENGTH,
    MAX_HOST_WEIGHTS_GIB,
    MIN_CONTEXT_LENGTH,
    MTP_ON_LLAMACPP,
    OWNED_FLAG_PATTERN,
    QUANTIZED_KV_CACHE_TYPES,
    SCALE_FROM_ZERO_NEEDS_PICKER,
    SCALE_FROM_ZERO_NOT_MULTI_NODE,
    SCALE_FROM_ZERO_NOT_WITH_KEDA,
    VLLM_KV_CACHE_TYPES,
    Accelerator,
    Autoscaling,
    Engine,
    KvCacheType,
    LoadMode,
    Parsers,
    PodOverrides,
    Rollout,
    _cel_list,
)
from glm_operator.api.glmservice_status import GLMServiceStatus
from glm_operator.api.rate_limit_store import RateLimitStore

VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


class Routing(v1alpha2.Routing):
    """v1alpha2's routing, with the main pool's idle time (v1alpha2: spec.idleSeconds)."""

    idle_seconds: int = Field(
        default=600, ge=30, le=86400,
        description="With autoscaling.minReplicas 0: seconds without a request after which "
        "the operator scales a version's main pool to zero (the router wakes it on the next "
        "one). Ignored otherwise.",
    )


class RateLimit(v1alpha2.RateLimit):
    """v1alpha2's rate limit, with the service's own shared store (v1alpha2: operator config)."""

    store: RateLimitStore | None = Field(
        default=None,
        description="A shared store (Redis) that makes the limits hold for the whole service, "
        "across replicas and both pools. Without it each gateway pod enforces the limits on "
        "its own, so the service as a whole admits up to the limit x its ready pods.",
    )


class Gateway(v1alpha2.Gateway):
    """v1alpha2's gateway settings, with v1alpha1's rate limit."""

    rate_limit: RateLimit | None = Field(
        default=None, description="Per-key rate limit.")


class LongContext(SpecModel):
    """An overflow pool with a larger context, for prompts the main pool rejects.

    The gateway sends a request the engine refuses for context size here, waking the pool
    from zero (0 -> 1); the pool's own HPA adds replicas up to maxReplicas on queued long
    requests (1 -> N); the operator scales it back to zero after idleSeconds without a long
    request (N -> 0), from an activity Lease its gateways renew (docs/autoscaling.md).
    """

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!self.enabled || has(self.contextLength)",
                    "message": "longContext.contextLength is required when longContext is enabled",
                    "fieldPath": ".contextLength",
                },
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "longContext.minReplicas must be <= longContext.maxReplicas",
                    "fieldPath": ".minReplicas",
                },
            ]
        }
    }

    enabled: bool = Field(default=False, description="Create the long-context pool.")
    context_length: int | None = Field(
        default=None,
        ge=MIN_CONTEXT_LENGTH,
        le=MAX_CONTEXT_LENGTH,
        description="Context of the pool; must exceed spec.contextLength.",
    )
    concurrency: int = Field(default=1, ge=1, le=64, description="Concurrent requests per replica.")
    min_replicas: int = Field(
        default=0, ge=0, le=100,
        description="0 lets the pool sleep: it wakes on the first long request and goes back "
        "to zero after idleSeconds without one. 1 or more keeps that many always running.")
    max_replicas: int = Field(
        default=1, ge=1, le=100,
        description="Upper bound; above max(1, minReplicas) the pool gets its own HPA on "
        "queued long requests.")
    idle_seconds: int = Field(
        default=600, ge=30, le=86400,
        description="With minReplicas 0: seconds without a long request after which the "
        "operator scales the pool to zero.")
    queue_length: int = Field(
        default=1, ge=1, le=1000,
        description="The pool's HPA target: long requests waiting per replica (beyond its "
        "concurrency) above which it adds a replica.")
    accelerator: Accelerator | None = Field(
        default=None, description="Accelerator per replica; spec.accelerator when unset."
    )



class CpuOffload(SpecModel):
    """Part of the model kept in host memory, for a model the accelerators cannot hold whole.

    The host memory it takes is planned and requested as the engine container's memory."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.acceleratorLayers) != has(self.hostWeightsGiB)",
                    "message": "cpuOffload takes exactly one of acceleratorLayers (engine "
                    "llamacpp) and hostWeightsGiB (engine vllm)",
                }
            ]
        }
    }

    accelerator_layers: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="llamacpp: layers kept on the accelerators (llama-server --n-gpu-layers), "
        "counting the model's layers (nextn included) and the output layer as one more; the "
        "other layers, their weights and their KV cache, run from host memory on the CPU "
        "(expect a large slowdown). The model's whole count or more offloads nothing. "
        "`glm-operator plan` and an Infeasible condition give the count that fits.",
    )
    host_weights_gib: int | None = Field(
        default=None,
        alias="hostWeightsGiB",
        ge=1,
        le=MAX_HOST_WEIGHTS_GIB,
        description="vllm: GiB of each GPU's weights kept in pinned host memory and streamed "
        "to the GPU on every forward pass (vLLM --cpu-offload-gb; CUDA profiles only). The "
        "pod's memory request grows by this much per GPU.",
    )



class GLMServiceSpec(SpecModel):
    """What to serve, on what, for how many users; the operator plans the rest."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.replicas) && has(self.autoscaling))",
                    "message": "replicas and autoscaling are mutually exclusive: set one",
                    "fieldPath": ".replicas",
                },
                {
                    "rule": "!has(self.engine) || self.engine != 'vllm' || "
                    "self.accelerator.profile != 'cpu'",
                    "message": "engine vllm does not run on the cpu accelerator profile: "
                    "use engine llamacpp with a GGUF ModelVersion",
                    "fieldPath": ".engine",
                },
                {
                    "rule": "!has(self.longContext) || !self.longContext.enabled || "
                    "(has(self.longContext.accelerator) ? "
                    "(!has(self.longContext.accelerator.nodes) || "
                    "self.longContext.accelerator.nodes == 1) : "
                    "(!has(self.accelerator.nodes) || self.accelerator.nodes == 1))",
                    "message": "the long-context pool runs on one node per replica: give "
                    "longContext.accelerator with nodes 1 (multi-node replicas are not woken "
                    "from zero)",
                    "fieldPath": ".longContext.accelerator",
                },
                {
                    "rule": "!has(self.longContext) || !self.longContext.enabled || "
                    "!has(self.longContext.contextLength) || !has(self.contextLength) || "
                    "self.longContext.contextLength > self.contextLength",
                    "message": "longContext.contextLength must be larger than contextLength",
                    "fieldPath": ".longContext.contextLength",
                },
                {
                    "rule": "!has(self.kvCacheType) || !has(self.engine) || "
                    f"(self.engine == 'vllm' ? self.kvCacheType in {_cel_list(VLLM_KV_CACHE_TYPES)}"
                    f" : self.kvCacheType in {_cel_list(LLAMACPP_KV_CACHE_TYPES)})",
                    "message": KV_TYPE_FOR_ENGINE,
                    "fieldPath": ".kvCacheType",
                },
                {
                    "rule": "!has(self.kvCacheType) || !(self.kvCacheType in "
                    f"{_cel_list(QUANTIZED_KV_CACHE_TYPES)}) || !has(self.engineArgs) || "
                    f"!self.engineArgs.join(' ').matches('{FLASH_ATTENTION_OFF}')",
                    "message": FLASH_ATTENTION_NEEDED,
                    "fieldPath": ".engineArgs",
                },
                {
                    "rule": "!has(self.kvUnified) || !has(self.engine) || self.engine != 'vllm'",
                    "message": "kvUnified is llama-server's (--kv-unified): engine vllm pages "
                    "its KV cache across sequences anyway; remove it",
                    "fieldPath": ".kvUnified",
                },
                {
                    "rule": "!has(self.loadMode) || !has(self.engine) || self.engine != 'vllm'",
                    "message": "loadMode is llama-server's (--load-mode); engine vllm reads "
                    "safetensors its own way: remove it",
                    "fieldPath": ".loadMode",
                },
                {
                    "rule": "!has(self.cpuOffload) || !has(self.cpuOffload.acceleratorLayers) "
                    "|| !has(self.engine) || self.engine != 'vllm'",
                    "message": "cpuOffload.acceleratorLayers is llama-server's (--n-gpu-layers);"
                    " with engine vllm give cpuOffload.hostWeightsGiB (--cpu-offload-gb)",
                    "fieldPath": ".cpuOffload.acceleratorLayers",
                },
                {
                    "rule": "!has(self.cpuOffload) || !has(self.cpuOffload.hostWeightsGiB) || "
                    "!has(self.engine) || self.engine != 'llamacpp'",
                    "message": "cpuOffload.hostWeightsGiB is vLLM's (--cpu-offload-gb); with "
                    "engine llamacpp give cpuOffload.acceleratorLayers (--n-gpu-layers)",
                    "fieldPath": ".cpuOffload.hostWeightsGiB",
                },
                {
                    "rule": "!has(self.cpuOffload) || self.accelerator.profile != 'cpu'",
                    "message": "cpuOffload needs an accelerator: on the cpu profile the whole "
                    "model is in host memory already",
                    "fieldPath": ".cpuOffload",
                },
                {
                    "rule": "!has(self.cpuOffload) || !has(self.accelerator.nodes) || "
                    "self.accelerator.nodes == 1",
                    "message": "cpuOffload and a multi-node replica (accelerator.nodes above 1) "
                    "do not combine: spread the model over nodes, or offload on one node",
                    "fieldPath": ".cpuOffload",
                },
                {
                    "rule": "!has(self.parsers) || !has(self.engine) || self.engine != 'llamacpp'",
                    "message": "parsers are vLLM's (--tool-call-parser, --reasoning-parser): "
                    "llama-server parses tool calls and reasoning from the model's own chat "
                    "template; remove parsers or use engine vllm",
                    "fieldPath": ".parsers",
                },
                {
                    "rule": "!has(self.multiTokenPrediction) || !self.multiTokenPrediction || "
                    "!has(self.engine) || self.engine != 'llamacpp'",
                    "message": MTP_ON_LLAMACPP,
                    "fieldPath": ".multiTokenPrediction",
                },
                {
                    "rule": "has(self.gateway) && (has(self.gateway.apiKeysSecret) || "
                    "(has(self.gateway.access) && self.gateway.access == 'Open'))",
                    "message": ACCESS_NOT_CHOSEN,
                    "fieldPath": ".gateway",
                },
                {
                    "rule": "!has(self.autoscaling) || self.autoscaling.minReplicas != 0 || "
                    "(has(self.routing) && has(self.routing.mode) && "
                    "self.routing.mode == 'EndpointPicker')",
                    "message": SCALE_FROM_ZERO_NEEDS_PICKER,
                    "fieldPath": ".autoscaling.minReplicas",
                },
                {
                    "rule": "!has(self.autoscaling) || self.autoscaling.minReplicas != 0 || "
                    "!has(self.autoscaling.scaler) || self.autoscaling.scaler != 'KEDA'",
                    "message": SCALE_FROM_ZERO_NOT_WITH_KEDA,
                    "fieldPath": ".autoscaling.minReplicas",
                },
                {
                    "rule": "!has(self.autoscaling) || self.autoscaling.minReplicas != 0 || "
                    "!has(self.accelerator.nodes) || self.accelerator.nodes == 1",
                    "message": SCALE_FROM_ZERO_NOT_MULTI_NODE,
                    "fieldPath": ".autoscaling.minReplicas",
                },
                {
                    "rule": "!has(self.gateway) || !has(self.gateway.access) || "
                    "self.gateway.access != 'Open' || !has(self.gateway.apiKeysSecret)",
                    "message": ACCESS_CONTRADICTS_KEYS,
                    "fieldPath": ".gateway.access",
                },
            ]
        }
    }

    model_version: ObjectName = Field(
        description=(
            "Name of the ModelVersion (same namespace) that should be live. Changing it starts "
            "a rollout from status.stableModelVersion."
        )
    )
    engine: Engine | None = Field(
        default=None,
        description=(
            "llamacpp (llama-server, GGUF) or vllm (safetensors). Default: from the "
            "ModelVersion format. A mismatch with the format is reported as "
            "ModelReady=False, reason EngineFormatMismatch (the API server cannot see the "
            "ModelVersion)."
        ),
    )
    accelerator: Accelerator = Field(description="Accelerator profile and devices per replica.")
    context_length: int = Field(
        default=DEFAULT_CONTEXT_LENGTH,
        ge=MIN_CONTEXT_LENGTH,
        le=MAX_CONTEXT_LENGTH,
        description="Tokens of context every request may use (prompt plus completion).",
    )
    concurrency: int = Field(
        default=DEFAULT_CONCURRENCY,
        ge=1,
        le=1024,
        description="Requests decoded at once per replica, each with the full contextLength.",
    )
    kv_cache_type: KvCacheType | None = Field(
        default=None,
        description="Element type of the KV cache, K and V alike. llamacpp: f16 (default), "
        "q8_0 (about half of f16), q4_0 (about a quarter), or f32, bf16, q5_1, q5_0, q4_1, "
        "iq4_nl; a quantized V cache needs flash attention, which the operator turns on "
        "(a profile without it refuses the quantized types). vllm: auto (the model's dtype, "
        "default) or fp8, fp8_e4m3, fp8_e5m2 (profiles with fp8). Applies to every pool.",
    )
    kv_unified: bool | None = Field(
        default=None,
        description="llamacpp: one KV buffer shared by every slot (--kv-unified) instead of "
        "one per slot (default false). Planned memory is the same; each request then "
        "attends over the whole buffer, which widens the compute buffer.",
    )
    load_mode: LoadMode | None = Field(
        default=None,
        description="llamacpp: mmap (default) maps the GGUF file from the cache volume; "
        "no-mmap reads it into the engine's own memory (on the cpu profile both are "
        "counted in the pod's memory).",
    )
    cpu_offload: CpuOffload | None = Field(
        default=None,
        description="Keep part of the model in host memory when the accelerators cannot "
        "hold it (one node per replica; not on the cpu profile). Applies to every pool.",
    )
    parsers: Parsers | None = Field(
        default=None,
        description="vllm: the tool-call and reasoning parsers, overriding the ones derived "
        "from the model (GLM-4.5/4.6 glm45, GLM-4.7/5/5.1 glm47).",
    )
    multi_token_prediction: StrictBool | None = Field(
        default=None,
        description="vllm: speculative decoding with the model's own MTP (nextn) layers "
        "(--speculative-config method mtp, one draft token per nextn layer). Default: on "
        "where the model has nextn layers (GLM-4.5 and later); false turns it off; true "
        "makes a model without them Infeasible. Their weights and KV cache are in the plan. "
        "llamacpp: refused (see docs/planning.md).",
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Fixed replica count (1 when neither replicas nor autoscaling is set). 0 "
        "stops the service: no pod runs and nothing wakes one (scale from zero on demand is "
        "autoscaling.minReplicas 0 with routing.mode EndpointPicker).",
    )
    autoscaling: Autoscaling | None = Field(
        default=None, description="Autoscaling instead of a fixed replica count."
    )
    long_context: LongContext | None = Field(
        default=None, description="Overflow pool for prompts longer than contextLength."
    )
    gateway: Gateway = Field(default_factory=Gateway, description="Gateway sidecar settings.")
    routing: Routing = Field(
        default_factory=Routing,
        description="How requests reach the main pool's pods: the Service (default), or a "
        "router and an endpoint picker (LLM-aware load balancing, scale from zero).",
    )
    rollout: Rollout = Field(default_factory=Rollout, description="Version rollout policy.")
    engine_args: list[str] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Extra engine arguments, one argv element each. Flags the operator plans or owns "
            "(model, host, port, context size, GPU layers, slots, KV cache type, threads, "
            "tensor parallel size, max model len, max num seqs, GPU memory utilization, API "
            "keys, load mode, CPU offload) are refused: kvCacheType, kvUnified, loadMode and "
            "cpuOffload are fields."
        ),
        json_schema_extra={
            "items": {"maxLength": 256},
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(a, !a.matches('{OWNED_FLAG_PATTERN}'))",
                    "message": "engineArgs must not set flags the operator owns",
                    "messageExpression": "'engineArgs must not set ' + "
                    f"self.filter(a, a.matches('{OWNED_FLAG_PATTERN}'))[0] + "
                    "': the operator sets it from the plan or the GLMService fields'",
                }
            ],
        },
    )
    pod_overrides: PodOverrides | None = Field(
        default=None, description="Escape hatches for the engine pods."
    )

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> GLMServiceSpec:
        """The CRD's CEL rules of v1alpha1, evaluated as v1alpha2's are (api/rules.py)."""
        if not (info.context or {}).get(ADMITTED):
            rules.check(self)
        return self

class GLMService(SpecModel):
    """A GLMService object as written at v1alpha1."""

    model_config = {"extra": "ignore"}

    api_version: str = Field(default=API_VERSION, pattern=f"^{re.escape(API_VERSION)}$")
    kind: Literal["GLMService"] = "GLMService"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GLMServiceSpec
    status: GLMServiceStatus = Field(default_factory=GLMServiceStatus)
