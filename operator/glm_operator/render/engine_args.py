"""Engine command lines from a plan: llama-server and `vllm serve`, always as argv lists.

Every flag the plan decides is written out explicitly, even where it equals the engine's
default today: a new engine build that changes a default must not silently change what
status.plan says the pods run with. The llama-server flags are the ones the pinned build
(e2e/versions.toml, llama_cpp_python's vendored llama.cpp) accepts; in particular it has
`--fit` on by default (it would re-plan context and layers behind our back, so it is turned
off) and `--load-mode` instead of the older `--no-mmap`.

User `engineArgs` come last, one argv element each; the API already refused any flag the
operator owns (OPERATOR_OWNED_ENGINE_FLAGS), so they cannot contradict the plan.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from glm_operator.planning.planner import KV_OFFLOAD_BACKEND, Plan
from glm_operator.render.ascend import vllm_quantization
from glm_operator.render.model_family import VllmParsers, vllm_parsers

LLAMA_SERVER = "llama-server"
VLLM_COMMAND: tuple[str, ...] = ("vllm", "serve")
# Loopback only: the gateway in the same pod is the engine's one client, so no other pod can
# skip its API keys and rate limits. The kubelet probes the gateway's /enginez (see pod.py).
ENGINE_HOST = "127.0.0.1"
# llama-server also listens on this Unix socket, in Linux's abstract namespace ("@": no file,
# gone with the process, so a restarted container finds no stale socket in its way). The
# namespace belongs to the pod's network namespace: only the pod's own containers reach it,
# as with loopback. The gateway sends answers and streams over it, which saves the loopback
# TCP stack's work on every chunk (docs/performance.md); probes and warm-up stay on TCP.
# llama-server takes a Unix socket for a host ending in ".sock" (tools/server/server-http.cpp).
ENGINE_SOCKET = "@glm-engine.sock"
# Multi-node: llama.cpp's ggml-rpc-server port (its default), and the Ray head's GCS port.
# vLLM groups span nodes through Ray, which both pinned engines have (vLLM 0.33's own
# --nnodes mode is not in vllm-ascend v0.23's vLLM 0.23 line; docs/planning.md).
# The worker binary as the pinned llama.cpp tree names it (tools/rpc: target ggml-rpc-server).
RPC_SERVER = "ggml-rpc-server"
RPC_PORT = 50052
RAY_PORT = 6379
VLLM_DISTRIBUTED_BACKEND = "ray"


class EngineArgsError(ValueError):
    """The plan does not carry settings for the engine asked for."""


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def llamacpp_argv(
    plan: Plan,
    model_path: str,
    port: int,
    alias: str,
    extra_args: Sequence[str] = (),
    threads: int | None = None,
    rpc_servers: Sequence[str] = (),
) -> list[str]:
    """`llama-server` argv (command included) for one replica of a llama.cpp plan;
    `threads` replaces the plan's when the pod's CPU was overridden; `rpc_servers`
    (host:port) are a multi-node replica's workers, whose devices llama-server lists first."""
    settings = plan.llamacpp
    if settings is None:
        raise EngineArgsError(f"plan for engine {plan.request.engine!r} has no llama.cpp settings")
    argv = [
        LLAMA_SERVER,
        "--model", model_path,
        "--host", f"{ENGINE_HOST},{ENGINE_SOCKET}",
        "--port", str(port),
        "--alias", alias,
        "--ctx-size", str(settings.ctx_size),
        "--parallel", str(settings.parallel),
        "--kv-unified" if settings.kv_unified else "--no-kv-unified",
        "--n-gpu-layers", str(settings.n_gpu_layers),
        "--cache-type-k", settings.cache_type_k,
        "--cache-type-v", settings.cache_type_v,
        "--flash-attn", _on_off(settings.flash_attn),
        "--threads", str(threads or settings.threads),
        "--batch-size", str(settings.batch_size),
        "--ubatch-size", str(settings.ubatch_size),
        "--cache-ram", str(settings.cache_ram_mib),
        "--load-mode", "mmap" if settings.mmap else "none",
        "--fit", _on_off(settings.fit),
        "--metrics",
        "--no-webui",
    ]  # fmt: skip
    if len(rpc_servers) != settings.rpc_workers:
        raise EngineArgsError(f"the plan has {settings.rpc_workers} RPC workers, "
                              f"{len(rpc_servers)} given")
    if rpc_servers:
        argv += ["--rpc", ",".join(rpc_servers)]
    if settings.tensor_split:
        argv += ["--split-mode", "layer",
                 "--tensor-split", ",".join(str(n) for n in settings.tensor_split)]
    argv.extend(extra_args)
    return argv


