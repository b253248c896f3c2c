"""GLMService (short name `glms`): one served model endpoint.

`spec.modelVersion` names the ModelVersion the user wants live; `status.stableModelVersion`
is the one serving now. When they differ the operator moves traffic to the new version
by `spec.rollout`. Everything the user does not choose (GPU layers, slots, KV cache type,
memory requests...) is planned and reported in `status.plan`.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import (
    Field,
    JsonValue,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

from glm_operator.api import rules
from glm_operator.api.base import (
    API_VERSION,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    RESERVED_LABEL_PREFIXES,
    Duration,
    FreeFormObject,
    ObjectMeta,
    ObjectName,
    Quantity,
    SecretName,
    SpecModel,
    StringMap,
)
from glm_operator.api.glmservice_status import GLMServiceStatus
from glm_operator.api.vllm_names import NO_PARSER, VLLM_REASONING_PARSERS, VLLM_TOOL_CALL_PARSERS
from glm_operator.wellknown import ABORT_ANNOTATION, PROMOTE_ANNOTATION

MIN_CONTEXT_LENGTH = 512
_RESERVED_PREFIXES = " and ".join(RESERVED_LABEL_PREFIXES)
MAX_CONTEXT_LENGTH = 1_048_576
DEFAULT_CONTEXT_LENGTH = 8192
DEFAULT_CONCURRENCY = 4
DEFAULT_CANARY_STEPS: tuple[int, ...] = (10, 25, 50)
# One-shot rollout commands. Annotations, not spec fields: they are actions on one rollout,
# not desired state. Each names the ModelVersion it acts on, so a stale one (left in git or
# on the object after that rollout ended) never acts on the next rollout. Their prefix is not
# glm-operator.dev/: kopf ignores changes to annotations under its own storage prefix.
CPU_PROFILE = "cpu"

# Flags the operator derives from the plan or owns for wiring (llama-server and vLLM).
# Letting engineArgs set them would silently contradict status.plan. They hold only
# [-a-z], so they go into the regex (shared by Python and CEL/RE2) unescaped.
OPERATOR_OWNED_ENGINE_FLAGS: tuple[str, ...] = (
    # llama-server
    "-m", "--model", "--host", "--port", "-c", "--ctx-size", "-ngl", "--gpu-layers",
    "--n-gpu-layers", "-np", "--parallel", "-kvu", "--kv-unified", "--no-kv-unified",
    "-ctk", "--cache-type-k", "-ctv", "--cache-type-v", "-t", "--threads", "-a", "--alias",
    "--api-key", "--api-key-file",
    # vLLM
    "--served-model-name", "--max-model-len", "--max-num-seqs", "--gpu-memory-utilization",
    "-tp", "--tensor-parallel-size", "--kv-cache-dtype", "--cpu-offload-gb",
    # vLLM's parsers (engine.vllm.parsers) and MTP speculative decoding (engine.vllm.
    # multiTokenPrediction)
    "--tool-call-parser", "--reasoning-parser", "--enable-auto-tool-choice",
    "--speculative-config", "-sc",
    # llama-server's load mode (engine.llamacpp.loadMode)
    "-lm", "--load-mode", "--mmap", "--no-mmap",
    # multi-node wiring (accelerator.nodes)
    "--rpc", "-pp", "--pipeline-parallel-size", "--distributed-executor-backend",
)  # fmt: skip
OWNED_FLAG_PATTERN = "^(" + "|".join(OPERATOR_OWNED_ENGINE_FLAGS) + ")(=.*)?$"
MTP_ON_LLAMACPP = (
    "multiTokenPrediction is rendered for engine vllm: the pinned llama-server's MTP "
    "(--spec-type draft-mtp) runs a second, draft context whose memory the plan does not count "
    "yet; remove multiTokenPrediction or use engine vllm"
)


class Engine(StrEnum):
    LLAMACPP = "llamacpp"
    VLLM = "vllm"


class Scaler(StrEnum):
    """Which autoscaler sizes the main pool (spec.autoscaling.scaler)."""

    AUTO = "Auto"  # KEDA when its ScaledObject CRD is served and prometheus.url is set, else HPA
    HPA = "HPA"  # an autoscaling/v2 HPA on the custom metrics API (prometheus-adapter)
    KEDA = "KEDA"  # a KEDA ScaledObject with Prometheus triggers; KEDA creates the HPA


class RolloutStrategy(StrEnum):
    CANARY = "canary"
    SURGE = "surge"


MAX_NODES = 16


class Accelerator(SpecModel):
    """The accelerator each replica gets: a profile name, devices per node, and nodes."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.profile != 'cpu' || self.count == 1",
                    "message": "accelerator.count must be 1 on the cpu profile "
                    "(CPU threads come from the CPU request)",
                    "fieldPath": ".count",
                },
                {
                    "rule": "self.profile != 'cpu' || !has(self.nodes) || self.nodes == 1",
                    "message": "accelerator.nodes must be 1 on the cpu profile: a replica "
                    "spans nodes only with accelerators (llama.cpp RPC or vLLM pipeline "
                    "parallel)",
                    "fieldPath": ".nodes",
                },
            ]
        }
    }

    profile: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description=(
            "Accelerator profile: nvidia-a10, nvidia-l4, nvidia-a100-40gb, nvidia-a100-80gb, "
            "nvidia-h100-80gb, nvidia-h200, nvidia-v100-32gb, ascend-910b, ascend-310p, cpu, "
            "or one added in the operator config. It fixes the device memory, the resource "
            "name, node labels and tolerations."
        ),
    )
    count: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Devices per node (per pod); above 1 the model is tensor-parallel (vLLM) "
        "or layer-split (llama.cpp) inside one pod.",
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=MAX_NODES,
        description="Nodes per replica. Above 1 each replica is a group of pods, one per node, "
        "placed on nodes of this profile: a leader (engine server and gateway) and workers "
        "(llama.cpp ggml-rpc-server, or vLLM Ray workers); vLLM runs pipeline parallel across the "
        "nodes, llama.cpp splits the layers over every device of the group. "
        "`glm-operator plan` proposes it when one node cannot hold the model.",
    )



