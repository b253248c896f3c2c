"""One client connection of the gateway's HTTP/1.1 server: httptools' parser (llhttp, as in
Node) under an asyncio Protocol, and nothing else. server.py listens and holds the shared
limits; messages.py has what handlers see; head_checks.py the protocol's rules on a head.

The gateway sits in front of an engine on the cores the engine uses, and what a user feels of
it is the time it adds to every answer. Measured on a whole answer after the engine worked
for a quarter of a second (docs/performance.md): a proxy through aiohttp's web server and
client added about 1 ms, the same proxy on this parser 0.26 ms. The difference is not
parsing but how much Python runs per request, cold after the wait: aiohttp's request and
response objects, its router, its payload and writer layers. Here a request is parsed by
callbacks into one small object, a handler returns bytes to write, and a streamed answer is
written by the handler straight to the transport (relay.py).

What a front door must still do, it does, against clients that mean harm too
(tests/gateway/test_http_hostile.py sends each case's bytes):
- keep-alive and pipelined requests (answered in order, one handler at a time per connection,
  at most 8 parsed ahead however many come in one packet, and the next handler runs only once
  the client has read what was written to it down to 64 KiB: pipelined requests whose
  answers nobody reads hold one answer, not all of them);
- `Expect: 100-continue`; bodies by Content-Length or chunked; HTTP/1.0 clients;
- a route's head check (`Router.add(..., head_check=)`) answers from the head alone, before a
  body byte is read and before `100 Continue`: the 401 of /v1/*;
- head bytes counted as they arrive: a head (or a trailer section) past 64 KiB is 431 then,
  however it is split, and no more than that is ever handed to the parser;
- caps: client connections (`max_connections`: one more is let into the probes' small reserve,
  served only if its first request is a probe, GET or HEAD of /healthz, /readyz or /enginez,
  and sent promptly; anything else is answered 503, so probes never share the fate of client
  connections; server.py has the reserve), the bytes held for
  requests across all connections (`max_buffered_bytes`, bodies counted as they arrive, never
  as announced: a body announced past what is left is answered 503 unread, one whose bytes
  would pass it 503 then), a body over `max_body_bytes` (413 unread); a body is kept as one
  growing buffer, so what it costs in memory is the bytes counted, however small its chunks;
- slow clients: a head must be whole 10 s after its first byte, and a body must not stall for
  30 s nor, past its first 30 s, average under 16 KiB a second (408); a client that leaves
  what is written to it unread `write_stall_timeout_seconds` is dropped as one that hung up;
- the protocol: HTTP/1.0 and 1.1 only (505), one Host in 1.1 (400), `Transfer-Encoding` only
  `chunked` (501), CONNECT 405, Upgrade ignored (the request answered, then the connection
  closed), trailer fields read and dropped (RFC 9110 6.5.1), bad framing and llhttp's
  strictness (CL with TE, two CLs, obs-fold) 400 once the requests before it are answered;
- a refusal that leaves bytes unread closes after a short linger (what the client still sends
  is read and dropped), so the client reads the answer rather than a reset;
- a client that hangs up cancels its handler (the engine connection is dropped with it);
- idle keep-alive connections close after 75 s; a graceful stop closes idle ones, answers a
  request that arrives meanwhile 503 `shutting_down`, and lets running handlers finish;
- a closed connection leaves no reference cycle (parser, requests, timers dropped), so its
  memory comes back without the cycle collector.

(Some 750 lines: a connection's parser callbacks, its limits as bytes arrive and its
answering share one object's state, and splitting that object would put a call between them
on every request and chunk. Its timer, which runs every few seconds, is timer.py.)
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, cast

import httptools

from glm_operator.gateway.wire.framing import CLIENT_BUFFER_HIGH, MAX_HEAD_BYTES, head_bytes
from glm_operator.gateway.wire.head_checks import head_fault, valid_host
from glm_operator.gateway.wire.messages import (
    SHUTTING_DOWN,
    Request,
    Response,
    Streamed,
    busy,
    error_response,
)
from glm_operator.gateway.wire.timer import look

if TYPE_CHECKING:
    from glm_operator.gateway.wire.server import HttpServer

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 75.0  # an idle client connection is closed after this long
HEAD_TIMEOUT_SECONDS = 10.0  # a request head must be whole this long after its first byte
BODY_TIMEOUT_SECONDS = 30.0  # a request body that sends nothing this long is given up
# Past its first BODY_TIMEOUT_SECONDS a body must average this many bytes a second (as
# Apache's mod_reqtimeout MinRate: each byte buys 1/rate s more), so a byte every few seconds
# cannot hold a connection and its bytes for ever. 128 kbit/s: a 4 MiB body may take 4 min.
MIN_BODY_RATE = 16 * 1024
# After a refusal that left the client's request unread: what it still sends is read and
# dropped this long, so that closing does not reset the connection under the answer.
LINGER_SECONDS = 2.0
# Requests parsed ahead of the one being answered; then parsing and reading pause (what was
# read already waits as bytes), so a flood of pipelined requests holds no more than this.
MAX_PIPELINED = 8
MAX_CONNECTIONS = 1024
MAX_BUFFERED_BYTES = 64 * 1024 * 1024
WRITE_STALL_TIMEOUT_SECONDS = 30.0
DRAIN_SECONDS = 25.0


class _Stop(Exception):
    """Raised from a parser callback that has answered the request itself: parsing ends."""


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests, answers them in order."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        # Made once the connection is accepted, dropped when it closes: it holds this
        # object's bound callbacks, a cycle the cycle collector would otherwise have to find.
        self._parser: Any = None
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self._queue: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._current: Request | None = None  # being answered
        self._lost = False
        self._reading = True  # False once a refusal or an Upgrade ended parsing
        self._lingering = False
        self._reserve = False  # over max_connections, let in for a probe (server.py)
        self._paused_reading = False
        # Bytes read past MAX_PIPELINED parsed requests, parsed once the queue has room.
        self._backlog = b""
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._active_at = self._loop.time()  # the last request's end: idle counts from here
        # the request being parsed
        self._url = bytearray()
        self._headers: dict[str, str] = {}
        self._fault: str | None = None  # a fault of the head seen in a header (two Hosts)
        self._head_bytes = 0  # what is kept of the head (names and values)
        # The body so far: its first piece as it came (a body that arrives in one piece is
        # never copied), then one bytearray it grows in, so that what it costs in memory is
        # the bytes counted (a list of 2-byte chunks cost 28 bytes of memory per byte).
        self._body: bytes | bytearray = b""
        self._body_bytes = 0
        self._request: Request | None = None  # its head is parsed, its body not yet
        self._in_head = True  # between requests or inside a head: bytes count toward the head
        self._begun = False  # the parser saw the request's first byte, and not its end
        self._ended = False  # a request ended in the piece just fed
        self._head_fed = 0  # bytes handed to the parser since the head began (at most)
        self._head_started = 0.0  # when the head in progress was first seen unfinished
        self._body_left = 0  # Content-Length bytes still to come; -1: chunked
        self._chunk_mark = -1  # body bytes when the last chunk's size line came
        self._trailer_line = 0  # bytes of the trailer line in progress (at most)
        self._trailer_bytes = 0
        self._raw_left = 0  # an Upgrade request's body, read past the parser
        self._upgrade = False  # the request asked for an Upgrade (ignored)
        self._held = 0  # bytes of the request being parsed counted in server.buffered_bytes
        # what the timer saw at its last look
        self._seen_body = -1
        self._seen_body_at = 0.0
        self._body_began = 0.0  # when the request's head ended
        self._seen_pending = 0
        self._seen_pending_at = 0.0
        self._resumes = 0
        self._seen_resumes = 0

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        server = self._server
        if len(server.connections) >= server.max_connections:
            if len(server.reserve) >= server.probe_reserve:
                self._crowded_out()  # it never counts among the open connections
                return
            # Over the cap, in the probes' reserve (server.py says why): served only if its
            # first request is a probe, and only if that comes at once.
            server.reserve.add(self)
            self._reserve = True
            self._parser = httptools.HttpRequestParser(self)
            self._timer = self._loop.call_later(server.reserve_head_seconds, self._crowded_out)
            return
        server.connections.add(self)
        self._parser = httptools.HttpRequestParser(self)
        self._arm_timer()

    def _crowded(self) -> Response:
        return busy(f"The gateway holds its most client connections "
                    f"({self._server.max_connections}); retry shortly.", "too_many_connections")

    def _crowded_out(self) -> None:
        """A connection over the cap, or in the probes' reserve with no probe come: answered
        503 and closed."""
        self._timer = None
        if (self._reading and self._task is None and not self._queue
                and not self.transport.is_closing()):
            self._reading = False
            crowded = self._crowded()
            self.transport.write(self._framed(crowded, (1, 1), "", keep_alive=False))
            self._server.refused(crowded, None)
            self._linger_close()

    def data_received(self, data: bytes) -> None:
        if not self._reading:
            return  # refused, upgraded or lingering: what more comes is dropped
        if self._raw_left:
            self._raw_body(data, 0)
            return
        parser, server = self._parser, self._server
        size, pos = len(data), 0
        view: memoryview | None = None
        align = True
        while pos < size and self._reading:
            aligned = False
            if self._in_head:
                # Between requests or inside a head: the parser is fed no more than the head
                # may still take (httptools joins a split header line with `bytes +=`), and
                # only up to the head's end, so that what follows is counted as what it is.
                room = MAX_HEAD_BYTES - self._head_fed
                if room <= 0:
                    self._refuse(431, "The request head is larger than 64 KiB.",
                                 "request_header_fields_too_large")
                    return
                take = min(room, size - pos)
                if align:
                    blank = data.find(b"\r\n\r\n", pos, pos + take)
                    if blank >= 0:
                        take, aligned = blank + 4 - pos, True
                self._head_fed += take
            elif self._body_left > 0:
                take = min(self._body_left, size - pos)  # a request ends at a piece's end
            elif self._body_left < 0 and self._chunk_mark == self._body_bytes:
                # Chunked, after a size line: perhaps the last one's trailer section.
                room = MAX_HEAD_BYTES - self._trailer_line
                if room <= 0:
                    self._refuse(431, "The request's trailer section is larger than 64 KiB.",
                                 "request_header_fields_too_large")
                    return
                take = min(room, size - pos)
            else:
                take = size - pos
            if take == size:
                piece: bytes | memoryview = data
            else:
                if view is None:
                    view = memoryview(data)
                piece = view[pos:pos + take]
            self._ended = False
            try:
                parser.feed_data(piece)
            except httptools.HttpParserUpgrade as upgrade:
                self._upgraded(data, pos + int(upgrade.args[0]))
                return
            except httptools.HttpParserError as exc:
                if not self._reading:
                    return  # one of our own refusals, answered already
                if str(exc) == "Invalid HTTP version":  # well formed, not one llhttp knows
                    self._refuse(505, "This HTTP version is not served here: send HTTP/1.1.",
                                 "http_version_not_supported")
                else:
                    self._refuse(400, f"Malformed HTTP request: {exc}.", "bad_request")
                return
            end = pos + take
            if aligned and self._in_head and not self._ended:
                align = False  # blank lines before a request, not a head's end: feed on
            if self._ended and self._in_head and self._begun:
                # A request ended inside this piece and the next one's head began after it:
                # that head has at most the bytes after the piece's last blank line.
                last = data.rfind(b"\r\n\r\n", pos, end)
                self._head_fed = end - last - 4 if last >= 0 else take
            elif self._body_left < 0 and self._chunk_mark == self._body_bytes \
                    and not self._in_head:
                newline = data.rfind(b"\n", pos, end)
                self._trailer_line = (end - newline - 1 if newline >= 0
                                      else self._trailer_line + take)
            pos = end
            if len(self._queue) >= MAX_PIPELINED and pos < size and self._reading:
                # Parsed far enough ahead (reading is paused): the rest waits as bytes.
                self._backlog = data[pos:]
                server.buffered_bytes += size - pos
                return
        if self._in_head and self._begun and self._reading:
            # A head is unfinished: its bytes count among those the server holds, and its
            # time runs from now.
            if not self._head_started:
                self._head_started = self._loop.time()
            grow = self._head_fed - self._held
            if grow > 0:
                self._held += grow
                server.buffered_bytes += grow

    def eof_received(self) -> None:
        # A client that closes its side has gone, as far as HTTP goes (few clients half-close,
        # and a closed one looks the same): the connection closes and its handler is
        # cancelled, so the engine stops generating for nobody (as aiohttp did).
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._reading = False
        server = self._server
        server.connections.discard(self)
        server.reserve.discard(self)
        if self._lingering:
            self._lingering = False
            server.lingering -= 1
        for handle in (self._timer, self._linger):
            if handle is not None:
                handle.cancel()
        self._timer = self._linger = None
        if self._task is not None:
            self._task.cancel()  # the client is gone: its handler stops (the engine's too)
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client closed"))
        # What the connection held comes back now (the request being answered, once its
        # handler has stopped), and nothing it made points back at it.
        server.buffered_bytes -= self._held
        self._held = 0
        for request in self._queue:
            self._release(request)
        self._queue.clear()
        self._request = None
        self._body = b""
        server.buffered_bytes -= len(self._backlog)
        self._backlog = b""
        self._parser = None

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._resumes += 1  # the client reads: what the write-stall timeout looks for
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        if self._lost or self.transport.is_closing():
            raise ConnectionResetError("the client closed")
        if not self._write_paused and self.transport.get_write_buffer_size() <= CLIENT_BUFFER_HIGH:
            return
        if self._drain_waiter is None:
            self._drain_waiter = self._loop.create_future()
        await self._drain_waiter

    # --- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._begun = True
        self._url.clear()
        self._headers = {}
        self._fault = None
        self._head_bytes = 0
        self._body = b""
        self._body_bytes = 0
        self._trailer_bytes = 0
        self._request = None

    def on_url(self, url: bytes) -> None:
        self._url += url  # bounded: the parser is never fed more than a head may hold

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + 4
        if self._request is not None:
            # A trailer field: read, counted, never merged into the head (RFC 9110 6.5.1: an
            # Authorization or X-Request-Id sent after the body is not the request's).
            self._trailer_bytes += size
            if self._trailer_bytes > MAX_HEAD_BYTES:
                self._refuse(431, "The request's trailer section is larger than 64 KiB.",
                             "request_header_fields_too_large")
                raise _Stop
            return
        self._head_bytes += size
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        previous = self._headers.get(key)
        if previous is None:
            self._headers[key] = text
        else:
            if key == "host":
                self._fault = "An HTTP request carries one Host header, not two (RFC 9112 3.2)."
            self._headers[key] = f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        parser, server = self._parser, self._server
        self._in_head = False
        self._head_fed = 0
        self._head_started = 0.0
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            self._refuse(505, f"HTTP/{version} is not served here: send HTTP/1.1.",
                         "http_version_not_supported")
            raise _Stop
        headers = self._headers
        method = parser.get_method().decode("latin-1")
        url = bytes(self._url)
        if not url.startswith(b"/"):  # absolute form (through a forward proxy) or `*`
            try:
                url = httptools.parse_url(url).path or b"/"
            except httptools.HttpParserInvalidURLError:
                url = b"/"
        path = url.split(b"?", 1)[0].decode("latin-1")
        request = Request(method=method, path=path,
                          version=(1, 1) if version == "1.1" else (1, 0), headers=headers,
                          connection=self)
        refusal = (head_fault(self._fault, request.http11, method, headers)
                   if self._fault is not None or "transfer-encoding" in headers
                   or method == "CONNECT" or ("host" not in headers and version == "1.1")
                   or not valid_host(headers.get("host")) else None)
        handler, head_check = server.router.route(method, path)
        request.handler = handler
        if refusal is None and self._reserve and (
                path not in server.probe_paths or method not in ("GET", "HEAD")):
            refusal = self._crowded()
        if refusal is None and head_check is not None:
            refusal = head_check(request)
        if refusal is not None or server.stopping:
            self._refuse_request(request, refusal or busy(*SHUTTING_DOWN))
            raise _Stop
        length = 0
        declared = headers.get("content-length")  # never with Transfer-Encoding (llhttp)
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:  # llhttp checks it; a bad one is bad framing all the same
                self._refuse_request(request, error_response(
                    400, "Malformed HTTP request: bad Content-Length.", "bad_request"))
                raise _Stop from None
            if length > server.max_body_bytes:
                # Refused before the body comes: not buffered, and (no 100 Continue) a
                # client that waits for it never sends it. The connection closes after it.
                request.too_large = True
                self._stop_reading(request)
                raise _Stop
            if length and server.buffered_bytes + length > server.max_buffered_bytes:
                # It cannot fit now: refused before a byte of it is read.
                self._refuse_request(request, self._full())
                raise _Stop
        # Held from now: the head, as what is kept of it. The body is counted as it comes,
        # not as announced: an announced length holds nothing yet, and reserving it let heads
        # that announce large bodies and send a byte now and then fill max_buffered_bytes with
        # nothing, so that every other body was 503 (issue 36). The bound still holds: a
        # piece is counted before it is kept, and one that would pass the cap is refused 503
        # (a body may then be refused part way, when others filled the cap meanwhile).
        held = self._head_bytes + len(url)
        server.buffered_bytes += held - self._held
        self._held = held
        if "transfer-encoding" in headers:
            self._body_left = -1
            self._chunk_mark = -1
        else:
            self._body_left = length
        # Both body clocks run from the head's end.
        self._body_began = self._seen_body_at = self._loop.time()
        self._seen_body = 0
        self._upgrade = "upgrade" in headers and parser.should_upgrade()
        if self._upgrade:
            # RFC 9110 7.8: a server may ignore Upgrade. llhttp takes the rest of the
            # connection for the other protocol, so a body is read past it (Content-Length
            # only), and the connection closes after the answer.
            if self._body_left < 0:
                self._refuse_request(request, error_response(
                    400, "A chunked body with Upgrade is not served: send the request "
                    "without Upgrade.", "bad_request"))
                raise _Stop
            self._raw_left = length
            self._body_left = 0
        self._request = request
        if "expect" in headers and request.http11 and self._task is None \
                and headers["expect"].lower() == "100-continue":
            # Not while an answer before it is being written (a 100 in the middle of a
            # stream would break its framing): the client then sends its body after its
            # own wait for the 100 (a second with curl).
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self._body_bytes += size
        server = self._server
        self._held += size  # counted as it comes (on_headers_complete says why)
        server.buffered_bytes += size
        if self._body_left >= 0:  # Content-Length: within max_body_bytes (its head said)
            self._body_left -= size
        elif self._body_bytes > server.max_body_bytes:
            request = cast(Request, self._request)
            request.too_large = True  # the handler answers 413; nothing more is read
            self._body = b""
            self._stop_reading(request)
            raise _Stop
        if server.buffered_bytes > server.max_buffered_bytes:
            self._body = b""
            self._refuse_request(cast(Request, self._request), self._full())
            raise _Stop
        self._keep(body)

    def _keep(self, piece: bytes) -> None:
        kept = self._body
        if not kept:
            self._body = piece
        elif isinstance(kept, bytearray):
            kept += piece  # in place, over-allocating by an eighth as it grows
        else:
            grown = bytearray(kept)
            grown += piece
            self._body = grown

    def _whole_body(self) -> bytes:
        """The body kept, as the request's bytes; the connection keeps nothing of it. A grown
        body is copied once and its bytearray freed at once: two copies of one body at most,
        for a moment (nothing else runs meanwhile)."""
        kept, self._body = self._body, b""
        return bytes(kept) if isinstance(kept, bytearray) else kept

    def _full(self) -> Response:
        return busy(f"The gateway holds its most request bytes "
                    f"({self._server.max_buffered_bytes}, --max-buffered-bytes); retry "
                    "shortly.", "server_busy")

    def on_chunk_header(self) -> None:
        self._chunk_mark = self._body_bytes
        self._trailer_line = 0

    def on_chunk_complete(self) -> None:
        self._chunk_mark = -1

    def on_message_complete(self) -> None:
        self._in_head = True
        self._begun = False
        self._ended = True
        self._body_left = 0
        request = self._request
        if request is None or self._raw_left:
            return  # an Upgrade request's body comes past the parser (_raw_body)
        self._request = None
        if self._body:
            request.body = self._whole_body()
        # Read now: with pipelining the parser moves on to the next request before this one
        # is answered.
        parser = self._parser
        request.keep_alive = (not self._upgrade and not self._reserve
                              and parser.should_keep_alive())
        self._dispatch(request)

    # --- past the parser -------------------------------------------------------------------

    def _upgraded(self, data: bytes, at: int) -> None:
        """The parser stopped at an Upgrade, which is ignored: the request is answered over
        HTTP/1.1, and nothing after it is parsed (it may be the other protocol)."""
        if self._raw_left:
            self._raw_body(data, at)
        else:
            self._reading = False

    def _raw_body(self, data: bytes, at: int) -> None:
        piece = data[at:at + self._raw_left]
        if not piece:
            return
        self._raw_left -= len(piece)
        self._body_bytes += len(piece)
        server = self._server
        self._held += len(piece)
        server.buffered_bytes += len(piece)
        if server.buffered_bytes > server.max_buffered_bytes:
            self._body = b""
            self._raw_left = 0
            self._refuse_request(cast(Request, self._request), self._full())
            return
        self._keep(piece)
        if self._raw_left:
            return
        request = cast(Request, self._request)
        self._request = None
        request.body = self._whole_body()
        request.keep_alive = False
        self._reading = False
        self._dispatch(request)

    # --- answering -------------------------------------------------------------------------

    def _dispatch(self, request: Request) -> None:
        request.held, self._held = request.held + self._held, 0
        self._queue.append(request)
        if len(self._queue) >= MAX_PIPELINED and not self._paused_reading:
            self._paused_reading = True
            self.transport.pause_reading()
        if self._task is None:
            self._task = self._loop.create_task(self._answer_queue())

    def _resume(self) -> None:
        """Room in the queue again: what was read ahead is parsed first, then the socket."""
        self._paused_reading = False
        backlog, self._backlog = self._backlog, b""
        if backlog:
            self._server.buffered_bytes -= len(backlog)
            self.data_received(backlog)
        if not self._paused_reading and not self._lost:
            self.transport.resume_reading()

    def _stop_reading(self, request: Request) -> None:
        """Answer `request` after those before it, and read nothing more: the connection
        closes after the answer (lingering: the client may still be sending)."""
        self._reading = False
        self._request = None
        self._begun = False
        self._body = b""
        request.keep_alive = False
        self._dispatch(request)
        if not self._paused_reading:  # until the answer is written: the kernel holds back
            self._paused_reading = True
            self.transport.pause_reading()

    def _refuse_request(self, request: Request, response: Response) -> None:
        request.refusal = response
        self._stop_reading(request)

    def _refuse(self, status: int, message: str, code: str) -> None:
        """A refusal before there is a request to answer (bad framing, a head too large or
        too slow): answered after the requests before it, then the connection closes."""
        self._refuse_request(Request("", "", (1, 1), {}, self),
                             error_response(status, message, code))

    def _release(self, request: Request) -> None:
        self._server.buffered_bytes -= request.held
        request.held = 0

    async def _answer_queue(self) -> None:
        try:
            while self._queue and not self.transport.is_closing():
                if self._write_paused or \
                        self.transport.get_write_buffer_size() > CLIENT_BUFFER_HIGH:
                    # The client has not read the answers so far: the next handler waits
                    # until it does, so that pipelined requests nobody reads do not pile
                    # their answers up here (the write-stall timeout drops a client that
                    # never reads; reading pauses once MAX_PIPELINED requests wait).
                    await self.drain()
                    continue
                request = self._queue.popleft()
                if (self._paused_reading and self._reading
                        and len(self._queue) < MAX_PIPELINED // 2):
                    self._resume()
                self._current = request
                try:
                    keep_alive = await self._answer(request)
                finally:
                    self._current = None
                    self._server.buffered_bytes -= request.held  # given back
                    request.held = 0
                if not keep_alive:
                    self._close_after_answer()
                    return
        except (asyncio.CancelledError, ConnectionError):
            return  # the client went away
        finally:
            self._task = None
        if self._server.stopping and self.is_idle():
            self.transport.close()
        else:
            self._active_at = self._loop.time()

    async def _answer(self, request: Request) -> bool:
        """Run the handler, write its answer; whether the connection may serve another."""
        server = self._server
        if request.refusal is None and server.stopping:
            # Arrived behind a running request after the stop began: refused, not started.
            request.refusal = busy(*SHUTTING_DOWN)
            request.keep_alive = False
        if request.refusal is not None:
            self._write(request, request.refusal)
            server.refused(request.refusal, request if request.method else None)
            return False
        handler = request.handler or server.router.find(request.method, request.path)
        server.in_flight += 1
        try:
            result = await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unhandled error answering %s %s", request.method, request.path)
            result = error_response(500, "internal error in the gateway", "internal",
                                    "server_error")
        finally:
            server.in_flight -= 1
        if isinstance(result, Streamed):
            return self._keep_alive(request) and result.complete and request.http11
        keep_alive = self._write(request, result)
        if result.after is not None:
            server.in_flight += 1  # a graceful stop waits for it too
            try:
                await result.after()
            except Exception:
                log.exception("unhandled error after answering %s %s", request.method,
                              request.path)
            finally:
                server.in_flight -= 1
        return keep_alive

    def _keep_alive(self, request: Request) -> bool:
        if not request.keep_alive or request.too_large:
            return False
        # Stopping: the connection closes after this answer, unless a request came behind it
        # (it is answered 503 shutting_down, with the close).
        return not self._server.stopping or bool(self._queue)

    def _framed(self, response: Response, version: tuple[int, int], method: str,
                keep_alive: bool, http11: bool = True) -> bytes:
        headers = response.headers
        headers["Content-Length"] = str(len(response.body))
        if not keep_alive:
            headers["Connection"] = "close"
        elif not http11:
            headers["Connection"] = "keep-alive"
        body = b"" if method == "HEAD" else response.body
        return head_bytes(response.status, headers, version) + body

    def _write(self, request: Request, response: Response) -> bool:
        """Write a whole answer with its framing; whether the connection stays open."""
        keep_alive = self._keep_alive(request)
        if not self.transport.is_closing():
            self.transport.write(self._framed(response, request.version, request.method,
                                              keep_alive, request.http11))
        return keep_alive

    def write_now(self, request: Request, response: Response) -> Streamed:
        return Streamed(complete=self._write(request, response) and request.http11)

    def _close_after_answer(self) -> None:
        if self._reading:
            self.transport.close()  # the request was read whole: nothing is left unread
        else:
            self._linger_close()

    def _linger_close(self) -> None:
        """Close a connection whose client may still be sending (a refused body): our side
        is shut after the answer, and what the client sends meanwhile is read and dropped
        until it closes, or for LINGER_SECONDS; closing with bytes unread would reset the
        connection, and the client could lose the answer with it."""
        transport, server = self.transport, self._server
        self._reading = False
        if transport.is_closing():
            return
        if server.lingering >= server.max_connections:
            transport.close()
            return
        try:
            if transport.can_write_eof():
                transport.write_eof()
        except (OSError, RuntimeError):
            transport.close()
            return
        if self._paused_reading:
            self._paused_reading = False
            transport.resume_reading()
        self._lingering = True
        server.lingering += 1
        self._linger = self._loop.call_later(server.linger_seconds, transport.close)

    # --- the connection's timer ------------------------------------------------------------

    def _arm_timer(self) -> None:
        # One timer per connection that re-arms itself, rather than one per request.
        self._timer = self._loop.call_later(self._server.tick_seconds, look, self)

    def is_idle(self) -> bool:
        """No request being read, waiting or answered."""
        return (self._task is None and not self._queue and self._request is None
                and not self._begun and not self._raw_left and not self._backlog)

    def close_if_idle(self) -> None:
        if self.is_idle() and not self._lingering:
            self.transport.close()
