"""One HTTP/2 connection (RFC 9113) in plain asyncio, as much of the protocol as the picker's
calls need and no more: the asyncio protocol, its streams, flow control, SETTINGS, PING and
GOAWAY. Frames are parsed in `data_received` with `struct`; the frames' numbers and bytes
are in http2_frames.py. A stream's content is its Stream's (a gRPC call, in the layer
above): the connection hands it the bytes and header blocks it receives, its end, or
why it failed (StreamFailure, in HTTP/2's terms), and knows nothing of gRPC.

Kept: h2c with prior knowledge (plaintext, as `grpc.insecure_channel`); SETTINGS both ways,
with their acks, and the peer's frame size and initial window honoured; flow control both
ways (a body past the peer's window waits for its WINDOW_UPDATE; what is received is
acknowledged once half the window is read); PING answered, the ack held for up to
ACK_DELAY_SECONDS (grpc-go's bandwidth probe would send one with every answer, each a packet
that wakes the router, and sends no next one before the last is acked); padding, priority
and CONTINUATION read; RST_STREAM both ways; GOAWAY (no new streams on that connection, the
streams past its last id failed); a frame over our maximum or a malformed one closes the
connection.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from glm_operator.router.http2_frames import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_HEAD,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    LAST_STREAM_ID,
    MAX_FRAME_BYTES,
    MAX_HEADER_BLOCK_BYTES,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTING,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    U32,
    WINDOW_UPDATE,
    ProtocolViolation,
    frame_bytes,
    unpadded,
)

RECEIVE_WINDOW_BYTES = 4 * 1024 * 1024  # per stream and per connection, before our update
# How long a PING's ack waits, so that the acks of the PINGs in that time go in one write:
# far inside any peer's ping timeout (grpc's keepalive waits 20 s). grpc-go sends its next
# bandwidth probe only once the last is acked, so this also holds its PINGs (and the wake-up
# of the router each costs) to about one per ACK_DELAY_SECONDS, where there was one per pick.
ACK_DELAY_SECONDS = 0.05


# Why a stream ended without its END_STREAM: the peer refused it (RST_STREAM
# REFUSED_STREAM) or reset it (any other code), told the connection to go away before it,
# broke the protocol, or the connection was lost.
FailureKind = Literal["refused", "reset", "going_away", "protocol_error", "lost"]


@dataclass(frozen=True, slots=True)
class StreamFailure:
    kind: FailureKind
    detail: str


class Stream(Protocol):
    """A stream's content, as the connection delivers it: a gRPC call, in the layer above."""

    stream_id: int  # set by Connection.start
    send_window: int  # the peer's window for this stream, kept by the connection
    unacked: int  # bytes received since our last WINDOW_UPDATE for it

    @property
    def open(self) -> bool: ...

    def received(self, data: bytes | memoryview) -> bool:
        """DATA's payload; False where the stream must be reset (CANCEL)."""

    def header_block(self, block: bytes) -> None:
        """A whole header block (HEADERS and its CONTINUATIONs), undecoded."""

    def ended(self) -> None:
        """The peer ended the stream."""

    def failed(self, failure: StreamFailure) -> None:
        """The stream ended without the peer's end."""


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to the peer, for the calls of one Channel."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, Stream] = {}
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
        self.lost: StreamFailure | None = None
        self.received_at = 0.0  # the loop's time of the last bytes read

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = b"".join(SETTING.pack(key, value) for key, value in (
            (SETTINGS_HEADER_TABLE_SIZE, 0), (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW_BYTES),
            (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK_BYTES)))
        transport.write(PREFACE + frame_bytes(SETTINGS, 0, 0, settings)
                        + frame_bytes(WINDOW_UPDATE, 0, 0,
                                      U32.pack(RECEIVE_WINDOW_BYTES - 65_535)))
        self.usable = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone(StreamFailure("lost", f"the connection was lost ({exc or 'closed'})"))

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
                high, low, kind, flags, stream_id = FRAME_HEAD.unpack_from(data, offset)
                length = (high << 8) | low
                if length > MAX_FRAME_BYTES:
                    raise ProtocolViolation(f"a frame of {length} bytes, over "
                                            f"{MAX_FRAME_BYTES}", FRAME_SIZE_ERROR)
                if size - offset < 9 + length:
                    break
                self._frame(kind, flags, stream_id & LAST_STREAM_ID,
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
            payload = unpadded(flags, payload)
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
                code = U32.unpack(payload)[0]
                call.failed(StreamFailure("refused" if code == REFUSED_STREAM else "reset",
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
            last = U32.unpack_from(payload)[0] & LAST_STREAM_ID if len(payload) >= 4 else 0
            for sid in [s for s in self._calls if s > last]:
                self._calls.pop(sid).failed(StreamFailure(
                    "going_away", "the picker is going away (GOAWAY)"))
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise ProtocolViolation("a WINDOW_UPDATE not of 4 bytes", FRAME_SIZE_ERROR)
            increment = U32.unpack(payload)[0] & LAST_STREAM_ID
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
            self._out.append(frame_bytes(WINDOW_UPDATE, 0, 0, U32.pack(self._unacked)))
            self._unacked = 0
        call = self._calls.get(stream_id)
        if call is None:
            return  # a stream we reset or finished: its bytes still count above
        data = unpadded(flags, payload)
        if data and not call.received(data):
            self.finish(call)
            return
        if flags & END_STREAM:
            self._calls.pop(stream_id, None)
            call.ended()
            return
        call.unacked += length
        if call.unacked >= RECEIVE_WINDOW_BYTES // 2:
            self._out.append(frame_bytes(WINDOW_UPDATE, 0, stream_id,
                                         U32.pack(call.unacked)))
            call.unacked = 0

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
        call.header_block(bytes(self._block))
        if end_stream:
            self._calls.pop(stream_id, None)
            call.ended()

    def _on_settings(self, payload: memoryview) -> None:
        if len(payload) % 6:
            raise ProtocolViolation("a SETTINGS frame not in 6-byte entries", FRAME_SIZE_ERROR)
        for index in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, index)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > LAST_STREAM_ID:
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

    def start(self, call: Stream, header_block: bytes) -> None:
        """`call` on a new stream, its request headers (an HPACK block) queued, written with
        the first data."""
        stream_id = self._next_stream_id
        self._next_stream_id += 2
        if self._next_stream_id >= LAST_STREAM_ID:
            self.usable = False  # the next call opens a new connection
        call.stream_id, call.send_window = stream_id, self._peer_initial_window
        self._calls[stream_id] = call
        self._out.append(frame_bytes(HEADERS, END_HEADERS, stream_id, header_block))

    async def send(self, call: Stream, data: bytes) -> None:
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

    def finish(self, call: Stream) -> None:
        if self._calls.pop(call.stream_id, None) is not None and self.lost is None:
            self._out.append(frame_bytes(RST_STREAM, 0, call.stream_id, U32.pack(CANCEL)))
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
            self._transport.write(frame_bytes(GOAWAY, 0, 0, U32.pack(0) + U32.pack(code)))
        self._gone(StreamFailure("protocol_error",
                                 f"HTTP/2 protocol error from the peer: {detail}"))
        self.close()

    def _gone(self, failure: StreamFailure) -> None:
        self.usable = False
        if self.lost is None:
            self.lost = failure
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.failed(failure)
        self._window_opened()
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
