"""The share of the engine's KV cache in use (0..1), read off the request path.

The memory signal that moves with load: device memory does not (both engines allocate their
whole KV cache when they load), the cache's occupancy does. One reading for every engine:

- llama.cpp's llama-server (the pinned build exports no KV-cache figure in /metrics): its
  /slots (on by default) lists each slot's context (`n_ctx`), whether it is working
  (`is_processing`) and the tokens in its sequence (`n_prompt_tokens`: the prompt plus what
  has been generated so far). In use = the tokens of working slots over the slots' contexts
  summed (the `--ctx-size` the planner chose). An idle slot keeps its last prompt for reuse;
  that is not load, so it is not counted, and the gauge goes back to 0 between requests.
  (With `--kv-unified`, which the planner does not render, every slot reports the whole
  shared buffer as its context, and the share reads low by the number of slots.)
- vLLM: its own gauge `vllm:kv_cache_usage_perc` (0..1 despite the name;
  `vllm:gpu_cache_usage_perc` before 0.10), averaged over its engines.

A background task polls the engine every few seconds; Prometheus scrapes every 30 s, so the
reading is at most one poll old and the request path never waits for it. (A /slots answer
restarts the one-second quiet wait after which llama-server checks whether a non-streaming
client is still there: one call every few seconds delays that notice by a second at most.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Literal

import aiohttp

log = logging.getLogger(__name__)

Engine = Literal["llamacpp", "vllm"]
VLLM_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def llamacpp_usage(slots: Any) -> float | None:
    """The share in use from llama-server's /slots answer; None when it is not one."""
    if not isinstance(slots, list) or not slots:
        return None
    capacity = 0
    used = 0
    for slot in slots:
        if not isinstance(slot, dict) or not isinstance(slot.get("n_ctx"), int):
            return None
        capacity += slot["n_ctx"]
        tokens = slot.get("n_prompt_tokens")
        if slot.get("is_processing") and isinstance(tokens, int):
            used += tokens
    if capacity <= 0:
        return None
    return min(1.0, used / capacity)


def vllm_usage(metrics_text: str) -> float | None:
    """vLLM's KV-cache gauge from its /metrics text (the mean over engines); None if absent.

    A plain line scan: the page is tens of kilobytes of histograms, and only these lines
    matter."""
    for name in VLLM_GAUGES:
        values = []
        for line in metrics_text.splitlines():
            if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
                try:
                    values.append(float(line.rsplit(maxsplit=1)[-1]))
                except ValueError:
                    continue
        if values:
            return min(1.0, max(0.0, sum(values) / len(values)))
    return None


class KvCacheProbe:
    """Finds which engine it talks to (llama-server answers /slots, vLLM does not) and reads
    its KV-cache share; `poll` runs until cancelled and hands each reading to `publish`."""

    def __init__(self, engine_url: str, session: aiohttp.ClientSession,
                 publish: Callable[[float], None], interval_seconds: float,
                 timeout_seconds: float) -> None:
        self.engine_url = engine_url
        self.session = session
        self.publish = publish
        self.interval_seconds = interval_seconds
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.engine: Engine | None = None

    async def _get(self, path: str) -> tuple[int, bytes]:
        async with self.session.get(self.engine_url + path, timeout=self.timeout) as response:
            return response.status, await response.read()

    async def _read_llamacpp(self) -> float | None:
        status, body = await self._get("/slots")
        if status != 200:
            return None
        try:
            return llamacpp_usage(json.loads(body))
        except ValueError:
            return None

    async def _read_vllm(self) -> float | None:
        status, body = await self._get("/metrics")
        return vllm_usage(body.decode("utf-8", "replace")) if status == 200 else None

    async def read(self) -> float | None:
        """One reading, or None when the engine does not answer (yet) or has no figure."""
        if self.engine == "llamacpp":
            return await self._read_llamacpp()
        if self.engine == "vllm":
            return await self._read_vllm()
        usage = await self._read_llamacpp()
        if usage is not None:
            self.engine = "llamacpp"
            return usage
        usage = await self._read_vllm()
        if usage is not None:
            self.engine = "vllm"
        return usage

    async def poll(self) -> None:
        while True:
            try:
                usage = await self.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.debug("KV cache reading failed: %s", exc)
                usage = None
            if usage is not None:
                self.publish(usage)
            await asyncio.sleep(self.interval_seconds)
