"""The gRPC side of a call (over http2_connection.py, whose Stream it is): its request's
headers, its messages length-prefixed (uncompressed) both ways, a limit on a received
message's size, and how it ended, from grpc-status (trailers or a trailers-only answer), or
from what the connection says of a stream that ended without it, named as gRPC names it
(grpc's doc/http-grpc-status-mapping.md, and UNAVAILABLE for a lost connection).

A call that gets its answer reads no headers at all; one that ends without it decodes its
own blocks (the `hpack` package) for the grpc-status and grpc-message.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Sequence

import hpack

from glm_operator.router.http2_connection import Connection, FailureKind, StreamFailure
from glm_operator.router.http2_frames import MAX_HEADER_BLOCK_BYTES, hpack_literal

_PREFIX = struct.Struct(">BI")  # gRPC: compressed flag, message length

# grpc's status codes by number (grpc/status.h), for the messages.
STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")


# A stream the connection saw end without its END_STREAM, as grpc's status.
STATUS_OF_FAILURE: dict[FailureKind, str] = {
    "refused": "UNAVAILABLE", "reset": "CANCELLED", "going_away": "UNAVAILABLE",
    "protocol_error": "INTERNAL", "lost": "UNAVAILABLE"}


class CallFailed(Exception):
    """The call ended without the answer: `code` is grpc's status name (UNAVAILABLE for a
    connection that failed or was lost, as grpc names it)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def grpc_message(message: bytes) -> bytes:
    """One gRPC message on the wire: uncompressed, length-prefixed."""
    return _PREFIX.pack(0, len(message)) + message


def request_header_block(path: bytes, authority: bytes) -> bytes:
    """gRPC's request headers, each a literal never indexed (RFC 7541 §6.2.3): nothing of
    ours enters the peer's table."""
    fields = ((b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
              (b":authority", authority), (b"content-type", b"application/grpc"),
              (b"te", b"trailers"))
    return b"".join(b"\x10" + hpack_literal(name) + hpack_literal(value) for name, value in fields)


def _status_name(value: str | None) -> str:
    try:
        number = int(value or "2")
    except ValueError:
        number = 2
    return STATUS_NAMES[number] if 0 <= number < len(STATUS_NAMES) else f"STATUS_{number}"


def status_of(blocks: Sequence[bytes]) -> CallFailed | None:
    """What a stream's header blocks say of how the call ended: None for grpc-status OK."""
    fields: dict[str, str] = {}
    for block in blocks:
        decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_BLOCK_BYTES)
        decoder.header_table_size = decoder.max_allowed_table_size = 0  # as we advertised:
        # each block stands alone
        try:
            fields.update((str(k), str(v)) for k, v in decoder.decode(block, raw=False))
        except (hpack.HPACKError, UnicodeDecodeError, ValueError) as exc:
            return CallFailed("UNKNOWN", f"the picker's headers could not be read ({exc})")
    http_status = fields.get(":status")
    if http_status not in (None, "200"):
        return CallFailed("UNAVAILABLE" if http_status in ("502", "503", "504") else "UNKNOWN",
                          f"HTTP status {http_status}")
    if "grpc-status" not in fields:
        return CallFailed("INTERNAL", "the stream ended without a grpc-status")
    name = _status_name(fields["grpc-status"])
    if name == "OK":
        return None
    return CallFailed(name, fields.get("grpc-message") or "no message")


class Call:
    """One stream: its received messages as they are parsed, then how it ended."""

    def __init__(self, connection: Connection, max_message_bytes: int) -> None:
        self._connection = connection
        self._max_message = max_message_bytes
        self.stream_id = 0  # and the window: set when the connection starts it
        self.send_window = 0
        self.started_at = asyncio.get_running_loop().time()
        self._buffer = bytearray()
        self._messages: deque[bytes] = deque()
        self._blocks: list[bytes] = []  # header blocks, read only if it ends unanswered
        self._failure: CallFailed | None = None
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None
        self.unacked = 0  # bytes received on this stream since our last WINDOW_UPDATE

    async def next_message(self) -> bytes | None:
        """The next message the peer sent; None when it ended the stream with OK."""
        while not self._messages:
            if self._failure is not None:
                raise self._failure
            if self._ended:
                # Read only now: a call answered before its end never decodes its headers.
                self._failure = status_of(self._blocks)
                if self._failure is not None:
                    raise self._failure
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._messages.popleft()

    def cancel(self) -> None:
        """Done with it: a stream the peer has not ended is reset (CANCEL), as grpc does."""
        self._connection.finish(self)

    @property
    def open(self) -> bool:
        return not self._ended and self._failure is None

    @property
    def connection(self) -> Connection:
        return self._connection

    # --- from the connection (http2_connection.Stream) --------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def received(self, data: bytes | memoryview) -> bool:
        """False where the call must be reset (a message too large, or compressed)."""
        buffer, max_message = self._buffer, self._max_message
        buffer += data
        while len(buffer) >= 5:
            compressed, length = _PREFIX.unpack_from(buffer)
            if length > max_message or compressed:
                self._fail(CallFailed("RESOURCE_EXHAUSTED", f"a message of {length} bytes, "
                                      f"over the limit of {max_message}") if compressed == 0
                           else CallFailed("INTERNAL", "a compressed message (none asked)"))
                return False
            if len(buffer) < 5 + length:
                break
            self._messages.append(bytes(buffer[5:5 + length]))
            del buffer[:5 + length]
        self._wake()
        return True

    def header_block(self, block: bytes) -> None:
        self._blocks.append(block)

    def ended(self) -> None:
        self._ended = True
        self._wake()

    def failed(self, failure: StreamFailure) -> None:
        self._fail(CallFailed(STATUS_OF_FAILURE[failure.kind], failure.detail))

    def _fail(self, failure: CallFailed) -> None:
        if self._failure is None:
            self._failure = failure
        self._wake()

