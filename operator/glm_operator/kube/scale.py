"""Read and set a Deployment's replicas through its `scale` subresource, asynchronously.

Used by the gateway sidecar to wake the long-context pool from zero, with the pod's own
ServiceAccount token (its Role allows get/patch/update on `deployments/scale` for that one
Deployment and nothing else).

This is a plain HTTPS call on the caller's aiohttp session rather than `kube.client`: the
official client is synchronous and costs more memory than the whole gateway budget (60 MiB),
and one GET and one PATCH need none of it. Importing this module must not import
`kubernetes`.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import aiohttp

REQUEST_TIMEOUT_SECONDS = 10.0


class ScaleError(RuntimeError):
    """The API server refused or failed a scale call; the message has the status and body."""


@dataclass(frozen=True)
class DeploymentRef:
    api_server: str
    namespace: str
    name: str

    @property
    def scale_url(self) -> str:
        return (f"{self.api_server}/apis/apps/v1/namespaces/{self.namespace}"
                f"/deployments/{self.name}/scale")


class DeploymentScale:
    def __init__(self, deployment: DeploymentRef, token_path: Path, ca_path: Path | None,
                 session: aiohttp.ClientSession) -> None:
        self.deployment = deployment
        self._token_path = token_path
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
        # None = no CA configured: TLS without verification (tests against a local server).
        self._ssl: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(ca_path)) if ca_path else False
        )

    def _headers(self) -> dict[str, str]:
        # Re-read each time: kubelet rotates projected ServiceAccount tokens.
        token = self._token_path.read_text().strip()
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    async def replicas(self) -> int:
        url = self.deployment.scale_url
        async with self._session.get(url, headers=self._headers(), ssl=self._ssl,
                                     timeout=self._timeout) as response:
            text = await response.text()
            if response.status != 200:
                raise ScaleError(f"GET {url}: HTTP {response.status}: {text[:300]}")
            spec = (await response.json()).get("spec", {})
        return int(spec.get("replicas", 0) or 0)

    async def set_replicas(self, replicas: int) -> None:
        url = self.deployment.scale_url
        headers = {**self._headers(), "Content-Type": "application/merge-patch+json"}
        body = b'{"spec":{"replicas":%d}}' % replicas
        async with self._session.patch(url, headers=headers, ssl=self._ssl, data=body,
                                       timeout=self._timeout) as response:
            if response.status != 200:
                text = await response.text()
                raise ScaleError(f"PATCH {url}: HTTP {response.status}: {text[:300]}")
