"""gRPC calls over one HTTP/2 connection, framed here in plain asyncio: as much of HTTP/2 and
gRPC as the picker's one call needs (picker.py), and no more.

Why not grpc.aio: a pick is one short bidirectional stream, and grpc.aio's stream cost about
1.2 ms on this path, its completion queue polled apart from the event loop and every message
a hop between the two, where the picker's own scheduling takes 32 µs. The `h2` package's
state machine cut that to 0.7 ms and still spent 0.45 ms of it in Python per pick. Here a
call's request side is bytes built once per pick (the request's HPACK block is the same
every time: built once per connection) and written in one `transport.write`; the answer is
parsed in the protocol's `data_received` with `struct` (docs/performance.md, routing).

HTTP/2 (RFC 9113) kept: h2c with prior knowledge (plaintext, as `grpc.insecure_channel`);
SETTINGS both ways, with their acks, and the peer's frame size and initial window honoured;
flow control both ways (a body past the peer's window waits for its WINDOW_UPDATE; what is
received is acknowledged once half the window is read); PING answered, the ack held for
up to ACK_DELAY_SECONDS (grpc-go's bandwidth probe would send one with every answer, each a
packet that wakes the router, and sends no next one before the last is acked); padding,
priority and CONTINUATION read; RST_STREAM both ways; GOAWAY (no new streams on that
connection, the streams past its last id failed); a frame over our maximum or a malformed
one closes the connection.

HPACK: we send only literals that are never indexed, and advertise a header table of 0
bytes, so the peer's header blocks stand alone and none has to be decoded to keep state.
A call that gets its answer reads no headers at all; one that ends without it decodes its
own blocks (the `hpack` package) for the grpc-status and grpc-message.

gRPC kept: the length-prefixed messages (uncompressed), grpc-status (trailers or a
trailers-only answer), a limit on a received message's size. Connecting is lazy, from the
next call after a connection is lost or told to go away, with a back-off after a failed
attempt (100 ms doubling to 1 s, as the channel was configured) during which calls fail at
once rather than each waiting on a dead address.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import deque
from collections.abc import Sequence
from typing import cast

import hpack

RECONNECT_BACKOFF_SECONDS = (0.1, 0.2, 0.4, 0.8, 1.0)
CONNECT_TIMEOUT_SECONDS = 1.0  # a dead address fails, and backs off, within this
RECEIVE_WINDOW_BYTES = 4 * 1024 * 1024  # per stream and per connection, before our update
MAX_FRAME_BYTES = 16_384  # what we accept (the protocol's default; we ask no more)
MAX_HEADER_BLOCK_BYTES = 64 * 1024
# How long a PING's ack waits, so that the acks of the PINGs in that time go in one write:
# far inside any peer's ping timeout (grpc's keepalive waits 20 s). grpc-go sends its next
# bandwidth probe only once the last is acked, so this also holds its PINGs (and the wake-up
# of the router each costs) to about one per ACK_DELAY_SECONDS, where there was one per pick.
ACK_DELAY_SECONDS = 0.05
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_LAST_STREAM_ID = 2**31 - 1

# Frame types, flags, settings and error codes (RFC 9113 §6, §7).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH = 0x1, 0x2
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x6
REFUSED_STREAM, CANCEL = 0x7, 0x8

_HEAD = struct.Struct(">HBBBI")  # length (24 bits, as 16 + 8), type, flags, stream id
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_PREFIX = struct.Struct(">BI")  # gRPC: compressed flag, message length

# grpc's status codes by number (grpc/status.h), for the messages.
STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")


class CallFailed(Exception):
    """The call ended without the answer: `code` is grpc's status name (UNAVAILABLE for a
    connection that failed or was lost, as grpc names it)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class ProtocolViolation(Exception):
    """The peer broke HTTP/2: the connection is closed."""


