"""Read your own writes: what this operator wrote that its watch may not have shown yet.

A reconcile reads from the index, which the watch fills a moment after a write. Two writes
must be seen at once by the next reconcile, or it would decide from a stale read:

- the status (rollout state): the write was guarded by the resourceVersion it was based
  on, so an index still showing that version is stale, and the status written is used
  instead; any other version is at least as new as ours;
- a long-context Deployment scaled to zero: an index still at the version the scale was
  guarded by is stale. Without this, the next reconcile would take the pool for newly woken
  and record a deadline (and a last activity) for a pool that sleeps.
"""

from __future__ import annotations

import threading
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str]


class OwnWrites:
    def __init__(self) -> None:
        # key -> (the resourceVersion the write was based on, the one it produced, status)
        self.written: dict[Key, tuple[str, str, Obj]] = {}
        # (namespace, Deployment) -> the resourceVersion the scale to zero was guarded by
        self.scaled_to_zero: dict[Key, str] = {}
        self._lock = threading.Lock()

    def status_written(self, key: Key, base: str, produced: str, status: Obj) -> None:
        with self._lock:
            self.written[key] = (base, produced, status)

    def scaled(self, namespace: str, deployment: str, resource_version: str) -> None:
        with self._lock:
            self.scaled_to_zero[(namespace, deployment)] = resource_version

    def with_own_status(self, key: Key, body: Obj) -> Obj:
        """The body with the status this operator wrote, while the index has not caught up."""
        with self._lock:
            entry = self.written.get(key)
            if entry is None:
                return body
            base, produced, status = entry
            if body["metadata"].get("resourceVersion") != base:
                del self.written[key]
                return body
        return {**body, "status": status,
                "metadata": {**body["metadata"], "resourceVersion": produced}}

    def with_own_scales(self, namespace: str, children: list[Obj]) -> list[Obj]:
        """The children with the scales to zero this operator made, while the index has not
        caught up."""
        with self._lock:
            if not self.scaled_to_zero:
                return children
            out = []
            for child in children:
                meta = child.get("metadata", {})
                ref = (namespace, meta.get("name", ""))
                base = (self.scaled_to_zero.get(ref) if child.get("kind") == "Deployment"
                        else None)
                if base is not None and meta.get("resourceVersion") == base:
                    child = {**child, "spec": {**child.get("spec", {}), "replicas": 0}}
                elif base is not None:
                    del self.scaled_to_zero[ref]
                out.append(child)
            return out
