"""Renew the long-context pool's activity Lease, asynchronously, with the pod's own token.

The mark the operator reads to put the pool to sleep (decide/long_context.py): a merge
patch of `spec.renewTime` (and `spec.holderIdentity`, the pod that saw the request) under
the gateway's own field manager. The operator's applied intent holds only
`leaseDurationSeconds` (the pool's idleSeconds), which the answer carries back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import aiohttp

from glm_operator.kube.pod_api import PodTokenApi, micro_time

FIELD_MANAGER = "glm-gateway"


@dataclass(frozen=True)
class LeaseRef:
    api_server: str
    namespace: str
    name: str

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"


class ActivityLease:
    def __init__(self, lease: LeaseRef, identity: str, token_path: Path, ca_path: Path | None,
                 session: aiohttp.ClientSession) -> None:
        self.lease = lease
        self.identity = identity
        self._api = PodTokenApi(lease.api_server, token_path, ca_path, session)

    async def renew(self, moment: datetime) -> int | None:
        """Write `moment` as the last activity; returns the Lease's leaseDurationSeconds."""
        patch = {"spec": {"renewTime": micro_time(moment), "holderIdentity": self.identity}}
        written = await self._api.merge_patch(self.lease.path, json.dumps(patch).encode(),
                                              {"fieldManager": FIELD_MANAGER})
        duration = (written.get("spec") or {}).get("leaseDurationSeconds")
        return int(duration) if isinstance(duration, int) else None
