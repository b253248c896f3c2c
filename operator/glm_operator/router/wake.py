"""Wake a version's main pool from zero: the first request for a version whose pool sleeps
(`minReplicas: 0`, no ready pod) sets its Deployment's replicas from 0 to 1 through the scale
subresource, having renewed the version's activity Lease first (so the operator, which puts
an idle pool back to sleep, counts the wake as activity). Requests meanwhile wait for a ready
pod in the router (pods.py), bounded in number and by the version's wake timeout.

Many requests share one wake per version: the first starts it, the rest find it running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from glm_operator.kube.scale import DeploymentScale, ScaleError

log = logging.getLogger(__name__)


class MainPoolWaker:
    def __init__(self, scale: DeploymentScale, mark_activity: Callable[[], Awaitable[object]],
                 on_wake: Callable[[], None]) -> None:
        self._scale = scale
        self._mark_activity = mark_activity
        self._on_wake = on_wake
        self._task: asyncio.Task[None] | None = None
        self.last_error = ""

    def wake(self) -> None:
        """Start a wake unless one runs; never waits (the caller waits for a ready pod)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._wake())

    async def _wake(self) -> None:
        try:
            if await self._scale.replicas() > 0:
                return  # awake already (starting, or another router woke it)
            await self._mark_activity()  # never fails: a failure is logged
            await self._scale.set_replicas(1)
        except (ScaleError, OSError, TimeoutError) as exc:
            self.last_error = str(exc)
            log.warning("could not wake %s: %s", self._scale.deployment.name, exc)
            return
        log.info("scaled %s/%s from 0 to 1", self._scale.deployment.namespace,
                 self._scale.deployment.name)
        self._on_wake()
