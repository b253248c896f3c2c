"""Read and set a Deployment's replicas through its `scale` subresource, asynchronously.

Used by the gateway sidecar to wake the long-context pool from zero, with the pod's own
ServiceAccount token (its Role allows get/patch/update on `deployments/scale` for that one
Deployment, and a patch of the pool's activity Lease). Importing this module must not
import `kubernetes` (see kube/pod_api.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import aiohttp

from glm_operator.kube.pod_api import ApiCallError, PodTokenApi

ScaleError = ApiCallError


@dataclass(frozen=True)
class DeploymentRef:
    api_server: str
    namespace: str
    name: str

    @property
    def scale_path(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.name}/scale"

    @property
    def scale_url(self) -> str:
        return self.api_server + self.scale_path


class DeploymentScale:
    def __init__(self, deployment: DeploymentRef, token_path: Path, ca_path: Path | None,
                 session: aiohttp.ClientSession) -> None:
        self.deployment = deployment
        self._api = PodTokenApi(deployment.api_server, token_path, ca_path, session)

    async def replicas(self) -> int:
        spec = (await self._api.get(self.deployment.scale_path)).get("spec", {})
        return int(spec.get("replicas", 0) or 0)

    async def set_replicas(self, replicas: int) -> None:
        await self._api.merge_patch(self.deployment.scale_path,
                                    b'{"spec":{"replicas":%d}}' % replicas)
