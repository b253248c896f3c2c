"""The engine pod: engine container + gateway sidecar, volumes, scheduling, probes, security.

Pure functions from a `PoolContext` (everything one pool of one service needs) to plain
dicts; the Deployment template places them. Key order is fixed, so the same inputs always
give the same bytes.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from glm_operator.api.base import duration_seconds
from glm_operator.api.glmservice import GLMService
from glm_operator.api.modelversion import ModelVersion
from glm_operator.api.rate_limit_store import RateLimitStore, service_store
from glm_operator.config import OperatorConfig
from glm_operator.gateway import flags as gateway_flags
from glm_operator.planning import memory as mem
from glm_operator.planning.planner import Plan
from glm_operator.render.ascend import (
    ascend_env,
    device_groups,
    driver_mounts,
    driver_volumes,
    group_env,
    is_ascend,
)
from glm_operator.render.engine_args import RAY_PORT, engine_argv, engine_socket, ray_head_argv
from glm_operator.render.model_family import VllmParsers, stop_sequences, vllm_parsers
from glm_operator.render.names import VERSION_LABEL, dns_name, label_value, pool_selector
from glm_operator.render.node_architecture import (
    engine_image_of,
    pin_architectures,
    pool_architectures,
)
from glm_operator.render.quantity import cpu_cores, cpu_quantity, memory_quantity

MODEL_MOUNT = "/models"
API_KEYS_MOUNT = "/etc/glm-operator/api-keys"
API_KEYS_VOLUME = "api-keys"
ENGINE_CONTAINER = "engine"
GATEWAY_CONTAINER = "gateway"
GATEWAY_PORT_NAME = "http"
# The engine listens on 127.0.0.1 only (engine_args.ENGINE_HOST): nothing but the gateway in
# the same pod may reach it, so API keys and rate limits cannot be bypassed. The kubelet
# probes the pod IP, so the engine's probes ask the gateway, which relays the engine's own
# /health (llama-server and vLLM: 503 while loading, 200 once loaded).
ENGINE_HEALTH_PATH = "/enginez"
TMP_SIZE = {"llamacpp": 1 * mem.GiB, "vllm": 20 * mem.GiB}  # vLLM: torch.compile/triton caches
# CANN compiles kernels at first use and caches them (ASCEND_CACHE_PATH, render/ascend.py).
ASCEND_LLAMACPP_TMP_SIZE = 4 * mem.GiB
GATEWAY_TMP_SIZE = 64 * mem.MiB

# vLLM writes caches under $HOME and downloads nothing: the root filesystem is read-only and
# the model is already on the volume.
VLLM_ENV: tuple[tuple[str, str], ...] = (
    ("HOME", "/tmp"),
    ("XDG_CACHE_HOME", "/tmp/.cache"),
    ("HF_HOME", "/tmp/.cache/huggingface"),
    ("VLLM_CACHE_ROOT", "/tmp/.cache/vllm"),
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("VLLM_NO_USAGE_STATS", "1"),
    ("DO_NOT_TRACK", "1"),
)
LLAMACPP_ENV: tuple[tuple[str, str], ...] = (("HOME", "/tmp"),)
# The pod's own name, for argv that names a group's workers after their leader ($(VAR) is
# expanded by the kubelet, no shell).
POD_NAME_ENV = "GLM_POD_NAME"
POD_NAME_VAR = {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}


class RenderInputError(ValueError):
    """The inputs cannot be rendered (infeasible plan, missing fields): names the field."""


@dataclass(frozen=True)
class ReplicaPolicy:
    """Who sets a pool's replicas: the operator (`fixed`, part of the applied intent), or an
    HPA or the gateway's wake-up (`fixed` None), which start from `initial`."""

    fixed: int | None
    initial: int