class ScalingPolicy(SpecModel):
    """One HPA scaling policy (autoscaling/v2 HPAScalingPolicy)."""

    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1, le=1000)
    period_seconds: int = Field(ge=1, le=1800)


class ScalingRules(SpecModel):
    """HPA scaling rules for one direction (autoscaling/v2 HPAScalingRules)."""

    stabilization_window_seconds: int | None = Field(default=None, ge=0, le=3600)
    select_policy: Literal["Max", "Min", "Disabled"] | None = None
    policies: list[ScalingPolicy] | None = Field(default=None, max_length=10)


class ScalingBehavior(SpecModel):
    """How fast to scale up and down. Model pods load slowly: scale down gently."""

    scale_up: ScalingRules | None = None
    scale_down: ScalingRules | None = None


class AutoscalingTargets(SpecModel):
    """Per-replica targets; the HPA scales on whichever asks for the most replicas."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.requestsPerSecond) || has(self.queueLength) || "
                    "has(self.kvCacheUtilization) || has(self.acceleratorMemoryUtilization)",
                    "message": "autoscaling.targets needs at least one of "
                    "requestsPerSecond, queueLength, kvCacheUtilization, "
                    "acceleratorMemoryUtilization",
                }
            ]
        }
    }

    kv_cache_utilization: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="Target share of the engine's KV cache in use, percent (the memory "
        "signal that moves with load, for every engine).",
    )
    accelerator_memory_utilization: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="Target GPU/NPU memory utilisation, percent: a guard only (engines "
        "allocate their KV cache up front, so device memory hardly moves with load).",
    )
    requests_per_second: float | None = Field(
        default=None,
        ge=0.001,
        le=100000,
        description="Target requests served per second per replica (rejections such as 401 "
        "and 429 do not count).",
    )
    queue_length: int | None = Field(
        default=None,
        ge=1,
        le=10000,
        description="Target queued (waiting, not yet decoding) requests per replica.",
    )



class Autoscaling(SpecModel):
    """Horizontal autoscaling of the main pool (an autoscaling/v2 HPA on gateway metrics)."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
                    "fieldPath": ".minReplicas",
                }
            ]
        }
    }

    min_replicas: int = Field(
        default=1, ge=0, le=1000,
        description="Lower bound. 0 (scale from zero) needs routing.mode EndpointPicker: the "
        "operator scales the pool to zero after idleSeconds without a request and "
        "the router wakes it on the next one (the HPA itself keeps a floor of 1 while pods "
        "run). Not with scaler KEDA, nor with multi-node replicas, yet.")
    max_replicas: int = Field(ge=1, le=1000, description="Upper bound.")
    targets: AutoscalingTargets = Field(description="Per-replica metric targets.")
    behavior: ScalingBehavior | None = Field(
        default=None, description="HPA behavior; the operator's defaults scale down slowly."
    )
    scaler: Scaler = Field(
        default=Scaler.AUTO,
        description="Who scales the main pool: HPA (an autoscaling/v2 HPA on the custom "
        "metrics API, e.g. prometheus-adapter), KEDA (a KEDA ScaledObject with one Prometheus "
        "trigger per target; KEDA creates and owns the HPA), or Auto (KEDA when KEDA's "
        "ScaledObject CRD is served and the operator has prometheus.url, else HPA). KEDA "
        "when it is not possible scales nothing: condition Autoscaling=False says why.",
    )



class RoutingMode(StrEnum):
    """How client requests reach the engine pods (spec.routing.mode)."""

    SERVICE = "Service"  # the Service spreads connections over ready engine pods
    ENDPOINT_PICKER = "EndpointPicker"  # a router asks an endpoint picker for each request
    # The platform's inference gateway (Gateway API Inference Extension) routes: the operator
    # writes an InferencePool per version and an HTTPRoute to them, no router.
    INFERENCE_GATEWAY = "InferenceGateway"


class FailureMode(StrEnum):
    """What the router does when the endpoint picker is down or slow (spec.routing.failureMode)."""

    FAIL_OPEN = "FailOpen"  # any ready pod of the chosen version
    FAIL_CLOSE = "FailClose"  # 503 with Retry-After


MAX_ROUTER_REPLICAS = 16


GATEWAY_REF_NEEDS_MODE = (
    "spec.routing.gatewayRef is read only with spec.routing.mode InferenceGateway: set "
    "routing.mode: InferenceGateway, or remove routing.gatewayRef")
MODE_NEEDS_GATEWAY_REF = (
    "spec.routing.mode InferenceGateway needs spec.routing.gatewayRef: name the Gateway "
    "(name, and namespace and sectionName where needed) whose HTTPRoute should carry the "
    "service, or choose mode Service or EndpointPicker")
HOSTNAMES_NEED_MODE = (
    "spec.routing.hostnames are the HTTPRoute's, written only with spec.routing.mode "
    "InferenceGateway: set mode InferenceGateway, or remove hostnames")
# Gateway API's own patterns (gateway.networking.k8s.io/v1 SectionName and Hostname).
SECTION_NAME_PATTERN = DNS_SUBDOMAIN_PATTERN
HOSTNAME_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_HOSTNAMES = 16


class GatewayRef(SpecModel):
    """The Gateway (Gateway API) whose inference extension routes the service: the parent of
    the HTTPRoute the operator writes (spec.routing.mode InferenceGateway)."""

    name: ObjectName = Field(description="The Gateway's name.")
    namespace: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN,
        description="The Gateway's namespace (default: the GLMService's). A Gateway in "
        "another namespace must allow routes from this one (its listener's allowedRoutes).")
    section_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=SECTION_NAME_PATTERN,
        description="One listener of the Gateway, by name (default: every listener that "
        "accepts the route).")


