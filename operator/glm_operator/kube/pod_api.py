"""Plain HTTPS calls to the API server with the pod's own ServiceAccount token, asynchronously.

What the gateway sidecar needs (wake the long-context pool, renew its activity Lease) is
one or two requests on the caller's aiohttp session: the official client is synchronous and
costs more memory than the whole gateway budget (60 MiB). Importing this module must not
import `kubernetes`.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

REQUEST_TIMEOUT_SECONDS = 10.0
MERGE_PATCH = "application/merge-patch+json"


class ApiCallError(RuntimeError):
    """The API server refused or failed a call; the message has the status and body."""


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class PodTokenApi:
    def __init__(self, api_server: str, token_path: Path, ca_path: Path | None,
                 session: aiohttp.ClientSession) -> None:
        self.api_server = api_server
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

    async def _request(self, method: str, path: str, data: bytes | None = None,
                       query: Mapping[str, str] | None = None) -> dict[str, Any]:
        url = self.api_server + path
        headers = self._headers()
        if data is not None:
            headers["Content-Type"] = MERGE_PATCH
        async with self._session.request(method, url, headers=headers, ssl=self._ssl,
                                         data=data, params=dict(query or {}),
                                         timeout=self._timeout) as response:
            text = await response.text()
            if response.status != 200:
                raise ApiCallError(f"{method} {url}: HTTP {response.status}: {text[:300]}")
            body: dict[str, Any] = await response.json()
        return body

    async def get(self, path: str) -> dict[str, Any]:
        return await self._request("GET", path)

    async def merge_patch(self, path: str, patch: bytes,
                          query: Mapping[str, str] | None = None) -> dict[str, Any]:
        return await self._request("PATCH", path, patch, query)
