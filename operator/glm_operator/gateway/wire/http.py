"""The gateway's HTTP/1.1 server: httptools' parser (llhttp, as in Node) under an asyncio
Protocol, and nothing else.

The gateway sits in front of an engine on the cores the engine uses, and what a user feels of
it is the time it adds to every answer. Measured on a whole answer after the engine worked
for a quarter of a second (docs/performance.md): a proxy through aiohttp's web server and
client added about 1 ms, the same proxy on this parser 0.26 ms. The difference is not
parsing but how much Python runs per request, cold after the wait: aiohttp's request and
response objects, its router, its payload and writer layers. Here a request is parsed by
callbacks into one small object, a handler returns bytes to write, and a streamed answer is
written by the handler straight to the transport (relay.py).

What a front door must still do, it does:
- keep-alive and pipelined requests (answered in order, one handler at a time per connection);
- `Expect: 100-continue`; bodies by Content-Length or chunked; HTTP/1.0 clients;
- a body over the limit is refused without being buffered (`Request.too_large`);
- heads over 64 KiB, bad framing: 400/431 and the connection closed;
- a client that hangs up cancels its handler (the engine connection is dropped with it);
- idle keep-alive connections close after 75 s; a graceful stop lets handlers finish.

(A little over 400 lines: a connection's parser callbacks and its answering share one
object's state, and splitting them would put a call between them on every request.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httptools

from glm_operator.gateway.wire.framing import CLIENT_BUFFER_HIGH, MAX_HEAD_BYTES, head_bytes

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 75.0  # an idle client connection is closed after this long
MAX_PIPELINED = 8  # requests parsed ahead of the one being answered; then reading pauses


@dataclass(slots=True)
class Request:
    method: str
    path: str  # without the query string
    version: tuple[int, int]
    headers: dict[str, str]  # lower-case names; repeated headers joined by ", "
    connection: HttpConnection
    body: bytes = b""
    too_large: bool = False  # the body passed the limit: not kept, and the connection closes
    keep_alive: bool = True  # what the client asked (HTTP version and Connection header)
    key_id: str | None = None  # the API key's id, when a head check found it (proxy.py)

    @property
    def transport(self) -> asyncio.Transport:
        return self.connection.transport

    @property
    def http11(self) -> bool:
        return self.version >= (1, 1)

    async def drain(self) -> None:
        await self.connection.drain()

    def write_now(self, response: Response) -> Streamed:
        """Write a whole answer at once, from a callback that has it (an engine's answer,
        the moment it is parsed) rather than from the handler's return; the handler then
        returns what this returns. The handler's turn to write: answers go out in order."""
        return self.connection.write_now(self, response)


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # Work that may wait until the answer is on its way (metrics, audit, charging a key's
    # budget): run right after the write, before the connection's next request.
    after: Callable[[], Awaitable[None]] | None = None


@dataclass(frozen=True, slots=True)
class Streamed:
    """What a handler returns when it wrote its answer itself (a relayed stream).
    `complete`: the body's framing was finished, so the connection can serve another request."""

    complete: bool


Handler = Callable[[Request], Awaitable[Response | Streamed]]


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> Response:
    return Response(status, json.dumps(data).encode(),
                    {"Content-Type": "application/json", **(headers or {})})