class Routing(SpecModel):
    """LLM-aware routing: a router in front of the main pool asks an endpoint picker (the
    Gateway API Inference Extension's EPP) which pod should serve each request, from the
    pods' queues, KV-cache use and prompt-prefix affinity; it also splits traffic between
    versions by the rollout's weights and wakes a main pool scaled to zero. Or, where the
    platform runs an inference gateway (Istio, agentgateway, NGINX Gateway Fabric), that
    gateway asks the pickers and splits the versions, from the InferencePools and the
    HTTPRoute the operator writes (mode InferenceGateway)."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": "!has(self.gatewayRef) || "
                         "(has(self.mode) && self.mode == 'InferenceGateway')",
                 "message": GATEWAY_REF_NEEDS_MODE, "fieldPath": ".gatewayRef"},
                {"rule": "!has(self.mode) || self.mode != 'InferenceGateway' || "
                         "has(self.gatewayRef)",
                 "message": MODE_NEEDS_GATEWAY_REF, "fieldPath": ".mode"},
                {"rule": "!has(self.hostnames) || "
                         "(has(self.mode) && self.mode == 'InferenceGateway')",
                 "message": HOSTNAMES_NEED_MODE, "fieldPath": ".hostnames"},
            ]
        }
    }

    mode: RoutingMode = Field(
        default=RoutingMode.SERVICE,
        description="Service (default): the client-facing Service spreads connections over "
        "the ready engine pods, which is all a one-replica service can use. EndpointPicker: "
        "the Service selects a router Deployment (routerReplicas pods) that picks the pod "
        "for each request through an endpoint picker Deployment; it costs those two "
        "Deployments and a hop, so opt in where replicas are above 1 (the picker keeps a "
        "conversation's prefix on the pod that has it cached and avoids busy pods) or for "
        "scale from zero (autoscaling.minReplicas 0 needs it: the router holds requests "
        "while the pool wakes). InferenceGateway: the Gateway named by gatewayRef routes, "
        "through an InferencePool and an endpoint picker per version and an HTTPRoute with "
        "the rollout's weights (needs the InferencePool and HTTPRoute CRDs; no router, no "
        "scale from zero).",
    )
    failure_mode: FailureMode = Field(
        default=FailureMode.FAIL_OPEN,
        description="When the endpoint picker does not answer in time or is down: FailOpen "
        "(default) sends the request to any ready pod of the version the weights chose; "
        "FailClose answers 503 with Retry-After. With InferenceGateway it is each "
        "InferencePool's endpointPickerRef.failureMode, which the gateway applies.",
    )
    gateway_ref: GatewayRef | None = Field(
        default=None,
        description="mode InferenceGateway (required there, refused otherwise): the Gateway "
        "whose HTTPRoute carries the service.",
    )
    hostnames: list[str] | None = Field(
        default=None, min_length=1, max_length=MAX_HOSTNAMES,
        description="mode InferenceGateway: the HTTPRoute's hostnames (default: the "
        "service's cluster host, <name>.<namespace>.svc.<clusterDomain>).",
        json_schema_extra={"items": {"maxLength": 253, "pattern": HOSTNAME_PATTERN}},
    )
    router_replicas: int = Field(
        default=2, ge=1, le=MAX_ROUTER_REPLICAS,
        description="Router pods (2 survives the loss of one node; the router holds no state "
        "a peer lacks).",
    )
    max_waiting_requests: int = Field(
        default=256, ge=1, le=10000,
        description="Requests each router pod holds while a pool wakes from zero or has no "
        "ready pod; one more is answered 503.",
    )

    @field_validator("hostnames")
    @classmethod
    def _hostnames(cls, names: list[str] | None) -> list[str] | None:
        for name in names or []:
            if len(name) > 253 or not re.match(HOSTNAME_PATTERN, name):
                raise ValueError(f"routing.hostnames: {name!r} is not a hostname (Gateway "
                                 "API's Hostname: lower-case DNS labels, optionally *. first)")
        return names



class RateLimit(SpecModel):
    """Per-API-key token buckets; over the limit the gateway answers 429 with Retry-After.
    Per gateway pod, unless the operator's config names a shared store (Redis): then the
    limits hold for the whole service, across replicas and both pools."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.requestsPerMinute) || has(self.tokensPerMinute)",
                    "message": "gateway.rateLimit needs requestsPerMinute or tokensPerMinute",
                }
            ]
        }
    }

    requests_per_minute: int | None = Field(default=None, ge=1, le=1_000_000)
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description="Prompt plus completion tokens per minute.",
    )
    burst: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Bucket size in requests; requestsPerMinute/6 (10 s worth) when unset.",
    )


class Audit(SpecModel):
    """One JSON line per request on the gateway's stdout."""

    enabled: bool = Field(default=True, description="Write audit lines.")
    include_prompts: bool = Field(
        default=False, description="Also log prompt and completion text (personal data!)."
    )


class Access(StrEnum):
    """Who the gateway serves (spec.gateway.access)."""

    API_KEYS = "APIKeys"  # a key from spec.gateway.apiKeysSecret on every /v1 request
    OPEN = "Open"  # anyone who reaches the Service, without a key


MAX_DRAIN_SECONDS = 3600
DEFAULT_MAX_DRAIN_SECONDS = 300
# The two access rules, shared by the CEL on GLMServiceSpec and the pydantic check.
ACCESS_NOT_CHOSEN = (
    "spec.gateway.apiKeysSecret is required: name a Secret whose every value is an API key, "
    "or set spec.gateway.access: Open to serve anyone who reaches the Service without a key"
)
ACCESS_CONTRADICTS_KEYS = (
    "spec.gateway.access Open serves without keys, yet spec.gateway.apiKeysSecret names "
    "keys: remove one of them"
)
# Validation context under which an object the API server already admitted is parsed: it
# may predate the access rule (a GLMService stored before spec.gateway.access existed), and
# the operator reports that (condition OpenAccess) rather than refusing to reconcile it.
ADMITTED = "admitted"
# Scale from zero of the main pool (spec.autoscaling.minReplicas 0): the rules shared by the
# CEL on GLMServiceSpec and the pydantic check.
SCALE_FROM_ZERO_NEEDS_PICKER = (
    "spec.autoscaling.minReplicas 0 needs spec.routing.mode EndpointPicker: only the router "
    "holds a request while the main pool wakes from zero; set spec.routing.mode: "
    "EndpointPicker, or autoscaling.minReplicas to 1 or more")
