"""plan(): model facts + what the user asked for -> engine settings and a memory verdict.

Pure: no I/O, no Kubernetes. The memory model it applies lives in memory.py and is
documented with worked examples in docs/planning.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from typing import Any

from glm_operator.planning import engine_support
from glm_operator.planning import memory as mem
from glm_operator.planning.accelerators import (
    LLAMACPP_CUDA_SM,
    PROFILES,
    AcceleratorProfile,
    Engine,
    get_profile,
)
from glm_operator.planning.facts import ArchitectureFacts
from glm_operator.planning.memory import GiB, MiB

# Memory that must stay free on every device for a llama.cpp plan (fragmentation, driver
# growth, a monitoring agent): 5 % of the device. vLLM's margin is 1 - gpu_memory_utilization.
LLAMACPP_RESERVE_FRACTION = Fraction(5, 100)
VLLM_GPU_MEMORY_UTILIZATION = 0.90
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_BLOCK_SIZE = 16
LLAMACPP_N_BATCH = 2048
LLAMACPP_N_UBATCH = 512
LLAMACPP_CTX_PAD = 256  # llama.cpp rounds the per-sequence context up to 256
LLAMACPP_GPU_THREADS = 4  # with every layer on the GPU the CPU only feeds it
# Host RAM for llama-server's prompt cache (--cache-ram). Its default (8192 MiB) is never
# left implicit: on a GPU node host RAM is cheap, on a CPU node RAM is the KV's home.
LLAMACPP_PROMPT_CACHE_MIB_GPU = 2048
LLAMACPP_PROMPT_CACHE_MIB_CPU = 0
HOST_PROCESS_BYTES = 512 * MiB  # engine process, tokenizer, HTTP threads

# ModelSlim's quantizations (quant_model_description.json), served by vllm-ascend's own
# `--quantization ascend` (render/ascend.py); w8a8c8 also stores the KV cache in int8.
MODELSLIM_QUANTIZATIONS = frozenset({"w8a8", "w8a8c8", "w4a8"})
MODELSLIM_INT8_KV = frozenset({"w8a8c8"})

# vLLM layouts of one replica's devices (docs/planning.md, "Layouts"):
#   tp   tensor parallel over the node's devices (and pipeline stages across nodes);
#   dcp  tensor parallel with decode context parallelism: the MLA latent and indexer caches
#        sharded over the TP ranks instead of copied onto each (--decode-context-parallel-size);
#   dep  data-parallel attention with expert parallelism: one DP rank per device, attention
#        and shared weights on each, routed experts split over all (--data-parallel-size,
#        --enable-expert-parallel), each rank caching its own sequences only.
# Listed lowest decode latency first: among the layouts that fit on the asked devices the
# planner takes the first (the tie rule), so DEP is chosen only where TP and DCP do not fit.
LAYOUTS: tuple[str, ...] = ("tp", "dcp", "dep")
# DEP's all-to-all dispatch and combine buffers (per rank, beside NCCL's).
VLLM_EP_ALL2ALL_BYTES = 1 * GiB
# vLLM's native CPU KV offload (--kv-offloading-size GiB, --kv-offloading-backend native: the
# OffloadingConnector) is a second tier behind the device's KV cache, not more of it: a
# sequence decodes only with its KV on the device. The tier keeps the KV blocks computed on
# the device (stored as they fill) for prefix-cache hits the device has evicted and for
# preempted sequences, which resume by a copy from host memory instead of a recomputed
# prefill (docs/planning.md, "Host-memory KV tier"). On CUDA it is one shared mmap of
# /dev/shm per engine core (each DP rank), so it counts in the pod's memory request and in
# its /dev/shm. The catalog has no host-memory fact of a node: the tier of a pod is bounded by
# the memory of its devices (KV_OFFLOAD_HOST_SHARE of it), a conservative bound for GPU
# servers (8 x H200 HGX nodes carry 2 TiB of host memory for 1.1 TiB of HBM); the scheduler
# enforces the node's real memory through the request.
KV_OFFLOAD_BACKEND = "native"
KV_OFFLOAD_HOST_SHARE = Fraction(1)


@dataclass(frozen=True)
class PlanRequest:
    facts: ArchitectureFacts
    quantization: str
    engine: Engine
    accelerator: str
    count: int = 1  # devices per node (tensor parallel for vLLM, layer split for llama.cpp)
    # Nodes per replica: above 1 a replica is a group of pods, one per node (pipeline
    # parallel across nodes for vLLM, a layer split over RPC backends for llama.cpp).
    nodes: int = 1
    context_length: int = 8192  # tokens one request may use
    concurrency: int = 1  # requests served at once at full context
    kv_cache_type: str | None = None  # None: f16 (llama.cpp) / auto (vLLM)
    kv_unified: bool = False  # llama.cpp: one KV buffer all slots share
    long_context: bool = False  # the overflow pool: one request at a time by default
    mmap: bool = True  # llama.cpp load mode
    allow_partial_offload: bool = False  # llama.cpp: keep the layers that do not fit in host RAM
    # llama.cpp: exactly this many layers (-ngl, output layer included) on the accelerators,
    # the rest in host RAM (spec.cpuOffload.acceleratorLayers). None: all, or as many as fit.
    gpu_layers: int | None = None
    cpu_offload_gib: int = 0  # vLLM: GiB of weights per GPU in pinned host RAM (--cpu-offload-gb)
    # vLLM: GiB of host memory for the CPU KV tier of each engine core (--kv-offloading-size,
    # the TP ranks of one DP rank together); 0: none.
    kv_offload_gib: int = 0
    node_memory_bytes: int | None = None  # CPU profile: RAM a replica may use (overrides)
    cpu_cores: int | None = None  # CPU profile: cores a replica may use (overrides)
    # vLLM: speculative decoding with the model's nextn (MTP) layers. None: where it has them.
    multi_token_prediction: bool | None = None
    # vLLM: the layout of the devices (LAYOUTS); None: the planner chooses (the fewest
    # devices that fit, ties to the lower-latency layout). A forced one is planned as asked.
    layout: str | None = None
    # vLLM DEP: tensor parallel size inside each data-parallel rank (count / this = the DP
    # ranks); 1: one rank per device.
    rank_tensor_parallel: int = 1

    def __post_init__(self) -> None:
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.rank_tensor_parallel < 1 or self.count % self.rank_tensor_parallel:
            raise ValueError(f"rank_tensor_parallel ({self.rank_tensor_parallel}) must divide "
                             f"count ({self.count})")
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")
        if self.context_length < 256:
            raise ValueError(f"context_length must be >= 256, got {self.context_length}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.engine not in ("llamacpp", "vllm"):
            raise ValueError(f"engine must be llamacpp or vllm, got {self.engine!r}")
        if self.gpu_layers is not None and self.gpu_layers < 1:
            raise ValueError(f"gpu_layers must be >= 1, got {self.gpu_layers}")
        if self.cpu_offload_gib < 0:
            raise ValueError(f"cpu_offload_gib must be >= 0, got {self.cpu_offload_gib}")
        if self.kv_offload_gib < 0:
            raise ValueError(f"kv_offload_gib must be >= 0, got {self.kv_offload_gib}")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the most loaded device (GPU/NPU), or in node RAM for CPU plans."""

    weights: int
    kv: int
    compute: int  # compute buffers / activations / CUDA graphs
    overhead: int  # runtime: CUDA context, CANN, NCCL; engine process on CPU
    reserved: int  # must stay free (5 % for llama.cpp, 1 - utilization for vLLM)
    available: int  # device memory (or node RAM)
    weights_measured: bool = False

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.overhead

    @property
    def headroom(self) -> int:
        """Free after everything and the reserve; negative when it does not fit."""
        return self.available - self.reserved - self.total


