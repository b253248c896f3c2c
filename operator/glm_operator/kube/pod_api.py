"""Plain HTTPS calls to the API server with the pod's own ServiceAccount token, asynchronously.

What the gateway sidecar needs (wake the long-context pool, renew its activity Lease) is
one or two requests on the caller's aiohttp session: the official client is synchronous and
costs more memory than the whole gateway budget (60 MiB). Importing this module must not
import `kubernetes`.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

REQUEST_TIMEOUT_SECONDS = 10.0
# A watch's silence before it is opened again (the server sends bookmarks meanwhile, and
# ends a watch itself after its timeout), and the longest event it may send.
WATCH_READ_TIMEOUT_SECONDS = 330.0
MAX_WATCH_EVENT_BYTES = 8 * 1024 * 1024
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

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        return await self._request("GET", path, query=query)

    async def watch(self, path: str, query: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """The events of a watch on `path` (a list URL; `query` has resourceVersion and the
        selectors), one dict each, until the server ends it. An event longer than
        MAX_WATCH_EVENT_BYTES ends it too (ApiCallError): the caller lists again."""
        url = self.api_server + path
        params = {**query, "watch": "1", "allowWatchBookmarks": "true"}
        async with self._session.get(url, headers=self._headers(), ssl=self._ssl,
                                     params=params,
                                     timeout=aiohttp.ClientTimeout(
                                         total=None, sock_connect=REQUEST_TIMEOUT_SECONDS,
                                         sock_read=WATCH_READ_TIMEOUT_SECONDS)) as response:
            if response.status != 200:
                text = await response.text()
                raise ApiCallError(f"GET {url} (watch): HTTP {response.status}: {text[:300]}")
            pending = bytearray()
            async for data in response.content.iter_any():
                pending += data
                while (end := pending.find(b"\n")) >= 0:
                    line = bytes(pending[:end])
                    del pending[:end + 1]
                    if line.strip():
                        yield json.loads(line)
                if len(pending) > MAX_WATCH_EVENT_BYTES:
                    raise ApiCallError(f"GET {url} (watch): an event over "
                                       f"{MAX_WATCH_EVENT_BYTES} bytes")

    async def merge_patch(self, path: str, patch: bytes,
                          query: Mapping[str, str] | None = None) -> dict[str, Any]:
        return await self._request("PATCH", path, patch, query)
