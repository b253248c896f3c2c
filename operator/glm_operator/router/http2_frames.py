"""HTTP/2 frames (RFC 9113): the protocol's numbers, a frame's bytes, padding, and the little
of HPACK (RFC 7541) that we write. Nothing here holds state: http2_connection.py does.

HPACK: we send only literals that are never indexed, and advertise a header table of 0
bytes, so the peer's header blocks stand alone and none has to be decoded to keep state.
"""

from __future__ import annotations

import struct

MAX_FRAME_BYTES = 16_384  # what we accept (the protocol's default; we ask no more)
MAX_HEADER_BLOCK_BYTES = 64 * 1024
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
LAST_STREAM_ID = 2**31 - 1

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

FRAME_HEAD = struct.Struct(">HBBBI")  # length (24 bits, as 16 + 8), type, flags, stream id
U32 = struct.Struct(">I")
SETTING = struct.Struct(">HI")


class ProtocolViolation(Exception):
    """The peer broke HTTP/2: the connection is closed."""


def frame_bytes(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def unpadded(flags: int, payload: memoryview) -> memoryview:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolViolation("padding longer than its frame", PROTOCOL_ERROR)
    return payload[1:len(payload) - payload[0]]


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


def hpack_literal(text: bytes) -> bytes:
    return _hpack_int(len(text), 7) + text  # not Huffman-coded

