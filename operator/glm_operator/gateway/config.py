"""The gateway's settings: one frozen dataclass, filled from CLI flags whose defaults come from
`GLM_GATEWAY_*` environment variables (the renderer may set either)."""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from glm_operator.gateway.relay import EngineAddress

Pool = Literal["main", "long-context"]
POOLS: tuple[Pool, ...] = ("main", "long-context")
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class WakeConfig:
    """How to wake the long-context pool from zero: the Deployment's scale subresource."""

    deployment: str
    namespace: str
    api_server: str
    token_path: Path
    ca_path: Path | None
    health_path: str = "/readyz"
    timeout_seconds: float = 300.0
    poll_seconds: float = 0.5
    retry_after_seconds: int = 30


OnUnavailable = Literal["allow", "deny"]
ON_UNAVAILABLE: tuple[OnUnavailable, ...] = ("allow", "deny")
# Only from the environment (a Secret's key, in the pod): a flag would show in the pod spec
# and in `ps`.
REDIS_PASSWORD_ENV = "GLM_GATEWAY_RATE_LIMIT_REDIS_PASSWORD"


@dataclass(frozen=True)
class RateLimitStoreConfig:
    """Where the service's shared rate-limit buckets live (ratelimit_store.py)."""

    address: str  # host:port of a Redis
    namespace: str  # with the service name, the buckets' key prefix
    tls: bool = False
    password: str = field(default="", repr=False)
    on_unavailable: OnUnavailable = "allow"  # allow: per-pod buckets; deny: 503
    timeout_seconds: float = 0.05

    def __post_init__(self) -> None:
        if self.on_unavailable not in ON_UNAVAILABLE:
            raise ValueError(f"on_unavailable must be one of {ON_UNAVAILABLE}, "
                             f"got {self.on_unavailable!r}")
        split_address(self.address)
        if not 0 < self.timeout_seconds <= 5:
            raise ValueError("the rate-limit store timeout must be in (0, 5] seconds, "
                             f"got {self.timeout_seconds:g}")