@dataclass(frozen=True)
class PoolContext:
    """One pool (main or long-context) of one service at one model version."""

    service: GLMService
    model_version: ModelVersion
    plan: Plan
    config: OperatorConfig
    pool: str  # "main" | "long-context"
    namespace: str
    # The long-context pool as the main pool's gateway sees it (None: no overflow pool).
    long_context_url: str | None = None
    long_context_deployment: str | None = None
    wake_timeout_seconds: int | None = None  # how long a long request waits for the wake
    # The long-context pool's activity Lease: the main pool's gateway renews it when it
    # wakes the pool, the long-context pool's gateways while they serve.
    activity_lease: str | None = None
    service_account: str | None = None
    # Replicas chosen by a rollout (a canary sized to its weight); None: from the spec.
    replicas: ReplicaPolicy | None = None
    # A multi-node replica's leader: the workers' ggml-rpc-server addresses (llama.cpp), which
    # may name $(POD_NAME_ENV).
    rpc_servers: tuple[str, ...] = ()

    @property
    def engine(self) -> str:
        return self.plan.request.engine

    @property
    def service_name(self) -> str:
        return self.service.metadata.name or ""

    @property
    def version(self) -> str:
        return self.model_version.metadata.name or ""


# ---------------------------------------------------------------- model location


def cache_claim_name(model_version: ModelVersion) -> str:
    """The PVC the ModelVersion's artifact is cached in (status wins: the fetch reported it)."""
    cache = model_version.status.cache
    if cache is not None and cache.claim_name:
        return cache.claim_name
    return dns_name(model_version.metadata.name or "", "cache")


def model_relative_path(model_version: ModelVersion) -> str:
    """Path of the model inside the cache PVC: as the fetch reported it, else the source's
    file name (what the fetch Job writes by default)."""
    cache = model_version.status.cache
    if cache is not None and cache.path:
        return cache.path.lstrip("/")
    path = urlsplit(model_version.spec.source.uri).path.rstrip("/")
    name = path.rsplit("/", 1)[-1]
    if not name:
        raise RenderInputError(
            f"ModelVersion {model_version.metadata.name}: spec.source.uri names no file"
        )
    return name


def model_size_bytes(model_version: ModelVersion, plan: Plan) -> int:
    """Measured size, else declared, else the plan's weight estimate."""
    if model_version.status.size_bytes:
        return model_version.status.size_bytes
    facts = model_version.spec.facts
    if facts is not None and facts.size_bytes:
        return facts.size_bytes
    return plan.model_weights_bytes


# ---------------------------------------------------------------- security


def pod_security_context(config: OperatorConfig) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
        "runAsGroup": config.run_as_group,
        "fsGroup": config.run_as_group,  # the cache PVC and Secret files readable by the pod
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pull_secrets(config: OperatorConfig) -> dict[str, Any]:
    """imagePullSecrets for every pod the operator renders (operator config), or nothing."""
    if not config.image_pull_secrets:
        return {}
    return {"imagePullSecrets": [{"name": name} for name in config.image_pull_secrets]}


def container_security_context(config: OperatorConfig) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
        "runAsGroup": config.run_as_group,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# ---------------------------------------------------------------- probes


def _http_probe(path: str, port: str | int, period: int, failures: int, timeout: int
                ) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def startup_seconds(ctx: PoolContext) -> int:
    """Time a replica may take to load: size / assumed read throughput + margin."""
    tuning = ctx.config.probes
    size = model_size_bytes(ctx.model_version, ctx.plan)
    request = ctx.plan.request
    if ctx.engine == "vllm":
        # every rank (count per node x nodes) reads its own shard in parallel
        size //= max(1, request.count * request.nodes)
    elif request.nodes > 1:
        # the leader reads the file and sends the workers' share over RPC: counted again
        size += size * (request.nodes - 1) // request.nodes
    seconds = size / (tuning.load_throughput_mib_per_second * mem.MiB)
    seconds += tuning.startup_margin_seconds
    if ctx.engine == "vllm":
        seconds += tuning.vllm_startup_extra_seconds
    return max(tuning.min_startup_seconds, math.ceil(seconds))


