"""The router's settings, from the flags of flags.py's ROUTER_FLAGS."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from glm_operator.gateway.config import api_access
from glm_operator.gateway.flags import PICKER_FAILURE_MODES, PickerFailureMode


@dataclass(frozen=True)
class RouterConfig:
    service_name: str
    namespace: str
    routes_configmap: str
    api_server: str
    token_path: Path
    ca_path: Path | None
    host: str = "0.0.0.0"
    # The service's keys Secret, mounted as the pods' gateways mount it; None: an Open
    # service, no key asked for.
    api_keys_path: Path | None = None
    port: int = 8080
    picker_address: str = ""
    picker_timeout_seconds: float = 0.1
    picker_failure_mode: PickerFailureMode = "open"
    pod_port: int = 8080
    max_waiting: int = 256
    chars_per_token: float = 4.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_connections: int = 1024
    max_buffered_bytes: int = 64 * 1024 * 1024
    write_stall_timeout_seconds: float = 30.0
    connect_timeout_seconds: float = 2.0
    read_timeout_seconds: float = 600.0
    drain_seconds: float = 25.0

    def __post_init__(self) -> None:
        if self.picker_failure_mode not in PICKER_FAILURE_MODES:
            raise ValueError(f"--picker-failure-mode must be one of {PICKER_FAILURE_MODES}")
        if not 0 < self.picker_timeout_seconds <= 30:
            raise ValueError("--picker-timeout must be in (0, 30] seconds")
        if not 1 <= self.max_waiting <= 100_000:
            raise ValueError("--max-waiting must be 1..100000")
        if not 0.5 <= self.chars_per_token <= 16:
            raise ValueError("--chars-per-token must be 0.5..16")
        if not 1 <= self.pod_port <= 65535:
            raise ValueError("--pod-port must be a port number")


def from_args(args: argparse.Namespace) -> RouterConfig:
    access = api_access(args)
    return RouterConfig(
        service_name=args.service_name, namespace=access["namespace"],
        routes_configmap=args.routes_configmap, api_server=access["api_server"],
        token_path=access["token_path"], ca_path=access["ca_path"], host=args.host,
        api_keys_path=args.api_keys,
        port=args.port, picker_address=args.picker_address,
        picker_timeout_seconds=args.picker_timeout,
        picker_failure_mode=args.picker_failure_mode, pod_port=args.pod_port,
        max_waiting=args.max_waiting, chars_per_token=args.chars_per_token,
        max_body_bytes=args.max_body_bytes, max_connections=args.max_connections,
        max_buffered_bytes=args.max_buffered_bytes,
        write_stall_timeout_seconds=args.write_stall_timeout,
        connect_timeout_seconds=args.connect_timeout,
        read_timeout_seconds=args.read_timeout, drain_seconds=args.drain_seconds)