@dataclass(frozen=True)
class LlamaCppSettings:
    n_gpu_layers: int
    parallel: int
    ctx_size: int  # total (--ctx-size)
    ctx_per_slot: int
    kv_unified: bool
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    threads: int
    batch_size: int
    ubatch_size: int
    mmap: bool
    cache_ram_mib: int
    fit: bool = False  # the pinned llama-server's --fit would override the plan: keep it off
    tensor_split: tuple[int, ...] = ()  # layers per device when count x nodes > 1
    rpc_workers: int = 0  # nodes - 1: ggml-rpc-server pods the leader's llama-server offloads to


@dataclass(frozen=True)
class VllmSettings:
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float
    tensor_parallel_size: int
    kv_cache_dtype: str
    dtype: str  # auto, or float16 where bf16 is missing (V100)
    max_num_batched_tokens: int
    kv_cache_tokens: int  # what the KV budget holds at this utilization (all GPUs together)
    pipeline_parallel_size: int = 1  # one stage per node
    # MTP: draft tokens per step, one per nextn layer (--speculative-config method mtp); 0 off
    speculative_tokens: int = 0
    cpu_offload_gb: int = 0  # --cpu-offload-gb: GiB of weights per GPU kept in host RAM
    layout: str = "tp"  # LAYOUTS
    data_parallel_size: int = 1  # --data-parallel-size (dep: one rank per device)
    enable_expert_parallel: bool = False  # --enable-expert-parallel
    decode_context_parallel_size: int = 1  # --decode-context-parallel-size (dcp)
    # max_num_seqs is per DP rank; the replica serves max_num_seqs x data_parallel_size
    # --kv-offloading-size: GiB of the host KV tier per engine core (DP rank); 0 off
    kv_offloading_size: int = 0
    kv_offload_tokens: int = 0  # what the host tier holds, the replica's engine cores together


@dataclass(frozen=True)
class Resources:
    cpu_request: float  # cores
    memory_request_bytes: int
    memory_limit_bytes: int
    devices: int  # accelerator devices requested
    resource_name: str | None
    shared_memory_bytes: int  # /dev/shm (emptyDir, Medium=Memory) for TP communication
    memory_note: str


@dataclass(frozen=True)
class NodeShare:
    """What one node of a multi-node replica holds (node 0 is the leader)."""

    role: str  # "leader" (engine server + gateway) or "worker" (ggml-rpc-server / vLLM worker)
    devices: int
    layers: int  # llama.cpp: layers incl. the output layer; vLLM: the pipeline stage's layers
    weights_bytes: int
    kv_bytes: int


@dataclass(frozen=True)
class LayoutCapacity:
    """One vLLM layout of the asked devices, planned: what its KV cache holds."""

    layout: str  # LAYOUTS
    label: str  # TP8, TP8+DCP8, DEP8
    feasible: bool
    kv_cache_tokens: int  # the replica's KV capacity at this layout
    requests_at_context: int  # requests of the asked context it holds at once
    headroom_bytes: int  # on the most loaded device
    chosen: bool
    reason: str  # the plan's reason at this layout

    def to_dict(self) -> dict[str, Any]:
        return {"layout": self.layout, "label": self.label, "feasible": self.feasible,
                "kvCacheTokens": self.kv_cache_tokens,
                "requestsAtContext": self.requests_at_context,
                "headroomBytes": self.headroom_bytes, "chosen": self.chosen}


@dataclass(frozen=True)
class Alternative:
    change: str  # what differs, e.g. "KV cache q8_0"
    settings: Mapping[str, Any]  # the PlanRequest fields that change
    headroom_bytes: int
    plan: Plan = field(repr=False, compare=False)

    def describe(self) -> str:
        return f"{self.change} fits with {gib(self.headroom_bytes)} GiB headroom"


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    profile: AcceleratorProfile
    feasible: bool
    reason: str
    memory: MemoryBreakdown
    kv_bytes_per_token: int  # whole model, one token, chosen KV types
    weights_basis: str
    # The whole model's weights, every device's share together: what a replica reads from
    # the cache while it loads (render sizes the startup probe from it when no size is known).
    model_weights_bytes: int
    resources: Resources
    llamacpp: LlamaCppSettings | None = None
    vllm: VllmSettings | None = None
    alternatives: tuple[Alternative, ...] = ()
    warnings: tuple[str, ...] = ()
    per_node: tuple[NodeShare, ...] = ()  # one entry per node when nodes > 1
    # vLLM: every layout the planner weighed on these devices, the chosen one marked
    layouts: tuple[LayoutCapacity, ...] = ()

    def summary(self) -> dict[str, Any]:
        """JSON-friendly form for GLMService status and `glm-operator plan --json`."""
        out: dict[str, Any] = {
            "feasible": self.feasible,
            "reason": self.reason,
            "engine": self.request.engine,
            "accelerator": self.profile.name,
            "count": self.request.count,
            "nodes": self.request.nodes,
            "quantization": self.request.quantization,
            "contextLength": self.request.context_length,
            "concurrency": self.request.concurrency,
            "memory": {
                "weightsBytes": self.memory.weights,
                "kvBytes": self.memory.kv,
                "computeBytes": self.memory.compute,
                "overheadBytes": self.memory.overhead,
                "reservedBytes": self.memory.reserved,
                "totalBytes": self.memory.total,
                "availableBytes": self.memory.available,
                "headroomBytes": self.memory.headroom,
            },
            "kvBytesPerToken": self.kv_bytes_per_token,
            "resources": asdict(self.resources),
            "alternatives": [
                {"change": a.change, "headroomBytes": a.headroom_bytes, **dict(a.settings)}
                for a in self.alternatives
            ],
        }
        if self.per_node:
            out["perNode"] = [
                {"role": n.role, "devices": n.devices, "layers": n.layers,
                 "weightsBytes": n.weights_bytes, "kvBytes": n.kv_bytes}
                for n in self.per_node
            ]
        if self.layouts:
            out["layouts"] = [lc.to_dict() for lc in self.layouts]
        if self.llamacpp:
            out["llamacpp"] = asdict(self.llamacpp)
        if self.vllm:
            out["vllm"] = asdict(self.vllm)
        return out


def gib(value: int) -> str:
    return f"{value / GiB:.1f}"


class PlanInputError(ValueError):
    """The request cannot be planned at all (as opposed to: planned, does not fit)."""


def plan(
    request: PlanRequest,
    profiles: Mapping[str, AcceleratorProfile] | None = None,
    *,
    with_alternatives: bool = True,
) -> Plan:
    """Plan one replica. Never raises for "does not fit": that is `feasible=False`."""
    catalog = PROFILES if profiles is None else profiles
    profile = get_profile(request.accelerator, catalog)
    result = _plan_one(request, profile)
    if not result.feasible and with_alternatives:
        result = replace(result, alternatives=tuple(_alternatives(request, catalog)))
    return result


def _unfit_reason(p: Plan) -> str:
    what = "node RAM" if p.profile.is_cpu else "per device"
    return (
        f"needs {gib(p.memory.total + p.memory.reserved)} GiB {what} "
        f"(weights {gib(p.memory.weights)}, KV {gib(p.memory.kv)}, "
        f"buffers {gib(p.memory.compute + p.memory.overhead)}, reserve {gib(p.memory.reserved)}); "
        f"{p.profile.name} has {gib(p.memory.available)} GiB: "
        f"short by {gib(-p.memory.headroom)} GiB"
    )