def split_address(address: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the Redis address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class ActivityConfig:
    """The long-context pool's activity Lease: renewed by that pool's gateways while they
    serve, and by a main-pool gateway when it wakes the pool (docs/autoscaling.md)."""

    lease: str
    namespace: str
    api_server: str
    token_path: Path
    ca_path: Path | None
    identity: str  # written as the Lease's holderIdentity: the pod that saw the request


@dataclass(frozen=True)
class GatewayConfig:
    engine_url: str
    service_name: str
    # A Unix socket the engine also listens on ("@name": Linux's abstract namespace, shared by
    # the pod's containers); answers and streams go over it, probes and warm-up over the URL.
    engine_socket: str | None = None
    model_version: str = ""
    pool: Pool = "main"
    host: str = "0.0.0.0"
    port: int = 8080
    context_length: int = 0  # 0: read it from the engine (/props) at warm-up
    engine_slots: int = 0  # 0: unknown, queued gauge counts only gateway-held requests
    long_context_url: str | None = None
    wake: WakeConfig | None = None
    activity: ActivityConfig | None = None
    api_keys_path: Path | None = None
    rate_limit_rps: float = 0.0  # per key; 0 disables
    rate_limit_burst: int = 0  # 0: max(1, ceil(rps))
    rate_limit_tokens_per_minute: int = 0  # per key, prompt + completion; 0 disables
    rate_limit_store: RateLimitStoreConfig | None = None  # None: each pod counts on its own
    max_body_bytes: int = 4 * 1024 * 1024
    stop_sequences: tuple[str, ...] = ()
    audit: str = "off"  # off | stdout | a file path
    audit_include_text: bool = False
    connect_timeout_seconds: float = 2.0
    engine_health_timeout_seconds: float = 2.0  # /enginez and /readyz ask the engine's /health
    read_timeout_seconds: float = 600.0
    warmup: bool = True
    kv_cache_poll_seconds: float = 5.0  # 0: no KV-cache gauge

    def __post_init__(self) -> None:
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        if self.pool == "long-context" and self.long_context_url:
            raise ValueError("the long-context pool cannot overflow to another long-context pool")
        if self.engine_socket is not None:
            check_socket_name(self.engine_socket)
            if EngineAddress.parse(self.engine_url) is None:
                # The socket is for the relay, which speaks plain HTTP/1.1 at the URL's root;
                # other engines are reached by aiohttp's client.
                raise ValueError("--engine-socket needs an http:// --engine-url without a "
                                 f"path, got {self.engine_url!r}")

    @property
    def labels(self) -> dict[str, str]:
        return {"service": self.service_name, "model_version": self.model_version,
                "pool": self.pool}


# sockaddr_un.sun_path is 108 bytes on Linux: a path, or "\0" + an abstract name.
MAX_SOCKET_NAME = 107


def check_socket_name(name: str) -> None:
    if not name.startswith(("/", "@")) or len(name) < 2:
        raise ValueError(f"--engine-socket must be an absolute path or @name (an abstract "
                         f"socket), got {name!r}")
    if len(name.encode()) > MAX_SOCKET_NAME:
        raise ValueError(f"--engine-socket {name!r} is longer than {MAX_SOCKET_NAME} bytes, "
                         "the most a Unix socket address holds")


def _env(name: str, default: str = "") -> str:
    return os.environ.get(f"GLM_GATEWAY_{name}", default)


def _env_bool(name: str, default: bool) -> bool:
    raw = _env(name)
    if not raw:
        return default
    return raw.lower() in {"1", "true", "yes", "on"}


def _default_namespace() -> str:
    path = SERVICE_ACCOUNT_DIR / "namespace"
    try:
        return path.read_text().strip()
    except OSError:
        return "default"


def _default_api_server() -> str:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--host", default=_env("HOST", "0.0.0.0"), help="listen address [GLM_GATEWAY_HOST]")
    add("--port", type=int, default=int(_env("PORT", "8080")),
        help="listen port [GLM_GATEWAY_PORT]")
    add("--engine-url", default=_env("ENGINE_URL", "http://127.0.0.1:8081"),
        help="the engine container's base URL [GLM_GATEWAY_ENGINE_URL]")
    add("--engine-socket", default=_env("ENGINE_SOCKET") or None, metavar="PATH|@NAME",
        help="a Unix socket the engine also listens on: answers and streams go over it, "
             "probes and warm-up over --engine-url; a connection it refuses goes over TCP "
             "[GLM_GATEWAY_ENGINE_SOCKET]")
    add("--service-name", default=_env("SERVICE_NAME"), required=not _env("SERVICE_NAME"),
        help="the GLMService name; the model id in /v1/models [GLM_GATEWAY_SERVICE_NAME]")
    add("--model-version", default=_env("MODEL_VERSION"),
        help="the ModelVersion served; a metrics label [GLM_GATEWAY_MODEL_VERSION]")
    add("--pool", choices=POOLS, default=_env("POOL", "main"), help="[GLM_GATEWAY_POOL]")
    add("--context-length", type=int, default=int(_env("CONTEXT_LENGTH", "0")),
        help="context per request the engine serves; 0 reads it from the engine "
             "[GLM_GATEWAY_CONTEXT_LENGTH]")
    add("--engine-slots", type=int, default=int(_env("ENGINE_SLOTS", "0")),
        help="requests the engine runs at once (llama.cpp --parallel, vLLM --max-num-seqs); "
             "requests beyond it count as queued [GLM_GATEWAY_ENGINE_SLOTS]")
    add("--long-context-url", default=_env("LONG_CONTEXT_URL") or None,
        help="the long-context pool's Service URL; requests too long for this engine go there "
             "[GLM_GATEWAY_LONG_CONTEXT_URL]")
    add("--long-context-deployment", default=_env("LONG_CONTEXT_DEPLOYMENT") or None,
        help="the long-context Deployment to scale from zero [GLM_GATEWAY_LONG_CONTEXT_DEPLOYMENT]")
    add("--long-context-health-path", default=_env("LONG_CONTEXT_HEALTH_PATH", "/readyz"),
        help="path polled on the long-context URL while it wakes "
             "[GLM_GATEWAY_LONG_CONTEXT_HEALTH_PATH]")
    add("--wake-timeout", type=float, default=float(_env("WAKE_TIMEOUT", "300")),
        help="seconds a long request waits for the long-context pool; the operator sets it "
             "from the pool's planned load time [GLM_GATEWAY_WAKE_TIMEOUT]")
    add("--activity-lease", default=_env("ACTIVITY_LEASE") or None,
        help="the long-context pool's activity Lease: renewed while this long-context gateway "
             "serves, or when this main-pool gateway wakes the pool [GLM_GATEWAY_ACTIVITY_LEASE]")
    add("--namespace", default=_env("NAMESPACE") or _default_namespace(),
        help="namespace of the long-context Deployment and its activity Lease "
             "[GLM_GATEWAY_NAMESPACE]")
    add("--kube-api-server", default=_env("KUBE_API_SERVER") or _default_api_server(),
        help="API server URL for the scale and Lease calls [GLM_GATEWAY_KUBE_API_SERVER]")
    add("--kube-token-path", type=Path,
        default=Path(_env("KUBE_TOKEN_PATH", str(SERVICE_ACCOUNT_DIR / "token"))),
        help="ServiceAccount token file, re-read on each call [GLM_GATEWAY_KUBE_TOKEN_PATH]")
    add("--kube-ca-path", default=_env("KUBE_CA_PATH", str(SERVICE_ACCOUNT_DIR / "ca.crt")),
        help="CA bundle for the API server; empty disables verification (tests only) "
             "[GLM_GATEWAY_KUBE_CA_PATH]")
    add("--api-keys", type=Path, default=Path(p) if (p := _env("API_KEYS")) else None,
        help="a mounted Secret directory (each file one key) or a file (one key per line); "
             "unset disables auth [GLM_GATEWAY_API_KEYS]")
    add("--rate-limit-rps", type=float, default=float(_env("RATE_LIMIT_RPS", "0")),
        help="requests per second per key, 0 = unlimited [GLM_GATEWAY_RATE_LIMIT_RPS]")
    add("--rate-limit-burst", type=int, default=int(_env("RATE_LIMIT_BURST", "0")),
        help="token bucket size per key; 0 = max(1, ceil(rps)) [GLM_GATEWAY_RATE_LIMIT_BURST]")
    add("--rate-limit-tokens-per-minute", type=int,
        default=int(_env("RATE_LIMIT_TOKENS_PER_MINUTE", "0")),
        help="prompt + completion tokens per minute per key, charged from each answer's usage; "
             "0 = unlimited [GLM_GATEWAY_RATE_LIMIT_TOKENS_PER_MINUTE]")
    add("--rate-limit-redis", default=_env("RATE_LIMIT_REDIS") or None, metavar="HOST:PORT",
        help="a Redis shared by every replica of the service: the limits then hold for the "
             "service, not per pod; its password comes from $" + REDIS_PASSWORD_ENV +
             " only [GLM_GATEWAY_RATE_LIMIT_REDIS]")
    add("--rate-limit-redis-tls", action="store_true",
        default=_env_bool("RATE_LIMIT_REDIS_TLS", False),
        help="talk TLS to the Redis, verified against the system CAs "
             "[GLM_GATEWAY_RATE_LIMIT_REDIS_TLS]")
    add("--rate-limit-store-unavailable", choices=ON_UNAVAILABLE,
        default=_env("RATE_LIMIT_STORE_UNAVAILABLE", "allow"),
        help="when the Redis does not answer in time: allow = count in this pod's own "
             "buckets, deny = 503 [GLM_GATEWAY_RATE_LIMIT_STORE_UNAVAILABLE]")
    add("--rate-limit-store-timeout", type=float,
        default=float(_env("RATE_LIMIT_STORE_TIMEOUT", "0.05")),
        help="seconds the Redis may take per request before it counts as unavailable "
             "[GLM_GATEWAY_RATE_LIMIT_STORE_TIMEOUT]")
    add("--max-body-bytes", type=int, default=int(_env("MAX_BODY_BYTES", str(4 * 1024 * 1024))),
        help="request body limit, 413 above it [GLM_GATEWAY_MAX_BODY_BYTES]")
    add("--stop", action="append", default=None,
        help="a stop sequence of the model, added to every request (repeatable) "
             "[GLM_GATEWAY_STOP, newline-separated]")
    add("--audit", default=_env("AUDIT", "off"),
        help="off | stdout | a file path: one JSON line per request [GLM_GATEWAY_AUDIT]")
    add("--audit-include-text", action="store_true",
        default=_env_bool("AUDIT_INCLUDE_TEXT", False),
        help="also write prompt and completion text [GLM_GATEWAY_AUDIT_INCLUDE_TEXT]")
    add("--connect-timeout", type=float, default=float(_env("CONNECT_TIMEOUT", "2")),
        help="seconds to connect to the engine before 503 [GLM_GATEWAY_CONNECT_TIMEOUT]")
    add("--engine-health-timeout", type=float,
        default=float(_env("ENGINE_HEALTH_TIMEOUT", "2")),
        help="seconds the engine's /health may take before /enginez and /readyz answer 503 "
             "[GLM_GATEWAY_ENGINE_HEALTH_TIMEOUT]")
    add("--read-timeout", type=float, default=float(_env("READ_TIMEOUT", "600")),
        help="seconds without a byte from the engine before 504 [GLM_GATEWAY_READ_TIMEOUT]")
    add("--kv-cache-poll-seconds", type=float,
        default=float(_env("KV_CACHE_POLL_SECONDS", "5")),
        help="seconds between readings of the engine's KV-cache use (the "
             "glm_gateway_kv_cache_usage_ratio gauge); 0 disables "
             "[GLM_GATEWAY_KV_CACHE_POLL_SECONDS]")
    add("--no-warmup", dest="warmup", action="store_false", default=_env_bool("WARMUP", True),
        help="report ready without a warm-up request [GLM_GATEWAY_WARMUP=false]")


def _api_access(args: argparse.Namespace) -> dict[str, Any]:
    """Where and as whom the gateway calls the API server (the wake, the activity Lease)."""
    return {"namespace": args.namespace, "api_server": args.kube_api_server.rstrip("/"),
            "token_path": args.kube_token_path,
            "ca_path": Path(args.kube_ca_path) if args.kube_ca_path else None}


def from_args(args: argparse.Namespace) -> GatewayConfig:
    stops = args.stop if args.stop is not None else [s for s in _env("STOP").split("\n") if s]
    wake = None
    if args.long_context_deployment:
        if not args.long_context_url:
            raise ValueError("--long-context-deployment needs --long-context-url")
        wake = WakeConfig(
            deployment=args.long_context_deployment,
            **_api_access(args),
            health_path=args.long_context_health_path,
            timeout_seconds=args.wake_timeout,
        )
    store = None
    if args.rate_limit_redis:
        store = RateLimitStoreConfig(
            address=args.rate_limit_redis, namespace=args.namespace,
            tls=args.rate_limit_redis_tls, password=os.environ.get(REDIS_PASSWORD_ENV, ""),
            on_unavailable=args.rate_limit_store_unavailable,
            timeout_seconds=args.rate_limit_store_timeout,
        )
    activity = None
    if args.activity_lease:
        activity = ActivityConfig(
            lease=args.activity_lease, **_api_access(args),
            identity=socket.gethostname(),  # the pod's name in Kubernetes
        )
    return GatewayConfig(
        engine_url=args.engine_url.rstrip("/"),
        engine_socket=args.engine_socket,
        service_name=args.service_name,
        model_version=args.model_version,
        pool=args.pool,
        host=args.host,
        port=args.port,
        context_length=args.context_length,
        engine_slots=args.engine_slots,
        long_context_url=args.long_context_url.rstrip("/") if args.long_context_url else None,
        wake=wake,
        activity=activity,
        api_keys_path=args.api_keys,
        rate_limit_rps=args.rate_limit_rps,
        rate_limit_burst=args.rate_limit_burst,
        rate_limit_tokens_per_minute=args.rate_limit_tokens_per_minute,
        rate_limit_store=store,
        max_body_bytes=args.max_body_bytes,
        stop_sequences=tuple(stops),
        audit=args.audit,
        audit_include_text=args.audit_include_text,
        connect_timeout_seconds=args.connect_timeout,
        engine_health_timeout_seconds=args.engine_health_timeout,
        read_timeout_seconds=args.read_timeout,
        warmup=args.warmup,
        kv_cache_poll_seconds=args.kv_cache_poll_seconds,
    )
