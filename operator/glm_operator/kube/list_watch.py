"""Keep a local copy of some objects current: list, then watch from the list's
resourceVersion, and list again when the watch ends or its version is too old (410).

For the router, which follows one service's pods and its route table with the pod's own
token (kube/pod_api.py): a selector keeps it to those objects, so a cluster of thousands of
services costs each router only its own. Importing this module must not import `kubernetes`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from glm_operator.kube.pod_api import ApiCallError, PodTokenApi

log = logging.getLogger(__name__)

RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)  # after a failed list, growing, then the last

Objects = dict[str, dict[str, Any]]  # by name
OnChange = Callable[[Objects], None]


class ListWatch:
    """`objects` (by name) follows the API server's; `on_change` sees each new state.
    `synced` is set once the first list is in."""

    def __init__(self, api: PodTokenApi, path: str, query: Mapping[str, str],
                 on_change: OnChange) -> None:
        self._api = api
        self._path = path
        self._query = dict(query)
        self._on_change = on_change
        self.objects: Objects = {}
        self.synced = asyncio.Event()
        self.last_error = ""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"watch {self._path}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                version = await self._list()
                failures = 0
                await self._watch(version)
            except asyncio.CancelledError:
                raise
            except (ApiCallError, OSError, ValueError, TimeoutError) as exc:
                # aiohttp's errors are OSErrors; a bad event is a ValueError (JSON)
                self.last_error = f"{type(exc).__name__}: {exc}"
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning("%s: %s; again in %g s", self._path, self.last_error, delay)
                await asyncio.sleep(delay)
            except Exception as exc:  # aiohttp.ClientError is not always an OSError
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: %s; again in 1 s", self._path, self.last_error)
                await asyncio.sleep(1.0)

    async def _list(self) -> str:
        listed = await self._api.get(self._path, self._query)
        self.objects = {item["metadata"]["name"]: item for item in listed.get("items", [])}
        self._changed()
        self.synced.set()
        return str(listed.get("metadata", {}).get("resourceVersion", ""))

    async def _watch(self, version: str) -> None:
        query = {**self._query, "resourceVersion": version}
        async for event in self._api.watch(self._path, query):
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":  # 410 Gone and the like: list again
                raise ApiCallError(f"watch ended: {obj.get('message', obj)}")
            if kind == "BOOKMARK":
                continue
            name = obj.get("metadata", {}).get("name")
            if not name:
                continue
            if kind == "DELETED":
                self.objects.pop(name, None)
            else:
                self.objects[name] = obj
            self._changed()

    def _changed(self) -> None:
        try:
            self._on_change(self.objects)
        except Exception:  # one bad object must not stop the watch
            log.exception("%s: applying a change failed", self._path)
