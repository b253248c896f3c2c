"""The gateway's settings: one frozen dataclass, filled from the flags of flags.py, whose
defaults come from their `GLM_GATEWAY_*` environment variables (the renderer may set
either)."""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glm_operator.gateway.flags import (
    BY_DEST,
    FLAGS,
    ON_UNAVAILABLE,
    Flag,
    OnUnavailable,
    Pool,
)
from glm_operator.gateway.flags import POOLS as POOLS
from glm_operator.gateway.flags import REDIS_PASSWORD_ENV as REDIS_PASSWORD_ENV
from glm_operator.gateway.wire.engine import EngineAddress

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


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
    max_connections: int = 1024
    max_buffered_bytes: int = 64 * 1024 * 1024
    max_in_flight_per_key: int = 0  # 0: unlimited
    write_stall_timeout_seconds: float = 30.0
    drain_seconds: float = 25.0
    first_token_overdue_seconds: float = 0.0  # 0: never
    request_overdue_seconds: float = 0.0  # 0: never
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
        for name in ("max_connections", "max_buffered_bytes", "write_stall_timeout_seconds",
                     "drain_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.first_token_overdue_seconds < 0 or self.request_overdue_seconds < 0:
            raise ValueError("the overdue bounds must be 0 (never) or more seconds")
        if self.max_in_flight_per_key < 0:
            raise ValueError("max_in_flight_per_key must be 0 (unlimited) or more, "
                             f"got {self.max_in_flight_per_key}")
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


def _env_default(flag: Flag) -> Any:
    """What the flag is when not given: its environment variable, else its default. An empty
    variable is unset, except for text whose default is text (`--kube-ca-path ""`)."""
    raw = os.environ.get(flag.env)
    if flag.kind in ("switch", "off"):
        return raw.lower() in TRUE_WORDS if raw else flag.default
    if raw is None or (raw == "" and not (flag.value_type is str
                                           and isinstance(flag.default, str))):
        return flag.default_from() if flag.default_from is not None else flag.default
    return flag.value_type(raw)


def _env_note(flag: Flag) -> str:
    if flag.kind == "repeated":
        return f"[{flag.env}, newline-separated]"
    if flag.kind == "off":
        return f"[{flag.env}=false]"
    return f"[{flag.env}]"


def add_arguments(parser: argparse.ArgumentParser, flags: tuple[Flag, ...] = FLAGS) -> None:
    """A table of flags (flags.py), with their environment variables as defaults."""
    for flag in flags:
        options: dict[str, Any] = {"help": f"{flag.help} {_env_note(flag)}".lstrip()}
        if flag.kind == "switch":
            options.update(action="store_true", default=_env_default(flag))
        elif flag.kind == "off":
            options.update(action="store_false", dest=flag.dest, default=_env_default(flag))
        elif flag.kind == "repeated":
            # The environment's list is read in from_args: given flags replace it, not add.
            options.update(action="append", default=None)
        else:
            default = _env_default(flag)
            options.update(default=default,
                           required=flag.required and not os.environ.get(flag.env))
            if flag.value_type is not str:
                options["type"] = flag.value_type
            if flag.choices is not None:
                options["choices"] = flag.choices
            if flag.metavar is not None:
                options["metavar"] = flag.metavar
        parser.add_argument(flag.name, **options)


def _repeated_from_env(flag: Flag) -> list[str]:
    return [item for item in os.environ.get(flag.env, "").split("\n") if item]


def api_access(args: argparse.Namespace) -> dict[str, Any]:
    """Where and as whom the gateway calls the API server (the wake, the activity Lease)."""
    return {"namespace": args.namespace, "api_server": args.kube_api_server.rstrip("/"),
            "token_path": args.kube_token_path,
            "ca_path": Path(args.kube_ca_path) if args.kube_ca_path else None}


def from_args(args: argparse.Namespace) -> GatewayConfig:
    stops = args.stop if args.stop is not None else _repeated_from_env(BY_DEST["stop"])
    wake = None
    if args.long_context_deployment:
        if not args.long_context_url:
            raise ValueError("--long-context-deployment needs --long-context-url")
        wake = WakeConfig(
            deployment=args.long_context_deployment,
            **api_access(args),
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
            lease=args.activity_lease, **api_access(args),
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
        max_connections=args.max_connections,
        max_buffered_bytes=args.max_buffered_bytes,
        max_in_flight_per_key=args.max_in_flight_per_key,
        write_stall_timeout_seconds=args.write_stall_timeout,
        drain_seconds=args.drain_seconds,
        first_token_overdue_seconds=args.first_token_overdue,
        request_overdue_seconds=args.request_overdue,
        stop_sequences=tuple(stops),
        audit=args.audit,
        audit_include_text=args.audit_include_text,
        connect_timeout_seconds=args.connect_timeout,
        engine_health_timeout_seconds=args.engine_health_timeout,
        read_timeout_seconds=args.read_timeout,
        warmup=args.warmup,
        kv_cache_poll_seconds=args.kv_cache_poll_seconds,
    )
