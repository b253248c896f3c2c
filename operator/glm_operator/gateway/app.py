"""The gateway: an OpenAI-compatible front for one engine container.

This module wires the parts (docs/gateway.md, "Code map"): the routes of its own HTTP server
(wire/server.py), the pipeline behind /v1/* (proxy.py) and its upstreams (upstream.py), and
what runs beside the requests: the engine's probes and warm-up, the key refresher, the
KV-cache probe, the long-context pool's wake and activity. aiohttp's client serves what is
off the hot path: health, warm-up, the KV-cache probe, the long-context pool, the Kubernetes
API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from glm_operator.gateway.coalesce import Coalesced
from glm_operator.gateway.config import GatewayConfig, WakeConfig
from glm_operator.gateway.openai.errors import GatewayError
from glm_operator.gateway.policy.audit import AuditLog
from glm_operator.gateway.policy.keys import REFRESHER_STALL_SECONDS, ApiKeyStore, keep_fresh
from glm_operator.gateway.policy.limits import KeyLimits
from glm_operator.gateway.policy.metrics import GatewayMetrics
from glm_operator.gateway.pools.activity import ActivityMarker, activity_lease, renew_logged
from glm_operator.gateway.pools.kv_cache import KvCacheProbe
from glm_operator.gateway.pools.overflow import Overflow
from glm_operator.gateway.pools.wake import LongContextWaker
from glm_operator.gateway.proxy import Answer, Proxy, client_request_id, error_response
from glm_operator.gateway.upstream import (
    HttpUpstream,
    PooledEngine,
    RelayedEngine,
    StreamBooks,
    Upstream,
)
from glm_operator.gateway.wire.engine import AIOHTTP_KEEPALIVE_SECONDS, EngineAddress
from glm_operator.gateway.wire.engine_pool import EnginePool
from glm_operator.gateway.wire.messages import Request, Response, Router, json_response
from glm_operator.gateway.wire.relay import EngineConnector
from glm_operator.gateway.wire.server import HttpServer

log = logging.getLogger(__name__)

# An engine's exposition is a few hundred KiB at most (vLLM's histograms per model); more is
# not metrics, and is not held in this process.
MAX_ENGINE_METRICS_BYTES = 8 * 1024 * 1024


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.metrics = metrics = GatewayMetrics.create(config.service_name,
                                                       config.model_version, config.pool)
        keys = ApiKeyStore(config.api_keys_path, check_reloads_after=REFRESHER_STALL_SECONDS
                           ) if config.api_keys_path else None
        limits = KeyLimits.from_config(config, metrics)
        audit = AuditLog(config.audit, {"service": config.service_name,
                                        "model_version": config.model_version,
                                        "pool": config.pool}, config.audit_include_text)
        self.warmed = not config.warmup
        self.draining = False  # SIGTERM came: not ready, running requests finish (cli.py)
        self.started_at = int(time.time())
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        books = StreamBooks(
            # the estimate if the client leaves
            count_events=limits is not None and limits.limits.tokens_per_minute > 0,
            keep_all=audit.include_text)
        timeout = config.read_timeout_seconds
        engine: Upstream = HttpUpstream(lambda: self.session, config.engine_url, timeout, books)
        whole = streams = engine
        relayed: Upstream | None = None
        address = EngineAddress.parse(config.engine_url, config.engine_socket)
        self._engine_clients: list[EnginePool | EngineConnector] = []
        if address is not None:
            pool = EnginePool(address, config.connect_timeout_seconds, timeout)
            connector = EngineConnector(address, config.connect_timeout_seconds, timeout)
            self._engine_clients += [pool, connector]
            # Whole answers over kept-alive connections, streams through the relay.
            whole = PooledEngine(pool, config.engine_url, timeout)
            relayed = RelayedEngine(connector, config.engine_url, timeout, books)
        long_context = None if not config.long_context_url else HttpUpstream(
            lambda: self.session, config.long_context_url, timeout, books,
            forward_identity=True)
        overflow = Overflow(long_context, metrics, limits, (config.wake or WakeConfig
                                                            ).retry_after_seconds)
        self.proxy = Proxy(whole, streams, overflow, keys, limits, audit, metrics,
                           config.max_body_bytes, config.stop_sequences, config.context_length,
                           config.engine_slots, relayed, config.max_in_flight_per_key,
                           config.first_token_overdue_seconds, config.request_overdue_seconds,
                           served_model=config.service_name)
        labels = metrics.labels
        # Read when scraped, not written per request: the hot path only counts.
        metrics.in_flight.labels(**labels).set_function(lambda: self.proxy.in_flight)
        metrics.queued.labels(**labels).set_function(self.proxy.queued_now)
        metrics.overdue.labels(**labels).set_function(self.proxy.overdue_now)
        self._ready_gauge = metrics.ready.labels(**labels)
        # The engine's /health and /metrics, asked at most once at a time (coalesce.py).
        self._engine_health = Coalesced(self._fetch_engine_health)
        self._engine_metrics = Coalesced(self._fetch_engine_metrics)

    @property
    def activity(self) -> ActivityMarker | None:
        """The long-context pool's activity mark (its Lease), once started."""
        return self.proxy.activity

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the gateway is not started"
        return self._session

    def http_server(self) -> HttpServer:
        """The HTTP front (wire/server.py) with the gateway's caps: a body over max_body_bytes
        becomes a JSON 413, and a /v1/* request without a valid key is answered 401 from its
        head alone (before its body is read)."""
        config, proxy = self.config, self.proxy
        router = Router(self.not_found)
        check = proxy.refuse_unauthenticated if proxy.keys is not None else None
        router.add("POST", "/v1/chat/completions", proxy.chat_completions, check)
        router.add("POST", "/v1/completions", proxy.completions, check)
        for method in ("GET", "HEAD"):
            router.add(method, "/v1/models", self.models)
            router.add(method, "/healthz", self.healthz)
            router.add(method, "/readyz", self.readyz)
            router.add(method, "/enginez", self.enginez)
            router.add(method, "/metrics", self.metrics_endpoint)
            router.add(method, "/metrics/engine", self.engine_metrics)
        return HttpServer(router, config.max_body_bytes,
                          max_connections=config.max_connections,
                          max_buffered_bytes=config.max_buffered_bytes,
                          write_stall_timeout_seconds=config.write_stall_timeout_seconds,
                          drain_seconds=config.drain_seconds,
                          on_refusal=proxy.refused)

    async def start(self) -> None:
        """Open the engine session and start the background work (warm-up, probes)."""
        config, proxy = self.config, self.proxy
        timeout = aiohttp.ClientTimeout(total=None, connect=config.connect_timeout_seconds,
                                        sock_read=config.read_timeout_seconds)
        # Forget pooled connections before the engine closes them (wire/engine.py), or the
        # next request writes into a socket the engine has closed.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=AIOHTTP_KEEPALIVE_SECONDS,
                                         enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        lease = None
        if config.activity is not None:
            lease = activity_lease(config.activity, self._session)
            if config.pool == "long-context":
                proxy.activity = ActivityMarker(lease)
                self._tasks.append(asyncio.create_task(proxy.activity.run()))
        if config.wake is not None and config.long_context_url:
            proxy.overflow.waker = LongContextWaker(
                config.wake, config.long_context_url, self._session,
                on_scale=self.metrics.wakes.labels(**self.metrics.labels).inc,
                mark_activity=(lambda: renew_logged(lease)) if lease is not None else None,
            )
        self._tasks.append(asyncio.create_task(self._warm_up()))
        if proxy.keys is not None:
            self._tasks.append(asyncio.create_task(keep_fresh(proxy.keys)))
        if config.kv_cache_poll_seconds > 0:
            probe = KvCacheProbe(config.engine_url, self._session, self._publish_kv_cache,
                                 config.kv_cache_poll_seconds,
                                 config.engine_health_timeout_seconds)
            self._tasks.append(asyncio.create_task(probe.poll()))
        if proxy.limits is not None:
            self._tasks.append(asyncio.create_task(proxy.limits.start()))

    def _publish_kv_cache(self, usage: float) -> None:
        # The series appears with the first reading: no reading is not "0 % in use".
        self.metrics.kv_cache_usage.labels(**self.metrics.labels).set(usage)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._session is not None:
            await self._session.close()
        for client in self._engine_clients:
            client.close()
        self.proxy.audit.close()
        if self.proxy.limits is not None:
            await self.proxy.limits.close()

    async def _warm_up(self) -> None:
        """Wait for the engine to load, answer one tiny request, learn its context and slots."""
        delay = 0.2
        while True:
            try:
                if await self._engine_healthy():
                    await self._learn_engine_shape()
                    if not self.warmed:
                        async with self.session.post(
                            self.config.engine_url + "/v1/completions",
                            json={"prompt": "Hello", "max_tokens": 1, "temperature": 0},
                        ) as response:
                            await response.read()
                            if response.status == 200:
                                self.warmed = True
                    if self.warmed:
                        log.info("engine ready at %s (context %s, slots %s)",
                                 self.config.engine_url, self.proxy.context_length,
                                 self.proxy.engine_slots)
                        return
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.debug("engine not ready yet: %s", exc)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 1.5)

    async def _learn_engine_shape(self) -> None:
        proxy = self.proxy
        if proxy.context_length and proxy.engine_slots:
            return
        try:
            async with self.session.get(self.config.engine_url + "/props") as response:
                if response.status != 200:
                    return
                props: dict[str, Any] = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return  # vLLM has no /props; the renderer passes both numbers there
        settings = props.get("default_generation_settings") or {}
        if not proxy.context_length and isinstance(settings.get("n_ctx"), int):
            proxy.context_length = settings["n_ctx"]
        if not proxy.engine_slots and isinstance(props.get("total_slots"), int):
            proxy.engine_slots = props["total_slots"]

    async def _fetch_engine_health(self) -> tuple[int | None, str]:
        """The engine's own /health: (its status, its body) or (None, why it did not answer).
        Through `_engine_health` (coalesce.py): one call at a time, shared."""
        timeout = aiohttp.ClientTimeout(total=self.config.engine_health_timeout_seconds)
        try:
            async with self.session.get(self.config.engine_url + "/health",
                                        timeout=timeout) as response:
                body = await response.read()
                return response.status, body[:200].decode("utf-8", "replace")
        except TimeoutError:
            return None, (f"no answer within {self.config.engine_health_timeout_seconds:g} s")
        except aiohttp.ClientError as exc:
            return None, str(exc) or type(exc).__name__

    async def _engine_healthy(self) -> bool:
        status, _ = await self._engine_health()
        return status == 200

    # --- plain endpoints -------------------------------------------------------------------

    async def healthz(self, _request: Request) -> Answer:
        return json_response({"status": "ok"})

    async def readyz(self, _request: Request) -> Answer:
        if self.draining:
            return json_response({"status": "draining"}, status=503)
        if not self.warmed:
            return json_response({"status": "warming up"}, status=503)
        if not await self._engine_healthy():
            return json_response({"status": "engine not ready"}, status=503)
        return json_response({"status": "ok"})

    async def enginez(self, _request: Request) -> Answer:
        """The engine's /health as seen from inside the pod, for the engine container's probes.

        The engine listens on loopback only, so the kubelet cannot reach it: its startup and
        liveness probes come here instead. 200 exactly when the engine's /health is 200;
        503 otherwise (loading, refusing connections, or slower than the health timeout),
        with the engine's answer in the body. Never authenticated, never counted.
        """
        status, detail = await self._engine_health()
        if status == 200:
            return json_response({"status": "ok"})
        return json_response({"status": "engine not healthy", "engine_status": status,
                              "detail": detail}, status=503)

    async def metrics_endpoint(self, _request: Request) -> Answer:
        self._ready_gauge.set(1 if self.warmed else 0)
        return Response(200, generate_latest(self.metrics.registry),
                        {"Content-Type": CONTENT_TYPE_LATEST})

    async def engine_metrics(self, _request: Request) -> Answer:
        """The engine's own /metrics (llama.cpp's with --metrics, vLLM's), passed through as
        it wrote them: the engine listens on loopback only, and its prefix-cache hits, queue
        and preemptions are what an operator watches. Prometheus adds namespace and pod; the
        ServiceMonitor scrapes it as a second endpoint (render/monitoring.py). One fetch at a
        time, shared by the requests that arrive meanwhile (coalesce.py)."""
        shared = await self._engine_metrics()
        return Response(shared.status, shared.body, dict(shared.headers))  # framed per client

    async def _fetch_engine_metrics(self) -> Response:
        timeout = aiohttp.ClientTimeout(total=self.config.engine_health_timeout_seconds)
        try:
            async with self.session.get(self.config.engine_url + "/metrics",
                                        timeout=timeout) as response:
                if response.status != 200:
                    return json_response({"status": "engine metrics unavailable",
                                          "engine_status": response.status}, status=502)
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > MAX_ENGINE_METRICS_BYTES:  # counted as it arrives
                        return json_response({"status": "engine metrics larger than "
                                                        f"{MAX_ENGINE_METRICS_BYTES} bytes"},
                                             status=502)
                    chunks.append(chunk)
                body = b"".join(chunks)
                content_type = response.headers.get("Content-Type", CONTENT_TYPE_LATEST)
        except TimeoutError:
            return json_response({"status": "engine metrics unavailable", "detail":
                                  f"no answer within "
                                  f"{self.config.engine_health_timeout_seconds:g} s"},
                                 status=503)
        except aiohttp.ClientError as exc:
            return json_response({"status": "engine metrics unavailable",
                                  "detail": str(exc) or type(exc).__name__}, status=503)
        return Response(200, body, {"Content-Type": content_type})

    async def not_found(self, request: Request) -> Answer:
        return error_response(GatewayError(404, f"Unknown path {request.method} "
                                                f"{request.path}.", "invalid_request_error",
                                           None, "not_found"), "")

    async def models(self, request: Request) -> Answer:
        rid = client_request_id(request.headers)
        try:
            self.proxy.authenticate(request)
        except GatewayError as err:
            return error_response(err, rid)
        model = {
            "id": self.config.service_name,
            "object": "model",
            "created": self.started_at,
            "owned_by": "glm-operator",
            "context_length": self.proxy.context_length,
            "max_model_len": self.proxy.context_length,
            "model_version": self.config.model_version,
            "pool": self.config.pool,
        }
        return json_response({"object": "list", "data": [model]})