def engine_probes(ctx: PoolContext) -> dict[str, dict[str, Any]]:
    """Startup and liveness of the engine, through the gateway's /enginez.

    The port is the gateway's number, not its name: the kubelet resolves a named probe port
    among the probed container's own ports, and the engine container declares none. There
    is no engine readinessProbe: the gateway's /readyz (engine healthy and warmed up) is
    the pod's readiness.
    """
    tuning = ctx.config.probes
    period = tuning.startup_period_seconds
    port = ctx.config.gateway_port
    return {
        # /health answers 503 until the weights are loaded; liveness waits for this.
        "startupProbe": _http_probe(ENGINE_HEALTH_PATH, port, period,
                                    math.ceil(startup_seconds(ctx) / period),
                                    tuning.timeout_seconds),
        # Generous: a busy engine answers /health late; restarting it reloads the whole model.
        # It also rides out a gateway restart (seconds) without restarting the engine.
        "livenessProbe": _http_probe(ENGINE_HEALTH_PATH, port,
                                     tuning.liveness_period_seconds,
                                     tuning.liveness_failure_threshold, tuning.timeout_seconds),
    }


def gateway_probes(config: OperatorConfig) -> dict[str, dict[str, Any]]:
    tuning = config.probes
    return {
        "startupProbe": _http_probe("/healthz", GATEWAY_PORT_NAME, 2, 30, 5),
        # /readyz: engine loaded and one warm-up request answered; gates Service traffic.
        "readinessProbe": _http_probe("/readyz", GATEWAY_PORT_NAME,
                                      tuning.readiness_period_seconds, 3, 5),
        "livenessProbe": _http_probe("/healthz", GATEWAY_PORT_NAME, 20, 3, 5),
    }


# ---------------------------------------------------------------- termination


@dataclass(frozen=True)
class Termination:
    """How a pod of the pool stops (config.TerminationTuning has the why): the gateway waits
    `endpoint_removal_seconds` before its SIGTERM, then drains for `drain_seconds`; the
    engine and a group's workers wait out both before theirs."""

    endpoint_removal_seconds: int  # the gateway's preStop sleep
    drain_seconds: int  # the gateway's --drain-seconds
    exit_margin_seconds: int

    @property
    def engine_wait_seconds(self) -> int:
        """The engine's (and workers') preStop sleep: it outlives the gateway's drain."""
        return self.endpoint_removal_seconds + self.drain_seconds

    @property
    def grace_seconds(self) -> int:
        """terminationGracePeriodSeconds: preStop wait + drain + the exits."""
        return self.engine_wait_seconds + self.exit_margin_seconds


def longest_generation_seconds(ctx: PoolContext) -> int:
    """The longest generation the pool allows: its context per request (prompt plus
    completion never exceed it) at the decode floor, the slowest per-request rate assumed
    with every slot busy. Counting the prompt at the decode rate bounds the prefill too."""
    context, _ = engine_context_and_slots(ctx.plan)
    tuning = ctx.config.termination
    rate = (tuning.cpu_decode_tokens_per_second if ctx.plan.profile.is_cpu
            else tuning.decode_tokens_per_second)
    return math.ceil(context / rate)


def termination(ctx: PoolContext) -> Termination:
    tuning = ctx.config.termination
    drain = min(ctx.service.spec.gateway.max_drain_seconds, longest_generation_seconds(ctx))
    return Termination(tuning.endpoint_removal_seconds, drain, tuning.exit_margin_seconds)


def pre_stop_sleep(seconds: int) -> dict[str, Any]:
    """The kubelet's own sleep action (no shell, no binary in the image needed)."""
    return {"preStop": {"sleep": {"seconds": seconds}}}


# ---------------------------------------------------------------- resources


