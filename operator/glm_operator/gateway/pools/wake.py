"""Wake the long-context pool from zero.

The gateway sets the long-context Deployment's replicas from 0 to 1 through its scale
subresource (`glm_operator.kube.scale`, with the pod's own token), having first renewed the
pool's activity Lease (so the operator, which puts an idle pool back to sleep, counts the
wake as activity); then it polls the pool's health until it answers or the wake timeout
passes (the operator sets it from the pool's planned load time).

Many overflowing requests at once share one wake: the first starts it, the rest await it.
Requests that fit the main pool never touch this.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp

from glm_operator.gateway.config import WakeConfig
from glm_operator.kube.scale import DeploymentRef, DeploymentScale, ScaleError

log = logging.getLogger(__name__)


class WakeError(RuntimeError):
    """The pool could not be woken; the message says why (API status, timeout)."""


class LongContextWaker:
    def __init__(self, config: WakeConfig, pool_url: str, session: aiohttp.ClientSession,
                 on_scale: Callable[[], None] = lambda: None,
                 mark_activity: Callable[[], Awaitable[object]] | None = None) -> None:
        self._config = config
        self._pool_url = pool_url
        self._session = session
        self._on_scale = on_scale
        self._mark_activity = mark_activity
        self._task: asyncio.Task[None] | None = None
        self._scale = DeploymentScale(
            DeploymentRef(config.api_server, config.namespace, config.deployment),
            config.token_path, config.ca_path, session)

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
        try:
            if await self._scale.replicas() > 0:
                return False
            if self._mark_activity is not None:  # never fails: a failure is logged
                await self._mark_activity()
            await self._scale.set_replicas(1)
        except ScaleError as exc:
            raise WakeError(str(exc)) from None
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
