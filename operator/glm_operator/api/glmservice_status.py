"""GLMService status: conditions, the capacity plan in force, replicas, rollout state.

`PlanSummary` has the shape of `glm_operator.planning.Plan.summary()` (camelCase or
snake_case keys both parse), so the controller stores the planner's own output; the CRD
schema must list every field, or the API server prunes it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from glm_operator.api.base import Int64, NonNegativeInt64, StatusModel
from glm_operator.api.conditions import MAX_CONDITIONS, Condition

HISTORY_LIMIT = 5


class GLMServiceConditionType(StrEnum):
    READY = "Ready"
    MODEL_READY = "ModelReady"
    PLANNED = "Planned"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    CANARY_PROGRESSING = "CanaryProgressing"
    TRAFFIC_SPLIT = "TrafficSplit"
    AUTOSCALING_TARGETS_VALID = "AutoscalingTargetsValid"
    AUTOSCALING = "Autoscaling"  # which autoscaler sizes the main pool, or why none does
    RESOLVED_REFS = "ResolvedRefs"  # the Secrets the pods read exist (False names the missing)
    # Abnormal-true, like Degraded: True (a warning) while the endpoint serves anyone.
    OPEN_ACCESS = "OpenAccess"
    # spec.routing.mode InferenceGateway: the gateway accepted every InferencePool.
    GATEWAY_ACCEPTED = "GatewayAccepted"


class RolloutPhase(StrEnum):
    PROGRESSING = "Progressing"  # waiting for the new version, or walking the canary steps
    PAUSED = "Paused"  # spec.rollout.paused
    PROMOTING = "Promoting"  # the new version grows to full size, then takes all traffic
    SUCCEEDED = "Succeeded"  # the new version is stable
    ROLLED_BACK = "RolledBack"  # analysis failed failureThreshold times
    ABORTED = "Aborted"  # the abort annotation named this version
    FAILED = "Failed"  # progress deadline exceeded


# A rollout in one of these phases is over; it stays in status.rollout until the next one.
FINISHED_PHASES = frozenset({RolloutPhase.SUCCEEDED, RolloutPhase.ROLLED_BACK,
                             RolloutPhase.ABORTED, RolloutPhase.FAILED})


class PlanMemory(StatusModel):
    """Bytes on the most loaded device (GPU/NPU), or in node RAM for CPU plans."""

    weights_bytes: NonNegativeInt64 | None = Field(default=None, description="Model weights.")
    kv_bytes: NonNegativeInt64 | None = Field(default=None, description="KV cache for all slots.")
    compute_bytes: NonNegativeInt64 | None = Field(
        default=None, description="Compute buffers, activations."
    )
    overhead_bytes: NonNegativeInt64 | None = Field(
        default=None, description="Runtime (CUDA, CANN, NCCL)."
    )
    reserved_bytes: NonNegativeInt64 | None = Field(
        default=None, description="Kept free on purpose."
    )
    total_bytes: NonNegativeInt64 | None = Field(
        default=None, description="Weights + KV + compute + overhead."
    )
    available_bytes: NonNegativeInt64 | None = Field(
        default=None, description="Device memory (or node RAM)."
    )
    headroom_bytes: Int64 | None = Field(
        default=None,
        description="Free after everything and the reserve; negative when it does not fit.",
    )


class PlanResources(StatusModel):
    """Pod resources the plan asks for."""

    cpu_request: float | None = Field(default=None, ge=0, description="Cores.")
    memory_request_bytes: NonNegativeInt64 | None = None
    memory_limit_bytes: NonNegativeInt64 | None = None
    devices: int | None = Field(default=None, ge=0, description="Accelerator devices.")
    resource_name: str | None = Field(default=None, description="e.g. nvidia.com/gpu.")
    shared_memory_bytes: NonNegativeInt64 | None = Field(
        default=None, description="/dev/shm for tensor parallel."
    )
    memory_note: str | None = Field(default=None, description="Why these memory numbers.")


class PlanAlternative(StatusModel):
    """A nearby configuration that fits (reported when the request does not)."""

    change: str = Field(description="What differs, e.g. 'KV cache q8_0'.")
    headroom_bytes: Int64 | None = None


class LlamaCppPlan(StatusModel):
    """llama-server settings (see docs/planning.md)."""

    n_gpu_layers: int | None = Field(default=None, ge=0, description="--n-gpu-layers.")
    parallel: int | None = Field(default=None, ge=1, description="--parallel (slots).")
    ctx_size: int | None = Field(default=None, ge=1, description="--ctx-size (all slots).")
    ctx_per_slot: int | None = Field(default=None, ge=1, description="Context each slot gets.")
    kv_unified: bool | None = Field(default=None, description="--kv-unified.")
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: bool | None = None
    threads: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1)
    ubatch_size: int | None = Field(default=None, ge=1)
    mmap: bool | None = None
    cache_ram_mib: int | None = Field(default=None, ge=0)
    fit: bool | None = None
    tensor_split: list[int] | None = Field(default=None, description="Layers per device.")
    rpc_workers: int | None = Field(
        default=None, ge=0, description="ggml-rpc-server pods (nodes - 1) the leader offloads to.")


class VllmPlan(StatusModel):
    """vLLM settings (see docs/planning.md)."""

    max_model_len: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, ge=0, le=1)
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    pipeline_parallel_size: int | None = Field(default=None, ge=1, description="One stage "
                                               "per node.")
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    kv_cache_tokens: NonNegativeInt64 | None = None
    cpu_offload_gb: int | None = Field(
        default=None, ge=0, description="--cpu-offload-gb: GiB of weights per GPU in host RAM.")
    speculative_tokens: int | None = Field(
        default=None, ge=0, description="MTP speculative decoding: draft tokens per step, one "
        "per nextn layer, the recipes' depth for the GLM-5 family on NVIDIA (--speculative-config "
        "method mtp); 0: off.")
    layout: Literal["tp", "dcp", "dep"] | None = Field(
        default=None, description="tp: tensor parallel; dcp: with decode context parallelism; "
        "dep: data-parallel attention with expert parallelism (docs/planning.md, Layouts).")
    data_parallel_size: int | None = Field(
        default=None, ge=1, description="--data-parallel-size; --max-num-seqs is per rank.")
    enable_expert_parallel: bool | None = Field(default=None,
                                                description="--enable-expert-parallel.")
    decode_context_parallel_size: int | None = Field(
        default=None, ge=1, description="--decode-context-parallel-size.")
    kv_offloading_size: int | None = Field(
        default=None, ge=0, description="--kv-offloading-size: GiB of the host KV tier per "
        "engine core (DP rank); 0: none.")
    kv_offload_tokens: NonNegativeInt64 | None = Field(
        default=None, description="Tokens the host KV tier holds, the replica's engine cores "
        "together: prefixes and preempted requests' KV, not decoding room.")


class PlanLayout(StatusModel):
    """One vLLM layout of the replica's devices the planner weighed, side by side."""

    layout: Literal["tp", "dcp", "dep"]
    label: str = Field(description="e.g. TP8, TP8+DCP8, DEP8.")
    feasible: bool
    kv_cache_tokens: NonNegativeInt64 = Field(description="KV capacity of the replica.")
    requests_at_context: int = Field(ge=0, description="Requests of the asked context it "
                                     "holds at once.")
    headroom_bytes: Int64 = Field(description="On the most loaded device.")
    chosen: bool