def frame_bytes(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def grpc_message(message: bytes) -> bytes:
    """One gRPC message on the wire: uncompressed, length-prefixed."""
    return _PREFIX.pack(0, len(message)) + message


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(text: bytes) -> bytes:
    return _hpack_int(len(text), 7) + text  # not Huffman-coded


def request_header_block(path: bytes, authority: bytes) -> bytes:
    """gRPC's request headers, each a literal never indexed (RFC 7541 §6.2.3): nothing of
    ours enters the peer's table."""
    fields = ((b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
              (b":authority", authority), (b"content-type", b"application/grpc"),
              (b"te", b"trailers"))
    return b"".join(b"\x10" + _literal(name) + _literal(value) for name, value in fields)


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

    def __init__(self, connection: Connection, stream_id: int, send_window: int) -> None:
        self._connection = connection
        self.stream_id = stream_id
        self.send_window = send_window
        self.started_at = asyncio.get_running_loop().time()
        self._buffer = bytearray()
        self._messages: deque[bytes] = deque()
        self._blocks: list[bytes] = []  # header blocks, read only if it ends unanswered
        self._failure: CallFailed | None = None
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None
        self._unacked = 0  # bytes received on this stream since our last WINDOW_UPDATE

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

    # --- from the connection ----------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _data(self, data: bytes | memoryview, max_message: int) -> bool:
        """False where the call must be reset (a message too large, or compressed)."""
        buffer = self._buffer
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

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _fail(self, failure: CallFailed) -> None:
        if self._failure is None:
            self._failure = failure
        self._wake()


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to the peer, for the calls of one Channel."""

    def __init__(self, authority: str, max_message_bytes: int) -> None:
        self._max_message = max_message_bytes
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, Call] = {}
        self._waiting_window: list[asyncio.Future[None]] = []
        self._next_stream_id = 1
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._owed: list[bytes] = []  # PING acks, written together by _ack_timer
        self._ack_timer: asyncio.TimerHandle | None = None
        self._continuing = 0  # the stream of a header block continued, 0 when none
        self._continued_end = False
        self._block = bytearray()
        # The peer's settings (defaults until its SETTINGS frame) and our send windows.
        self._peer_frame_size = 16_384
        self._peer_initial_window = 65_535
        self.send_window = 65_535
        self._unacked = 0  # bytes received on the connection since our last WINDOW_UPDATE
        self.usable = False  # connected, no GOAWAY, stream ids left
        self.lost: CallFailed | None = None
        self.received_at = 0.0  # the loop's time of the last bytes read
        self._path_blocks: dict[bytes, bytes] = {}
        self._authority = authority.encode()

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = b"".join(_SETTING.pack(key, value) for key, value in (
            (SETTINGS_HEADER_TABLE_SIZE, 0), (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW_BYTES),
            (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK_BYTES)))
        transport.write(PREFACE + frame_bytes(SETTINGS, 0, 0, settings)
                        + frame_bytes(WINDOW_UPDATE, 0, 0,
                                      _U32.pack(RECEIVE_WINDOW_BYTES - 65_535)))
        self.usable = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone(CallFailed("UNAVAILABLE", f"the connection was lost ({exc or 'closed'})"))

    def data_received(self, data: bytes) -> None:
        self.received_at = asyncio.get_running_loop().time()
        if self._buffer:  # a frame split across reads: rare for answers this small
            self._buffer += data
            data = bytes(self._buffer)
            self._buffer.clear()
        view = memoryview(data)
        offset, size = 0, len(data)
        try:
            while size - offset >= 9:
                high, low, kind, flags, stream_id = _HEAD.unpack_from(data, offset)
                length = (high << 8) | low
                if length > MAX_FRAME_BYTES:
                    raise ProtocolViolation(f"a frame of {length} bytes, over "
                                            f"{MAX_FRAME_BYTES}", FRAME_SIZE_ERROR)
                if size - offset < 9 + length:
                    break
                self._frame(kind, flags, stream_id & _LAST_STREAM_ID,
                            view[offset + 9:offset + 9 + length])
                offset += 9 + length
        except ProtocolViolation as exc:
            self._violated(exc)
            return
        if offset < size:
            self._buffer += data[offset:]
        self._flush()  # SETTINGS acks and window updates: rare, and the peer may wait on them
        if self._owed and self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY_SECONDS,
                                                                     self._write_owed)
        self._retire_when_idle()

    # --- frames -----------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continuing and (kind != CONTINUATION or stream_id != self._continuing):
            raise ProtocolViolation("a header block interrupted", PROTOCOL_ERROR)
        if kind == DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            if stream_id == 0:
                raise ProtocolViolation("HEADERS on stream 0", PROTOCOL_ERROR)
            payload = _unpadded(flags, payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._on_block(stream_id, bytes(payload), bool(flags & END_HEADERS),
                           bool(flags & END_STREAM))
        elif kind == CONTINUATION:
            if not self._continuing:
                raise ProtocolViolation("CONTINUATION without HEADERS", PROTOCOL_ERROR)
            self._on_block(stream_id, bytes(payload), bool(flags & END_HEADERS),
                           self._continued_end, continued=True)
        elif kind == RST_STREAM:
            call = self._calls.pop(stream_id, None)
            if call is not None and len(payload) == 4:
                code = _U32.unpack(payload)[0]
                call._fail(CallFailed("UNAVAILABLE" if code == REFUSED_STREAM else "CANCELLED",
                                      f"the peer reset the stream (HTTP/2 error {code})"))
                self._window_opened()  # a sender waiting on its window stops
        elif kind == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
        elif kind == PING:
            if not flags & ACK and len(payload) == 8:
                self._owed.append(frame_bytes(PING, ACK, 0, bytes(payload)))
        elif kind == GOAWAY:
            self.usable = False
            last = _U32.unpack_from(payload)[0] & _LAST_STREAM_ID if len(payload) >= 4 else 0
            for sid in [s for s in self._calls if s > last]:
                self._calls.pop(sid)._fail(CallFailed(
                    "UNAVAILABLE", "the picker is going away (GOAWAY)"))
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise ProtocolViolation("a WINDOW_UPDATE not of 4 bytes", FRAME_SIZE_ERROR)
            increment = _U32.unpack(payload)[0] & _LAST_STREAM_ID
            if stream_id == 0:
                self.send_window += increment
            elif (call := self._calls.get(stream_id)) is not None:
                call.send_window += increment
            self._window_opened()
        elif kind == PUSH_PROMISE:
            raise ProtocolViolation("a PUSH_PROMISE, with push disabled", PROTOCOL_ERROR)
        # PRIORITY and frame types we do not know are ignored, as the protocol says.

    def _on_data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        length = len(payload)  # padding counts against the windows too
        self._unacked += length
        if self._unacked >= RECEIVE_WINDOW_BYTES // 2:
            self._out.append(frame_bytes(WINDOW_UPDATE, 0, 0, _U32.pack(self._unacked)))
            self._unacked = 0
        call = self._calls.get(stream_id)
        if call is None:
            return  # a stream we reset or finished: its bytes still count above
        data = _unpadded(flags, payload)
        if data and not call._data(data, self._max_message):
            self.finish(call)
            return
        if flags & END_STREAM:
            self._calls.pop(stream_id, None)
            call._end()
            return
        call._unacked += length
        if call._unacked >= RECEIVE_WINDOW_BYTES // 2:
            self._out.append(frame_bytes(WINDOW_UPDATE, 0, stream_id,
                                         _U32.pack(call._unacked)))
            call._unacked = 0

    def _on_block(self, stream_id: int, fragment: bytes, end_headers: bool,
                  end_stream: bool, continued: bool = False) -> None:
        if not continued:
            self._block = bytearray()
        self._block += fragment
        if len(self._block) > MAX_HEADER_BLOCK_BYTES:
            raise ProtocolViolation("a header block over 64 KiB", PROTOCOL_ERROR)
        if not end_headers:
            self._continuing, self._continued_end = stream_id, end_stream
            return
        self._continuing = 0
        call = self._calls.get(stream_id)
        if call is None:
            return  # reset or done: with no header table, nothing of it need be read
        call._blocks.append(bytes(self._block))
        if end_stream:
            self._calls.pop(stream_id, None)
            call._end()

    def _on_settings(self, payload: memoryview) -> None:
        if len(payload) % 6:
            raise ProtocolViolation("a SETTINGS frame not in 6-byte entries", FRAME_SIZE_ERROR)
        for index in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, index)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > _LAST_STREAM_ID:
                    raise ProtocolViolation("an initial window over 2^31-1",
                                            FLOW_CONTROL_ERROR)
                delta, self._peer_initial_window = value - self._peer_initial_window, value
                for call in self._calls.values():
                    call.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16_384 <= value <= 16_777_215:
                    raise ProtocolViolation(f"a frame size of {value}", PROTOCOL_ERROR)
                self._peer_frame_size = value
        self._out.append(frame_bytes(SETTINGS, ACK, 0))
        self._window_opened()

    # --- calls ------------------------------------------------------------------------------

    def start(self, path: bytes) -> Call:
        """A new stream, its request headers queued (written with the first data)."""
        stream_id = self._next_stream_id
        self._next_stream_id += 2
        if self._next_stream_id >= _LAST_STREAM_ID:
            self.usable = False  # the next call opens a new connection
        block = self._path_blocks.get(path)
        if block is None:
            block = self._path_blocks[path] = request_header_block(path, self._authority)
        call = Call(self, stream_id, self._peer_initial_window)
        self._calls[stream_id] = call
        self._out.append(frame_bytes(HEADERS, END_HEADERS, stream_id, block))
        return call

    async def send(self, call: Call, data: bytes) -> None:
        """Write `data` on the call's stream and end its request side, as the peer's
        flow-control windows and frame size allow (the headers go in the same write)."""
        view = memoryview(data)
        while True:
            if not call.open or self.lost is not None:
                self._flush()
                return  # answered (or failed) before all was sent: the reader sees which
            allowed = min(call.send_window, self.send_window)
            while allowed > 0 or not view:
                piece = view[:min(allowed, self._peer_frame_size)]
                last = len(piece) == len(view)
                self._out.append(frame_bytes(DATA, END_STREAM if last else 0, call.stream_id,
                                             piece.tobytes()))
                call.send_window -= len(piece)
                self.send_window -= len(piece)
                allowed -= len(piece)
                view = view[len(piece):]
                if last:
                    self._flush()
                    return
            self._flush()
            waiter = asyncio.get_running_loop().create_future()
            self._waiting_window.append(waiter)
            await waiter

    def finish(self, call: Call) -> None:
        if self._calls.pop(call.stream_id, None) is not None and self.lost is None:
            self._out.append(frame_bytes(RST_STREAM, 0, call.stream_id, _U32.pack(CANCEL)))
            self._flush()
        self._retire_when_idle()

    def close(self) -> None:
        self.usable = False
        if self._transport is not None:
            self._transport.close()

    def _window_opened(self) -> None:
        waiting, self._waiting_window = self._waiting_window, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)

    def _retire_when_idle(self) -> None:
        """A connection that takes no new calls is closed once its last call is done."""
        if not self.usable and not self._calls and self._transport is not None:
            self._transport.close()

    def _flush(self) -> None:
        if self._out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(self._out))
        self._out.clear()

    def _write_owed(self) -> None:
        self._ack_timer = None
        if self._owed and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(self._owed))
        self._owed.clear()

    def _violated(self, exc: ProtocolViolation) -> None:
        detail, code = exc.args
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame_bytes(GOAWAY, 0, 0, _U32.pack(0) + _U32.pack(code)))
        self._gone(CallFailed("INTERNAL", f"HTTP/2 protocol error from the peer: {detail}"))
        self.close()

    def _gone(self, failure: CallFailed) -> None:
        self.usable = False
        if self.lost is None:
            self.lost = failure
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call._fail(failure)
        self._window_opened()
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None


def _unpadded(flags: int, payload: memoryview) -> memoryview:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolViolation("padding longer than its frame", PROTOCOL_ERROR)
    return payload[1:len(payload) - payload[0]]


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

    async def call(self, path: bytes, messages: Sequence[bytes]) -> Call:
        """Start a call and send `messages`, ending the request side after them (the peer
        reads every message, then the end). The caller reads the answer and cancels."""
        connection = self._connection
        if connection is None or not connection.usable:
            connection = await self._connected()
        call = connection.start(path)
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
                    lambda: Connection(self.address, self._max), self._host, self._port)
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
        connection = call._connection
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
