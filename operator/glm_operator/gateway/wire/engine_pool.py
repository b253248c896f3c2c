"""Whole (non-streamed) answers from the pod's engine, over kept-alive connections.

A whole answer is one request and one short response, so what it costs is the code around
it, run cold after the engine's wait: each connection here is an asyncio Protocol whose
response is parsed by httptools (C) into one future, and idle connections wait in a pool.
Streams do not come here: they are relayed on connections of their own (relay.py).

The pinned llama-server (cpp-httplib) closes a connection after 5 s without a request; a
pooled connection idle longer than that allows (engine.py) is dropped rather than used. One
that the engine closed anyway just before the request was written fails before any byte of
an answer came back: the engine never saw that request, so it is sent again on another
connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

import httptools

from glm_operator.gateway.wire.engine import (
    OWN_CONNECTION_MAX_IDLE_SECONDS,
    EngineAddress,
    EngineHead,
    EngineTimeout,
    connect,
)
from glm_operator.gateway.wire.framing import EngineProtocolError

log = logging.getLogger(__name__)

# Called with the whole answer the moment it is parsed, inside the connection's callback:
# the gateway writes a good answer to its client from there, before its handler resumes.
AnswerHook = Callable[[EngineHead, bytes], None]

# Pooled connections the engine may have closed together (after a burst of requests).
STALE_RETRIES = 3


class NeverAnswered(ConnectionResetError):
    """The connection closed before any byte of the answer: the engine never saw it."""


class KeptAliveConnection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[tuple[EngineHead, bytes]] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._answered_bytes = False
        self._timer: asyncio.TimerHandle | None = None
        self._on_answer: AnswerHook | None = None
        self.keep_alive = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def post(self, path: str, authority: str, body: bytes, read_timeout: float | None,
             on_answer: AnswerHook | None = None) -> asyncio.Future[tuple[EngineHead, bytes]]:
        assert self.transport is not None
        self._answer = answer = self._loop.create_future()
        self._on_answer = on_answer
        self._headers, self._body, self._answered_bytes = {}, [], False
        if read_timeout:
            self._timer = self._loop.call_later(read_timeout, self._timed_out, read_timeout)
        self.transport.write(
            b"POST %b HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b"
            % (path.encode(), authority.encode(), len(body), body))
        return answer

    # --- asyncio.Protocol and httptools callbacks --------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._answered_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(EngineProtocolError(f"bad HTTP answer from the engine: {exc}"))

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
        self._fail(NeverAnswered(f"the engine closed the connection: {why}")
                   if not self._answered_bytes else
                   ConnectionResetError(f"the engine closed the connection mid-answer: {why}"))

    def _timed_out(self, seconds: float) -> None:
        self._timer = None
        self._fail(EngineTimeout(f"no answer from the engine within {seconds:g} s"))

    def _fail(self, exc: Exception) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_exception(exc)
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

    async def post(self, path: str, body: bytes, on_answer: AnswerHook | None = None
                   ) -> tuple[EngineHead, bytes]:
        """POST JSON and return the whole answer; `on_answer` sees it first, as it is
        parsed (once: a request sent again after a stale connection is answered once)."""
        loop = asyncio.get_running_loop()
        for _ in range(STALE_RETRIES + 1):
            connection = self._take_idle(loop.time())
            pooled = connection is not None
            if connection is None:
                connection = await self._connect(loop)
            try:
                head, answer = await connection.post(path, self.address.authority, body,
                                                     self._read_timeout, on_answer)
            except NeverAnswered:
                if pooled:
                    continue  # closed while idle: the engine never saw the request
                raise
            except BaseException:
                connection.abort()  # cancelled or failed: the engine stops working on it
                raise
            if connection.keep_alive and not connection.lost:
                self._idle.append((connection, loop.time()))
            else:
                connection.abort()
            return head, answer
        raise NeverAnswered("the engine closed every kept-alive connection")

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> KeptAliveConnection:
        connection = KeptAliveConnection(loop)
        await connect(self.address, connection, self._connect_timeout)
        return connection

    def _take_idle(self, now: float) -> KeptAliveConnection | None:
        while self._idle:
            connection, since = self._idle.pop()
            if not connection.lost and now - since <= OWN_CONNECTION_MAX_IDLE_SECONDS:
                return connection
            connection.abort()
        return None

    def close(self) -> None:
        for connection, _ in self._idle:
            connection.abort()
        self._idle.clear()
