"""Every flag of `glm-operator gateway`, declared once: its name, its environment variable,
its type and default, its help, and how the renderer writes it.

The gateway parses this table (config.py); the renderer writes the gateway container's
arguments from it (render/pod.py). Pure on purpose: the operator imports it, so it imports
nothing of the gateway's runtime (no asyncio, no aiohttp).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ENV_PREFIX = "GLM_GATEWAY_"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

Pool = Literal["main", "long-context"]
POOLS: tuple[Pool, ...] = ("main", "long-context")
OnUnavailable = Literal["allow", "deny"]
ON_UNAVAILABLE: tuple[OnUnavailable, ...] = ("allow", "deny")
# Only from the environment (a Secret's key, in the pod): a flag would show in the pod spec
# and in `ps`.
REDIS_PASSWORD_ENV = "GLM_GATEWAY_RATE_LIMIT_REDIS_PASSWORD"

# value: `--name VALUE`; switch: `--name` sets True; off: `--name` sets False (its env var
# says the value itself, GLM_GATEWAY_WARMUP=false); repeated: `--name A --name B`, its env
# var newline-separated.
Kind = Literal["value", "switch", "off", "repeated"]


@dataclass(frozen=True)
class Flag:
    name: str  # "--rate-limit-rps"
    help: str  # the environment variable is added in brackets
    value_type: type = str  # what argparse makes of the text: str, int, float, Path
    default: Any = None  # when neither the flag nor its environment variable says
    kind: Kind = "value"
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    # A default computed when the gateway starts (the pod's namespace), not written here.
    default_from: Callable[[], Any] | None = None
    required: bool = False  # unless its environment variable is set
    dest_name: str = ""  # the value's name where it is not the flag's (--no-warmup: warmup)
    env_name: str = ""  # the variable's suffix where it is not the flag's

    @property
    def dest(self) -> str:
        return self.dest_name or self.name.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + (self.env_name or self.dest.upper())

    def write(self, value: Any) -> list[str]:
        """The arguments that give this flag `value` (None, False, []: none)."""
        if self.kind == "switch":
            return [self.name] if value else []
        if self.kind == "off":
            return [] if value else [self.name]
        if self.kind == "repeated":
            return [arg for item in value for arg in (self.name, str(item))]
        if value is None:
            return []
        return [self.name, f"{value:g}" if isinstance(value, float) else str(value)]


def default_namespace() -> str:
    path = SERVICE_ACCOUNT_DIR / "namespace"
    try:
        return path.read_text().strip()
    except OSError:
        return "default"


def default_api_server() -> str:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port}"


FLAGS: tuple[Flag, ...] = (
    Flag("--host", "listen address", default="0.0.0.0"),
    Flag("--port", "listen port", int, 8080),
    Flag("--engine-url", "the engine container's base URL", default="http://127.0.0.1:8081"),
    Flag("--engine-socket",
         "a Unix socket the engine also listens on: answers and streams go over it, probes "
         "and warm-up over --engine-url; a connection it refuses goes over TCP",
         metavar="PATH|@NAME"),
    Flag("--service-name", "the GLMService name; the model id in /v1/models", default="",
         required=True),
    Flag("--model-version", "the ModelVersion served; a metrics label", default=""),
    Flag("--pool", "", default="main", choices=POOLS),
    Flag("--context-length",
         "context per request the engine serves; 0 reads it from the engine", int, 0),
    Flag("--engine-slots",
         "requests the engine runs at once (llama.cpp --parallel, vLLM --max-num-seqs); "
         "requests beyond it count as queued", int, 0),
    Flag("--long-context-url",
         "the long-context pool's Service URL; requests too long for this engine go there"),
    Flag("--long-context-deployment", "the long-context Deployment to scale from zero"),
    Flag("--long-context-health-path", "path polled on the long-context URL while it wakes",
         default="/readyz"),
    Flag("--wake-timeout",
         "seconds a long request waits for the long-context pool; the operator sets it from "
         "the pool's planned load time", float, 300.0),
    Flag("--activity-lease",
         "the long-context pool's activity Lease: renewed while this long-context gateway "
         "serves, or when this main-pool gateway wakes the pool"),
    Flag("--namespace", "namespace of the long-context Deployment and its activity Lease",
         default_from=default_namespace),
    Flag("--kube-api-server", "API server URL for the scale and Lease calls",
         default_from=default_api_server),
    Flag("--kube-token-path", "ServiceAccount token file, re-read on each call", Path,
         SERVICE_ACCOUNT_DIR / "token"),
    Flag("--kube-ca-path",
         "CA bundle for the API server; empty disables verification (tests only)",
         default=str(SERVICE_ACCOUNT_DIR / "ca.crt")),
    Flag("--api-keys",
         "a mounted Secret directory (each file one key) or a file (one key per line); "
         "unset disables auth", Path),
    Flag("--rate-limit-rps", "requests per second per key, 0 = unlimited", float, 0.0),
    Flag("--rate-limit-burst", "token bucket size per key; 0 = max(1, ceil(rps))", int, 0),
    Flag("--rate-limit-tokens-per-minute",
         "prompt + completion tokens per minute per key, charged from each answer's usage; "
         "0 = unlimited", int, 0),
    Flag("--rate-limit-redis",
         "a Redis shared by every replica of the service: the limits then hold for the "
         f"service, not per pod; its password comes from ${REDIS_PASSWORD_ENV} only",
         metavar="HOST:PORT"),
    Flag("--rate-limit-redis-tls", "talk TLS to the Redis, verified against the system CAs",
         bool, False, "switch"),
    Flag("--rate-limit-store-unavailable",
         "when the Redis does not answer in time: allow = count in this pod's own buckets, "
         "deny = 503", default="allow", choices=ON_UNAVAILABLE),
    Flag("--rate-limit-store-timeout",
         "seconds the Redis may take per request before it counts as unavailable", float,
         0.05),
    Flag("--max-body-bytes", "request body limit, 413 above it", int, 4 * 1024 * 1024),
    Flag("--max-connections",
         "client connections held at once; one more is answered 503 and closed", int, 1024),
    Flag("--max-buffered-bytes",
         "request bytes all connections may hold at once (heads and bodies being read); a "
         "request that would pass it is answered 503", int, 64 * 1024 * 1024),
    Flag("--max-in-flight-per-key",
         "requests one API key may have running at once, 429 above it; 0 = unlimited", int,
         0),
    Flag("--write-stall-timeout",
         "seconds a client may leave written bytes unread before its stream is ended (499) "
         "and the engine's slot freed", float, 30.0),
    Flag("--first-token-overdue",
         "seconds a request may wait for its first byte of answer before it counts as "
         "overdue (glm_gateway_requests_overdue); 0 = never", float, 0.0),
    Flag("--request-overdue",
         "seconds a request may run in all before it counts as overdue; 0 = never (the "
         "operator sets both from the plan's longest generation)", float, 0.0),
    Flag("--drain-seconds",
         "after SIGTERM, seconds running requests get to finish (the operator sizes it from "
         "the longest generation the service allows)", float, 25.0),
    Flag("--stop", "a stop sequence of the model, added to every request (repeatable)",
         kind="repeated"),
    Flag("--audit", "off | stdout | a file path: one JSON line per request", default="off"),
    Flag("--audit-include-text", "also write prompt and completion text", bool, False,
         "switch"),
    Flag("--connect-timeout", "seconds to connect to the engine before 503", float, 2.0),
    Flag("--engine-health-timeout",
         "seconds the engine's /health may take before /enginez and /readyz answer 503",
         float, 2.0),
    Flag("--read-timeout", "seconds without a byte from the engine before 504", float, 600.0),
    Flag("--kv-cache-poll-seconds",
         "seconds between readings of the engine's KV-cache use (the "
         "glm_gateway_kv_cache_usage_ratio gauge); 0 disables", float, 5.0),
    Flag("--no-warmup", "report ready without a warm-up request", bool, True, "off",
         dest_name="warmup"),
)
BY_DEST: dict[str, Flag] = {flag.dest: flag for flag in FLAGS}

PickerFailureMode = Literal["open", "closed"]
PICKER_FAILURE_MODES: tuple[PickerFailureMode, ...] = ("open", "closed")

# `glm-operator router`: the router in front of a service's pools (glm_operator/router/). It
# shares the gateway's listener, its client limits, its API-server flags and its keys (the
# same Secret, checked before a request may wake a pool); rate limits and audit stay in the
# pods' gateways, so none of those flags is here.
ROUTER_SHARED = ("host", "port", "service_name", "namespace", "kube_api_server",
                 "kube_token_path", "kube_ca_path", "api_keys", "max_body_bytes",
                 "max_connections", "max_buffered_bytes", "write_stall_timeout",
                 "connect_timeout", "read_timeout", "drain_seconds")
ROUTER_FLAGS: tuple[Flag, ...] = (
    # `glm-operator gateway --router`, the router's first name (glm_operator/cli.py ALIASES),
    # in router pods rendered by older operators; the renderer no longer writes it.
    Flag("--router", "ignored: `glm-operator gateway --router` is this command's old name",
         bool, False, "switch"),
    *(BY_DEST[dest] for dest in ROUTER_SHARED),
    Flag("--routes-configmap",
         "the ConfigMap holding routes.json (versions, weights, pools), watched through the "
         "API server", required=True),
    Flag("--picker-address",
         "the endpoint picker's ext-proc gRPC address; empty: pick the least-loaded ready "
         "pod of the chosen version", default="", metavar="HOST:PORT"),
    Flag("--picker-timeout", "seconds the picker may take per request", float, 0.1),
    Flag("--picker-failure-mode",
         "when the picker fails or is slow: open = any ready pod of the chosen version, "
         "closed = 503 with Retry-After", default="open", choices=PICKER_FAILURE_MODES),
    Flag("--pod-port", "the pods' gateway port (the picker's target port)", int, 8080),
    Flag("--max-waiting",
         "requests held at once while a version wakes or has no ready pod; one more is 503",
         int, 256),
    Flag("--chars-per-token",
         "characters per token, to tell a prompt too long for the main pool without a "
         "tokenizer; the pods' own overflow remains the fallback", float, 4.0),
)
ROUTER_BY_DEST: dict[str, Flag] = {flag.dest: flag for flag in ROUTER_FLAGS}


def write_router(values: Mapping[str, Any]) -> list[str]:
    """The router's arguments for `values` (by flag dest, in the order given)."""
    return [arg for dest, value in values.items() for arg in ROUTER_BY_DEST[dest].write(value)]


def write(values: Mapping[str, Any]) -> list[str]:
    """The gateway's arguments for `values` (by flag dest, in the order given)."""
    return [arg for dest, value in values.items() for arg in BY_DEST[dest].write(value)]