class PlanNodeShare(StatusModel):
    """One node of a multi-node replica."""

    role: Literal["leader", "worker"]
    devices: int = Field(ge=1)
    layers: int = Field(ge=0, description="Model layers this node's devices hold.")
    weights_bytes: NonNegativeInt64 = Field(description="Weights on this node, all devices.")
    kv_bytes: NonNegativeInt64 = Field(description="KV cache on this node, all devices.")


class PlanSummary(StatusModel):
    """The capacity plan the pods run with (see docs/planning.md)."""

    feasible: bool | None = Field(default=None, description="Whether the request fits.")
    reason: str | None = Field(default=None, description="Why (with the numbers).")
    engine: Literal["llamacpp", "vllm"] | None = None
    accelerator: str | None = Field(default=None, description="Profile name.")
    count: int | None = Field(default=None, ge=1, description="Devices per node (per pod).")
    nodes: int | None = Field(default=None, ge=1, description="Nodes (pods) per replica.")
    per_node: list[PlanNodeShare] | None = Field(
        default=None, max_length=16,
        description="What each node of a multi-node replica holds (the leader first).")
    quantization: str | None = None
    context_length: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)
    model_version: str | None = Field(default=None, description="The ModelVersion planned for.")
    facts_source: Literal["measured", "declared"] | None = Field(
        default=None, description="measured: from the GGUF header; declared: from spec.facts."
    )
    memory: PlanMemory | None = None
    kv_bytes_per_token: NonNegativeInt64 | None = Field(
        default=None, description="Whole model, one token."
    )
    resources: PlanResources | None = None
    alternatives: list[PlanAlternative] | None = Field(default=None, max_length=16)
    layouts: list[PlanLayout] | None = Field(
        default=None, max_length=4, description="vLLM: each layout weighed on these devices "
        "and its capacity; the chosen one fits on the fewest devices, ties to lower latency.")
    llamacpp: LlamaCppPlan | None = None
    vllm: VllmPlan | None = None


class AnalysisResult(StatusModel):
    """One analysis check of the canary's gateway metrics over one interval."""

    time: datetime | None = None
    window_seconds: float | None = Field(default=None, ge=0)
    request_count: float | None = Field(default=None, ge=0)
    error_rate_percent: float | None = Field(
        default=None, description="Failed requests (and overdue ones) of the canary, percent.")
    overdue_requests: float | None = Field(
        default=None, ge=0, description="Canary requests running past their bound at the "
        "check, counted as failing.")
    latency_p99_ms: float | None = Field(
        default=None, description="Estimated from the histogram's buckets.")
    time_to_first_token_p99_ms: float | None = Field(
        default=None, description="Estimated from the histogram's buckets.")
    stable_request_count: float | None = Field(default=None, ge=0)
    stable_error_rate_percent: float | None = None
    stable_latency_p99_ms: float | None = None
    stable_time_to_first_token_p99_ms: float | None = None
    verdict: Literal["Passed", "Failed", "InsufficientTraffic", "Unavailable"] | None = None
    failed_gates: list[str] | None = Field(
        default=None, max_length=8, description="The gates that failed, with measured values."
    )
    message: str | None = None


