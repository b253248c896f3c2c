"""HTTP/1.1 framing shared by the server (http.py) and the engine connections (relay.py,
engine_pool.py): response heads, chunked bodies, and the limits on what a peer may send.
"""

from __future__ import annotations

from http import HTTPStatus

MAX_HEAD_BYTES = 64 * 1024  # a request's or an answer's status line and headers together
MAX_LINE_BYTES = 4096  # one chunk-size or trailer line
# Bytes buffered for a client before its writer waits (http.py's drain) and the relay stops
# reading from the engine: a slow reader must not make the gateway buffer an answer.
CLIENT_BUFFER_HIGH = 64 * 1024
LAST_CHUNK = b"0\r\n\r\n"  # ends a chunked body (no trailer)


class EngineProtocolError(Exception):
    """The engine's answer is not HTTP/1.1 framing the gateway can follow."""


_REASONS = {status.value: status.phrase for status in HTTPStatus}


def head_bytes(status: int, headers: dict[str, str], version: tuple[int, int] = (1, 1)
               ) -> bytes:
    """A response's status line and headers (the blank line included)."""
    reason = _REASONS.get(status, "Unknown")
    lines = [f"HTTP/{version[0]}.{version[1]} {status} {reason}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class ChunkedBody:
    """Follows HTTP/1.1 chunked framing across packets: hands out the payload pieces and
    says when the last chunk and its trailer have arrived."""

    __slots__ = ("_left", "_line", "_skip", "_trailer", "complete")

    def __init__(self) -> None:
        self._left = 0  # payload bytes still to come in the current chunk
        self._skip = 0  # bytes of the CRLF after a chunk's payload still to come
        self._line = b""  # a size or trailer line split across packets
        self._trailer = False  # after the zero-size chunk
        self.complete = False

    @property
    def at_boundary(self) -> bool:
        """Between two chunks: a terminating zero chunk written now keeps the framing."""
        return not (self._left or self._skip or self._line or self._trailer)

    def feed(self, data: bytes, out: list[bytes]) -> int:
        """Append `data`'s payload pieces to `out`; return how many bytes of `data` belong
        to this body (all of them unless it completed inside `data`)."""
        pos, size = 0, len(data)
        while pos < size and not self.complete:
            if self._left:
                take = min(self._left, size - pos)
                out.append(data[pos:pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._skip = 2
                continue
            if self._skip:
                take = min(self._skip, size - pos)
                pos += take
                self._skip -= take
                continue
            end = data.find(b"\n", pos)
            if end < 0:
                self._line += data[pos:]
                if len(self._line) > MAX_LINE_BYTES:
                    raise EngineProtocolError("chunk-size line too long")
                return size
            line = (self._line + data[pos:end]).rstrip(b"\r")
            self._line = b""
            pos = end + 1
            if self._trailer:
                self.complete = not line  # an empty line ends the trailer
                continue
            try:
                length = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise EngineProtocolError(f"bad chunk-size line {line[:40]!r}") from None
            if length < 0:
                raise EngineProtocolError(f"bad chunk-size line {line[:40]!r}")
            if length:
                self._left = length
            else:
                self._trailer = True
        return pos
