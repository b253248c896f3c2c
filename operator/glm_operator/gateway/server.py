"""The gateway: an OpenAI-compatible front for one engine container.

The hot path is deliberately thin because the gateway shares CPU cores with the engine, and
after the engine's wait every line of it runs cold: requests come through the gateway's own
HTTP server (http.py, httptools), the body is parsed once for validation and sent on as the
client's own bytes (re-encoded only when the model's stop sequences must be added), a whole
answer comes back over a kept-alive connection (engine_pool.py), a streamed one is copied
from the engine's socket to the client's at the transport level, chunk framing and all
(relay.py), token counts come from a scan of the last bytes (usage.py), and metrics, audit
and the key's charge wait until the answer is written. aiohttp's client serves what is off
that path: health, warm-up, the KV-cache probe, the long-context pool, the Kubernetes API.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from glm_operator.gateway.config import GatewayConfig
from glm_operator.gateway.openai import errors
from glm_operator.gateway.openai.errors import GatewayError
from glm_operator.gateway.openai.usage import context_overflow, token_counts
from glm_operator.gateway.openai.validation import Endpoint, ParsedRequest, parse_request
from glm_operator.gateway.policy.audit import AuditLog, AuditRecord
from glm_operator.gateway.policy.keys import ApiKeyStore
from glm_operator.gateway.policy.limits import KeyLimits
from glm_operator.gateway.policy.metrics import GatewayMetrics
from glm_operator.gateway.pools.activity import ActivityMarker, renew_logged
from glm_operator.gateway.pools.kv_cache import KvCacheProbe
from glm_operator.gateway.pools.wake import LongContextWaker, WakeError
from glm_operator.gateway.wire.engine_pool import STALE_RETRIES, EnginePool
from glm_operator.gateway.wire.http import (
    HttpServer,
    Request,
    Response,
    Router,
    Streamed,
    head_bytes,
    json_response,
)
from glm_operator.gateway.wire.relay import (
    ClientGone,
    EngineAddress,
    EngineConnector,
    EngineExchange,
    EngineHead,
    EngineProtocolError,
    EngineTimeout,
    StreamCapture,
)
from glm_operator.kube.activity import ActivityLease, LeaseRef

log = logging.getLogger(__name__)

JSON = "application/json"
CLIENT_CLOSED = 499  # nginx's code for "the client went away": audit and metrics use it
STREAM_TAIL_CHUNKS = 4  # the last SSE events (usage / timings) always fit in these
STREAM_END = b"data: [DONE]"  # the OpenAI stream's last event (llama-server and vLLM)
SSE = "text/event-stream"
ANONYMOUS = "anonymous"
Answer = Response | Streamed


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.metrics = GatewayMetrics.create(config.service_name, config.model_version,
                                             config.pool)
        labels = self.metrics.labels
        # Read when scraped, not written per request: the hot path only counts.
        self._in_flight = 0
        self.metrics.in_flight.labels(**labels).set_function(lambda: self._in_flight)
        self.metrics.queued.labels(**labels).set_function(self._queued_now)
        self._ready_gauge = self.metrics.ready.labels(**labels)
        self.keys = ApiKeyStore(config.api_keys_path, check_reloads_after=KEYS_STALE_SECONDS
                                ) if config.api_keys_path else None
        self.limits = KeyLimits.from_config(config, self.metrics)
        self.audit = AuditLog(config.audit, {"service": config.service_name,
                                             "model_version": config.model_version,
                                             "pool": config.pool}, config.audit_include_text)
        self.context_length = config.context_length
        self.engine_slots = config.engine_slots
        self.warmed = not config.warmup
        self.started_at = int(time.time())
        self._session: aiohttp.ClientSession | None = None
        self._waker: LongContextWaker | None = None
        self.activity: ActivityMarker | None = None  # long-context pool: renews its Lease
        self._warmup_task: asyncio.Task[None] | None = None
        self._kv_cache_task: asyncio.Task[None] | None = None
        self._limits_task: asyncio.Task[None] | None = None
        self._activity_task: asyncio.Task[None] | None = None
        self._keys_task: asyncio.Task[None] | None = None
        self._at_engine = 0
        self._held = 0
        # Streamed requests to this pod's engine go through the transport-level relay.
        address = EngineAddress.parse(config.engine_url, config.engine_socket)
        self._engine = None if address is None else EngineConnector(
            address, config.connect_timeout_seconds, config.read_timeout_seconds)
        # Whole answers from it over kept-alive connections.
        self._engine_pool = None if address is None else EnginePool(
            address, config.connect_timeout_seconds, config.read_timeout_seconds)

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the gateway is not started"
        return self._session

    def http_server(self) -> HttpServer:
        """The HTTP front (gateway/http.py); a body over max_body_bytes becomes a JSON 413."""
        router = Router(self.not_found)
        router.add("POST", "/v1/chat/completions", self.chat_completions)
        router.add("POST", "/v1/completions", self.completions)
        for method in ("GET", "HEAD"):
            router.add(method, "/v1/models", self.models)
            router.add(method, "/healthz", self.healthz)
            router.add(method, "/readyz", self.readyz)
            router.add(method, "/enginez", self.enginez)
            router.add(method, "/metrics", self.metrics_endpoint)
        return HttpServer(router, self.config.max_body_bytes)

    async def start(self) -> None:
        """Open the engine session and start the background work (warm-up, probes)."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_seconds,
                                        sock_read=self.config.read_timeout_seconds)
        # llama-server (cpp-httplib) drops a keep-alive connection after 5 s idle; forget
        # ours before that, or the next request writes into a socket the engine has closed.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=ENGINE_KEEPALIVE_SECONDS,
                                         enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        lease = None
        if self.config.activity is not None:
            a = self.config.activity
            lease = ActivityLease(LeaseRef(a.api_server, a.namespace, a.lease), a.identity,
                                  a.token_path, a.ca_path, self._session)
            if self.config.pool == "long-context":
                self.activity = ActivityMarker(lease)
                self._activity_task = asyncio.create_task(self.activity.run())
        if self.config.wake is not None and self.config.long_context_url:
            self._waker = LongContextWaker(
                self.config.wake, self.config.long_context_url, self._session,
                on_scale=self.metrics.wakes.labels(**self.metrics.labels).inc,
                mark_activity=(lambda: renew_logged(lease)) if lease is not None else None,
            )
        self._warmup_task = asyncio.create_task(self._warm_up())
        if self.keys is not None:
            self._keys_task = asyncio.create_task(self._refresh_keys(self.keys))
        if self.config.kv_cache_poll_seconds > 0:
            probe = KvCacheProbe(self.config.engine_url, self._session, self._publish_kv_cache,
                                 self.config.kv_cache_poll_seconds,
                                 self.config.engine_health_timeout_seconds)
            self._kv_cache_task = asyncio.create_task(probe.poll())
        if self.limits is not None:
            self._limits_task = asyncio.create_task(self.limits.start())

    @staticmethod
    async def _refresh_keys(keys: ApiKeyStore) -> None:
        """Key files are looked at here, every second, never while a request waits."""
        while True:
            await asyncio.sleep(KEYS_REFRESH_SECONDS)
            try:
                keys.refresh()
            except Exception:  # never let the refresher die: requests would look themselves
                log.exception("reloading the API keys failed")

    def _publish_kv_cache(self, usage: float) -> None:
        # The series appears with the first reading: no reading is not "0 % in use".
        self.metrics.kv_cache_usage.labels(**self.metrics.labels).set(usage)

    async def stop(self) -> None:
        for task in (self._warmup_task, self._kv_cache_task, self._limits_task,
                     self._activity_task, self._keys_task):
            if task is not None:
                task.cancel()
        if self._session is not None:
            await self._session.close()
        if self._engine is not None:
            self._engine.close()
        if self._engine_pool is not None:
            self._engine_pool.close()
        self.audit.close()
        if self.limits is not None:
            await self.limits.close()

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
                                 self.config.engine_url, self.context_length, self.engine_slots)
                        return
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.debug("engine not ready yet: %s", exc)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 1.5)

    async def _learn_engine_shape(self) -> None:
        if self.context_length and self.engine_slots:
            return
        try:
            async with self.session.get(self.config.engine_url + "/props") as response:
                if response.status != 200:
                    return
                props: dict[str, Any] = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return  # vLLM has no /props; the renderer passes both numbers there
        settings = props.get("default_generation_settings") or {}
        if not self.context_length and isinstance(settings.get("n_ctx"), int):
            self.context_length = settings["n_ctx"]
        if not self.engine_slots and isinstance(props.get("total_slots"), int):
            self.engine_slots = props["total_slots"]

    async def _engine_health(self) -> tuple[int | None, str]:
        """The engine's own /health: (its status, its body) or (None, why it did not answer)."""
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

    async def not_found(self, request: Request) -> Answer:
        return self._error(GatewayError(404, f"Unknown path {request.method} {request.path}.",
                                        "invalid_request_error", None, "not_found"), "")

    async def models(self, request: Request) -> Answer:
        rid = request.headers.get("x-request-id") or _request_id()
        try:
            self._authenticate(request)
        except GatewayError as err:
            return self._error(err, rid)
        model = {
            "id": self.config.service_name,
            "object": "model",
            "created": self.started_at,
            "owned_by": "glm-operator",
            "context_length": self.context_length,
            "max_model_len": self.context_length,
            "model_version": self.config.model_version,
            "pool": self.config.pool,
        }
        return json_response({"object": "list", "data": [model]})

    # --- the proxy -------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Answer:
        return await self._proxy(request, "chat", "/v1/chat/completions")

    async def completions(self, request: Request) -> Answer:
        return await self._proxy(request, "completions", "/v1/completions")

    def _error(self, err: GatewayError, rid: str) -> Response:
        headers = {"Content-Type": JSON, **err.headers()}
        if rid:
            headers["X-Request-Id"] = rid
        return Response(err.status, err.body(), headers)

    def _authenticate(self, request: Request) -> str:
        if self.keys is None:
            return ANONYMOUS
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise errors.unauthorized(
                "Missing API key: send it as 'Authorization: Bearer <key>'."
            )
        key_id = self.keys.check(key.strip())
        if key_id is None:
            raise errors.unauthorized("Incorrect API key provided.")
        return key_id

    def _read_body(self, request: Request) -> bytes:
        if request.too_large:
            raise errors.too_large(self.config.max_body_bytes)
        return request.body

    def _queued_now(self) -> float:
        """Requests waiting: held for the long-context pool's wake, or beyond the engine's
        slots (the engine queues those itself)."""
        over_slots = max(0, self._at_engine - self.engine_slots) if self.engine_slots else 0
        return over_slots + self._held

    async def _proxy(self, request: Request, endpoint: Endpoint, path: str) -> Answer:
        started = time.perf_counter()
        rid = request.headers.get("x-request-id") or _request_id()
        record = AuditRecord(request_id=rid, endpoint=endpoint)
        self._in_flight += 1
        try:
            try:
                record.key_id = self._authenticate(request)
                if self.limits is not None:
                    record.shared_admission = await self.limits.admit(record.key_id)
                parsed = parse_request(self._read_body(request), endpoint,
                                       self.config.stop_sequences)
                record.stream = parsed.stream
                record.request_bytes = len(parsed.body)
                max_tokens = parsed.payload.get("max_tokens",
                                                parsed.payload.get("max_completion_tokens"))
                record.max_tokens = max_tokens if isinstance(max_tokens, int) else None
                if self.audit.include_text:
                    record.prompt = parsed.payload.get("messages" if endpoint == "chat"
                                                       else "prompt")
                response = await self._served(request, parsed, path, record, started, rid)
            except GatewayError as err:
                record.error_code = err.code
                response = self._error(err, rid)
        except asyncio.CancelledError:
            # The client went away: accounted all the same.
            if record.status != 200:  # 200 here: a stream whose last event was delivered
                record.status = CLIENT_CLOSED
            await self._account(record, started)
            raise
        except Exception:
            record.status, record.error_code = 500, "internal"  # the server answers 500
            await self._account(record, started)
            raise
        if isinstance(response, Streamed):
            record.status = record.status or 200  # a stream may have set 499
            await self._account(record, started)
        else:
            # Metrics, audit and the key's charge wait until the answer is written: none of
            # it is the client's time.
            record.status = record.status or response.status
            response.after = functools.partial(self._account, record, started)
        return response

    async def _account(self, record: AuditRecord, started: float) -> None:
        """A finished request in the metrics, the audit log and its key's token budget."""
        self._in_flight -= 1
        elapsed = time.perf_counter() - started
        record.duration_ms = elapsed * 1000
        self._observe(record, elapsed)
        if self.limits is not None and not record.handed_over:
            charge = self.limits.charge(record.key_id, tokens_to_charge(record))
            # Shielded when it waits for the store: a client that went away cancels the
            # request, not its charge.
            await (asyncio.shield(charge) if self.limits.store is not None else charge)

    def _observe(self, record: AuditRecord, elapsed: float) -> None:
        self.metrics.record(record.endpoint, record.status, elapsed, record.stream,
                            None if record.ttft_ms is None else record.ttft_ms / 1000,
                            record.prompt_tokens, record.completion_tokens)
        self.audit.write(record)

    async def _served(self, request: Request, parsed: ParsedRequest, path: str,
                      record: AuditRecord, started: float, rid: str) -> Answer:
        """A valid request, answered by the engine: in the long-context pool, activity that
        keeps the pool awake while it runs (its Lease is renewed, throttled)."""
        if self.activity is None:
            return await self._forward(request, parsed, path, record, started, rid)
        self.activity.begin()
        try:
            return await self._forward(request, parsed, path, record, started, rid)
        finally:
            self.activity.end()

    async def _forward(self, request: Request, parsed: ParsedRequest, path: str,
                       record: AuditRecord, started: float, rid: str) -> Answer:
        """Send to this pod's engine; on a context-size refusal, to the long-context pool."""
        if self._engine_pool is not None and not parsed.stream:
            return await self._forward_whole(request, parsed, path, record, started, rid,
                                             self._engine_pool)
        if parsed.stream and self._engine is not None and request.http11:
            return await self._forward_stream(request, parsed, path, record, started, rid,
                                              self._engine)
        self._at_engine += 1
        try:
            async with await self._post(self.config.engine_url + path, parsed.body,
                                        {"Content-Type": JSON}) as upstream:
                if upstream.status == 400:
                    body = await upstream.read()
                    overflow = context_overflow(400, body)
                    if overflow is None:
                        return self._passthrough(upstream, body, record, rid)
                else:
                    return await self._relay(request, upstream, parsed, record, started, rid)
        finally:
            self._at_engine -= 1
        record.overflow = True
        return await self._overflow(request, parsed, path, record, started, rid, overflow)

    async def _overflow(self, request: Request, parsed: ParsedRequest, path: str,
                        record: AuditRecord, started: float, rid: str,
                        overflow: tuple[int | None, int | None]) -> Answer:
        n_prompt, n_ctx = overflow
        n_ctx = n_ctx or self.context_length or None
        outcome = self.metrics.overflow.labels
        labels = self.metrics.labels
        if not self.config.long_context_url:
            outcome(**labels, outcome="no_pool").inc()
            raise errors.prompt_too_long(n_prompt, n_ctx, "the engine refused it")
        if self._waker is not None:
            self._held += 1
            try:
                await self._waker.ensure_awake()
            except (WakeError, aiohttp.ClientError, OSError) as exc:
                outcome(**labels, outcome="wake_timeout").inc()
                retry = self.config.wake.retry_after_seconds if self.config.wake else 30
                raise GatewayError(
                    503,
                    f"The prompt has {n_prompt} tokens, more than this pool's context of "
                    f"{n_ctx}; the long-context pool is not ready: {exc}",
                    "server_error", None, "long_context_unavailable", retry,
                ) from None
            finally:
                self._held -= 1
        if record.shared_admission and self.limits is not None:
            # That pool's gateway counts this request in the same store: count it once.
            await self.limits.hand_over(record.key_id)
            record.handed_over = True
        headers = {"Content-Type": JSON, "X-Request-Id": rid}
        if "authorization" in request.headers:
            headers["Authorization"] = request.headers["authorization"]
        try:
            async with await self._post(self.config.long_context_url + path, parsed.body,
                                        headers) as upstream:
                outcome(**labels, outcome="routed").inc()
                return await self._relay(request, upstream, parsed, record, started, rid)
        except GatewayError:
            outcome(**labels, outcome="failed").inc()
            raise

    async def _post(self, url: str, body: bytes, headers: dict[str, str]
                    ) -> aiohttp.ClientResponse:
        for attempt in range(1, STALE_RETRIES + 2):
            try:
                return await self.session.post(url, data=body, headers=headers)
            except aiohttp.SocketTimeoutError:
                raise errors.engine_timeout(self.config.read_timeout_seconds) from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # A pooled keep-alive connection the engine had already closed: the request
                # never reached it, so sending it once more on a fresh connection is safe.
                # A refused connection (ClientConnectorError) is not retried: fast 503.
                if attempt <= STALE_RETRIES and not isinstance(exc,
                                                                aiohttp.ClientConnectorError):
                    continue
                raise errors.engine_unavailable(f"{url}: {exc or type(exc).__name__}") from None
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise errors.engine_unavailable(f"{url}: {exc or type(exc).__name__}") from None
        raise AssertionError("unreachable")

    def _passthrough(self, upstream: aiohttp.ClientResponse, body: bytes, record: AuditRecord,
                     rid: str) -> Response:
        return self._answer(upstream.status, upstream.headers.get("Content-Type", JSON), body,
                            record, rid)

    def _answer(self, status: int, content_type: str, body: bytes, record: AuditRecord,
                rid: str) -> Response:
        if status >= 400:
            record.error_code = f"engine_{status}"
        return Response(status, body, {"Content-Type": content_type, "X-Request-Id": rid})

    def _whole_answer(self, status: int, content_type: str, body: bytes, record: AuditRecord,
                      rid: str) -> Response:
        """An answer read whole: its usage counted, then passed on."""
        self._count_usage(status, body, record)
        return self._answer(status, content_type, body, record, rid)

    def _count_usage(self, status: int, body: bytes, record: AuditRecord) -> None:
        if status == 200:
            record.prompt_tokens, record.completion_tokens = token_counts(body)
            if self.audit.include_text:
                record.completion = _completion_text(body)

    async def _relay(self, request: Request, upstream: aiohttp.ClientResponse,
                     parsed: ParsedRequest, record: AuditRecord, started: float, rid: str
                     ) -> Answer:
        content_type = upstream.headers.get("Content-Type", JSON)
        if not (parsed.stream and upstream.status == 200
                and content_type.startswith("text/event-stream")):
            try:
                body = await upstream.read()
            except aiohttp.SocketTimeoutError:
                raise errors.engine_timeout(self.config.read_timeout_seconds) from None
            except aiohttp.ClientError as exc:
                raise errors.engine_unavailable(f"the engine dropped the answer: {exc}") from None
            return self._whole_answer(upstream.status, content_type, body, record, rid)
        return await self._stream(request, upstream, record, started, rid, content_type)

    @contextlib.contextmanager
    def _relay_errors(self, where: str) -> Iterator[None]:
        """The relay's failures as the gateway's own errors: a timeout is 504, anything
        else the engine did (refused, dropped, bad framing) is 503 naming `where`."""
        try:
            yield
        except EngineTimeout:
            raise errors.engine_timeout(self.config.read_timeout_seconds) from None
        except (OSError, EngineProtocolError) as exc:
            raise errors.engine_unavailable(f"{where}: {exc or type(exc).__name__}") from None

    async def _forward_whole(self, request: Request, parsed: ParsedRequest, path: str,
                             record: AuditRecord, started: float, rid: str,
                             engine: EnginePool) -> Answer:
        """A whole answer from this pod's engine over a kept-alive connection; on a
        context-size refusal, to the long-context pool.

        A good answer is written to the client from the engine connection's callback, the
        moment it is parsed: the handler's resumption, usage counting and the rest happen
        after the client has it (on a cold path they cost about 0.2 ms)."""
        written: Streamed | None = None

        def write_now(head: EngineHead, body: bytes) -> None:
            nonlocal written
            if head.status == 200:
                written = request.write_now(Response(
                    200, body, {"Content-Type": head.content_type, "X-Request-Id": rid}))

        self._at_engine += 1
        try:
            with self._relay_errors(f"{self.config.engine_url}{path}"):
                head, body = await engine.post(path, parsed.body,
                                               write_now if request.http11 else None)
        finally:
            self._at_engine -= 1
        if written is not None:
            self._count_usage(head.status, body, record)
            return written
        overflow = context_overflow(head.status, body)
        if overflow is None:
            if head.status == 400:
                return self._answer(400, head.content_type, body, record, rid)
            return self._whole_answer(head.status, head.content_type, body, record, rid)
        record.overflow = True
        return await self._overflow(request, parsed, path, record, started, rid, overflow)

    async def _forward_stream(self, request: Request, parsed: ParsedRequest, path: str,
                              record: AuditRecord, started: float, rid: str,
                              engine: EngineConnector) -> Answer:
        """A streamed request to this pod's engine, relayed at the transport level; on a
        context-size refusal, to the long-context pool like any other."""
        self._at_engine += 1
        try:
            with self._relay_errors(f"{self.config.engine_url}{path}"):
                exchange = await engine.open(path, parsed.body)
            try:
                head = await exchange.head
                if head.status == 200 and head.content_type.startswith(SSE):
                    return await self._relay_stream(request, exchange, record, started, rid,
                                                    head.content_type)
                with self._relay_errors("the engine dropped the answer"):
                    body = await exchange.read_body()
            finally:
                exchange.abort()
            overflow = context_overflow(head.status, body)
            if overflow is None:
                return self._whole_answer(head.status, head.content_type, body, record, rid)
        finally:
            self._at_engine -= 1
        record.overflow = True
        return await self._overflow(request, parsed, path, record, started, rid, overflow)

    async def _relay_stream(self, request: Request, exchange: EngineExchange,
                            record: AuditRecord, started: float, rid: str, content_type: str
                            ) -> Answer:
        # HTTP/1.1 only (_forward): the head says "Transfer-Encoding: chunked", and the body's
        # framing is the engine's own, written by the relay.
        transport = request.transport
        transport.write(_stream_head(content_type, rid, chunked=True))
        capture = StreamCapture(
            # the estimate if the client leaves
            count_events=self.limits is not None and self.limits.limits.tokens_per_minute > 0,
            keep_all=self.audit.include_text)
        try:
            exchange.relay(transport, capture, request.drain)
            await exchange.done
        except ClientGone:
            self._stream_ended(record, capture, started, complete=False)
            if not capture.delivered:
                record.error_code = "client_closed"
                record.status = CLIENT_CLOSED
            return Streamed(complete=False)
        except (OSError, EngineTimeout, EngineProtocolError) as exc:
            # Headers are gone already: end the stream if its framing allows, else drop the
            # client's connection, and say so in the log.
            log.warning("request %s: engine stream broke: %s", rid, exc)
            record.error_code = "engine_stream_broken"
            self._stream_ended(record, capture, started, complete=False)
            if not exchange.end_stream_cleanly():
                transport.close()
            return Streamed(complete=False)
        except asyncio.CancelledError:
            # The client went away (aiohttp cancels the handler): dropping our engine
            # connection makes the engine stop generating and free the slot.
            self._stream_ended(record, capture, started, complete=False)
            if not capture.delivered:
                record.error_code = "client_closed"
            raise
        finally:
            exchange.abort()
        self._stream_ended(record, capture, started, complete=True)
        if capture.keep_all:
            record.completion = _stream_text(b"".join(capture.everything))
        return Streamed(complete=True)

    @staticmethod
    def _stream_ended(record: AuditRecord, capture: StreamCapture, started: float,
                      complete: bool) -> None:
        if capture.first_at is not None:
            record.ttft_ms = (capture.first_at - started) * 1000
        record.streamed_events = capture.events
        if capture.delivered:
            # The client has the whole answer: if it hangs up before the chunked body's last
            # bytes, that is not a request it gave up on.
            record.status = 200
        if capture.delivered or complete:
            record.prompt_tokens, record.completion_tokens = token_counts(
                b"".join(capture.tail))

    async def _stream(self, request: Request, upstream: aiohttp.ClientResponse,
                      record: AuditRecord, started: float, rid: str, content_type: str
                      ) -> Answer:
        """A stream read through aiohttp's client (the long-context pool, an engine that is
        not plain http://, an HTTP/1.0 client), framed here: chunked for HTTP/1.1 clients,
        ended by closing the connection for HTTP/1.0 ones."""
        chunked = request.http11
        transport = request.transport
        transport.write(_stream_head(content_type, rid, chunked=chunked,
                                     version=request.version))
        tail: deque[bytes] = deque(maxlen=STREAM_TAIL_CHUNKS)
        everything: list[bytes] | None = [] if self.audit.include_text else None
        # the estimate if the client leaves
        count_events = self.limits is not None and self.limits.limits.tokens_per_minute > 0
        first = True
        try:
            async for chunk in upstream.content.iter_any():
                if first:
                    record.ttft_ms = (time.perf_counter() - started) * 1000
                    first = False
                if transport.is_closing():
                    raise ConnectionResetError("the client closed")
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                await request.drain()
                tail.append(chunk)
                if count_events:
                    record.streamed_events += chunk.count(b"data: ")
                if everything is not None:
                    everything.append(chunk)
                if STREAM_END in chunk:
                    # The client has the whole answer: if it hangs up before the chunked
                    # body's last bytes, that is not a request it gave up on.
                    record.status = 200
        except ConnectionResetError:
            # The client went away: closing our upstream socket makes the engine stop
            # generating and free the slot.
            upstream.close()
            if record.status != 200:
                record.status = CLIENT_CLOSED
                record.error_code = "client_closed"
            else:
                record.prompt_tokens, record.completion_tokens = token_counts(b"".join(tail))
            return Streamed(complete=False)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Headers are gone already; all we can do is end the stream and say so in the log.
            log.warning("request %s: engine stream broke: %s", rid, exc)
            record.error_code = "engine_stream_broken"
            upstream.close()
            if chunked and not transport.is_closing():
                transport.write(b"0\r\n\r\n")  # chunks are whole here: the framing holds
            return Streamed(complete=False)
        # llama-server closes its side of a keep-alive connection after a streamed answer;
        # back in the pool, the socket would fail the next request that picks it up.
        upstream.close()
        record.prompt_tokens, record.completion_tokens = token_counts(b"".join(tail))
        if everything is not None:
            record.completion = _stream_text(b"".join(everything))
        # A client gone after the last event had the whole answer.
        if chunked and not transport.is_closing():
            transport.write(b"0\r\n\r\n")
        return Streamed(complete=chunked)


