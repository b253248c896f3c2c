"""Whole (non-streamed) answers from the pod's engine, over kept-alive connections.

A whole answer is one request and one short response, so what it costs is the code around
it, run cold after the engine's wait: each connection here is an asyncio Protocol whose
response is parsed by httptools (C) into one future, and idle connections wait in a pool.
Streams do not come here: they are relayed on connections of their own (relay.py).

The pinned llama-server (cpp-httplib) closes a connection after 5 s without a request; a
pooled connection idle longer than that allows (engine.py) is dropped rather than used. A
request is sent again on another connection only when it was never written: its connection
had closed (or sent EOF) before the write. Once written, the engine may have run it, so a
connection that closes before the answer is whole fails the request (EngineDropped: a 502),
never sends it twice.

A closed connection drops its parser (which holds its bound callbacks) and the answer's
hook, so it is freed when the pool lets go of it, without the cycle collector.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

import httptools

from glm_operator.gateway.wire.engine import (
    OWN_CONNECTION_MAX_IDLE_SECONDS,
    EngineAddress,
    EngineDropped,
    EngineHead,
    EngineTimeout,
    NeverWritten,
    bare,
    connect,
    idle_peer_spoke,
    socket_fd,
)
from glm_operator.gateway.wire.framing import EngineProtocolError

log = logging.getLogger(__name__)

# Called with the whole answer the moment it is parsed, inside the connection's callback:
# the gateway writes a good answer to its client from there, before its handler resumes.
AnswerHook = Callable[[EngineHead, bytes], None]

# Pooled connections the engine may have closed together (after a burst of requests).
STALE_RETRIES = 3


class KeptAliveConnection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser: Any = None  # while connected: it holds this object's bound callbacks
        self.transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[tuple[EngineHead, bytes]] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._answered_bytes = False
        self._timer: asyncio.TimerHandle | None = None
        self._on_answer: AnswerHook | None = None
        self.keep_alive = False
        self.lost = False  # closed, or the engine sent EOF: never written to again
        self.fd = -1

    @property
    def writable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.fd = socket_fd(transport)
        self._parser = httptools.HttpResponseParser(self)

    def post(self, path: str, authority: str, body: bytes, read_timeout: float | None,
             on_answer: AnswerHook | None = None, extra_headers: bytes = b""
             ) -> asyncio.Future[tuple[EngineHead, bytes]]:
        """Write the request; NeverWritten (at once) when the connection had closed."""
        if not self.writable:
            raise NeverWritten("the engine had closed the connection")
        assert self.transport is not None
        self._answer = answer = self._loop.create_future()
        self._on_answer = on_answer
        self._headers, self._body, self._answered_bytes = {}, [], False
        if read_timeout:
            self._timer = self._loop.call_later(read_timeout, self._timed_out, read_timeout)
        self.transport.write(
            b"POST %b HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%b\r\n%b"
            % (path.encode(), authority.encode(), len(body), extra_headers, body))
        return answer

    # --- asyncio.Protocol and httptools callbacks --------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._answered_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(EngineProtocolError(f"bad HTTP answer from the engine: {exc}"))

    def eof_received(self) -> None:
        self.lost = True  # at once: the pool must not write into it meanwhile
        return None  # close our side too; connection_lost settles a request in flight

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        answer, self._answer = self._answer, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        on_answer, self._on_answer = self._on_answer, None
        if answer is not None and not answer.done():
            result = (EngineHead(self._parser.get_status_code(), self._headers),
                      b"".join(self._body))
            if on_answer is not None:
                try:
                    on_answer(*result)
                except Exception:  # the handler still gets the answer, and answers itself
                    log.exception("writing the engine's answer from its callback failed")
            answer.set_result(result)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        why = exc or "EOF"
        # Only a request in flight fails: it was written, so the engine may have run it.
        when = "mid-answer" if self._answered_bytes else "before answering"
        self._fail(EngineDropped(f"the engine closed the connection {when}: {why}"))
        self._parser = None

    def _timed_out(self, seconds: float) -> None:
        self._timer = None
        self._fail(EngineTimeout(f"no answer from the engine within {seconds:g} s"))

    def _fail(self, exc: Exception) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._on_answer = None
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_exception(bare(exc))
        self.abort()

    def abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class EnginePool:
    def __init__(self, address: EngineAddress, connect_timeout: float | None,
                 read_timeout: float | None) -> None:
        self.address = address
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._idle: list[tuple[KeptAliveConnection, float]] = []  # newest last

    async def post(self, path: str, body: bytes, on_answer: AnswerHook | None = None,
                   extra_headers: bytes = b"") -> tuple[EngineHead, bytes]:
        """POST JSON and return the whole answer; `on_answer` sees it first, as it is
        parsed; `extra_headers`: whole header lines (CRLF-terminated) to send along.
        Sent again only where it was never written (its connection had closed);
        EngineDropped when the engine closed the connection after it was written."""
        loop = asyncio.get_running_loop()
        for _ in range(STALE_RETRIES + 1):
            connection = self._take_idle(loop.time())
            if connection is None:
                connection = await self._connect(loop)
            try:
                head, answer = await connection.post(path, self.address.authority, body,
                                                     self._read_timeout, on_answer,
                                                     extra_headers)
            except NeverWritten:
                connection.abort()
                continue  # closed before the write: the engine never saw the request
            except BaseException:
                connection.abort()  # cancelled or failed: the engine stops working on it
                raise
            if connection.keep_alive and not connection.lost:
                self._idle.append((connection, loop.time()))
            else:
                connection.abort()
            return head, answer
        raise NeverWritten("the engine closed every connection before the request was written")

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> KeptAliveConnection:
        connection = KeptAliveConnection(loop)
        await connect(self.address, connection, self._connect_timeout)
        return connection

    def _take_idle(self, now: float) -> KeptAliveConnection | None:
        while self._idle:
            connection, since = self._idle.pop()
            if (connection.writable and now - since <= OWN_CONNECTION_MAX_IDLE_SECONDS
                    and not idle_peer_spoke(connection.fd)):
                return connection
            connection.abort()
        return None

    def close(self) -> None:
        for connection, _ in self._idle:
            connection.abort()
        self._idle.clear()
