"""The route table the operator writes (the `<service>-routes` ConfigMap's `routes.json`), and
the exact split of requests between its versions. Pure: no I/O.

The table is the router's only input from the operator: which versions serve, with which
weights (the rollout's, the same numbers it gives a VirtualService), which Deployment each
version's main pool is (to wake it from zero), and the long-context pool's address. A table
that does not parse is refused whole: the router keeps the last good one and says why.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

MAX_VERSIONS = 16
MAX_TABLE_BYTES = 64 * 1024


class TableError(ValueError):
    """routes.json is not what the operator writes; the message names the field."""


@dataclass(frozen=True, slots=True)
class VersionRoute:
    name: str  # the ModelVersion (what x-glm-version names)
    weight: int  # percent of requests
    deployment: str  # its main pool's Deployment, scaled from zero when it sleeps
    min_replicas: int  # 0: the pool sleeps when idle, and a request wakes it
    wake_timeout_seconds: float  # how long a request waits for the pool to wake
    activity_lease: str | None  # renewed when a request wakes it
    label: str = ""  # its pods' version label, where it is not the name (a name over 63)

    @property
    def pod_label(self) -> str:
        return self.label or self.name


@dataclass(frozen=True, slots=True)
class LongContextRoute:
    """The long-context pool: its pods are found like the main pool's (by the pool label),
    one Deployment per version, woken from zero like a main pool."""

    context_tokens: int
    deployments: dict[str, str]  # version -> its long-context Deployment
    min_replicas: int
    wake_timeout_seconds: float
    activity_lease: str | None

    def route_for(self, version: VersionRoute) -> VersionRoute | None:
        """The version's long-context pool, as a route of its own (None: it has none)."""
        deployment = self.deployments.get(version.name)
        if deployment is None:
            return None
        return VersionRoute(version.name, version.weight, deployment, self.min_replicas,
                            self.wake_timeout_seconds, self.activity_lease, version.label)


@dataclass(frozen=True, slots=True)
class RouteTable:
    versions: tuple[VersionRoute, ...]
    main_context_tokens: int  # 0: unknown, every prompt goes to the main pool
    long_context: LongContextRoute | None

    def version(self, name: str) -> VersionRoute | None:
        return next((v for v in self.versions if v.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.versions)


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise TableError(f"{where}.{key} is missing")
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TableError(f"{where}.{key} must be {getattr(kind, '__name__', kind)}, "
                         f"got {value!r}")
    return value


def _wake_fields(item: dict[str, Any], where: str) -> tuple[int, float, str | None]:
    minimum = item.get("minReplicas", 1)
    if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 0:
        raise TableError(f"{where}.minReplicas must be a non-negative integer")
    timeout = item.get("wakeTimeoutSeconds", 300.0)
    if (not isinstance(timeout, int | float) or isinstance(timeout, bool)
            or not math.isfinite(timeout) or not 0 < timeout <= 86400):
        raise TableError(f"{where}.wakeTimeoutSeconds must be in (0, 86400]")
    lease = item.get("activityLease")
    if lease is not None and not isinstance(lease, str):
        raise TableError(f"{where}.activityLease must be a string or null")
    return minimum, float(timeout), lease or None


def _version(item: Any, index: int) -> VersionRoute:
    where = f"versions[{index}]"
    if not isinstance(item, dict):
        raise TableError(f"{where} must be an object")
    name = _field(item, "name", str, where)
    weight = _field(item, "weight", int, where)
    if not name or len(name) > 253:
        raise TableError(f"{where}.name must be 1 to 253 characters")
    label = item.get("podLabel", "")
    if not isinstance(label, str) or len(label) > 63:
        raise TableError(f"{where}.podLabel must be a label value (63 characters at most)")
    if not 0 <= weight <= 100:
        raise TableError(f"{where}.weight must be 0..100, got {weight}")
    return VersionRoute(name, weight, _field(item, "deployment", str, where),
                        *_wake_fields(item, where), label)


def _long_context(raw: Any) -> LongContextRoute | None:
    if raw is None:
        return None
    where = "routes.longContext"
    if not isinstance(raw, dict):
        raise TableError(f"{where} must be an object or null")
    context = _field(raw, "contextTokens", int, where)
    if context <= 0:
        raise TableError(f"{where}.contextTokens must be positive")
    deployments = _field(raw, "deployments", dict, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in deployments.items()):
        raise TableError(f"{where}.deployments must map version names to Deployment names")
    return LongContextRoute(context, dict(deployments), *_wake_fields(raw, where))


def parse(text: str | bytes) -> RouteTable:
    """The table in `text`; TableError names what is wrong."""
    if len(text) > MAX_TABLE_BYTES:
        raise TableError(f"routes.json is {len(text)} bytes, over {MAX_TABLE_BYTES}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise TableError(f"routes.json is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TableError("routes.json must be an object")
    items = _field(data, "versions", list, "routes")
    if not 1 <= len(items) <= MAX_VERSIONS:
        raise TableError(f"routes.versions must hold 1 to {MAX_VERSIONS} versions")
    versions = tuple(_version(item, i) for i, item in enumerate(items))
    if len({v.name for v in versions}) != len(versions):
        raise TableError("routes.versions names a version twice")
    total = sum(v.weight for v in versions)
    if total != 100:
        raise TableError(f"routes.versions weights sum to {total}, not 100")
    context = data.get("mainContextTokens", 0)
    if not isinstance(context, int) or isinstance(context, bool) or context < 0:
        raise TableError("routes.mainContextTokens must be a non-negative integer")
    long_context = _long_context(data.get("longContext"))
    return RouteTable(versions, context, long_context)


class WeightedSplit:
    """Smooth weighted round robin (nginx's): each request goes to the version furthest
    behind its share, so over any run of 100 requests each version gets its weight exactly
    (within one request), not a random draw's spread. Deterministic per router replica;
    replicas together stay within one request per replica of the weights."""

    def __init__(self, versions: tuple[VersionRoute, ...]) -> None:
        self._weights = [(v.name, v.weight) for v in versions if v.weight > 0]
        self._current = dict.fromkeys((name for name, _ in self._weights), 0)
        self._total = sum(weight for _, weight in self._weights)

    def next(self) -> str:
        best = ""
        best_value = -1 << 62
        for name, weight in self._weights:
            value = self._current[name] + weight
            self._current[name] = value
            if value > best_value:
                best, best_value = name, value
        self._current[best] -= self._total
        return best
