"""gRPC calls over one HTTP/2 connection, framed by us in plain asyncio: as much of HTTP/2 and
gRPC as the picker's one call needs (picker.py), and no more.

Why not grpc.aio: a pick is one short bidirectional stream, and grpc.aio's stream cost about
1.2 ms on this path, its completion queue polled apart from the event loop and every message
a hop between the two, where the picker's own scheduling takes 32 µs. The `h2` package's
state machine cut that to 0.7 ms and still spent 0.45 ms of it in Python per pick. Here a
call's request side is bytes built once per pick (the request's HPACK block is the same
every time: built once per connection) and written in one `transport.write`; the answer is
parsed in the protocol's `data_received` with `struct` (docs/performance.md, routing).

The client in layers, bottom up: http2_frames.py (the frames' numbers and bytes),
http2_connection.py (one connection: streams, flow control, PING, GOAWAY), grpc_call.py (a
call's messages, and its status from the trailers), and here the Channel that connects.
Callers import what they use from here.

Connecting is lazy, from the next call after a connection is lost or told to go away, with a
back-off after a failed attempt (100 ms doubling to 1 s, as the channel was configured)
during which calls fail at once rather than each waiting on a dead address.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from glm_operator.router.grpc_call import Call, CallFailed, grpc_message, request_header_block
from glm_operator.router.http2_connection import Connection
from glm_operator.router.http2_frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_FRAME_BYTES,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    frame_bytes,
)

__all__ = [
    "ACK",
    "CONTINUATION",
    "DATA",
    "END_HEADERS",
    "END_STREAM",
    "GOAWAY",
    "HEADERS",
    "MAX_FRAME_BYTES",
    "PADDED",
    "PING",
    "PREFACE",
    "PRIORITY_FLAG",
    "RST_STREAM",
    "SETTINGS",
    "SETTINGS_ENABLE_PUSH",
    "SETTINGS_HEADER_TABLE_SIZE",
    "SETTINGS_MAX_FRAME_SIZE",
    "Call",
    "CallFailed",
    "Channel",
    "frame_bytes",
    "grpc_message",
]

RECONNECT_BACKOFF_SECONDS = (0.1, 0.2, 0.4, 0.8, 1.0)
CONNECT_TIMEOUT_SECONDS = 1.0  # a dead address fails, and backs off, within this


class Channel:
    """Calls to `address` ("host:port"), over one connection made on first use and made
    again after it is lost or told to go away."""

    def __init__(self, address: str, max_message_bytes: int) -> None:
        self.address = address
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._max = max_message_bytes
        self._connection: Connection | None = None
        self._connecting: asyncio.Task[Connection] | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""
        # A path's request headers: the same HPACK block on every call (no header table).
        self._header_blocks: dict[bytes, bytes] = {}

    async def call(self, path: bytes, messages: Sequence[bytes]) -> Call:
        """Start a call and send `messages`, ending the request side after them (the peer
        reads every message, then the end). The caller reads the answer and cancels."""
        connection = self._connection
        if connection is None or not connection.usable:
            connection = await self._connected()
        block = self._header_blocks.get(path)
        if block is None:
            block = self._header_blocks[path] = request_header_block(path,
                                                                     self.address.encode())
        call = Call(connection, self._max)
        connection.start(call, block)
        try:
            await connection.send(call, b"".join(grpc_message(m) for m in messages))
        except BaseException:
            call.cancel()
            raise
        return call

    async def _connected(self) -> Connection:
        if self._connecting is None:
            loop = asyncio.get_running_loop()
            if loop.time() < self._retry_at:
                raise CallFailed("UNAVAILABLE", f"{self.address}: {self._last_error} "
                                 "(trying again after a back-off)")
            self._connecting = asyncio.ensure_future(self._connect())
        # Shielded: a caller's timeout leaves the attempt running for the next caller.
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                _, connection = await loop.create_connection(
                    Connection, self._host, self._port)
        except (OSError, TimeoutError) as exc:
            self._failures += 1
            backoff = RECONNECT_BACKOFF_SECONDS[min(self._failures,
                                                    len(RECONNECT_BACKOFF_SECONDS)) - 1]
            self._retry_at = loop.time() + backoff
            self._last_error = ("cannot connect: " + (
                f"no answer within {CONNECT_TIMEOUT_SECONDS:g} s"
                if isinstance(exc, TimeoutError) else str(exc.strerror or exc)))
            raise CallFailed("UNAVAILABLE", f"{self.address}: {self._last_error}") from None
        finally:
            self._connecting = None
        self._failures = 0
        self._connection = connection  # one gone away closes once its calls are done
        return connection

    def timed_out(self, call: Call) -> None:
        """A call got no answer in time: where the connection has read nothing since the
        call started, it is taken as dead (no keepalive here) and the next call reconnects."""
        connection = call.connection
        if connection is self._connection and connection.received_at < call.started_at:
            self.drop()

    def drop(self) -> None:
        """Close the connection (the next call makes another)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        self.drop()