def _override_values(values: Mapping[str, str | int] | None, device: str | None) -> dict[str, str]:
    # The device count is the plan's (tensor parallel, node fit): never overridden.
    return {k: str(v) for k, v in (values or {}).items() if k != device}


def overridden_threads(ctx: PoolContext) -> int | None:
    """llama.cpp threads for a CPU the user set in podOverrides.resources (the limit, else
    the request), one per whole core: more threads than cores only contend. None when the
    plan's CPU stands."""
    overrides = ctx.service.spec.pod_overrides
    resources = overrides.resources if overrides is not None else None
    if resources is None:
        return None
    cpu = (resources.limits or {}).get("cpu") or (resources.requests or {}).get("cpu")
    if cpu is None:
        return None
    return max(1, math.floor(cpu_cores(cpu)))


def engine_resources(ctx: PoolContext) -> dict[str, dict[str, str]]:
    res = ctx.plan.resources
    cpu = cpu_quantity(res.cpu_request)
    requests = {"cpu": cpu, "memory": memory_quantity(res.memory_request_bytes)}
    limits = {"cpu": cpu, "memory": memory_quantity(res.memory_limit_bytes)}
    device = res.resource_name
    if device and res.devices:
        # Extended resources: request must equal limit. The device plugin then hands the
        # container the devices it allocated (on Ascend: the /dev/davinciN nodes, or
        # ASCEND_VISIBLE_DEVICES for Ascend Docker Runtime; render/ascend.py): the pod
        # names no device itself.
        requests[device] = limits[device] = str(res.devices)
    overrides = ctx.service.spec.pod_overrides
    if overrides is not None and overrides.resources is not None:
        requests.update(_override_values(overrides.resources.requests, device))
        limits.update(_override_values(overrides.resources.limits, device))
    return {"requests": requests, "limits": limits}


def gateway_resources(config: OperatorConfig) -> dict[str, dict[str, str]]:
    r = config.gateway_resources
    return {
        "requests": {"cpu": r.cpu_request, "memory": r.memory_request},
        "limits": {"cpu": r.cpu_limit, "memory": r.memory_limit},
    }


# ---------------------------------------------------------------- containers


def _env_list(pairs: tuple[tuple[str, str], ...], extra: list[tuple[str, str]]) -> list[Any]:
    merged = dict(pairs)
    merged.update(extra)  # a user's podOverrides.env wins over our defaults
    return [{"name": k, "value": v} for k, v in merged.items()]


def engine_image(ctx: PoolContext) -> str:
    return engine_image_of(ctx.service, ctx.plan)


def engine_env(ctx: PoolContext) -> tuple[tuple[str, str], ...]:
    """The engine's environment before the user's podOverrides.env (which wins)."""
    return (*(VLLM_ENV if ctx.engine == "vllm" else LLAMACPP_ENV),
            *ascend_env(ctx.plan.profile))


def model_parsers(ctx: PoolContext) -> VllmParsers:
    """vLLM's parsers for the model: the GLMService's spec.parsers, else derived from the
    architecture and the generation the ModelVersion's source or name gives (GLM-4.7)."""
    chosen = ctx.service.spec.parsers
    names = (ctx.model_version.spec.source.uri, ctx.model_version.metadata.name or "")
    return vllm_parsers(ctx.plan.request.facts.architecture, names,
                        chosen.tool_call if chosen else None, chosen.reasoning if chosen else None)