ENGINE_KEEPALIVE_SECONDS = 4.0
KEYS_REFRESH_SECONDS = 1.0  # a rotated key works (or stops working) within a second
KEYS_STALE_SECONDS = 5.0  # the refresher has stalled: a request looks at the files itself

# A prompt's tokens when the engine never said: about four bytes of JSON per token.
BYTES_PER_TOKEN_ESTIMATE = 4


def _request_id() -> str:
    # A name for the logs, not a secret: no system call for randomness on the hot path.
    return f"{random.getrandbits(64):016x}"


def _stream_head(content_type: str, rid: str, chunked: bool,
                 version: tuple[int, int] = (1, 1)) -> bytes:
    headers = {"Content-Type": content_type, "Cache-Control": "no-cache", "X-Request-Id": rid}
    if chunked:
        headers["Transfer-Encoding"] = "chunked"
    else:
        headers["Connection"] = "close"  # an HTTP/1.0 client reads to the connection's end
    return head_bytes(200, headers, version)


def tokens_to_charge(record: AuditRecord) -> int:
    """What one request cost the token budget: the engine's usage (prompt + completion) when
    the answer carried it. A client that went away gets no usage back, yet the engine worked:
    it is charged an estimate, the request's size for the prompt plus the chunks streamed so
    far, or, not streaming, its max_tokens (a busy llama-server finishes such a request).
    Refused requests (4xx/5xx, never reached the engine or answered with an error) cost
    nothing."""
    if record.prompt_tokens is not None or record.completion_tokens is not None:
        return (record.prompt_tokens or 0) + (record.completion_tokens or 0)
    if record.status not in (200, CLIENT_CLOSED) or not record.request_bytes:
        return 0
    prompt = record.request_bytes // BYTES_PER_TOKEN_ESTIMATE
    if record.stream:
        return prompt + record.streamed_events
    return prompt + (record.max_tokens or 0)


def _completion_text(body: bytes) -> str | None:
    try:
        choice = json.loads(body)["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    text = choice.get("message", {}).get("content") if "message" in choice else choice.get("text")
    return text if isinstance(text, str) else None


def _stream_text(data: bytes) -> str:
    """Join the deltas of an SSE stream (only for the audit log with text enabled)."""
    parts: list[str] = []
    for line in data.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        try:
            choices = json.loads(line[6:]).get("choices") or []
        except ValueError:
            continue
        for choice in choices:
            delta = choice.get("delta", {}).get("content") if "delta" in choice else choice.get(
                "text")
            if isinstance(delta, str):
                parts.append(delta)
    return "".join(parts)
