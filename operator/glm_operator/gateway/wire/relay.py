"""Streamed answers relayed at the transport level.

A streamed answer is most of the gateway's work per request: a hundred or more small HTTP
chunks. Through aiohttp's client and server each chunk is parsed off the engine's socket
into a stream reader, wakes the handler coroutine, and is framed again for the client. Here
the engine's connection is an asyncio Protocol whose `data_received` writes the engine's
bytes, chunk framing included, straight to the client's transport: one callback and one
write per packet, no coroutine switch. The framing is followed (ChunkedBody) only to know
where the answer ends and to keep its last events, where the engine puts the token counts.

Each streamed request has its own connection with `Connection: close`: the pinned
llama-server closes a keep-alive connection after every streamed answer anyway
(docs/performance.md). EngineConnector keeps one connection opened ahead (a spare), so a
request's bytes leave without waiting for a TCP handshake. Whole (non-streamed) answers go
over kept-alive connections instead (engine_pool.py).

A request goes to the engine once: a spare found closed before the write is replaced by a new
connection, but one that closes after the request was written fails it (EngineDropped: a
502), since the engine may have run it. The client side's own limits (a client that stops
reading is dropped after the write-stall timeout, which cancels the handler and so this
exchange) are the HTTP server's (http.py). `abort()` lets go of the client's transport and
callbacks, so nothing of a finished stream waits for the cycle collector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import cast

from glm_operator.gateway.wire.engine import (
    OWN_CONNECTION_MAX_IDLE_SECONDS,
    EngineAddress,
    EngineDropped,
    EngineHead,
    EngineTimeout,
    bare,
    connect,
    idle_peer_spoke,
    socket_fd,
)
from glm_operator.gateway.wire.framing import (
    CLIENT_BUFFER_HIGH,
    LAST_CHUNK,
    MAX_HEAD_BYTES,
    ChunkedBody,
    EngineProtocolError,
    response_head,
)

DrainFn = Callable[[], Awaitable[None]]  # waits until the client's socket buffer drained
# Sees the payload of each packet as it is relayed (chunk framing removed), after the write:
# what the stream's bookkeeping keeps (openai/sse.py), here nothing but a call.
PayloadSink = Callable[[list[bytes]], None]


def _ignore(_pieces: list[bytes]) -> None:
    return None


class ClientGone(Exception):
    """The client's connection closed before the answer was relayed."""



