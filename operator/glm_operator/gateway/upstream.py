"""One interface over the engine clients, one answer type.

`Upstream.send` posts a valid request and returns either an `UpstreamAnswer` (a whole answer,
which the pipeline passes on, or routes to the long-context pool on a context refusal) or
`Streamed` (a stream, relayed and its books kept). Three clients stand behind it:

- `PooledEngine`: whole answers from this pod's engine over kept-alive connections
  (wire/engine_pool.py); a good answer is written to the client from the engine connection's
  callback the moment it is parsed (`UpstreamAnswer.sent`);
- `RelayedEngine`: streams from this pod's engine to HTTP/1.1 clients, relayed at the transport
  level (wire/relay.py);
- `HttpUpstream`: aiohttp's client for the rest (the long-context pool, an engine that is not
  plain http://, an HTTP/1.0 client's stream).

The pool and the relay send a request to the engine once: again only where it was never
written (its connection had closed first); a connection the engine closes after the write is
a 502 `engine_dropped` (`engine_errors`), since the engine may have run the request.
aiohttp's client cannot tell the two apart, so through it a request is never sent twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from glm_operator.gateway.call import Call
from glm_operator.gateway.openai import errors
from glm_operator.gateway.openai.errors import GatewayError
from glm_operator.gateway.openai.sse import StreamCapture, error_event
from glm_operator.gateway.openai.validation import ParsedRequest
from glm_operator.gateway.policy.outcomes import STREAM_BROKEN, STREAM_TIMED_OUT
from glm_operator.gateway.wire.engine import EngineDropped, EngineHead, EngineTimeout
from glm_operator.gateway.wire.engine_pool import EnginePool
from glm_operator.gateway.wire.framing import LAST_CHUNK, EngineProtocolError, head_bytes
from glm_operator.gateway.wire.messages import Request, Response, Streamed
from glm_operator.gateway.wire.relay import ClientGone, EngineConnector, EngineExchange

log = logging.getLogger(__name__)

JSON = "application/json"
SSE = "text/event-stream"


@dataclass(slots=True)
class UpstreamAnswer:
    """A whole answer, from whichever client."""

    status: int
    content_type: str
    body: bytes
    sent: Streamed | None = None  # the client has it already (written from the callback)


Reply = UpstreamAnswer | Streamed


class Upstream(Protocol):
    async def send(self, request: Request, parsed: ParsedRequest, path: str, call: Call
                   ) -> Reply: ...


@dataclass(frozen=True, slots=True)
class StreamBooks:
    """What every stream keeps: chunks counted (for a token budget's estimate when the
    client leaves) and kept whole (for the audit log's text)."""

    count_events: bool
    keep_all: bool

    def capture(self) -> StreamCapture:
        return StreamCapture(self.count_events, self.keep_all)


@contextlib.contextmanager
def engine_errors(where: str, read_timeout: float) -> Iterator[None]:
    """Our engine clients' failures as the gateway's own errors: a timeout is 504; a
    connection the engine closed after the request was written to it is 502 (the request is
    not sent again: the engine may have run it); anything else the engine did (refused,
    bad framing) is 503 naming `where`."""
    try:
        yield
    except EngineTimeout:
        raise errors.engine_timeout(read_timeout) from None
    except EngineDropped as exc:
        raise engine_dropped(where, exc) from None
    except (OSError, EngineProtocolError) as exc:
        raise errors.engine_unavailable(f"{where}: {exc or type(exc).__name__}") from None


def engine_dropped(where: str, exc: BaseException) -> GatewayError:
    return GatewayError(
        502, f"{where}: {exc or type(exc).__name__}. The request was not sent again, since "
        "the engine may have run it.", "server_error", None, "engine_dropped")


def stream_head(content_type: str, rid: str, chunked: bool,
                version: tuple[int, int] = (1, 1)) -> bytes:
    headers = {"Content-Type": content_type, "Cache-Control": "no-cache", "X-Request-Id": rid}
    if chunked:
        headers["Transfer-Encoding"] = "chunked"
    else:
        headers["Connection"] = "close"  # an HTTP/1.0 client reads to the connection's end
    return head_bytes(200, headers, version)


@dataclass(slots=True)
class PooledEngine:
    pool: EnginePool
    url: str  # what an error names
    read_timeout: float

    async def send(self, request: Request, parsed: ParsedRequest, path: str, call: Call
                   ) -> Reply:
        """A good answer is written to the client from the engine connection's callback, the
        moment it is parsed: the handler's resumption, usage counting and the rest happen
        after the client has it (on a cold path they cost about 0.2 ms)."""
        written: Streamed | None = None
        rid = call.record.request_id

        def write_now(head: EngineHead, body: bytes) -> None:
            nonlocal written
            if head.status == 200:
                written = request.write_now(Response(
                    200, body, {"Content-Type": head.content_type, "X-Request-Id": rid}))

        with engine_errors(f"{self.url}{path}", self.read_timeout):
            head, body = await self.pool.post(path, parsed.body,
                                              write_now if request.http11 else None)
        return UpstreamAnswer(head.status, head.content_type, body, written)


@dataclass(slots=True)
class RelayedEngine:
    connector: EngineConnector
    url: str  # what an error names
    read_timeout: float
    books: StreamBooks

    async def send(self, request: Request, parsed: ParsedRequest, path: str, call: Call
                   ) -> Reply:
        with engine_errors(f"{self.url}{path}", self.read_timeout):
            exchange = await self.connector.open(path, parsed.body)
        try:
            head = await exchange.head
            if head.status == 200 and head.content_type.startswith(SSE):
                return await self._relay(request, exchange, call, head.content_type)
            with engine_errors("the engine dropped the answer", self.read_timeout):
                body = await exchange.read_body()
        finally:
            exchange.abort()
        return UpstreamAnswer(head.status, head.content_type, body)

    async def _relay(self, request: Request, exchange: EngineExchange, call: Call,
                     content_type: str) -> Streamed:
        # HTTP/1.1 only (proxy.py): the head says "Transfer-Encoding: chunked", and the body's
        # framing is the engine's own, written by the relay.
        transport = request.transport
        transport.write(stream_head(content_type, call.record.request_id, chunked=True))
        capture = call.capture = self.books.capture()
        try:
            exchange.relay(transport, capture.note, request.drain)
            await exchange.done
        except ClientGone:
            call.client_left(capture)
            return Streamed(complete=False)
        except (OSError, EngineTimeout, EngineProtocolError) as exc:
            # Headers are gone already: end the stream if its framing allows, else drop the
            # client's connection, and say so in the log.
            log.warning("request %s: engine stream broke: %s", call.record.request_id, exc)
            event = _broke_off(call, isinstance(exc, EngineTimeout), self.read_timeout)
            call.stream_ended(capture, complete=False)
            if not exchange.end_stream_cleanly(event):
                transport.close()
            return Streamed(complete=False)
        except asyncio.CancelledError:
            # The client went away (its handler is cancelled): dropping our engine
            # connection makes the engine stop generating and free the slot.
            call.client_left(capture)
            raise
        finally:
            exchange.abort()
        call.stream_ended(capture, complete=True)
        return Streamed(complete=True)


@dataclass(slots=True)
class HttpUpstream:
    """aiohttp's client to `url`; `forward_identity`: the request id and the client's
    Authorization go along (the long-context pool's gateway checks the key itself)."""

    session: Callable[[], aiohttp.ClientSession]  # the gateway's, once started
    url: str
    read_timeout: float
    books: StreamBooks
    forward_identity: bool = False

    async def send(self, request: Request, parsed: ParsedRequest, path: str, call: Call
                   ) -> Reply:
        headers = {"Content-Type": JSON}
        if self.forward_identity:
            headers["X-Request-Id"] = call.record.request_id
            if "authorization" in request.headers:
                headers["Authorization"] = request.headers["authorization"]
        async with await self._post(self.url + path, parsed.body, headers) as upstream:
            content_type = upstream.headers.get("Content-Type", JSON)
            if parsed.stream and upstream.status == 200 and content_type.startswith(SSE):
                return await self._stream(request, upstream, call, content_type)
            try:
                body = await upstream.read()
            except aiohttp.SocketTimeoutError:
                raise errors.engine_timeout(self.read_timeout) from None
            except aiohttp.ClientError as exc:
                raise errors.engine_unavailable(f"the engine dropped the answer: {exc}") from None
            return UpstreamAnswer(upstream.status, content_type, body)

    async def _post(self, url: str, body: bytes, headers: dict[str, str]
                    ) -> aiohttp.ClientResponse:
        """One POST, never sent twice: aiohttp cannot tell a pooled connection closed before
        the write from one the engine (or the long-context pool) closed after it, having
        perhaps run the request. Its pool lets go of connections before the engine closes
        them (wire/engine.py), so the first is rare; both are a 502."""
        try:
            return await self.session().post(url, data=body, headers=headers)
        except aiohttp.SocketTimeoutError:
            raise errors.engine_timeout(self.read_timeout) from None
        except aiohttp.ClientConnectorError as exc:  # refused or unreachable: a fast 503
            raise errors.engine_unavailable(f"{url}: {exc or type(exc).__name__}") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise engine_dropped(url, exc) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise errors.engine_unavailable(f"{url}: {exc or type(exc).__name__}") from None

    async def _stream(self, request: Request, upstream: aiohttp.ClientResponse, call: Call,
                      content_type: str) -> Streamed:
        """A stream read through aiohttp's client, framed here: chunked for HTTP/1.1 clients,
        ended by closing the connection for HTTP/1.0 ones."""
        chunked = request.http11
        transport = request.transport
        transport.write(stream_head(content_type, call.record.request_id, chunked=chunked,
                                    version=request.version))
        capture = call.capture = self.books.capture()
        try:
            async for chunk in upstream.content.iter_any():
                if transport.is_closing():
                    raise ConnectionResetError("the client closed")
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                await request.drain()
                capture.note((chunk,))
        except (ConnectionResetError, asyncio.CancelledError) as exc:
            # The client went away: closing our upstream socket makes the engine stop
            # generating and free the slot.
            upstream.close()
            call.client_left(capture)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return Streamed(complete=False)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Headers are gone already; all we can do is end the stream and say so in the log.
            log.warning("request %s: engine stream broke: %s", call.record.request_id, exc)
            event = _broke_off(call, isinstance(exc, TimeoutError), self.read_timeout)
            upstream.close()
            call.stream_ended(capture, complete=False)
            _end_stream(transport, chunked, event)  # chunks are whole here: framing holds
            return Streamed(complete=False)
        # llama-server closes its side of a keep-alive connection after a streamed answer;
        # back in the pool, the socket would fail the next request that picks it up.
        upstream.close()
        call.stream_ended(capture, complete=True)
        # Ended without its last event: the engine broke off (call.py says so in the books);
        # the client is told so too. A client gone after the last event had the whole answer.
        event = b"" if capture.delivered else error_event(
            "The model engine ended the stream before its end; the answer is incomplete.",
            STREAM_BROKEN)
        _end_stream(transport, chunked, event)
        return Streamed(complete=chunked)


def _broke_off(call: Call, timed_out: bool, read_timeout: float) -> bytes:
    """A stream the engine broke off (or stopped feeding): its books and the error event
    that tells the client."""
    if timed_out:
        call.record.error_code = STREAM_TIMED_OUT
        return error_event(f"The model engine sent nothing for {read_timeout:g} s; the "
                           "answer is incomplete.", STREAM_TIMED_OUT)
    call.record.error_code = STREAM_BROKEN
    return error_event("The model engine broke off the stream; the answer is incomplete.",
                       STREAM_BROKEN)


def _end_stream(transport: asyncio.Transport, chunked: bool, last_event: bytes) -> None:
    """The end of a stream framed here: `last_event` (an error event) then the last chunk
    (HTTP/1.1), or the event then the close (HTTP/1.0)."""
    if transport.is_closing():
        return
    if not chunked:
        if last_event:
            transport.write(last_event)
        return
    transport.write((b"%x\r\n%b\r\n" % (len(last_event), last_event) if last_event else b"")
                    + LAST_CHUNK)