def _plan_one(request: PlanRequest, profile: AcceleratorProfile) -> Plan:
    problem = _compatibility_problem(request, profile)
    if request.engine == "vllm":
        result = _plan_vllm_layouts(request, profile)
    else:
        result = _plan_llamacpp(request, profile)
    if problem:
        return replace(result, feasible=False, reason=problem)
    return result


def vllm_layouts(request: PlanRequest, profile: AcceleratorProfile) -> tuple[str, ...]:
    """The layouts the planner weighs for a vLLM request, in LAYOUTS order."""
    return tuple(layout for layout in LAYOUTS if _layout_problem(request, profile, layout) is None)


def _layout_problem(request: PlanRequest, profile: AcceleratorProfile, layout: str) -> str | None:
    """Why `layout` does not apply to this request, or None."""
    facts = request.facts
    if layout == "tp":
        return None
    name = "DEP (data-parallel attention with expert parallelism)" if layout == "dep" else (
        "DCP (decode context parallelism)")
    if request.count < 2:
        return f"{name} needs several devices of one node: count is {request.count}"
    if profile.vendor != "nvidia":
        return (f"{name} is planned for vLLM on NVIDIA only: vllm-ascend's (v0.23) is not "
                f"checked yet; {profile.name} runs tensor parallelism")
    if layout == "dep":
        if not facts.is_moe:
            return (f"{facts.architecture} is a dense model: its data parallelism is replicas "
                    "(raise spec.replicas); DEP splits a MoE model's experts")
        if request.nodes > 1:
            return "DEP across nodes is not rendered yet: one node (nodes 1)"
        if request.count // request.rank_tensor_parallel < 2:
            return (f"DEP needs at least two data-parallel ranks: {request.count} devices of "
                    f"{request.rank_tensor_parallel} per rank make one")
        return None
    if not facts.is_mla:
        return (f"{name} shards an MLA latent cache that every TP rank would copy; "
                f"{facts.architecture}'s KV heads are split by tensor parallelism already")
    return None


def layout_label(settings: VllmSettings) -> str:
    if settings.layout == "dep":
        tp = f"xTP{settings.tensor_parallel_size}" if settings.tensor_parallel_size > 1 else ""
        return f"DEP{settings.data_parallel_size}{tp}"
    label = f"TP{settings.tensor_parallel_size}"
    if settings.pipeline_parallel_size > 1:
        label += f"xPP{settings.pipeline_parallel_size}"
    if settings.layout == "dcp":
        label += f"+DCP{settings.decode_context_parallel_size}"
    return label