SCALE_FROM_ZERO_NOT_WITH_KEDA = (
    "spec.autoscaling.minReplicas 0 with spec.autoscaling.scaler KEDA is not built yet (KEDA "
    "would scale the sleeping pool back to its minReplicaCount): use scaler HPA or Auto, "
    "or minReplicas 1 or more")
SCALE_FROM_ZERO_NOT_MULTI_NODE = (
    "spec.autoscaling.minReplicas 0 with multi-node replicas (accelerator.nodes above 1) is "
    "not built yet: the router wakes a Deployment, not a group; use minReplicas 1 or more")
# KV cache element types each engine's pinned build takes (llama-server -ctk/-ctv, vLLM
# --kv-cache-dtype). planning/memory.py sizes them; tests/api checks the two lists agree.
LLAMACPP_KV_CACHE_TYPES: tuple[str, ...] = (
    "f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
VLLM_KV_CACHE_TYPES: tuple[str, ...] = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
LlamaCppKvCacheType = Literal[
    "f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"]
VllmKvCacheType = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
KvCacheType = Literal[
    "f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl",
    "auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
MAX_HOST_WEIGHTS_GIB = 4096
QUANTIZED_KV_CACHE_TYPES = tuple(t for t in LLAMACPP_KV_CACHE_TYPES if t.startswith(("q", "iq")))
# engineArgs that turn llama-server's flash attention off (RE2 and Python alike, over the
# arguments joined by spaces).
FLASH_ATTENTION_OFF = "(^| )(-fa|--flash-attn)[ =](off|false|0)( |$)"
FLASH_ATTENTION_NEEDED = (
    "engineArgs turn flash attention off, which llama.cpp needs for the quantized V cache "
    "kvCacheType asks for: remove the flag (the operator turns it on)")
KV_TYPE_FOR_ENGINE = (
    "kvCacheType must be one the engine takes: llamacpp "
    + ", ".join(LLAMACPP_KV_CACHE_TYPES) + "; vllm " + ", ".join(VLLM_KV_CACHE_TYPES))


class Gateway(SpecModel):
    """The OpenAI-compatible gateway sidecar in front of each engine."""

    access: Access | None = Field(
        default=None,
        description=(
            "APIKeys (implied by apiKeysSecret) or Open. A GLMService must choose: without "
            "apiKeysSecret it is refused unless access is Open, so an endpoint never serves "
            "anyone by omission. Open: condition OpenAccess=True (Warning) says so."
        ),
    )
    api_keys_secret: SecretName | None = Field(
        default=None,
        description=(
            "Secret whose every data value is one valid API key (several at once, for "
            "rotation; reloaded without restart). Required unless access is Open. While it "
            "does not exist, condition ResolvedRefs=False names it."
        ),
    )
    rate_limit: RateLimit | None = Field(default=None, description="Per-key rate limit.")
    audit: Audit = Field(default_factory=Audit, description="Audit log.")
    max_drain_seconds: int = Field(
        default=DEFAULT_MAX_DRAIN_SECONDS,
        ge=1,
        le=MAX_DRAIN_SECONDS,
        description=(
            "Upper bound on how long a stopping model pod (scale-down, rollout, node drain, "
            "eviction) lets the requests it is running finish, once it has left the "
            "Service's endpoints. Each pool gets min(maxDrainSeconds, the longest generation "
            "it allows), the longest generation being its context per request (prompt plus "
            "completion never exceed it) at the operator's decode floor "
            "(termination.decodeTokensPerSecond, default 20 tokens/s per request; "
            "cpuDecodeTokensPerSecond, 2, on the cpu profile). The pod's "
            "terminationGracePeriodSeconds is the endpoint-removal wait before SIGTERM "
            "(termination.endpointRemovalSeconds, 10) + this drain + an exit margin (5)."
        ),
    )

    @property
    def effective_access(self) -> Access | None:
        """APIKeys when keys are named, Open when chosen; None: neither (an object admitted
        before the choice was required)."""
        if self.api_keys_secret:
            return Access.API_KEYS
        return Access.OPEN if self.access == Access.OPEN else None


class UndecidedAction(StrEnum):
    ROLL_BACK = "RollBack"
    WAIT = "Wait"


class CanaryAnalysis(SpecModel):
    """What a canary step must show, from the gateway's Prometheus metrics, to go on.

    A request fails the version that served it when it ended in a server error, a timeout, a
    stream the engine broke, or a client who gave up before the first token; requests still
    running past their bound (the gateway's overdue gauge) count as failing while they last.
    By default the canary is judged against the stable version over the same window."""

    compare_to_stable: bool = Field(
        default=True,
        description="Judge the canary against the stable version over the same window (its "
        "failure rate and p99s, with the tolerances below), as Kayenta does; false: only the "
        "absolute bounds.",
    )
    max_error_rate_increase_percent: float = Field(
        default=1.0, ge=0, le=100,
        description="Percentage points the canary's failure rate may exceed the stable's.",
    )
    max_latency_increase_percent: int = Field(
        default=50, ge=0, le=10_000,
        description="Percent the canary's p99 latency and p99 time to first token may exceed "
        "the stable's (a difference under 100 ms never fails).",
    )
    max_error_rate_percent: float | None = Field(
        default=None, ge=0, le=100,
        description="Absolute bound on the canary's failure rate, percent. Unset: 1 when the "
        "stable had too little traffic to compare with (or compareToStable is false), else "
        "only the relative gate.",
    )
    max_latency_p99_ms: int | None = Field(
        default=None, ge=1, le=3_600_000, description="Absolute p99 request latency bound."
    )
    max_time_to_first_token_p99_ms: int | None = Field(
        default=None, ge=1, le=3_600_000, description="Absolute p99 time-to-first-token bound."
    )
    min_request_count: int = Field(
        default=20,
        ge=0,
        le=1_000_000,
        description="Fewer canary requests in an interval cannot be judged: the step holds "
        "(see undecidedDeadline).",
    )
    failure_threshold: int = Field(
        default=3, ge=1, le=100, description="Failed checks before the rollback."
    )
    undecided_deadline: Duration = Field(
        default="10m",
        description="How long a step may go without a check it could judge (too little "
        "traffic) before onUndecided applies.",
    )
    on_undecided: UndecidedAction = Field(
        default=UndecidedAction.ROLL_BACK,
        description="RollBack: a canary that cannot be judged by undecidedDeadline rolls "
        "back, saying so; Wait: it holds its step until traffic comes.",
    )


class Rollout(SpecModel):
    """How traffic moves from status.stableModelVersion to spec.modelVersion."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.strategy == 'canary' || "
                    "(!has(self.steps) && !has(self.analysis))",
                    "message": "rollout.steps and rollout.analysis apply only to strategy canary",
                    "fieldPath": ".strategy",
                }
            ]
        }
    }

    strategy: RolloutStrategy = Field(
        default=RolloutStrategy.SURGE,
        description=(
            "surge: start the new version at full size, then remove the old one. "
            "canary: move traffic by steps, with analysis and automatic rollback."
        ),
    )
    steps: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=20,
        description="Canary traffic weights, percent, strictly ascending (default 10, 25, 50).",
        json_schema_extra={
            "items": {"minimum": 1, "maximum": 100},
            "x-kubernetes-list-type": "set",
            "x-kubernetes-validations": [
                {
                    "rule": "self.isSorted()",
                    "message": "rollout.steps must be strictly ascending weights between 1 and 100",
                }
            ],
        },
    )
    interval: Duration = Field(
        default="1m",
        description="Time per step: each analysis check reads this window of metrics, e.g. 2m.",
    )
    analysis: CanaryAnalysis | None = Field(
        default=None,
        description="Canary gates; without it the defaults below apply (a canary is always "
        "analysed).",
    )
    paused: bool = Field(
        default=False,
        description="Hold the rollout where it is: weights, replicas and analysis stay. "
        f"Promote and abort are annotations naming the version: {PROMOTE_ANNOTATION} and "
        f"{ABORT_ANNOTATION}.",
    )
    progress_deadline: Duration | None = Field(
        default=None,
        description="How long the new version may take to become ready (model fetched, pods "
        "Ready) before the rollout fails with ProgressDeadlineExceeded and the stable version "
        "keeps all traffic. Default: the larger of 15m and the model's planned load time "
        "plus 5m.",
    )

    @field_validator("steps")
    @classmethod
    def _ascending(cls, steps: list[int] | None) -> list[int] | None:
        if steps is None:
            return None
        if any(not 1 <= w <= 100 for w in steps):
            raise ValueError("rollout.steps weights must be between 1 and 100")
        if any(b <= a for a, b in itertools.pairwise(steps)):
            raise ValueError("rollout.steps must be strictly ascending")
        return steps

    @property
    def effective_steps(self) -> tuple[int, ...]:
        return tuple(self.steps) if self.steps else DEFAULT_CANARY_STEPS


class Toleration(SpecModel):
    """core/v1 Toleration."""

    key: str | None = Field(default=None, max_length=316)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, json_schema_extra={"format": "int64"})




def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


class LoadMode(StrEnum):
    """How llama-server reads the GGUF file (spec.loadMode)."""

    MMAP = "mmap"  # --load-mode mmap: mapped from the cache volume, pages shared and reclaimable
    NO_MMAP = "no-mmap"  # --load-mode none: read into memory the process owns


class ResourceOverrides(SpecModel):
    """Container resources merged over the planned ones (accelerator devices excepted)."""

    requests: dict[str, Quantity] | None = Field(
        default=None, json_schema_extra={"maxProperties": 16}
    )
    limits: dict[str, Quantity] | None = Field(
        default=None, json_schema_extra={"maxProperties": 16}
    )


class EnvVar(SpecModel):
    name: str = Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str = Field(default="", max_length=32768)


_RESERVED_LABEL_RULE = " && ".join(f"!k.startsWith('{p}')" for p in RESERVED_LABEL_PREFIXES)


class PodOverrides(SpecModel):
    """Escape hatches applied to every engine pod, after the plan."""

    node_selector: StringMap | None = Field(
        default=None, description="Added to the profile's. A kubernetes.io/arch that the "
        "operator's own pin leaves out (no image build for it) is refused: Planned=False, "
        "reason NoImageForNodeArchitecture.")
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=32, description="Added to the profile's."
    )
    affinity: FreeFormObject | None = Field(
        default=None, description="core/v1 Affinity; replaces the profile's node affinity "
        "(the kubernetes.io/arch pin is still added to each required node selector term)."
    )
    resources: ResourceOverrides | None = Field(default=None, description="Engine container.")
    annotations: StringMap | None = Field(default=None, description="Pod annotations.")
    labels: StringMap | None = Field(
        default=None,
        description=f"Pod labels; {_RESERVED_PREFIXES} keys are reserved.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, {_RESERVED_LABEL_RULE})",
                    "message": "podOverrides.labels must not use the reserved prefixes "
                    f"{_RESERVED_PREFIXES}",
                }
            ]
        },
    )
    priority_class_name: str | None = Field(default=None, max_length=253)
    env: list[EnvVar] | None = Field(
        default=None, max_length=64, description="Extra engine environment variables."
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Engine image; the profile's image for the engine when unset.",
    )



class Parsers(SpecModel):
    """vLLM's parsers of a model's output. Derived from the model when absent: the GLM-4.5 and
    GLM-4.6 family (glm4moe) get glm45 for tool calls, GLM-4.7, GLM-5 and GLM-5.1 (glm4moe
    named 4.7 in its source or name, glm-dsa, glm5-next) glm47; reasoning glm45 for all of
    them; other models none."""

    tool_call: str | None = Field(
        default=None,
        description="vLLM --tool-call-parser (with --enable-auto-tool-choice): one of the pinned "
        "vLLM's parsers, or none to turn tool-call parsing off.",
        json_schema_extra={"enum": [*VLLM_TOOL_CALL_PARSERS, NO_PARSER]},
    )
    reasoning: str | None = Field(
        default=None,
        description="vLLM --reasoning-parser: one of the pinned vLLM's parsers, or none to "
        "leave the thinking text in the answer.",
        json_schema_extra={"enum": [*VLLM_REASONING_PARSERS, NO_PARSER]},
    )

    @field_validator("tool_call")
    @classmethod
    def _known_tool_call_parser(cls, name: str | None) -> str | None:
        if name is not None and name not in (*VLLM_TOOL_CALL_PARSERS, NO_PARSER):
            raise ValueError(f"parsers.toolCall {name!r} is not a parser of the pinned vLLM; "
                             f"give one of {', '.join(VLLM_TOOL_CALL_PARSERS)}, or none")
        return name

    @field_validator("reasoning")
    @classmethod
    def _known_reasoning_parser(cls, name: str | None) -> str | None:
        if name is not None and name not in (*VLLM_REASONING_PARSERS, NO_PARSER):
            raise ValueError(f"parsers.reasoning {name!r} is not a parser of the pinned vLLM; "
                             f"give one of {', '.join(VLLM_REASONING_PARSERS)}, or none")
        return name


class LlamaCpp(SpecModel):
    """llama-server (llama.cpp) settings: GGUF models, on every accelerator and the CPU."""

    kv_cache_type: LlamaCppKvCacheType | None = Field(
        default=None,
        description="Element type of the KV cache, K and V alike: f16 (default), q8_0 (about "
        "half of f16), q4_0 (about a quarter), or f32, bf16, q5_1, q5_0, q4_1, iq4_nl; a "
        "quantized V cache needs flash attention, which the operator turns on (a profile "
        "without it refuses the quantized types). Applies to every pool.",
    )
    kv_unified: bool | None = Field(
        default=None,
        description="One KV buffer shared by every slot (--kv-unified) instead of one per slot "
        "(default false). Planned memory is the same; each request then attends over the "
        "whole buffer, which widens the compute buffer.",
    )
    load_mode: LoadMode | None = Field(
        default=None,
        description="mmap (default) maps the GGUF file from the cache volume; no-mmap reads it "
        "into the engine's own memory (on the cpu profile both are counted in the pod's "
        "memory).",
    )
    accelerator_layers: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="CPU offload: layers kept on the accelerators (llama-server "
        "--n-gpu-layers), counting the model's layers (nextn included) and the output layer "
        "as one more; the other layers, their weights and their KV cache, run from host "
        "memory on the CPU (expect a large slowdown). The model's whole count or more "
        "offloads nothing. `glm-operator plan` and an Infeasible condition give the count "
        "that fits. Not on the cpu profile, nor with multi-node replicas.",
    )


VLLM_LAYOUTS = ("tp", "dcp", "dep")


class Vllm(SpecModel):
    """vLLM settings: safetensors models, on NVIDIA GPUs and (vllm-ascend) Ascend NPUs."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.rankTensorParallel) || "
                    "(has(self.layout) && self.layout == 'dep')",
                    "message": "rankTensorParallel is the tensor parallelism inside each "
                    "data-parallel rank: it needs layout dep",
                    "fieldPath": ".rankTensorParallel",
                }
            ]
        }
    }

    kv_cache_type: VllmKvCacheType | None = Field(
        default=None,
        description="Element type of the KV cache: auto (the model's dtype, default) or fp8, "
        "fp8_e4m3, fp8_e5m2 (profiles with fp8). Applies to every pool.",
    )
    cpu_offload_gib: int | None = Field(
        default=None,
        alias="cpuOffloadGiB",
        ge=1,
        le=MAX_HOST_WEIGHTS_GIB,
        description="GiB of each GPU's weights kept in pinned host memory and streamed to the "
        "GPU on every forward pass (vLLM --cpu-offload-gb; CUDA profiles only). The pod's "
        "memory request grows by this much per GPU. Not with multi-node replicas.",
    )
    kv_offload_gib: int | None = Field(
        default=None,
        alias="kvOffloadGiB",
        ge=1,
        le=MAX_HOST_WEIGHTS_GIB,
        description="GiB of host memory for vLLM's CPU KV tier per engine core (each "
        "data-parallel rank), --kv-offloading-size with the native backend; CUDA profiles, "
        "one node. A second tier behind the GPU's KV cache: it keeps computed KV blocks for "
        "prefix-cache hits and for preempted requests, which resume by a copy instead of a "
        "recomputed prefill; it adds no decoding room (requests decode with their KV on the "
        "GPU). With it the plan fits when the GPUs hold one request at the asked context and "
        "the tier the rest. The pod's memory request and /dev/shm grow by it per engine core. "
        "Applies to every pool.",
    )
    parsers: Parsers | None = Field(
        default=None,
        description="The tool-call and reasoning parsers, overriding the ones derived from the "
        "model (GLM-4.5/4.6 glm45, GLM-4.7/5/5.1 glm47).",
    )
    multi_token_prediction: StrictBool | None = Field(
        default=None,
        description="Speculative decoding with the model's own MTP (nextn) layers "
        "(--speculative-config method mtp, one draft token per nextn layer). Default: on "
        "where the model has nextn layers (GLM-4.5 and later); false turns it off; true "
        "makes a model without them Infeasible. Their weights and KV cache are in the plan.",
    )
    layout: Literal["tp", "dcp", "dep"] | None = Field(
        default=None,
        description="How the main pool's devices of one replica share the model "
        "(docs/planning.md, Layouts): tp (tensor parallel; the MLA latent cache is copied on "
        "every rank), dcp (tensor parallel with decode context parallelism: the latent and "
        "indexer caches sharded over the ranks; MLA models), dep (data-parallel attention "
        "with expert parallelism: each rank caches only its own sequences; MoE models, one "
        "node). Default: the planner's choice, the fewest devices that fit, ties to the "
        "lower-latency layout; status.plan.layouts shows each one's capacity. A layout that "
        "does not apply to the model or does not fit makes the plan Infeasible, naming the "
        "layouts that do.",
    )
    rank_tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="layout dep: tensor parallelism inside each data-parallel rank (it "
        "divides accelerator.count; default 1).",
    )