class EngineExchange(asyncio.Protocol):
    """One request to the engine on its own connection, and its answer.

    `head` resolves with the status and headers. Then either `read_body()` collects a whole
    (small) answer, or `relay()` forwards the body to the client as it arrives."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float | None) -> None:
        self._loop = loop
        self._read_timeout = read_timeout
        self.transport: asyncio.Transport | None = None
        self.head: asyncio.Future[EngineHead] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self._buffer = bytearray()  # the head, then a body not relayed
        self._pieces: list[bytes] = []  # the body's payload, read before any relay()
        self._raw: list[bytes] = []  # the same bytes as they came, chunk framing included
        self._chunked: ChunkedBody | None = None
        self._length: int | None = None  # Content-Length left, when not chunked
        self._until_close = False  # neither: the body ends with the connection
        self._relay_to: asyncio.Transport | None = None
        self._reframe = False  # the engine's body is not chunked: frame it for the client
        self._on_payload: PayloadSink = _ignore
        self._drain: asyncio.Task[None] | None = None
        self._drain_client: DrainFn | None = None
        self._last_data = loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self.sent = False
        self.lost = False  # closed, or the engine sent EOF
        self.fd = -1

    @property
    def writable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, yet have its methods.
        self.transport = cast(asyncio.Transport, transport)
        self.fd = socket_fd(transport)

    def send(self, path: str, authority: str, body: bytes, extra_headers: bytes = b"") -> None:
        """Write the request (a POST of JSON, `extra_headers` whole CRLF-terminated lines);
        the read timeout counts from here."""
        assert self.transport is not None
        self.sent = True
        self._last_data = self._loop.time()
        if self._read_timeout:
            self._timer = self._loop.call_later(self._read_timeout, self._check_timeout)
        self.transport.write(
            b"POST %b HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n%b\r\n%b"
            % (path.encode(), authority.encode(), len(body), extra_headers, body))

    def data_received(self, data: bytes) -> None:
        self._last_data = self._loop.time()
        try:
            if self._relay_to is not None:
                self._forward(data)
            elif not self.head.done():
                self._buffer += data
                self._parse_head()
            else:
                self._collect(data)
        except EngineProtocolError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        self.lost = True  # at once: a spare that the engine closed is not written to
        return None  # close our side too; connection_lost settles the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.sent:
            return  # a spare the engine closed: never used, nobody waits on it
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._drain is not None:
            self._drain.cancel()
        if not self.head.done():
            # Written, so perhaps run: not sent again.
            self.head.set_exception(EngineDropped(
                f"the engine closed the connection before answering: {exc or 'EOF'}"))
        elif self._until_close and not self.done.done():
            # A body delimited by the connection's end is complete now.
            if self._relay_to is not None and not self._relay_to.is_closing():
                self._relay_to.write(LAST_CHUNK)
            self._settle()
        elif not self.done.done():
            self.done.set_exception(EngineDropped(
                f"the engine closed the connection mid-answer: {exc or 'EOF'}"))

    # --- reading ---------------------------------------------------------------------------

    def _parse_head(self) -> None:
        """The head, once whole, by RFC 9112 only (framing.response_head): a head it refuses
        fails the exchange as the engine's protocol error, and nothing of it is relayed."""
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise EngineProtocolError("response head too large")
            return
        parsed = response_head(bytes(self._buffer[:end]))
        rest = bytes(self._buffer[end + 4:])
        self._buffer.clear()
        if parsed.chunked:
            self._chunked = ChunkedBody()
        elif parsed.length is not None:
            self._length = parsed.length
        else:
            self._until_close = True
        status, headers = parsed.status, parsed.headers
        if status in (204, 304) or 100 <= status < 200:
            self._chunked, self._length, self._until_close = None, 0, False
        self.head.set_result(EngineHead(status, headers))
        if rest:
            self._collect(rest)
        elif self._length == 0:
            self._settle()

    def _collect(self, data: bytes) -> None:
        """Keep a body that is read whole, or its first bytes until relay() starts."""
        if self._chunked is not None:
            used = self._chunked.feed(data, self._pieces)
            self._raw.append(data[:used])
            if self._chunked.complete:
                self._settle()
        elif self._length is not None:
            self._pieces.append(data[:self._length])
            self._length -= min(self._length, len(data))
            if not self._length:
                self._settle()
        else:
            self._pieces.append(data)

    def _settle(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, exc: BaseException) -> None:
        for future in (self.head, self.done):
            if not future.done():
                future.set_exception(bare(exc))
                break
        self._close()

    def _check_timeout(self) -> None:
        assert self._read_timeout
        idle = self._loop.time() - self._last_data
        if self._drain is not None:  # we stopped reading, for a slow client: not the engine
            idle = 0.0
        if idle >= self._read_timeout:
            self._timer = None
            self._fail(EngineTimeout(f"no data from the engine for {idle:.0f} s"))
        else:
            self._timer = self._loop.call_later(self._read_timeout - idle, self._check_timeout)

    async def read_body(self) -> bytes:
        """The whole body of an answer that is not relayed (an error, a JSON answer)."""
        await self.done
        return b"".join(self._pieces)

    # --- relaying --------------------------------------------------------------------------

    def relay(self, client: asyncio.Transport, on_payload: PayloadSink,
              drain_client: DrainFn) -> None:
        """From now on the body goes to `client` as it arrives; `done` says when it ended.

        The client's response head must be written already, announcing a chunked body: the
        engine's own chunk framing is forwarded unchanged (or made, if it sent none)."""
        self._relay_to = client
        self._on_payload = on_payload
        self._drain_client = drain_client
        self._reframe = self._chunked is None
        # Body bytes that came before this call (with the head, or while the handler woke):
        # as they came when chunked (a chunk may continue in the next packet), else framed.
        pending, self._pieces = [p for p in self._pieces if p], []
        raw, self._raw = b"".join(self._raw), []
        ended = self.done.done() and self.done.exception() is None
        if not self._reframe:
            if raw:
                client.write(raw)
        elif pending or ended:
            client.write(b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pending)
                         + (LAST_CHUNK if ended else b""))
        if pending:
            on_payload(pending)

    def _forward(self, data: bytes) -> None:
        client = self._relay_to
        assert client is not None
        if client.is_closing():
            self._fail(ClientGone())
            return
        pieces: list[bytes] = []
        if self._reframe:
            if self._length is not None:
                data = data[:self._length]
                self._length -= len(data)
            if data:
                client.write(b"%x\r\n%b\r\n" % (len(data), data))
                pieces.append(data)
            ended = self._length == 0
            if ended:
                client.write(LAST_CHUNK)
        else:
            assert self._chunked is not None
            used = self._chunked.feed(data, pieces)
            client.write(data if used == len(data) else data[:used])
            ended = self._chunked.complete
        self._on_payload(pieces)
        if ended:
            self._settle()
        elif client.get_write_buffer_size() > CLIENT_BUFFER_HIGH and self._drain is None:
            assert self.transport is not None and self._drain_client is not None
            self.transport.pause_reading()
            self._drain = self._loop.create_task(self._resume_after(self._drain_client))

    async def _resume_after(self, drain_client: DrainFn) -> None:
        try:
            await drain_client()
        except (ConnectionError, RuntimeError):
            return  # the client is gone; the next packet or the handler notices
        finally:
            self._drain = None
            self._last_data = self._loop.time()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def end_stream_cleanly(self, last_event: bytes = b"") -> bool:
        """After the engine broke off: end the client's chunked body if the framing allows,
        `last_event` (an error event) its last chunk (True), else leave it to the caller to
        drop the client's connection (False)."""
        client = self._relay_to
        if client is None or client.is_closing():
            return False
        if self._reframe or (self._chunked is not None and self._chunked.at_boundary):
            client.write((b"%x\r\n%b\r\n" % (len(last_event), last_event) if last_event
                          else b"") + LAST_CHUNK)
            return True
        return False

    def abort(self) -> None:
        """Drop the engine connection at once (the engine stops generating for it), and let
        go of the client: the exchange is over."""
        self._close()
        self._relay_to = None
        self._on_payload = _ignore
        self._drain_client = None
        if self._drain is not None:
            self._drain.cancel()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class EngineConnector:
    """Opens each streamed request's connection to the engine, keeping one opened ahead."""

    def __init__(self, address: EngineAddress, connect_timeout: float | None,
                 read_timeout: float | None, keep_spare: bool = True) -> None:
        self.address = address
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._keep_spare = keep_spare
        self._spare: EngineExchange | None = None
        self._spare_at = 0.0
        self._opening: asyncio.Task[None] | None = None

    async def _connect(self) -> EngineExchange:
        exchange = EngineExchange(asyncio.get_running_loop(), self._read_timeout)
        await connect(self.address, exchange, self._connect_timeout)
        return exchange

    async def _open_spare(self) -> None:
        try:
            spare = await self._connect()
        except (OSError, TimeoutError):
            return  # the next request connects itself, and says why it could not
        finally:
            self._opening = None
        if self._spare is not None:
            self._spare.abort()
        self._spare, self._spare_at = spare, asyncio.get_running_loop().time()

    def _take_spare(self) -> EngineExchange | None:
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        age = asyncio.get_running_loop().time() - self._spare_at
        if (not spare.writable or age > OWN_CONNECTION_MAX_IDLE_SECONDS
                or idle_peer_spoke(spare.fd)):
            spare.abort()  # closed before anything was written to it: a new one instead
            return None
        return spare

    async def open(self, path: str, body: bytes, extra_headers: bytes = b"") -> EngineExchange:
        """Send one POST; return once the answer's head has arrived. EngineDropped when the
        engine closed the connection after the request was written (never sent twice)."""
        exchange = self._take_spare() if self._keep_spare else None
        if self._keep_spare and self._opening is None:
            self._opening = asyncio.create_task(self._open_spare())
        if exchange is None:
            exchange = await self._connect()
        exchange.send(path, self.address.authority, body, extra_headers)
        try:
            await exchange.head
        except BaseException:
            exchange.abort()
            raise
        return exchange

    def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
        if self._spare is not None:
            self._spare.abort()
            self._spare = None
