"""The service's ready pods, by pool and version, as the router sees them.

Pure apart from the `changed` event: `ready_by_version` reads pod objects (from the router's
watch) into addresses, and `ReadyPods` holds the current answer and wakes whoever waits for
a pool of a version to get its first ready pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from glm_operator.wellknown import MAIN_POOL, POOL_LABEL, VERSION_LABEL


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    name: str
    address: str  # "ip:port", as the picker names it

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


def _ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False  # terminating: its gateway drains, and takes no new work
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


PoolKey = tuple[str, str]  # (pool, version)


def ready_by_version(pods: Iterable[dict[str, Any]], port: int
                     ) -> dict[PoolKey, tuple[PodEndpoint, ...]]:
    by_key: dict[PoolKey, list[PodEndpoint]] = {}
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels") or {}
        version = labels.get(VERSION_LABEL)
        if not version or not _ready(pod):
            continue
        endpoint = PodEndpoint(pod["metadata"]["name"], _address(pod["status"]["podIP"], port))
        by_key.setdefault((labels.get(POOL_LABEL, MAIN_POOL), version), []).append(endpoint)
    return {key: tuple(sorted(endpoints, key=lambda e: e.name))
            for key, endpoints in by_key.items()}


class ReadyPods:
    def __init__(self, port: int) -> None:
        self._port = port
        self.by_version: dict[PoolKey, tuple[PodEndpoint, ...]] = {}
        self._changed = asyncio.Event()

    def update(self, pods: Iterable[dict[str, Any]]) -> None:
        self.by_version = ready_by_version(pods, self._port)
        self._changed.set()
        self._changed = asyncio.Event()

    def of(self, version: str, pool: str = MAIN_POOL) -> tuple[PodEndpoint, ...]:
        return self.by_version.get((pool, version), ())

    def find(self, address: str) -> PodEndpoint | None:
        for endpoints in self.by_version.values():
            for endpoint in endpoints:
                if endpoint.address == address:
                    return endpoint
        return None

    async def wait_for(self, version: str, timeout: float, pool: str = MAIN_POOL
                       ) -> tuple[PodEndpoint, ...]:
        """The pool's ready pods once it has one; () when `timeout` passes first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (ready := self.of(version, pool)):
            left = deadline - loop.time()
            if left <= 0:
                return ()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return ()
        return ready