class EngineSettings(SpecModel):
    """The engine, named by its key, with the settings only that engine honours. Absent (or
    empty): the engine follows the ModelVersion's format (GGUF llamacpp, safetensors vllm)."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.llamacpp) && has(self.vllm))",
                    "message": "engine names one engine: give llamacpp or vllm, not both",
                }
            ]
        }
    }

    llamacpp: LlamaCpp | None = Field(
        default=None, description="llama-server (GGUF models).")
    vllm: Vllm | None = Field(default=None, description="vLLM (safetensors models).")

    @property
    def name(self) -> Engine | None:
        if self.llamacpp is not None:
            return Engine.LLAMACPP
        if self.vllm is not None:
            return Engine.VLLM
        return None


@dataclass(frozen=True)
class CpuOffload:
    """The engine's CPU offload, whichever engine: llama.cpp's accelerator layers or vLLM's
    GiB of weights per GPU in host memory (exactly one is set)."""

    accelerator_layers: int | None = None
    host_weights_gib: int | None = None


# A pool's own rules; GLMServiceSpec, the main pool, lists them with its others.
POOL_RULES: list[JsonValue] = [
    {
        "rule": "!(has(self.replicas) && has(self.autoscaling))",
        "message": "replicas and autoscaling are mutually exclusive: set one",
        "fieldPath": ".replicas",
    },
]


class Pool(SpecModel):
    """A pool of engine replicas: what each replica runs on, for what context and how many
    requests at once, and how many replicas. The main pool's fields sit at the top of the
    spec; the long-context pool is `longContext`, of the same type."""

    model_config = {"json_schema_extra": {"x-kubernetes-validations": POOL_RULES}}

    accelerator: Accelerator | None = Field(
        default=None,
        description="Accelerator profile and devices per replica (the long-context pool: the "
        "main pool's when unset).",
    )
    context_length: int | None = Field(
        default=None,
        ge=MIN_CONTEXT_LENGTH,
        le=MAX_CONTEXT_LENGTH,
        description="Tokens of context every request may use (prompt plus completion). The "
        "long-context pool: required, larger than the main pool's.",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Requests decoded at once per replica, each with the full contextLength "
        f"(main pool {DEFAULT_CONCURRENCY}, long-context pool 1 when unset).",
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Fixed replica count. Neither replicas nor autoscaling: the main pool runs "
        "1 replica; the long-context pool sleeps at zero, wakes to one on the first long "
        "request and goes back after idleSeconds. 0 stops the main pool: no pod runs and "
        "nothing wakes one (scale from zero on demand is autoscaling.minReplicas 0 with "
        "routing.mode EndpointPicker).",
    )
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="Autoscaling instead of a fixed replica count. The long-context pool "
        "scales on targets.queueLength only (long requests waiting per replica).",
    )
    idle_seconds: int = Field(
        default=600,
        ge=30,
        le=86400,
        description="With a minimum of 0 replicas: seconds without a request after which the "
        "operator scales the pool to zero (the router wakes the main pool, the gateway the "
        "long-context pool, on the next one). Ignored otherwise.",
    )

    @property
    def min_replicas(self) -> int:
        """The floor of a pool scaled on its queue (the long-context pool): fixed replicas
        give their count; neither replicas nor autoscaling sleeps at 0."""
        if self.replicas is not None:
            return self.replicas
        return 0 if self.autoscaling is None else self.autoscaling.min_replicas

    @property
    def max_replicas(self) -> int:
        """The ceiling, as min_replicas: neither replicas nor autoscaling wakes to 1."""
        if self.replicas is not None:
            return max(1, self.replicas)
        return 1 if self.autoscaling is None else self.autoscaling.max_replicas

    @property
    def queue_length(self) -> int:
        """Long requests waiting per replica above which the pool adds one (1 by default)."""
        targets = self.autoscaling.targets if self.autoscaling is not None else None
        return 1 if targets is None or targets.queue_length is None else targets.queue_length

    @property
    def effective_concurrency(self) -> int:
        return 1 if self.concurrency is None else self.concurrency

    @property
    def enabled(self) -> bool:
        """A long-context pool given is a pool run (v1alpha1 had `enabled`)."""
        return True


_LLAMACPP = "has(self.engine) && has(self.engine.llamacpp)"
_VLLM = "has(self.engine) && has(self.engine.vllm)"
_OFFLOAD = (f"(({_LLAMACPP} && has(self.engine.llamacpp.acceleratorLayers)) || "
            f"({_VLLM} && has(self.engine.vllm.cpuOffloadGiB)))")
LONG_CONTEXT_SCALES_ON_QUEUE = (
    "longContext.autoscaling scales on targets.queueLength only (the pool's own HPA on "
    "queued long requests; other targets, behavior and scaler are the main pool's): remove "
    "the others")


class GLMServiceSpec(Pool):
    """What to serve, on what, for how many users; the operator plans the rest."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                *POOL_RULES,
                {
                    "rule": f"!({_VLLM}) || self.accelerator.profile != 'cpu'",
                    "message": "engine vllm does not run on the cpu accelerator profile: "
                    "use engine llamacpp with a GGUF ModelVersion",
                    "fieldPath": ".engine.vllm",
                },
                {
                    "rule": "!has(self.longContext) || has(self.longContext.contextLength)",
                    "message": "longContext.contextLength is required: the long-context "
                    "pool's context, larger than contextLength",
                    "fieldPath": ".longContext.contextLength",
                },
                {
                    "rule": "!has(self.longContext) || "
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
                    "rule": "!has(self.longContext) || "
                    "!has(self.longContext.contextLength) || !has(self.contextLength) || "
                    "self.longContext.contextLength > self.contextLength",
                    "message": "longContext.contextLength must be larger than contextLength",
                    "fieldPath": ".longContext.contextLength",
                },
                {
                    "rule": "!has(self.longContext) || !has(self.longContext.autoscaling) || "
                    "(!has(self.longContext.autoscaling.behavior) && "
                    "(!has(self.longContext.autoscaling.scaler) || "
                    "self.longContext.autoscaling.scaler == 'Auto') && "
                    "!has(self.longContext.autoscaling.targets.requestsPerSecond) && "
                    "!has(self.longContext.autoscaling.targets.kvCacheUtilization) && "
                    "!has(self.longContext.autoscaling.targets.acceleratorMemoryUtilization))",
                    "message": LONG_CONTEXT_SCALES_ON_QUEUE,
                    "fieldPath": ".longContext.autoscaling",
                },
                {
                    "rule": f"!({_LLAMACPP}) || !has(self.engine.llamacpp.kvCacheType) || "
                    f"!(self.engine.llamacpp.kvCacheType in "
                    f"{_cel_list(QUANTIZED_KV_CACHE_TYPES)}) || !has(self.engineArgs) || "
                    f"!self.engineArgs.join(' ').matches('{FLASH_ATTENTION_OFF}')",
                    "message": FLASH_ATTENTION_NEEDED,
                    "fieldPath": ".engineArgs",
                },
                {
                    "rule": f"!{_OFFLOAD} || self.accelerator.profile != 'cpu'",
                    "message": "CPU offload (engine.llamacpp.acceleratorLayers, "
                    "engine.vllm.cpuOffloadGiB) needs an accelerator: on the cpu profile the "
                    "whole model is in host memory already",
                    "fieldPath": ".engine",
                },
                {
                    "rule": f"!{_OFFLOAD} || !has(self.accelerator.nodes) || "
                    "self.accelerator.nodes == 1",
                    "message": "CPU offload and a multi-node replica (accelerator.nodes above "
                    "1) do not combine: spread the model over nodes, or offload on one node",
                    "fieldPath": ".engine",
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
    engine: EngineSettings | None = Field(
        default=None,
        description=(
            "The engine as one key, with its own settings: llamacpp (llama-server, GGUF) or "
            "vllm (safetensors). Default: from the ModelVersion format. A mismatch with the "
            "format is reported as ModelReady=False, reason EngineFormatMismatch (the API "
            "server cannot see the ModelVersion)."
        ),
    )
    accelerator: Accelerator = Field(
        description="Accelerator profile and devices per replica of the main pool.")
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
    long_context: Pool | None = Field(
        default=None,
        description="An overflow pool with a larger context, for prompts the main pool "
        "rejects: the gateway sends a request the engine refuses for context size there, "
        "waking the pool from zero (0 -> 1); its own HPA adds replicas up to its maximum on "
        "queued long requests (1 -> N); the operator scales it back to zero after its "
        "idleSeconds without a long request (docs/autoscaling.md). Given: it runs.",
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
            "Extra engine arguments, one argv element each, for whichever engine runs. Flags "
            "the operator plans or owns (model, host, port, context size, GPU layers, slots, "
            "KV cache type, threads, tensor parallel size, max model len, max num seqs, GPU "
            "memory utilization, API keys, load mode, CPU offload) are refused: the engine's "
            "settings are fields under engine."
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
        """The CRD's CEL rules, evaluated here too (api/rules.py): each written once. An
        object the API server admitted is not checked again (it may predate a rule, as a
        GLMService stored before spec.gateway.access existed; the operator reports that as
        a condition instead of refusing to reconcile it)."""
        if not (info.context or {}).get(ADMITTED):
            rules.check(self)
        return self

    # --- the engine's settings, read by the planner and the renderers ----------------------

    @property
    def engine_name(self) -> Engine | None:
        """The engine named in spec.engine; None follows the ModelVersion's format."""
        return None if self.engine is None else self.engine.name

    @property
    def kv_cache_type(self) -> str | None:
        engine = self.engine
        if engine is not None and engine.llamacpp is not None:
            return engine.llamacpp.kv_cache_type
        if engine is not None and engine.vllm is not None:
            return engine.vllm.kv_cache_type
        return None

    @property
    def kv_unified(self) -> bool | None:
        llamacpp = self.engine.llamacpp if self.engine is not None else None
        return None if llamacpp is None else llamacpp.kv_unified

    @property
    def load_mode(self) -> LoadMode | None:
        llamacpp = self.engine.llamacpp if self.engine is not None else None
        return None if llamacpp is None else llamacpp.load_mode

    @property
    def parsers(self) -> Parsers | None:
        vllm = self.engine.vllm if self.engine is not None else None
        return None if vllm is None else vllm.parsers

    @property
    def multi_token_prediction(self) -> bool | None:
        vllm = self.engine.vllm if self.engine is not None else None
        return None if vllm is None else vllm.multi_token_prediction

    @property
    def cpu_offload(self) -> CpuOffload | None:
        engine = self.engine
        if engine is not None and engine.llamacpp is not None and (
                engine.llamacpp.accelerator_layers is not None):
            return CpuOffload(accelerator_layers=engine.llamacpp.accelerator_layers)
        if engine is not None and engine.vllm is not None and (
                engine.vllm.cpu_offload_gib is not None):
            return CpuOffload(host_weights_gib=engine.vllm.cpu_offload_gib)
        return None

    # --- the pools and routing -----------------------------------------------------------

    @property
    def effective_replicas(self) -> int:
        """Replicas when autoscaling is off."""
        return 1 if self.replicas is None else self.replicas

    @property
    def endpoint_picker(self) -> bool:
        """Requests go through the router and the endpoint picker (spec.routing.mode)."""
        return self.routing.mode == RoutingMode.ENDPOINT_PICKER

    @property
    def inference_gateway(self) -> bool:
        """The platform's inference gateway routes, from InferencePools and an HTTPRoute."""
        return self.routing.mode == RoutingMode.INFERENCE_GATEWAY

    @property
    def main_pool_may_sleep(self) -> bool:
        """The main pool scales from zero: autoscaling.minReplicas 0 (EndpointPicker only)."""
        return (self.endpoint_picker and self.autoscaling is not None
                and self.autoscaling.min_replicas == 0)


class GLMService(SpecModel):
    """A GLMService object as stored in the API server."""

    model_config = {"extra": "ignore"}

    api_version: str = Field(default=API_VERSION, pattern=f"^{re.escape(API_VERSION)}$")
    kind: Literal["GLMService"] = "GLMService"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GLMServiceSpec
    status: GLMServiceStatus = Field(default_factory=GLMServiceStatus)