def engine_socket(plan: Plan) -> str | None:
    """The Unix socket the plan's engine listens on besides TCP: llama-server's. vLLM's
    `--uds` would replace its TCP listener (and the probes with it), so vLLM has none."""
    return ENGINE_SOCKET if plan.llamacpp is not None else None


def rpc_server_argv(plan: Plan) -> list[str]:
    """A llama.cpp multi-node worker: ggml-rpc-server serving every device of its node to the
    leader's llama-server (which sends it the weights: the worker needs no model file).
    It listens on all addresses: the leader reaches it by its stable hostname."""
    settings = plan.llamacpp
    if settings is None:
        raise EngineArgsError(f"plan for engine {plan.request.engine!r} has no llama.cpp settings")
    return [RPC_SERVER, "--host", "0.0.0.0", "--port", str(RPC_PORT),
            "--threads", str(settings.threads)]


def ray_worker_argv(leader_address: str) -> list[str]:
    """A vLLM multi-node worker: a Ray node joining the leader's Ray head, in the foreground."""
    return ["ray", "start", f"--address={leader_address}:{RAY_PORT}", "--block",
            "--disable-usage-stats"]


def ray_head_argv() -> list[str]:
    """The leader's Ray head (started beside `vllm serve`, which then runs its workers)."""
    return ["ray", "start", "--head", f"--port={RAY_PORT}", "--disable-usage-stats"]


def vllm_argv(
    plan: Plan,
    model_path: str,
    port: int,
    served_model_name: str,
    extra_args: Sequence[str] = (),
    parsers: VllmParsers | None = None,
) -> list[str]:
    """`vllm serve` argv (command included) for one replica of a vLLM plan; `parsers` as
    model_family.vllm_parsers chose them for the model (default: from its architecture)."""
    settings = plan.vllm
    if settings is None:
        raise EngineArgsError(f"plan for engine {plan.request.engine!r} has no vLLM settings")
    argv = [
        *VLLM_COMMAND,
        model_path,
        "--served-model-name", served_model_name,
        "--host", ENGINE_HOST,
        "--port", str(port),
        "--tensor-parallel-size", str(settings.tensor_parallel_size),
        *(("--pipeline-parallel-size", str(settings.pipeline_parallel_size),
           "--distributed-executor-backend", VLLM_DISTRIBUTED_BACKEND)
          if settings.pipeline_parallel_size > 1 else ()),
        *(("--data-parallel-size", str(settings.data_parallel_size))
          if settings.data_parallel_size > 1 else ()),
        *(("--enable-expert-parallel",) if settings.enable_expert_parallel else ()),
        *(("--decode-context-parallel-size", str(settings.decode_context_parallel_size))
          if settings.decode_context_parallel_size > 1 else ()),
        "--max-model-len", str(settings.max_model_len),
        "--max-num-seqs", str(settings.max_num_seqs),
        "--max-num-batched-tokens", str(settings.max_num_batched_tokens),
        "--gpu-memory-utilization", f"{settings.gpu_memory_utilization:g}",
        "--kv-cache-dtype", settings.kv_cache_dtype,
        "--dtype", settings.dtype,
    ]  # fmt: skip
    if settings.cpu_offload_gb:  # only when spec.cpuOffload asks: vLLM's default is 0
        argv += ["--cpu-offload-gb", str(settings.cpu_offload_gb)]
    if settings.kv_offloading_size:  # spec.engine.vllm.kvOffloadGiB: the host KV tier
        argv += ["--kv-offloading-size", str(settings.kv_offloading_size),
                 "--kv-offloading-backend", KV_OFFLOAD_BACKEND]
    quantization = vllm_quantization(plan)
    if quantization is not None:
        argv += ["--quantization", quantization]
    chosen = parsers or vllm_parsers(plan.request.facts.architecture)
    if chosen.tool_call:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", chosen.tool_call]
    if chosen.reasoning:
        argv += ["--reasoning-parser", chosen.reasoning]
    if settings.speculative_tokens:
        argv += ["--speculative-config", json.dumps(
            {"method": "mtp", "num_speculative_tokens": settings.speculative_tokens},
            separators=(",", ":"))]
    argv.extend(extra_args)
    return argv


def engine_argv(
    plan: Plan, model_path: str, port: int, name: str, extra_args: Sequence[str] = (),
    threads: int | None = None, rpc_servers: Sequence[str] = (),
    parsers: VllmParsers | None = None,
) -> list[str]:
    """The argv for whichever engine the plan is for."""
    if plan.request.engine == "vllm":
        return vllm_argv(plan, model_path, port, name, extra_args, parsers)
    return llamacpp_argv(plan, model_path, port, name, extra_args, threads, rpc_servers)