class Router:
    """Exact (method, path) routes; anything else goes to the fallback."""

    def __init__(self, fallback: Handler) -> None:
        self._routes: dict[tuple[str, str], Handler] = {}
        self._fallback = fallback

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method, path)] = handler

    def find(self, method: str, path: str) -> Handler:
        return self._routes.get((method, path)) or self._fallback


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests, answers them in order."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self._queue: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._paused_reading = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._active_at = self._loop.time()  # the last request's end: idle counts from here
        # the request being parsed
        self._url = bytearray()
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._header_name = b""
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._request: Request | None = None

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not served here")
        except httptools.HttpParserError as exc:
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, "request head larger than 64 KiB")
            else:
                self._refuse(400, f"malformed HTTP request: {exc}")

    def eof_received(self) -> None:
        # A client that closes its side has gone, as far as HTTP goes (few clients half-close,
        # and a closed one looks the same): the connection closes and its handler is
        # cancelled, so the engine stops generating for nobody (as aiohttp did).
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._server.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        if self._task is not None:
            self._task.cancel()  # the client is gone: its handler stops (the engine's too)
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(ConnectionResetError("the client closed"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        if self._closing or self.transport.is_closing():
            raise ConnectionResetError("the client closed")
        if not self._write_paused and self.transport.get_write_buffer_size() <= CLIENT_BUFFER_HIGH:
            return
        if self._drain_waiter is None:
            self._drain_waiter = self._loop.create_future()
        await self._drain_waiter

    # --- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url.clear()
        self._headers = {}
        self._head_bytes = 0
        self._body = []
        self._body_bytes = 0
        self._request = None

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("head too large")
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        previous = self._headers.get(key)
        self._headers[key] = text if previous is None else f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        parser = self._parser
        version = parser.get_http_version()
        url = bytes(self._url)
        if not url.startswith(b"/"):  # absolute form (through a forward proxy) or `*`
            try:
                url = httptools.parse_url(url).path or b"/"
            except httptools.HttpParserInvalidURLError:
                url = b"/"
        path = url.split(b"?", 1)[0].decode("latin-1")
        self._request = request = Request(
            method=parser.get_method().decode("latin-1"), path=path,
            version=(1, 1) if version == "1.1" else (1, 0), headers=self._headers,
            connection=self)
        length = self._headers.get("content-length")
        limit = self._server.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            # Refused before the body comes: not buffered, and (no 100 Continue) a client
            # that waits for it never sends it. The connection closes after the answer.
            request.too_large = True
            self._dispatch(request)
            self._closing = True  # read nothing more
            return
        if self._headers.get("expect", "").lower() == "100-continue" and request.http11:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._request is None or self._request.too_large:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._server.max_body_bytes:
            self._request.too_large = True  # chunked: read to the end, keep nothing
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        request = self._request
        if request is None or self._closing:
            return
        if not request.too_large:
            request.body = b"".join(self._body)
        self._body = []
        # Read now: with pipelining the parser moves on to the next request before this one
        # is answered.
        request.keep_alive = self._parser.should_keep_alive()
        self._dispatch(request)

    # --- answering -------------------------------------------------------------------------

    def _dispatch(self, request: Request) -> None:
        self._queue.append(request)
        if len(self._queue) >= MAX_PIPELINED and not self._paused_reading:
            self._paused_reading = True
            self.transport.pause_reading()
        if self._task is None:
            self._task = self._loop.create_task(self._answer_queue())

    async def _answer_queue(self) -> None:
        try:
            while self._queue and not self.transport.is_closing():
                request = self._queue.popleft()
                if self._paused_reading and len(self._queue) < MAX_PIPELINED // 2:
                    self._paused_reading = False
                    self.transport.resume_reading()
                keep_alive = await self._answer(request)
                if not keep_alive:
                    self.transport.close()
                    return
        except asyncio.CancelledError:
            return  # the client went away
        finally:
            self._task = None
        if self._server.stopping:
            self.transport.close()
        else:
            self._active_at = self._loop.time()

    async def _answer(self, request: Request) -> bool:
        """Run the handler, write its answer; whether the connection may serve another."""
        self._server.in_flight += 1
        try:
            result = await self._server.router.find(request.method, request.path)(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unhandled error answering %s %s", request.method, request.path)
            result = json_response({"error": {"message": "internal error in the gateway",
                                              "type": "server_error", "code": "internal"}},
                                   500)
        finally:
            self._server.in_flight -= 1
        if isinstance(result, Streamed):
            return self._keep_alive(request) and result.complete and request.http11
        keep_alive = self._write(request, result)
        if result.after is not None:
            self._server.in_flight += 1  # a graceful stop waits for it too
            try:
                await result.after()
            except Exception:
                log.exception("unhandled error after answering %s %s", request.method,
                              request.path)
            finally:
                self._server.in_flight -= 1
        return keep_alive

    def _keep_alive(self, request: Request) -> bool:
        return request.keep_alive and not request.too_large and not self._server.stopping

    def _write(self, request: Request, response: Response) -> bool:
        """Write a whole answer with its framing; whether the connection stays open."""
        keep_alive = self._keep_alive(request)
        headers = response.headers
        headers["Content-Length"] = str(len(response.body))
        if not keep_alive:
            headers["Connection"] = "close"
        elif not request.http11:
            headers["Connection"] = "keep-alive"
        body = b"" if request.method == "HEAD" else response.body
        if not self.transport.is_closing():
            self.transport.write(head_bytes(response.status, headers, request.version) + body)
        return keep_alive

    def write_now(self, request: Request, response: Response) -> Streamed:
        return Streamed(complete=self._write(request, response) and request.http11)

    def _refuse(self, status: int, message: str) -> None:
        """Bad framing: answer once and close; nothing after it can be parsed."""
        self._closing = True
        self._queue.clear()
        if self._task is None and not self.transport.is_closing():
            body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                         "code": "bad_request"}}).encode()
            self.transport.write(head_bytes(status, {
                "Content-Type": "application/json", "Content-Length": str(len(body)),
                "Connection": "close"}) + body)
        self.transport.close()

    def _arm_idle(self, delay: float = KEEPALIVE_SECONDS) -> None:
        # One timer per connection that re-arms itself, rather than one per request.
        self._idle = self._loop.call_later(delay, self._idle_timeout)

    def _idle_timeout(self) -> None:
        self._idle = None
        if self._task is not None or self._queue:
            self._arm_idle()  # busy: look again a whole period later
            return
        idle = self._loop.time() - self._active_at
        if idle >= KEEPALIVE_SECONDS:
            self.transport.close()
        else:
            self._arm_idle(KEEPALIVE_SECONDS - idle)

    def close_if_idle(self) -> None:
        if self._task is None and not self._queue:
            self.transport.close()


class HttpServer:
    """Listens, and on stop lets running handlers finish for up to `shutdown_timeout`."""

    def __init__(self, router: Router, max_body_bytes: int) -> None:
        self.router = router
        self.max_body_bytes = max_body_bytes
        self.connections: set[HttpConnection] = set()
        self.in_flight = 0
        self.stopping = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; return the port (a free one when `port` is 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: HttpConnection(self), host, port,
                                                reuse_address=True, backlog=1024)
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def stop(self, shutdown_timeout: float) -> None:
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close_if_idle()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + shutdown_timeout
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            with contextlib.suppress(Exception):
                connection.transport.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