class RolloutStatus(StatusModel):
    """The rollout from status.stableModelVersion to spec.modelVersion (the last one, once
    finished). Everything the operator needs to resume it after a restart is here."""

    strategy: Literal["surge", "canary"] = "surge"
    model_version: str = Field(description="The version being rolled out.")
    from_model_version: str | None = Field(default=None, description="The stable version.")
    phase: RolloutPhase = RolloutPhase.PROGRESSING
    step: int = Field(default=0, ge=0, description="1-based index into rollout.steps; 0 before "
                      "the first step.")
    weight: int = Field(default=0, ge=0, le=100, description="Traffic percent to the new "
                        "version now.")
    failed_checks: int = Field(default=0, ge=0)
    started_time: datetime | None = None
    step_started_time: datetime | None = Field(
        default=None, description="Start of the current step's analysis window."
    )
    progress_time: datetime | None = Field(
        default=None, description="Last time the rollout moved (the deadline counts from it)."
    )
    last_analysis: AnalysisResult | None = None
    undecided_since: datetime | None = Field(
        default=None, description="Since when the step's checks could not judge the canary "
        "(too little traffic); unset after a judged check.")
    message: str | None = None


class RolloutRecord(StatusModel):
    """A finished rollout."""

    model_version: str
    from_model_version: str | None = None
    strategy: Literal["surge", "canary"] = "surge"
    result: str = Field(description="Succeeded, RolledBack, Aborted, Failed or Superseded.")
    started_time: datetime | None = None
    finished_time: datetime | None = None
    message: str | None = None


class PoolStatus(StatusModel):
    """One pool of engine pods that may sleep: the long-context pool, or the main pool of a
    service that scales from zero (status.mainPool)."""

    replicas: int = Field(default=0, ge=0)
    ready_replicas: int = Field(default=0, ge=0)
    endpoint: str | None = None
    model_version: str | None = Field(
        default=None, description="status.mainPool: the ModelVersion whose main pool the idle "
        "times describe (another version starts its own).")
    last_activity_time: datetime | None = Field(
        default=None, description="The last request the pool served (its activity Lease), or "
        "when the operator saw the pool wake, whichever is later; as of its last check.")
    scale_to_zero_time: datetime | None = Field(
        default=None, description="When the operator scales the awake pool to zero unless a "
        "request comes first (it checks the activity Lease again then); absent while the "
        "pool sleeps or when minReplicas keeps it up.")


class GLMServiceStatus(StatusModel):
    """What is serving now."""

    observed_generation: int | None = Field(
        default=None, ge=0, json_schema_extra={"format": "int64"}
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Ready, ModelReady, Planned, Progressing, Degraded, CanaryProgressing, "
        "TrafficSplit, Autoscaling, AutoscalingTargetsValid.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    stable_model_version: str | None = Field(
        default=None, description="The ModelVersion serving now (the rollout's starting point)."
    )
    replicas: int = Field(default=0, ge=0, description="Main pool pods of the serving "
                          "(stable) version (scale subresource).")
    ready_replicas: int = Field(default=0, ge=0, description="Ready main pool pods of the "
                                "serving (stable) version.")
    selector: str | None = Field(
        default=None, description="Label selector of the main pool pods (scale subresource)."
    )
    endpoint: str | None = Field(default=None, description="In-cluster OpenAI base URL.")
    stable_spec: dict[str, Any] | None = Field(
        default=None,
        description="The spec the stable version was rolled out with: a rollout renders the "
        "stable pods from it, so changing spec.modelVersion together with other fields never "
        "restarts them.",
        json_schema_extra={"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    )
    plan: PlanSummary | None = None
    rollout: RolloutStatus | None = None
    canary_weight: int | None = Field(
        default=None, ge=0, le=100, description="Percent of traffic to the canary while a "
        "canary runs; unset otherwise (kubectl's Canary weight column).")
    canary_ready_replicas: int | None = Field(
        default=None, ge=0, description="Ready pods of the canary's main pool while a canary "
        "runs (readyReplicas counts the stable version's).")
    rollout_history: list[RolloutRecord] | None = Field(
        default=None, max_length=HISTORY_LIMIT, description="The last finished rollouts, "
        "newest first."
    )
    long_context: PoolStatus | None = None
    main_pool: PoolStatus | None = Field(
        default=None, description="With autoscaling.minReplicas 0 (scale from zero): the "
        "serving version's main pool and when it goes back to zero.")