def _capacity(p: Plan, chosen: bool) -> LayoutCapacity:
    settings = p.vllm
    assert settings is not None
    context = mem.round_up(p.request.context_length, VLLM_BLOCK_SIZE)
    ranks = settings.data_parallel_size
    requests = ranks * ((settings.kv_cache_tokens // ranks) // context)
    return LayoutCapacity(
        layout=settings.layout, label=layout_label(settings), feasible=p.feasible,
        kv_cache_tokens=settings.kv_cache_tokens, requests_at_context=requests,
        headroom_bytes=p.memory.headroom, chosen=chosen, reason=p.reason)


def _plan_vllm_layouts(request: PlanRequest, profile: AcceleratorProfile) -> Plan:
    """Plan every layout that applies; keep the forced one, else the first that fits in
    LAYOUTS order (lowest latency), else the nearest to fitting (the most headroom)."""
    layouts = vllm_layouts(request, profile)
    plans = {layout: _plan_vllm(request, profile, layout) for layout in layouts}
    if request.layout is not None:
        problem = _layout_problem(request, profile, request.layout)
        if problem is not None:
            chosen = replace(plans["tp"], feasible=False, reason=f"layout {request.layout}: "
                             f"{problem}")
            return chosen
        chosen_layout = request.layout
    else:
        # With a host KV tier, a layout whose devices hold every request at once comes before
        # one that leans on the tier (preempting).
        fitting = sorted((layout for layout in layouts if plans[layout].feasible),
                         key=lambda layout: _oversubscribed(plans[layout]))
        chosen_layout = fitting[0] if fitting else max(
            layouts, key=lambda layout: plans[layout].memory.headroom)
    capacities = tuple(_capacity(plans[layout], layout == chosen_layout) for layout in layouts)
    chosen = plans[chosen_layout]
    if len(layouts) > 1:
        chosen = replace(chosen, reason=f"{layout_label(chosen.vllm)}: {chosen.reason}"
                         if chosen.vllm else chosen.reason)
    return replace(chosen, layouts=capacities if len(layouts) > 1 else ())


def _oversubscribed(p: Plan) -> bool:
    """The devices hold fewer than the asked requests at full context (the host KV tier
    keeps the others' KV while they wait)."""
    settings = p.vllm
    if settings is None:
        return False
    context = mem.round_up(p.request.context_length, VLLM_BLOCK_SIZE)
    ranks = settings.data_parallel_size
    return (settings.kv_cache_tokens // ranks) // context < settings.max_num_seqs


def _compatibility_problem(request: PlanRequest, profile: AcceleratorProfile) -> str | None:
    facts = request.facts
    q = mem.quantization(request.quantization)
    if request.engine not in profile.engines:
        runs = ", ".join(profile.engines)
        return f"{profile.name} does not run {request.engine} (it runs {runs})"
    if cannot_load := engine_support.unsupported(request.engine, facts.architecture):
        return cannot_load
    if (request.engine == "llamacpp" and profile.vendor == "nvidia" and profile.cuda_sm
            and profile.cuda_sm < min(LLAMACPP_CUDA_SM)):
        built = ", ".join(f"sm_{sm}" for sm in LLAMACPP_CUDA_SM)
        return (f"{profile.name} is sm_{profile.cuda_sm}: our llama.cpp CUDA image has kernels "
                f"for {built} (CUDA 13), none for it; serve it with vLLM or a llama.cpp image "
                "built for it (an operator-config profile)")
    if request.engine == "llamacpp" and q.format != "gguf":
        return f"llama.cpp serves GGUF quantizations; {q.name} is a Hugging Face format"
    if request.engine == "vllm" and q.format != "hf":
        return f"vLLM serves safetensors quantizations; {q.name} is a GGUF type"
    if request.count > profile.max_devices_per_node:
        return (
            f"{request.count} x {profile.name} per replica exceeds the "
            f"{profile.max_devices_per_node} devices of one node: count is devices per node "
            "(accelerator.nodes spans nodes)"
        )
    if profile.is_cpu and request.count != 1:
        return "a CPU replica has count 1"
    if profile.is_cpu and request.nodes != 1:
        return "a CPU replica runs on one node (nodes 1): multi-node needs accelerators"
    offloads = (request.allow_partial_offload or request.gpu_layers is not None
                or request.cpu_offload_gib > 0)
    if request.nodes > 1 and offloads:
        return "partial CPU offload and a multi-node replica do not combine"
    if profile.is_cpu and (request.gpu_layers is not None or request.cpu_offload_gib > 0):
        return "cpuOffload needs an accelerator: on the cpu profile the model is in host RAM"
    if request.engine == "llamacpp" and request.cpu_offload_gib > 0:
        return ("cpuOffload.hostWeightsGiB is vLLM's (--cpu-offload-gb): with llama.cpp give "
                "cpuOffload.acceleratorLayers")
    if request.engine == "vllm" and request.gpu_layers is not None:
        return ("cpuOffload.acceleratorLayers is llama.cpp's (--n-gpu-layers): with vLLM give "
                "cpuOffload.hostWeightsGiB")
    if request.engine == "vllm" and request.cpu_offload_gib > 0 and profile.vendor != "nvidia":
        return (f"vLLM's CPU weight offload (--cpu-offload-gb, UVA) is built for CUDA; "
                f"{profile.name} is a {profile.vendor} profile: remove cpuOffload")
    if request.kv_offload_gib and request.engine != "vllm":
        return ("kvOffloadGiB is vLLM's host KV tier (--kv-offloading-size): llama.cpp has "
                "--cache-ram")
    if request.kv_offload_gib and profile.vendor != "nvidia":
        return (f"vLLM's host KV tier (--kv-offloading-size) is planned on NVIDIA only (its "
                f"shared-memory region is CUDA's; vllm-ascend 0.23 is not checked): {profile.name} "
                f"is a {profile.vendor} profile: remove kvOffloadGiB")
    if request.kv_offload_gib and request.nodes > 1:
        return ("vLLM's host KV tier (kvOffloadGiB) is planned on one node (nodes 1): across "
                "nodes vLLM splits it over Ray workers the plan does not count yet")
    if request.engine == "vllm" and request.nodes > facts.block_count:
        return (f"{request.nodes} pipeline stages (nodes) exceed the model's "
                f"{facts.block_count} layers")
    if request.multi_token_prediction and request.engine != "vllm":
        return ("multiTokenPrediction is rendered for vLLM: the pinned llama-server's draft-mtp "
                "runs a draft context the plan does not count yet")
    if request.multi_token_prediction and _pp_mtp_refused(request, profile):
        return (f"multiTokenPrediction with {request.nodes} nodes on {profile.name}: "
                "vllm-ascend refuses MTP with pipeline parallelism (it spans the nodes) "
                "outside a PD-disaggregated prefill node; remove multiTokenPrediction or "
                "use one node")
    if request.multi_token_prediction and not _mtp_tokens(request, profile):
        return (f"multiTokenPrediction needs nextn (MTP) layers vLLM can draft with: "
                f"{facts.architecture} with nextnPredictLayers {facts.nextn_predict_layers} "
                "has none; remove multiTokenPrediction")
    if request.context_length > facts.context_length:
        return (
            f"context {request.context_length} exceeds the model's trained context "
            f"{facts.context_length}"
        )
    if q.name in ("fp8",) and not (profile.vendor == "nvidia" and (profile.fp8 or profile.bf16)):
        return f"{profile.name} cannot run fp8 weights"
    if q.name in MODELSLIM_QUANTIZATIONS and profile.vendor != "huawei":
        # ModelSlim's format (quant_model_description.json), served by vllm-ascend's own
        # `--quantization ascend` (render/ascend.py): no CUDA kernel reads it.
        return (f"{profile.name} cannot run {q.name} (ModelSlim) weights: vllm-ascend serves them, "
                "on Ascend NPUs; a compressed-tensors W8A8 checkpoint is quantization int8")
    if request.engine == "vllm":
        if facts.head_count % request.count:
            return (
                f"tensor parallel size {request.count} must divide the {facts.head_count} "
                "attention heads"
            )
        kv_heads, tp = facts.head_count_kv, request.count
        if kv_heads % tp and tp % kv_heads:
            return (
                f"tensor parallel size {tp} must divide the {kv_heads} KV heads "
                "(or be a multiple of them)"
            )
        if (request.kv_cache_type or "auto").startswith("fp8") and not profile.fp8:
            return f"{profile.name} has no fp8 KV cache"
    if request.engine == "llamacpp":
        kv_type = request.kv_cache_type or "f16"
        if kv_type not in mem.LLAMACPP_KV_TYPES:
            return (f"kvCacheType {kv_type} is not a llama.cpp KV cache type: llama.cpp takes "
                    f"{', '.join(mem.LLAMACPP_KV_TYPES)}")
        if kv_type == "bf16" and not profile.bf16:
            return f"{profile.name} has no bf16: use f16 or q8_0 for the KV cache"
        if kv_type not in _UNQUANTIZED_KV and not profile.flash_attention:
            return (f"{profile.name} has no flash attention, which llama.cpp needs for a "
                    f"quantized V cache: kvCacheType {kv_type} is refused (use f16)")
    elif (request.kv_cache_type or "auto") not in mem.VLLM_KV_TYPES:
        return (f"kvCacheType {request.kv_cache_type} is not a vLLM KV cache dtype: vLLM takes "
                f"{', '.join(mem.VLLM_KV_TYPES)}")
    return None


# ---------------------------------------------------------------- llama.cpp

_UNQUANTIZED_KV = ("f16", "f32", "bf16")


def _plan_llamacpp(request: PlanRequest, profile: AcceleratorProfile) -> Plan:
    facts = request.facts
    kv_type = request.kv_cache_type or "f16"
    if kv_type not in mem.LLAMACPP_KV_TYPES:
        kv_type = "f16"  # reported as incompatible by _compatibility_problem
    # A quantized V cache needs flash attention; without it only K is quantized.
    type_k = kv_type
    type_v = kv_type if (profile.flash_attention or kv_type in ("f16", "f32", "bf16")) else "f16"
    slots = 1 if request.long_context and request.concurrency == 1 else request.concurrency
    per_slot = mem.round_up(request.context_length, LLAMACPP_CTX_PAD)
    ctx_total = per_slot * slots
    n_kv_attended = ctx_total if request.kv_unified else per_slot
    # The pinned llama.cpp neither loads the nextn (MTP) layers nor caches KV for them;
    # recurrent (KDA) layers hold a fixed state per slot instead of KV.
    kv_per_token = mem.kv_bytes_per_token(facts, type_k, type_v, nextn=False)
    kv_total = kv_per_token * ctx_total + mem.recurrent_state_bytes(facts, slots)
    weights = mem.weights_bytes(facts, request.quantization, nextn=False)
    compute = mem.llamacpp_compute_bytes(
        facts,
        n_tokens=min(ctx_total, LLAMACPP_N_UBATCH),
        n_kv=n_kv_attended,
        n_outputs=slots,  # llama-server's n_outputs_max: one sampled row per slot
        flash_attention=profile.flash_attention,
    )
    warnings: list[str] = []
    if type_v != type_k:
        warnings.append(f"{profile.name} has no flash attention: V cache stays f16")
    # Layers as llama.cpp counts them for -ngl: trunk + nextn, and the output layer as one more.
    n_layers = facts.block_count + facts.nextn_predict_layers
    units = n_layers + 1
    cores = request.cpu_cores or profile.cpu_cores

    if profile.is_cpu:
        available = request.node_memory_bytes or profile.memory_bytes
        breakdown = mem_breakdown(
            weights=weights.bytes,
            kv=kv_total,
            compute=compute,
            overhead=profile.runtime_overhead_bytes + LLAMACPP_PROMPT_CACHE_MIB_CPU * MiB,
            reserved=int(available * LLAMACPP_RESERVE_FRACTION),
            available=available,
            measured=weights.measured,
        )
        n_gpu_layers = 0
        tensor_split: tuple[int, ...] = ()
        threads = cores
        host_request = breakdown.total
        note = (
            "weights counted in request and limit: with mmap they are page cache charged to the "
            "pod (a lower limit thrashes re-reading the file), loaded they are anonymous memory "
            "(a lower limit is an OOM kill)"
            if request.mmap
            else "weights loaded into anonymous memory (--no-mmap): counted in request and limit"
        )
        cache_ram = LLAMACPP_PROMPT_CACHE_MIB_CPU
    else:
        available = profile.memory_bytes
        count = request.count * request.nodes  # RPC backends are devices to llama-server
        tensor_split = _split(units, count)
        if count > 1:
            layer_bytes = _layer_bytes(facts, request.quantization, weights.bytes, n_layers)
            device_weights, device_kv = max(
                _device_holdings(tensor_split, layer_bytes, kv_total, n_layers),
                key=lambda held: held[0] + held[1])
        else:
            device_weights, device_kv = weights.bytes, kv_total
        breakdown = mem_breakdown(
            weights=device_weights,
            kv=device_kv,
            compute=compute,
            overhead=profile.runtime_overhead_bytes,
            reserved=int(available * LLAMACPP_RESERVE_FRACTION),
            available=available,
            measured=weights.measured,
        )
        n_gpu_layers = units  # every layer and the output layer
        host_weights = 0
        if request.gpu_layers is not None and request.gpu_layers < units:
            n_gpu_layers = request.gpu_layers
            breakdown, host_weights = _offload_at(
                breakdown, weights.bytes, kv_total, n_layers, count, n_gpu_layers)
        elif breakdown.headroom < 0 and request.allow_partial_offload:
            n_gpu_layers, breakdown, host_weights = _partial_offload(
                breakdown, weights.bytes, kv_total, n_layers, count
            )
        if n_gpu_layers < units:
            warnings.append(
                f"{units - n_gpu_layers} of {units} layers run on the CPU: "
                "expect a large slowdown"
            )
        threads = cores if n_gpu_layers < units else min(LLAMACPP_GPU_THREADS, cores)
        cache_ram = LLAMACPP_PROMPT_CACHE_MIB_GPU
        host_request = HOST_PROCESS_BYTES + cache_ram * MiB + host_weights + compute // 4
        note = (
            "offloaded weights pass through page cache only while loading (clean, reclaimable): "
            "not counted; host RAM = engine process + prompt cache"
            + (" + CPU-resident layers" if host_weights else "")
        )
    limit = host_request + max(GiB, host_request // 10)
    resources = Resources(
        cpu_request=float(cores if profile.is_cpu else threads),
        memory_request_bytes=mem.round_up(host_request, MiB),
        memory_limit_bytes=mem.round_up(limit, MiB),
        devices=0 if profile.is_cpu else request.count,
        resource_name=profile.resource_name,
        shared_memory_bytes=0,
        memory_note=note,
    )
    settings = LlamaCppSettings(
        n_gpu_layers=n_gpu_layers,
        parallel=slots,
        ctx_size=ctx_total,
        ctx_per_slot=per_slot,
        kv_unified=request.kv_unified,
        cache_type_k=type_k,
        cache_type_v=type_v,
        flash_attn=profile.flash_attention,
        threads=threads,
        batch_size=LLAMACPP_N_BATCH,
        ubatch_size=LLAMACPP_N_UBATCH,
        mmap=request.mmap,
        cache_ram_mib=cache_ram,
        tensor_split=tensor_split if request.count * request.nodes > 1 else (),
        rpc_workers=request.nodes - 1,
    )
    per_node: tuple[NodeShare, ...] = ()
    if request.nodes > 1 and tensor_split:  # a CPU plan has no split (and refuses nodes)
        # llama-server puts its RPC devices first, its own last (src/llama.cpp: "add RPC
        # servers at the front of the list"): tensor_split is in that order.
        c = request.count
        held = _device_holdings(
            tensor_split, _layer_bytes(facts, request.quantization, weights.bytes, n_layers),
            kv_total, n_layers)
        spans = [(len(tensor_split) - c, len(tensor_split))]  # the leader
        spans += [((k - 1) * c, k * c) for k in range(1, request.nodes)]
        per_node = tuple(
            NodeShare(
                role="leader" if i == 0 else "worker",
                devices=c,
                layers=sum(tensor_split[lo:hi]),
                weights_bytes=sum(w for w, _ in held[lo:hi]),
                kv_bytes=sum(k for _, k in held[lo:hi]),
            )
            for i, (lo, hi) in enumerate(spans)
        )
    result = _finish(request, profile, breakdown, kv_per_token, weights, resources,
                     warnings, llamacpp=settings)
    return replace(result, per_node=per_node)


@dataclass(frozen=True)
class LayerBytes:
    """Where llama.cpp puts a model's weights when it offloads layers: the input embeddings
    stay in host memory, each block goes to the device the split gives it, and the output
    layer to the device of the last unit (src/llama-model.cpp, load_tensors)."""

    host: int  # token embeddings
    block: int  # one repeating layer
    output: int  # output norm + output matrix (a device copy of the embeddings when tied)


def _layer_bytes(facts: ArchitectureFacts, quant: str, total: int, n_layers: int) -> LayerBytes:
    matrix = int(mem.vocab_size(facts) * facts.embedding_length
                 * mem.quantization(quant).bits_per_weight / 8)
    in_file = matrix if facts.tied_embeddings else 2 * matrix
    if in_file * 2 > total:  # facts that do not add up: every unit weighs the same
        even = total // (n_layers + 1)
        return LayerBytes(host=0, block=even, output=even)
    return LayerBytes(host=matrix, block=(total - in_file) // n_layers, output=matrix)


def _device_holdings(tensor_split: tuple[int, ...], layer_bytes: LayerBytes, kv_total: int,
                     n_layers: int) -> list[tuple[int, int]]:
    """(weights, KV) bytes on each device of a layer split, in llama.cpp's device order: a
    device gets its units of blocks, the last one holds the output layer as its last unit."""
    last = max(i for i, units in enumerate(tensor_split) if units)
    held = []
    for i, units in enumerate(tensor_split):
        blocks, output = (units - 1, layer_bytes.output) if i == last else (units, 0)
        held.append((blocks * layer_bytes.block + output, kv_total * blocks // n_layers))
    return held


def _split(units: int, count: int) -> tuple[int, ...]:
    base, extra = divmod(units, count)
    return tuple(base + (1 if i < extra else 0) for i in range(count))


def _partial_offload(
    full: MemoryBreakdown, weights: int, kv_total: int, n_layers: int, count: int
) -> tuple[int, MemoryBreakdown, int]:
    """The most layers (of n_layers + output) that fit; the rest stay in host RAM."""
    units = n_layers + 1
    for ngl in range(units - 1, -1, -1):
        on_gpu, host = _offload_at(full, weights, kv_total, n_layers, count, ngl)
        if on_gpu.headroom >= 0 or ngl == 0:
            return ngl, on_gpu, host
    raise AssertionError("unreachable")


def _offload_at(
    full: MemoryBreakdown, weights: int, kv_total: int, n_layers: int, count: int, ngl: int
) -> tuple[MemoryBreakdown, int]:
    """`ngl` of the n_layers + output units on the devices: the most loaded device's
    breakdown, and the host RAM the other units' weights and KV take."""
    units = n_layers + 1
    per_device = -(-ngl // count) if ngl else 0
    on_gpu_weights = weights * per_device // units
    on_gpu_kv = kv_total * min(per_device, n_layers) // n_layers
    host = weights * (units - ngl) // units + kv_total * (units - ngl) // units
    return replace(full, weights=on_gpu_weights, kv=on_gpu_kv), host


def mem_breakdown(
    *,
    weights: int,
    kv: int,
    compute: int,
    overhead: int,
    reserved: int,
    available: int,
    measured: bool,
) -> MemoryBreakdown:
    return MemoryBreakdown(weights, kv, compute, overhead, reserved, available, measured)


# ---------------------------------------------------------------- vLLM


def _pp_mtp_refused(request: PlanRequest, profile: AcceleratorProfile) -> bool:
    """vllm-ascend v0.23 refuses MTP with pipeline parallelism at start
    (NPUPlatform._validate_pd_pp_mtp_config), and a vLLM group spans its nodes by it."""
    return profile.vendor == "huawei" and request.nodes > 1


def _mtp_tokens(request: PlanRequest, profile: AcceleratorProfile) -> int:
    """Draft tokens of vLLM's MTP speculative decoding: one per nextn layer, where vLLM has a
    drafter for the architecture, the engine accepts it and the GLMService did not turn it
    off. Their memory is planned already: the nextn layers' weights are in the artifact's
    size, their KV in mem.kv_layers."""
    facts = request.facts
    if request.engine != "vllm" or request.multi_token_prediction is False:
        return 0
    if _pp_mtp_refused(request, profile):
        return 0
    if facts.architecture not in engine_support.VLLM_MTP_ARCHITECTURES:
        return 0
    # The GLM-5 family on CUDA: the depth its recipes run (vllm-ascend's tutorials are not
    # checked here: one token per nextn layer there, as before).
    depth = engine_support.recipe_mtp_tokens(
        facts.architecture, facts.context_length, facts.nextn_predict_layers)
    if depth is not None and profile.vendor == "nvidia":
        return depth
    return facts.nextn_predict_layers


def default_vllm_kv_dtype(facts: ArchitectureFacts, profile: AcceleratorProfile) -> str:
    """The KV cache dtype a vLLM plan takes when the GLMService names none.

    fp8 for the GLM-5 family (glm-dsa) where the device has fp8, as vLLM's GLM-5.1 and
    GLM-5.2 recipes run it (`--kv-cache-dtype fp8` on Hopper, `fp8_e4m3` on Blackwell, where
    vLLM itself turns `auto` into fp8 for GlmMoeDsaForCausalLM); `auto` (the model's dtype)
    for every other model: fp8 KV trades accuracy, which only the family's recipes have
    taken and measured. docs/planning.md, "KV cache type".
    """
    if facts.architecture in FP8_KV_DEFAULT_ARCHITECTURES and profile.fp8 and (
            profile.vendor == "nvidia"):
        return fp8_kv_dtype(profile)
    return "auto"


# Model families whose published vLLM recipes run an fp8 KV cache.
FP8_KV_DEFAULT_ARCHITECTURES = frozenset({"glm-dsa"})


def fp8_kv_dtype(profile: AcceleratorProfile) -> str:
    """vLLM's spelling of an fp8 KV cache on this device: `fp8_e4m3` on Blackwell (SM 10x),
    `fp8` (e4m3 too) elsewhere, as the recipes write them."""
    return "fp8_e4m3" if (profile.cuda_sm or 0) >= 100 else "fp8"


def _plan_vllm(request: PlanRequest, profile: AcceleratorProfile, layout: str = "tp") -> Plan:
    facts = request.facts
    pp = request.nodes
    dep, dcp_layout = layout == "dep", layout == "dcp"
    # devices per node: TP ranks, or DP ranks of rank_tensor_parallel devices each for DEP
    tp = request.rank_tensor_parallel if dep else request.count
    dp = request.count // tp if dep else 1
    dcp = request.count if dcp_layout else 1
    kv_dtype = request.kv_cache_type or default_vllm_kv_dtype(facts, profile)
    if kv_dtype not in mem.VLLM_KV_TYPES:
        kv_dtype = "auto"
    weights = mem.weights_bytes(facts, request.quantization)
    # A ModelSlim C8 checkpoint keeps its KV cache in int8 (one byte a value), whatever
    # --kv-cache-dtype says: its quant description sets it.
    kv_size_dtype = ("fp8" if request.quantization.lower() in MODELSLIM_INT8_KV
                     and kv_dtype == "auto" else kv_dtype)
    # KV heads are split across TP ranks; with more ranks than KV heads each rank keeps one.
    heads_per_gpu = max(1, -(-facts.head_count_kv // tp))
    share = Fraction(heads_per_gpu, facts.head_count_kv)
    # MLA keeps one latent head on every rank, whatever the TP (mem.vllm_kv_bytes_per_token);
    # DCP shards it (and the indexer's) over the DCP ranks, token by token.
    kv_per_token_gpu = -(-mem.vllm_kv_bytes_per_token(facts, kv_size_dtype,
                                                      kv_heads_share=share) // dcp)
    kv_per_token = mem.vllm_kv_bytes_per_token(facts, kv_size_dtype)
    seqs = -(-request.concurrency // dp)  # per DP rank: each rank holds its own sequences
    tokens = mem.round_up(request.context_length, VLLM_BLOCK_SIZE) * seqs
    # Pipeline parallel: each node (stage) holds its layers' weights and KV; the largest
    # stage is the most loaded device.
    stages = _split(facts.block_count, pp) if pp <= facts.block_count else (facts.block_count,)
    stage_share = Fraction(stages[0], facts.block_count)
    kv_per_token_rank = kv_per_token_gpu  # all layers, this rank's KV heads
    kv_per_token_gpu = int(kv_per_token_gpu * stage_share)
    # The host KV tier of each engine core, in tokens: vLLM stores one copy of every rank's
    # blocks, or one of an MLA latent that the TP ranks replicate (OffloadingConnector's
    # replicated layout: TP only, one node).
    host_copies = 1 if facts.is_mla and dcp == 1 and pp == 1 else tp * pp
    host_bytes_per_token = kv_per_token_rank * host_copies
    offload_tier = request.kv_offload_gib * GiB
    host_tokens = offload_tier // host_bytes_per_token if host_bytes_per_token else 0
    # The device must hold what the tier does not, and at least one request at full context
    # (vLLM refuses a max_model_len its KV cache cannot hold): the tier adds no decoding room.
    context = mem.round_up(request.context_length, VLLM_BLOCK_SIZE)
    device_tokens = max(min(tokens, context), tokens - host_tokens)
    kv_needed = kv_per_token_gpu * device_tokens
    utilization = VLLM_GPU_MEMORY_UTILIZATION
    available = profile.memory_bytes
    activation = mem.vllm_activation_bytes(
        facts, max_num_batched_tokens=VLLM_MAX_NUM_BATCHED_TOKENS, max_num_seqs=seqs, tp=tp
    ) + mem.vllm_sparse_mla_workspace_bytes(facts, request.context_length)
    overhead = profile.runtime_overhead_bytes + (
        mem.VLLM_TP_COMMUNICATION_BYTES if request.count > 1 else 0)
    warnings: list[str] = []
    if dep:
        # Attention, dense layers, shared experts and embeddings whole on every DP rank; the
        # routed experts split over the EP ranks (every device of the node).
        split = mem.moe_weights(facts, weights.bytes)
        gpu_weights = split.replicated // tp + split.experts // request.count
        overhead += VLLM_EP_ALL2ALL_BYTES
    else:
        gpu_weights = int(weights.bytes * stage_share) // tp
    offload = request.cpu_offload_gib * GiB  # --cpu-offload-gb: weights per GPU in host RAM
    breakdown = mem_breakdown(
        weights=max(0, gpu_weights - offload),
        kv=kv_needed,
        compute=activation + mem.VLLM_CUDA_GRAPH_BYTES,
        overhead=overhead,
        reserved=available - int(available * utilization),
        available=available,
        measured=weights.measured,
    )
    kv_budget = breakdown.kv + breakdown.headroom
    kv_tokens = max(0, kv_budget) // kv_per_token_gpu if kv_per_token_gpu else 0
    # The replica's capacity: each DP rank holds its own tokens (a DCP rank holds a 1/dcp
    # share of each token, counted in kv_per_token_gpu already).
    kv_tokens *= dp
    dtype = "auto" if profile.bf16 else "float16"
    if not profile.bf16:
        warnings.append(f"{profile.name} has no bf16: vLLM runs float16 (--dtype float16)")
    if tp > 1 and not profile.nvlink:
        warnings.append(f"{profile.name} has no NVLink: tensor parallelism's all-reduce in "
                        "every layer crosses PCIe (llama.cpp splits layers instead)")
    settings = VllmSettings(
        max_model_len=request.context_length,
        max_num_seqs=seqs,
        gpu_memory_utilization=utilization,
        tensor_parallel_size=tp,
        kv_cache_dtype=kv_dtype,
        dtype=dtype,
        max_num_batched_tokens=VLLM_MAX_NUM_BATCHED_TOKENS,
        kv_cache_tokens=int(kv_tokens),
        pipeline_parallel_size=pp,
        speculative_tokens=_mtp_tokens(request, profile),
        cpu_offload_gb=request.cpu_offload_gib,
        layout=layout,
        data_parallel_size=dp,
        enable_expert_parallel=dep,
        decode_context_parallel_size=dcp,
        kv_offloading_size=request.kv_offload_gib,
        kv_offload_tokens=int(host_tokens) * dp,
    )
    if offload:
        warnings.append(f"{request.cpu_offload_gib} GiB of weights per GPU are streamed from "
                        "host RAM on every forward pass: expect a large slowdown")
    devices = request.count
    tier_total = offload_tier * dp  # one region per engine core
    # pinned host copies of the offloaded weights, one per GPU; the KV tier's /dev/shm pages
    # are charged to the pod as well
    host = 4 * GiB + 2 * GiB * devices + offload * devices + tier_total
    resources = Resources(
        cpu_request=float(2 + 2 * devices),
        memory_request_bytes=host,
        memory_limit_bytes=host + 4 * GiB,
        devices=devices,
        resource_name=profile.resource_name,
        shared_memory_bytes=(2 * GiB if devices > 1 else 0) + tier_total,
        memory_note=(
            "safetensors are read through page cache (reclaimable) and copied to the devices: "
            "host RAM = API server + one worker per GPU"
            + (" + the offloaded weights of every GPU (pinned)" if offload else "")
            + (f" + the host KV tier ({request.kv_offload_gib} GiB per engine core, in "
               "/dev/shm)" if tier_total else "")
        ),
    )
    if tier_total:
        asked = request.concurrency * context
        held = dp * ((int(kv_tokens) // dp) // context)
        warnings.append(
            f"host KV tier: {request.kv_offload_gib} GiB x {dp} engine core"
            f"{'s' if dp > 1 else ''} hold {int(host_tokens) * dp} tokens in host memory: "
            "prefixes the device evicted and the KV of preempted requests (restored by a "
            "copy, not a recomputed prefill); it adds no decoding room"
            + (f": the device holds {held} of the {request.concurrency} requests at full "
               "context at once, the rest wait preempted" if int(kv_tokens) < asked else ""))
    per_node: tuple[NodeShare, ...] = ()
    if pp > 1:
        per_node = tuple(
            NodeShare(
                role="leader" if i == 0 else "worker",
                devices=tp,
                layers=layers,
                weights_bytes=int(weights.bytes * Fraction(layers, facts.block_count)),
                # Per rank, times the ranks: MLA's one latent KV head is on every rank.
                kv_bytes=int(kv_per_token_rank * tokens * Fraction(layers, facts.block_count))
                * tp,
            )
            for i, layers in enumerate(stages)
        )
    result = _finish(request, profile, breakdown, kv_per_token, weights, resources,
                     warnings, vllm=settings)
    bound = int(profile.memory_bytes * devices * KV_OFFLOAD_HOST_SHARE)
    if tier_total > bound:
        return replace(result, per_node=per_node, feasible=False, reason=(
            f"the host KV tier ({request.kv_offload_gib} GiB x {dp} engine cores = "
            f"{gib(tier_total)} GiB) exceeds the planner's bound of host memory for it, the "
            f"memory of the pod's {devices} x {profile.name} ({gib(bound)} GiB): the catalog "
            "has no host-memory fact of a node"))
    if offload >= gpu_weights:
        return replace(result, per_node=per_node, feasible=False, reason=(
            f"cpuOffload.hostWeightsGiB {request.cpu_offload_gib} is not below the "
            f"{gib(gpu_weights)} GiB of weights per GPU: vLLM would keep no layer on the GPU"))
    return replace(result, per_node=per_node)


def _finish(
    request: PlanRequest,
    profile: AcceleratorProfile,
    breakdown: MemoryBreakdown,
    kv_per_token: int,
    weights: mem.WeightsEstimate,
    resources: Resources,
    warnings: list[str],
    *,
    llamacpp: LlamaCppSettings | None = None,
    vllm: VllmSettings | None = None,
) -> Plan:
    feasible = breakdown.headroom >= 0
    result = Plan(
        request=request,
        profile=profile,
        feasible=feasible,
        reason="",
        memory=breakdown,
        kv_bytes_per_token=kv_per_token,
        weights_basis=weights.basis,
        model_weights_bytes=weights.bytes,
        resources=resources,
        llamacpp=llamacpp,
        vllm=vllm,
        warnings=tuple(warnings),
    )
    if feasible:
        where = "node RAM" if profile.is_cpu else f"per {profile.name} device"
        if request.nodes > 1:
            where += f" ({request.nodes} nodes x {request.count} devices)"
        reason = (
            f"fits: {gib(breakdown.total)} GiB of {gib(breakdown.available)} GiB {where} "
            f"(weights {gib(breakdown.weights)}, KV {gib(breakdown.kv)}, "
            f"buffers {gib(breakdown.compute + breakdown.overhead)}), "
            f"{gib(breakdown.headroom)} GiB headroom after a {gib(breakdown.reserved)} GiB reserve"
        )
    else:
        reason = _unfit_reason(result)
    return replace(result, reason=reason)


# ---------------------------------------------------------------- alternatives


MAX_NODES = 16  # the API's accelerator.nodes bound


def _vllm_tp_ok(facts: ArchitectureFacts, count: int) -> bool:
    return not (facts.head_count % count
                or (facts.head_count_kv % count and count % facts.head_count_kv))


def _multi_node_alternative(
    request: PlanRequest, profile: AcceleratorProfile, attempt: Any
) -> None:
    """One node cannot hold the replica: the fewest full nodes that can (a replica becomes a
    group of pods, one per node, without CPU offload). The long-context pool runs on one node
    per replica (it wakes from zero), so it gets none."""
    if profile.is_cpu or request.allow_partial_offload or request.long_context:
        return
    no_offload: dict[str, Any] = {}
    if request.gpu_layers is not None:
        no_offload["gpu_layers"] = None
    if request.cpu_offload_gib:
        no_offload["cpu_offload_gib"] = 0
    counts = [c for c in range(profile.max_devices_per_node, 0, -1)
              if request.engine != "vllm" or _vllm_tp_ok(request.facts, c)]
    if not counts:
        return
    count = counts[0]
    for nodes in range(max(2, request.nodes + 1), MAX_NODES + 1):
        if attempt(f"{nodes} nodes x {count} x {profile.name}", nodes=nodes, count=count,
                   **no_offload):
            return


def _alternatives(
    request: PlanRequest, catalog: Mapping[str, AcceleratorProfile]
) -> list[Alternative]:
    """The nearest configurations that fit, one per kind of change, in the order a user
    would usually try them."""
    found: list[Alternative] = []

    def attempt(change: str, **settings: Any) -> bool:
        try:
            candidate = _plan_one(replace(request, **settings), get_profile(
                settings.get("accelerator", request.accelerator), catalog))
        except ValueError:
            return False
        if candidate.feasible:
            if candidate.vllm and candidate.vllm.layout != "tp" and "layout" not in settings:
                change += f" ({layout_label(candidate.vllm)})"  # the layout it fits in
            found.append(Alternative(change, settings, candidate.memory.headroom, candidate))
            return True
        return False

    facts = request.facts
    profile = get_profile(request.accelerator, catalog)
    # A smaller KV cache first for vLLM (issue 38): it keeps the weights the user chose, and
    # the recipes of the models that need it run it; llama.cpp's comes after the weights'.
    if request.engine == "vllm":
        _kv_alternative(request, profile, attempt)
        _layout_alternatives(request, profile, attempt)
    q = mem.quantization(request.quantization)
    ladder = mem.QUANTIZATION_LADDER[q.format]
    for name in ladder:
        smaller = mem.quantization(name)
        if smaller.bits_per_weight < q.bits_per_weight and attempt(
            f"quantization {smaller.name}", quantization=smaller.name
        ):
            break

    if request.engine == "llamacpp":
        _kv_alternative(request, profile, attempt)
    if request.engine == "vllm":
        _kv_tier_alternative(request, profile, attempt)

    for slots in range(request.concurrency - 1, 0, -1):
        if attempt(f"{slots} concurrent request{'s' if slots > 1 else ''}", concurrency=slots):
            break

    context = request.context_length
    step = 1024
    for ctx in range((context - 1) // step * step, step - 1, -step):
        if attempt(f"context {ctx}", context_length=ctx):
            break

    if not profile.is_cpu:
        for count in range(request.count + 1, profile.max_devices_per_node + 1):
            if request.engine == "vllm" and not _vllm_tp_ok(facts, count):
                continue
            if attempt(f"{count} x {profile.name}", count=count):
                break
        if not any(a.settings.keys() & {"count"} for a in found):
            _multi_node_alternative(request, profile, attempt)

    bigger = sorted(
        (p for p in catalog.values()
         if p.memory_bytes > profile.memory_bytes and request.engine in p.engines
         and p.is_cpu == profile.is_cpu),
        key=lambda p: p.memory_bytes,
    )
    for other in bigger:
        nodes = f"{request.nodes} nodes x " if request.nodes > 1 else ""
        if attempt(f"{nodes}{request.count} x {other.name}" if not other.is_cpu else other.name,
                   accelerator=other.name):
            break

    if request.engine == "llamacpp" and not profile.is_cpu and not request.allow_partial_offload:
        # The most layers that fit, as the exact count spec.cpuOffload.acceleratorLayers takes.
        partial = _plan_one(replace(request, allow_partial_offload=True, gpu_layers=None),
                            profile)
        settings = partial.llamacpp
        if partial.feasible and settings and settings.n_gpu_layers > 0:
            layers = facts.block_count + facts.nextn_predict_layers + 1
            attempt(f"partial CPU offload ({settings.n_gpu_layers}/{layers} layers on the GPU)",
                    gpu_layers=settings.n_gpu_layers)
    if request.engine == "vllm" and profile.vendor == "nvidia":
        _vllm_offload_alternative(request, profile, attempt)
    return found


def _kv_alternative(request: PlanRequest, profile: AcceleratorProfile, attempt: Any) -> None:
    """The first smaller KV cache type that fits: q8_0 then q4_0 for llama.cpp, fp8 (in the
    device's spelling) for vLLM, named with the layout it fits in."""
    kv_steps: tuple[str, ...]
    if request.engine == "llamacpp":
        kv_now, kv_steps = request.kv_cache_type or "f16", ("q8_0", "q4_0")
    else:
        kv_now = request.kv_cache_type or default_vllm_kv_dtype(request.facts, profile)
        kv_steps = (fp8_kv_dtype(profile),)
    for kv in kv_steps:
        if mem.KV_CACHE_TYPES[kv] < mem.KV_CACHE_TYPES.get(kv_now, Fraction(2)) and attempt(
            f"KV cache {kv}", kv_cache_type=kv
        ):
            return


def _layout_alternatives(request: PlanRequest, profile: AcceleratorProfile,
                         attempt: Any) -> None:
    """A forced layout that does not fit: each other layout that does on the same devices
    (alone, then with the fp8 KV cache)."""
    if request.layout is None:
        return
    for layout in vllm_layouts(request, profile):
        if layout == request.layout:
            continue
        if not attempt(f"layout {layout}", layout=layout) and profile.fp8:
            attempt(f"layout {layout} with KV cache {fp8_kv_dtype(profile)}", layout=layout,
                    kv_cache_type=fp8_kv_dtype(profile))


def _kv_tier_alternative(request: PlanRequest, profile: AcceleratorProfile,
                         attempt: Any) -> None:
    """The devices hold at least one request at the asked context but not all of them: the
    smallest host KV tier (whole GiB per engine core) that holds the rest's KV while they wait
    preempted. It changes how many decode at once, not what fits: the plan's reason says so."""
    if profile.vendor != "nvidia" or request.nodes > 1:
        return
    current = _plan_one(request, profile)
    settings = current.vllm
    if settings is None or current.feasible:
        return
    context = mem.round_up(request.context_length, VLLM_BLOCK_SIZE)
    ranks = settings.data_parallel_size
    on_device = settings.kv_cache_tokens // ranks  # per engine core
    asked = context * settings.max_num_seqs
    if on_device < context or on_device >= asked:
        return  # not one request fits, or the shortfall is not the KV's
    short = asked - on_device
    first = max(1, -(-short * _tier_bytes_per_token(request, profile, settings.layout) // GiB))
    held = ranks * (on_device // context)
    for size in range(first, first + 3):
        if attempt(f"host KV tier of {size} GiB ({held} of {request.concurrency} requests "
                   "decode at full context at once, the others wait preempted)",
                   kv_offload_gib=size):
            return


def _tier_bytes_per_token(request: PlanRequest, profile: AcceleratorProfile,
                          layout: str) -> int:
    """Host bytes one token takes in the KV tier of an engine core (see _plan_vllm)."""
    probe = _plan_vllm(replace(request, kv_offload_gib=1), profile, layout)
    assert probe.vllm is not None
    per_core = probe.vllm.kv_offload_tokens // probe.vllm.data_parallel_size
    return -(-GiB // per_core) if per_core else GiB


def _vllm_offload_alternative(
    request: PlanRequest, profile: AcceleratorProfile, attempt: Any
) -> None:
    """The fewest whole GiB of weights per GPU that, kept in host RAM (--cpu-offload-gb),
    let the rest fit."""
    current = _plan_one(request, profile)
    if current.vllm is None or current.memory.headroom >= 0:
        return
    short = -(current.memory.headroom // GiB)  # whole GiB short, rounded up
    on_gpu = current.memory.weights // GiB
    for extra in range(short, min(short + 4, on_gpu)):
        gib_total = request.cpu_offload_gib + extra
        if attempt(f"CPU offload of {gib_total} GiB of weights per GPU",
                   cpu_offload_gib=gib_total):
            return