def engine_container(ctx: PoolContext) -> dict[str, Any]:
    config = ctx.config
    argv = engine_argv(
        ctx.plan,
        f"{MODEL_MOUNT}/{model_relative_path(ctx.model_version)}",
        config.engine_port,
        ctx.service_name,
        ctx.service.spec.engine_args or (),
        threads=overridden_threads(ctx),
        rpc_servers=ctx.rpc_servers,
        parsers=model_parsers(ctx),
    )
    split = 2 if ctx.engine == "vllm" else 1  # `vllm serve` vs `llama-server`
    overrides = ctx.service.spec.pod_overrides
    user_env = [(e.name, e.value) for e in (overrides.env or [])] if overrides else []
    mounts: list[dict[str, Any]] = [
        {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if ctx.plan.resources.shared_memory_bytes:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    mounts += driver_mounts(ctx.plan.profile, ctx.config)
    env = _env_list(engine_env(ctx), user_env)
    # The engine stops only after the gateway has drained: SIGTERM would end its
    # generations (llama-server and vLLM both stop at once).
    lifecycle: dict[str, Any] = pre_stop_sleep(termination(ctx).engine_wait_seconds)
    if any(f"$({POD_NAME_ENV})" in a for a in argv):
        env.insert(0, POD_NAME_VAR)
    env += group_env(ctx.plan)
    if ctx.plan.vllm is not None and ctx.plan.vllm.pipeline_parallel_size > 1:
        # The leader of a vLLM group: a Ray head in this container (it must see this
        # node's devices), started beside `vllm serve`, whose Ray executor connects to it and
        # waits for the workers' Ray nodes to join.
        env.append({"name": "RAY_ADDRESS", "value": f"127.0.0.1:{RAY_PORT}"})
        lifecycle = {"postStart": {"exec": {"command": ray_head_argv()}}, **lifecycle}
    return {
        "name": ENGINE_CONTAINER,
        "image": engine_image(ctx),
        "command": argv[:split],
        "args": argv[split:],
        # No `ports`: the engine is reachable on loopback only, never through a Service.
        "env": env,
        "lifecycle": lifecycle,
        "resources": engine_resources(ctx),
        "volumeMounts": mounts,
        **engine_probes(ctx),
        "securityContext": container_security_context(config),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def rate_limit_store(service: GLMService, config: OperatorConfig) -> RateLimitStore | None:
    """The Redis the service's gateways share their buckets in (api/rate_limit_store.py)."""
    return service_store(service.metadata.annotations,
                         service.spec.gateway.rate_limit is not None, config.rate_limit_store)


def rate_limit_flags(service: GLMService, config: OperatorConfig) -> dict[str, Any]:
    """requestsPerMinute -> the gateway's per-second bucket (burst defaults to 10 s worth);
    tokensPerMinute -> its per-key token budget (prompt + completion, charged from usage)."""
    limit = service.spec.gateway.rate_limit
    if limit is None:
        return {}
    flags: dict[str, Any] = {}
    if limit.requests_per_minute is not None:
        flags["rate_limit_rps"] = limit.requests_per_minute / 60
        flags["rate_limit_burst"] = limit.burst or max(1, limit.requests_per_minute // 6)
    if limit.tokens_per_minute is not None:
        flags["rate_limit_tokens_per_minute"] = limit.tokens_per_minute
    store = rate_limit_store(service, config)
    if store is not None:
        # The password is not here: rate_limit_env passes it from its Secret.
        flags["rate_limit_redis"] = store.redis.address
        flags["rate_limit_store_unavailable"] = store.on_unavailable.lower()
        flags["rate_limit_store_timeout"] = duration_seconds(store.timeout)
        flags["rate_limit_redis_tls"] = store.redis.tls
    return flags


def rate_limit_env(service: GLMService, config: OperatorConfig) -> list[dict[str, Any]]:
    """The shared store's password, from its Secret key straight into the environment: never
    in the args or the pod spec's plain values."""
    store = rate_limit_store(service, config)
    secret = store.redis.password_secret if store is not None else None
    if secret is None:
        return []
    return [{"name": gateway_flags.REDIS_PASSWORD_ENV,
             "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}]


def engine_context_and_slots(plan: Plan) -> tuple[int, int]:
    if plan.llamacpp is not None:
        return plan.llamacpp.ctx_per_slot, plan.llamacpp.parallel
    if plan.vllm is not None:
        return plan.vllm.max_model_len, plan.vllm.max_num_seqs
    raise RenderInputError("plan has neither llama.cpp nor vLLM settings")


def gateway_flag_values(ctx: PoolContext) -> dict[str, Any]:
    """What the gateway is told, by flag (gateway/flags.py: None, False or [] leave a flag
    out); the order is the arguments' order."""
    config = ctx.config
    context, slots = engine_context_and_slots(ctx.plan)
    gw = ctx.service.spec.gateway
    flags: dict[str, Any] = {
        "port": config.gateway_port,
        "engine_url": f"http://127.0.0.1:{config.engine_port}",
        "service_name": ctx.service_name,
        "model_version": ctx.version,
        "pool": ctx.pool,
        "namespace": ctx.namespace,
        "context_length": context,
        "engine_slots": slots,
        "engine_socket": engine_socket(ctx.plan),
    }
    if ctx.long_context_url and ctx.long_context_deployment:
        flags["long_context_url"] = ctx.long_context_url
        flags["long_context_deployment"] = ctx.long_context_deployment
        flags["wake_timeout"] = ctx.wake_timeout_seconds
    flags["activity_lease"] = ctx.activity_lease or None
    flags["api_keys"] = Path(API_KEYS_MOUNT) if gw.api_keys_secret else None
    flags.update(rate_limit_flags(ctx.service, ctx.config))
    flags["stop"] = list(stop_sequences(ctx.plan.request.facts.architecture))
    flags["audit"] = "stdout" if gw.audit.enabled else "off"
    flags["audit_include_text"] = gw.audit.enabled and gw.audit.include_prompts
    flags["drain_seconds"] = termination(ctx).drain_seconds
    flags.update(overdue_flags(ctx))
    return flags


# A stream with no first token after this long counts as overdue (canary analysis) when the
# rollout sets no TTFT gate: far above any prefill, and a hung engine still shows within
# about one analysis interval.
DEFAULT_FIRST_TOKEN_OVERDUE_SECONDS = 60


def overdue_flags(ctx: PoolContext) -> dict[str, Any]:
    """When a running request counts as failing (gateway/metrics.py REQUESTS_OVERDUE): past
    the longest generation the pool allows, or, a stream, without a first token after the
    rollout's TTFT gate (else DEFAULT_FIRST_TOKEN_OVERDUE_SECONDS), never above the first."""
    longest = longest_generation_seconds(ctx)
    analysis = ctx.service.spec.rollout.analysis
    gate_ms = analysis.max_time_to_first_token_p99_ms if analysis is not None else None
    first = gate_ms / 1000 if gate_ms else DEFAULT_FIRST_TOKEN_OVERDUE_SECONDS
    return {"first_token_overdue": min(float(first), float(longest)),
            "request_overdue": float(longest)}


def api_keys_mount() -> dict[str, Any]:
    """The keys Secret in a container that checks keys (the pods' gateways, the router): a
    directory mount (no subPath), so the kubelet updates it when keys rotate."""
    return {"name": API_KEYS_VOLUME, "mountPath": API_KEYS_MOUNT, "readOnly": True}


def api_keys_volume(secret: str) -> dict[str, Any]:
    """The keys Secret as a pod's volume, readable by the pod's group (fsGroup) only."""
    return {"name": API_KEYS_VOLUME, "secret": {"secretName": secret, "defaultMode": 0o440}}


def gateway_container(ctx: PoolContext) -> dict[str, Any]:
    config = ctx.config
    mounts: list[dict[str, Any]] = [{"name": "gateway-tmp", "mountPath": "/tmp"}]
    if ctx.service.spec.gateway.api_keys_secret:
        mounts.append(api_keys_mount())
    args = ["gateway", *gateway_flags.write(gateway_flag_values(ctx))]
    env = rate_limit_env(ctx.service, ctx.config)
    return {
        "name": GATEWAY_CONTAINER,
        "image": config.operator_image,
        "command": ["glm-operator"],
        "args": args,
        **({"env": env} if env else {}),
        "ports": [{"name": GATEWAY_PORT_NAME, "containerPort": config.gateway_port,
                   "protocol": "TCP"}],
        # Serving on while the endpoints drop the pod (it is not ready from the moment it
        # is deleted): SIGTERM, and the end of accepting, come after this.
        "lifecycle": pre_stop_sleep(termination(ctx).endpoint_removal_seconds),
        "resources": gateway_resources(config),
        "volumeMounts": mounts,
        **gateway_probes(config),
        "securityContext": container_security_context(config),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


# ---------------------------------------------------------------- scheduling and volumes


def node_affinity(plan: Plan) -> dict[str, Any] | None:
    """Required node affinity on the labels GPU Feature Discovery / the Ascend plugin publish."""
    labels = plan.profile.node_labels
    if not labels:
        return None
    expressions = [{"key": k, "operator": "In", "values": list(v)} for k, v in labels.items()]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}


def cache_affinity(ctx: PoolContext) -> dict[str, Any] | None:
    """A ReadWriteOnce cache is mounted by one node: every pod of the version (any pool, any
    service in the namespace) goes where the version's pods already run.

    Required pod affinity on kubernetes.io/hostname with the pods carrying the version's
    label, which the real kube-scheduler honours as it is: the first pod, matching its own
    term with no other pod to follow, may land on any node (the scheduler's rule for a pod
    that satisfies its own affinity), the rest on its node. Pinning to the node the fetch Job
    ran on would not do: that pod is gone once Succeeded (the scheduler does not see finished
    pods), and a network volume (EBS, PD) attaches wherever the first consumer lands.
    Multi-node groups with such a cache are refused before rendering
    (decide/cache_placement.py)."""
    if ctx.model_version.spec.cache.access_mode != "ReadWriteOnce" or ctx.plan.request.nodes > 1:
        return None
    return {"labelSelector": {"matchLabels": {VERSION_LABEL: label_value(ctx.version)}},
            "topologyKey": HOSTNAME_TOPOLOGY}


def tolerations(ctx: PoolContext) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [t.to_dict() for t in ctx.plan.profile.tolerations]
    overrides = ctx.service.spec.pod_overrides
    if overrides is not None and overrides.tolerations:
        out += [t.model_dump(by_alias=True, exclude_none=True) for t in overrides.tolerations]
    return out


def tmp_size(ctx: PoolContext) -> int:
    if ctx.engine == "llamacpp" and is_ascend(ctx.plan.profile):
        return ASCEND_LLAMACPP_TMP_SIZE
    return TMP_SIZE[ctx.engine]


def volumes(ctx: PoolContext) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "model", "persistentVolumeClaim": {
            "claimName": cache_claim_name(ctx.model_version), "readOnly": True}},
        {"name": "tmp", "emptyDir": {"sizeLimit": memory_quantity(tmp_size(ctx))}},
        {"name": "gateway-tmp", "emptyDir": {"sizeLimit": memory_quantity(GATEWAY_TMP_SIZE)}},
    ]
    shm = ctx.plan.resources.shared_memory_bytes
    if shm:
        # Tensor-parallel workers exchange tensors through /dev/shm (64 MiB by default).
        out.append({"name": "dshm", "emptyDir": {"medium": "Memory",
                                                 "sizeLimit": memory_quantity(shm)}})
    secret = ctx.service.spec.gateway.api_keys_secret
    if secret:
        out.append(api_keys_volume(secret))
    return out + driver_volumes(ctx.plan.profile, ctx.config)


def engine_pod_security_context(ctx: PoolContext) -> dict[str, Any]:
    """The pod's security context, joined to the groups that own its devices (Ascend)."""
    context = pod_security_context(ctx.config)
    groups = device_groups(ctx.plan.profile, ctx.config)
    if groups:
        context["supplementalGroups"] = groups
    return context


def placement(ctx: PoolContext) -> dict[str, Any]:
    """Priority class, node selector, affinity and tolerations of every pod of the pool."""
    out: dict[str, Any] = {}
    overrides = ctx.service.spec.pod_overrides
    if overrides is not None and overrides.priority_class_name:
        out["priorityClassName"] = overrides.priority_class_name
    if overrides is not None and overrides.node_selector:
        out["nodeSelector"] = dict(overrides.node_selector)
    affinity = (copy.deepcopy(overrides.affinity)  # never hand out the input's own dict
                if overrides is not None and overrides.affinity else node_affinity(ctx.plan))
    pinned = cache_affinity(ctx)
    if pinned is not None:  # added to the user's own affinity, never replaced by it
        affinity = dict(affinity or {})
        pod_affinity = dict(affinity.get("podAffinity") or {})
        required = "requiredDuringSchedulingIgnoredDuringExecution"
        pod_affinity[required] = [*(pod_affinity.get(required) or []), pinned]
        affinity["podAffinity"] = pod_affinity
    fit = pool_architectures(ctx.service, ctx.plan, ctx.config)
    if fit.problem is not None:  # refused before rendering (decide/image_architecture.py)
        raise RenderInputError(fit.problem)
    # Kept even under the user's own affinity, which replaces the profile's labels only: a
    # pod on a node its images have no build for never starts (exec format error).
    out["affinity"] = pin_architectures(affinity, fit.architectures)
    tol = tolerations(ctx)
    if tol:
        out["tolerations"] = tol
    return out


ZONE_TOPOLOGY = "topology.kubernetes.io/zone"
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"  # set by the Deployment controller


def topology_spread(ctx: PoolContext) -> list[dict[str, Any]]:
    """A single-node pool's replicas spread over nodes, then zones, so one drained node (or
    one lost zone) takes as few of them as the cluster allows.

    ScheduleAnyway on both: accelerators are scarce, and a replica left Pending because the
    only node with a free GPU already runs one is capacity lost for certain, against a node
    failure that may not come; the PodDisruptionBudget is what keeps a drain from taking the
    last ready replica. Zones are a preference for the same reason, and nodes without the
    zone label must not refuse the pod (DoNotSchedule filters them out). `pod-template-hash`
    counts only the pods of one ReplicaSet, so a rollout's new pods spread among themselves.
    Multi-node groups get none: their pods already land on distinct nodes, and spreading a
    group's pods over zones would put its RPC or Ray traffic between zones.
    """
    if ctx.plan.request.nodes > 1:
        return []
    selector = {"matchLabels": pool_selector(ctx.service_name, ctx.version, ctx.pool)}
    return [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": copy.deepcopy(selector),
             "matchLabelKeys": [POD_TEMPLATE_HASH_LABEL]}
            for key in (HOSTNAME_TOPOLOGY, ZONE_TOPOLOGY)]


def pod_spec(ctx: PoolContext) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if ctx.service_account:
        spec["serviceAccountName"] = ctx.service_account
    # Only gateways that wake the long-context pool or mark its activity talk to the API
    # server.
    spec["automountServiceAccountToken"] = bool(ctx.service_account)
    spec["enableServiceLinks"] = False  # thousands of Services must not become env vars
    spec["securityContext"] = engine_pod_security_context(ctx)
    spec.update(pull_secrets(ctx.config))
    spec.update(placement(ctx))
    spread = topology_spread(ctx)
    if spread:
        spec["topologySpreadConstraints"] = spread
    spec["terminationGracePeriodSeconds"] = termination(ctx).grace_seconds
    spec["containers"] = [engine_container(ctx), gateway_container(ctx)]
    spec["volumes"] = volumes(ctx)
    return spec
