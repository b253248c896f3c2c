"""Wake the long-context pool from zero.

The gateway makes exactly one kind of API call: read and set `replicas` on the long-context
Deployment's `scale` subresource, with the pod's own ServiceAccount token (its Role allows
get/patch/update on `deployments/scale` for that one Deployment and nothing else).

This is a plain HTTPS call on the gateway's aiohttp session rather than glm_operator.kube:
the official client is synchronous and costs more memory than the whole gateway budget
(60 MiB), and one GET and one PATCH need none of it.

Many overflowing requests at once share one wake: the first starts it, the rest await it.
Requests that fit the main pool never touch this.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable

import aiohttp

from glm_operator.gateway.config import WakeConfig

log = logging.getLogger(__name__)


class WakeError(RuntimeError):
    """The pool could not be woken; the message says why (API status, timeout)."""


class LongContextWaker:
    def __init__(self, config: WakeConfig, pool_url: str, session: aiohttp.ClientSession,
                 on_scale: Callable[[], None] = lambda: None) -> None:
        self._config = config
        self._pool_url = pool_url
        self._session = session
        self._on_scale = on_scale
        self._task: asyncio.Task[None] | None = None
        self._ssl: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(config.ca_path)) if config.ca_path else False
        )

    @property
    def scale_url(self) -> str:
        c = self._config
        return (f"{c.api_server}/apis/apps/v1/namespaces/{c.namespace}"
                f"/deployments/{c.deployment}/scale")

    def _headers(self) -> dict[str, str]:
        # Re-read each time: kubelet rotates projected ServiceAccount tokens.
        token = self._config.token_path.read_text().strip()
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    async def pool_ready(self, timeout: float = 2.0) -> bool:
        url = self._pool_url + self._config.health_path
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def scale_to_one_if_zero(self) -> bool:
        """Set replicas to 1 when it is 0; True when this call scaled. Never scales down."""
        timeout = aiohttp.ClientTimeout(total=10)
        async with self._session.get(self.scale_url, headers=self._headers(), ssl=self._ssl,
                                     timeout=timeout) as response:
            text = await response.text()
            if response.status != 200:
                raise WakeError(f"GET {self.scale_url}: HTTP {response.status}: {text[:300]}")
            replicas = (await response.json()).get("spec", {}).get("replicas", 0) or 0
        if replicas > 0:
            return False
        headers = {**self._headers(), "Content-Type": "application/merge-patch+json"}
        async with self._session.patch(self.scale_url, headers=headers, ssl=self._ssl,
                                       data=b'{"spec":{"replicas":1}}',
                                       timeout=timeout) as response:
            if response.status != 200:
                text = await response.text()
                raise WakeError(f"PATCH {self.scale_url}: HTTP {response.status}: {text[:300]}")
        log.info("scaled %s/%s from 0 to 1", self._config.namespace, self._config.deployment)
        self._on_scale()
        return True

    async def _wake(self) -> None:
        deadline = time.monotonic() + self._config.timeout_seconds
        await self.scale_to_one_if_zero()
        while time.monotonic() < deadline:
            if await self.pool_ready():
                return
            await asyncio.sleep(self._config.poll_seconds)
        raise WakeError(
            f"the long-context pool {self._config.deployment} was not ready after "
            f"{self._config.timeout_seconds:g} s"
        )

    async def ensure_awake(self) -> None:
        """Return when the pool answers its health check; raise WakeError otherwise."""
        if await self.pool_ready():
            return
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._wake())
        # shield: one impatient client going away must not cancel the wake for the others
        await asyncio.shield(self._task)
