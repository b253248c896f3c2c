"""HTTP/1.1 framing shared by the server (http.py) and the engine connections (relay.py,
engine_pool.py): response heads, chunked bodies, and the limits on what a peer may send.

Who parses what: a client's request (the gateway's and the router's) and an engine's whole
answer (engine_pool.py) are parsed by llhttp, through httptools; an engine's streamed answer
is followed here (ChunkedBody), because the relay forwards its bytes as they came. So the
relay must end a body exactly where llhttp would: a chunk-size line that one reader takes
for sixteen and another refuses is two readers disagreeing on where a body ends, the ground
of request smuggling. ChunkedBody therefore reads RFC 9112 section 7.1's grammar and nothing
else, and tests/gateway/test_chunk_grammar.py checks it against llhttp's verdicts (Node's
and httptools') on generated lines. The head of that streamed answer is read here too
(response_head), by RFC 9112 sections 4 to 6 and nothing else, checked against llhttp's
verdicts the same way (tests/gateway/test_response_head.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD_BYTES = 64 * 1024  # a request's or an answer's status line and headers together
MAX_LINE_BYTES = 4096  # one chunk-size or trailer line
MAX_TRAILER_BYTES = MAX_HEAD_BYTES  # a trailer section, as a head: it is one
# Significant hex digits of a chunk size: sixteen make 2**64 - 1, as far as llhttp counts
# (it refuses a size past a 64-bit integer); leading zeros are not counted, as llhttp's.
MAX_SIZE_DIGITS = 16
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


# RFC 9112 section 7.1: chunk-size = 1*HEXDIG, then chunk extensions,
#   *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] ),
# a name a token and a value a token or a quoted-string (RFC 9110 section 5.6). Bytes only,
# so that no Unicode digit (int() takes '\uff11\uff10' as 16) and no '0x', '_', sign or
# space can pass for a size. Where llhttp and the RFC differ, the stricter verdict is taken,
# so that neither reader takes a line the other refuses: no BWS (llhttp refuses whitespace
# around ';' and '=', which the RFC allows), and neither an empty name nor an empty value
# after '=' (which llhttp takes and the RFC does not). Linear: each repeat starts with ';'.
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]+)(?:;%b(?:=(?:%b|%b))?)*" % (_TOKEN, _TOKEN, _QUOTED))
# RFC 9110 section 5.2: a field line, here a trailer's (no obs-fold: RFC 9112 section 5.2
# lets a recipient refuse it, and llhttp does).
_FIELD_LINE = re.compile(rb"%b:[ \t]*[\t \x21-\x7e\x80-\xff]*" % _TOKEN)


# RFC 9112 section 4: status-line = HTTP-version SP status-code SP [ reason-phrase ]; the
# last SP may be missing (llhttp takes `HTTP/1.1 200`, and nothing is lost without it). Only
# HTTP/1.0 and 1.1 (llhttp also takes `HTTP/2.0`), and a status code of RFC 9110 section 15's
# range (llhttp takes any three digits).
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9])(?: [\t \x21-\x7e\x80-\xff]*)?")
# RFC 9110 section 8.6: Content-Length = 1*DIGIT, and "5, 5" (a list of one value) allowed.
_LENGTH_LIST = re.compile(rb"[0-9]+(?:[ \t]*,[ \t]*[0-9]+)*")
MAX_LENGTH = 2**64 - 1  # llhttp's bound ("Content-Length overflow")


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """A response head as the relay reads it: where its body ends is `chunked`, else
    `length` bytes, else (neither) the connection's end."""

    status: int
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    chunked: bool
    length: int | None


def response_head(head: bytes) -> ResponseHead:
    """The status, fields and body framing of a response head (its lines, without the blank
    line that ends it); EngineProtocolError for anything RFC 9112 does not allow a sender, or
    that leaves where the body ends open to two readings:

    - each line a field line (no whitespace before the colon, no obs-fold: RFC 9112 sections
      5.1 and 5.2 let a recipient refuse both, and llhttp does; no bare CR or LF);
    - Transfer-Encoding exactly `chunked` (any case, OWS around it, but no tab after it,
      where llhttp reads a body to the connection's end instead): another coding before
      it could not be undone for the client, whose head the gateway writes itself; chunked
      twice or not last (RFC 9112 section 6.1) leaves no framing this relay follows;
    - Content-Length 1*DIGIT, at most 2**64 - 1; repeated (as lines or a list) only with one
      value (RFC 9110 section 8.6), differing values refused;
    - not both (RFC 9112 section 6.1: "ought to be handled as an error" by an intermediary,
      which must not forward the message).

    Bounded by MAX_HEAD_BYTES. Linear in the head's size."""
    if len(head) > MAX_HEAD_BYTES:
        raise EngineProtocolError("response head too large")
    lines = head.split(b"\r\n")
    status_match = _STATUS_LINE.fullmatch(lines[0])
    if status_match is None:
        raise EngineProtocolError(f"bad status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    codings: list[bytes] = []
    lengths: list[bytes] = []
    for line in lines[1:]:
        if _FIELD_LINE.fullmatch(line) is None:
            raise EngineProtocolError(
                f"bad header line {line[:80]!r}: RFC 9112 allows `name: value` only (no "
                "whitespace before the colon, no line folding, no control characters)")
        name, _, raw = line.partition(b":")
        value = raw.strip(b" \t")
        key = name.decode("latin-1").lower()
        if key == "transfer-encoding":
            if b"\t" in raw[len(raw.rstrip(b" \t")):]:
                # OWS to the RFC, but llhttp then takes no chunked framing: refused.
                raise EngineProtocolError(f"Transfer-Encoding {raw[:40]!r} ends with a tab")
            codings.extend(c.strip(b" \t").lower() for c in value.split(b","))
        elif key == "content-length":
            if _LENGTH_LIST.fullmatch(value) is None:
                raise EngineProtocolError(f"bad Content-Length {value[:40]!r}: RFC 9110 "
                                          "allows digits only")
            lengths.extend(v.strip(b" \t") for v in value.split(b","))
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    length: int | None = None
    if lengths:
        if len({v.lstrip(b"0") for v in lengths}) > 1:
            raise EngineProtocolError(
                f"differing Content-Length values {headers['content-length'][:80]!r}")
        digits = lengths[0].lstrip(b"0") or b"0"
        if len(digits) > 20 or int(digits) > MAX_LENGTH:
            raise EngineProtocolError(f"Content-Length {digits[:40]!r} past 2**64 - 1")
        length = int(digits)
    if codings:
        if codings != [b"chunked"]:
            raise EngineProtocolError(
                f"Transfer-Encoding {headers['transfer-encoding'][:80]!r}: only `chunked`, "
                "once, is followed")
        if lengths:
            raise EngineProtocolError("both Transfer-Encoding and Content-Length: RFC 9112 "
                                      "6.1 has a proxy refuse such an answer")
    return ResponseHead(int(status_match.group(1)), headers, bool(codings), length)


def chunk_size(line: bytes) -> int:
    """The size a chunk-size line (CRLF removed) announces; EngineProtocolError for any
    line that is not RFC 9112's, or whose size has more than MAX_SIZE_DIGITS hex digits."""
    match = _SIZE_LINE.fullmatch(line)
    if match is None:
        raise EngineProtocolError(
            f"bad chunk-size line {line[:40]!r}: RFC 9112 allows hex digits and chunk "
            "extensions only")
    digits = match.group(1).lstrip(b"0") or b"0"
    if len(digits) > MAX_SIZE_DIGITS:
        raise EngineProtocolError(f"chunk size of {len(digits)} hex digits: at most "
                                  f"{MAX_SIZE_DIGITS} are followed")
    return int(digits, 16)


class ChunkedBody:
    """Follows HTTP/1.1 chunked framing across packets: hands out the payload pieces and
    says when the last chunk and its trailer have arrived.

    Strict where RFC 9112 lets a recipient choose, as llhttp is by default: every line ends
    with CRLF (a bare LF is refused, though RFC 9112 section 2.2 lets a recipient take it as a
    line end: an intermediary that forwards the bytes must not read them otherwise than the
    client will), each chunk's data is followed by CRLF exactly, and trailer lines must be
    field lines, each within MAX_LINE_BYTES and all within MAX_TRAILER_BYTES (llhttp bounds
    neither: ours are the only lines it takes that we refuse, with an empty extension name
    or value, which RFC 9112 forbids). What is refused raises EngineProtocolError
    before any byte of the packet is counted as read; `at_boundary` then says whether the
    bytes forwarded before that packet ended between two chunks."""

    __slots__ = ("_left", "_line", "_refused", "_skip", "_trailer", "_trailer_bytes",
                 "complete")

    def __init__(self) -> None:
        self._left = 0  # payload bytes still to come in the current chunk
        self._skip = 0  # bytes of the CRLF after a chunk's payload still to come
        self._line = b""  # a size or trailer line split across packets
        self._trailer = False  # after the zero-size chunk
        self._trailer_bytes = 0
        # None; after a refusal, whether the body was between chunks before that packet.
        self._refused: bool | None = None
        self.complete = False

    @property
    def at_boundary(self) -> bool:
        """Between two chunks: a terminating zero chunk written now keeps the framing."""
        if self._refused is not None:
            return self._refused
        return not (self._left or self._skip or self._line or self._trailer)

    def feed(self, data: bytes, out: list[bytes]) -> int:
        """Append `data`'s payload pieces to `out`; return how many bytes of `data` belong
        to this body (all of them unless it completed inside `data`)."""
        if self._refused is not None:
            raise EngineProtocolError("the chunked body was refused already")
        boundary = not (self._left or self._skip or self._line or self._trailer)
        pieces = len(out)
        pos, size = 0, len(data)
        try:
            while pos < size and not self.complete:
                if self._left:
                    take = min(self._left, size - pos)
                    out.append(data[pos:pos + take])
                    pos += take
                    self._left -= take
                    if not self._left:
                        self._skip = 2
                elif self._skip:
                    pos = self._crlf(data, pos)
                else:
                    end = data.find(b"\n", pos)
                    if end < 0:
                        self._line += data[pos:]
                        if len(self._line) > MAX_LINE_BYTES:
                            raise EngineProtocolError("chunk-size or trailer line too long")
                        return size
                    line = self._line + data[pos:end] if self._line else data[pos:end]
                    self._line = b""
                    pos = end + 1
                    if len(line) > MAX_LINE_BYTES:
                        raise EngineProtocolError("chunk-size or trailer line too long")
                    if line[-1:] != b"\r":
                        raise EngineProtocolError(
                            "a line of the chunked body ends with a bare LF")
                    if self._trailer:
                        self._trailer_line(line[:-1])
                    else:
                        self._left = chunk_size(line[:-1])
                        self._trailer = not self._left
        except EngineProtocolError:
            self._refused = boundary
            del out[pieces:]  # none of the packet counts as read
            raise
        return pos

    def _crlf(self, data: bytes, pos: int) -> int:
        """Past the CRLF that ends a chunk's data, which may come split across packets."""
        if self._skip == 2 and data.startswith(b"\r\n", pos):
            self._skip = 0
            return pos + 2
        if data[pos] != (13 if self._skip == 2 else 10):
            raise EngineProtocolError("a chunk's data is not followed by CRLF")
        self._skip -= 1
        return pos + 1

    def _trailer_line(self, line: bytes) -> None:
        """One line after the last chunk: the empty one ends the body."""
        if not line:
            self.complete = True
            return
        self._trailer_bytes += len(line) + 2
        if self._trailer_bytes > MAX_TRAILER_BYTES:
            raise EngineProtocolError("trailer section too large")
        if _FIELD_LINE.fullmatch(line) is None:
            raise EngineProtocolError(f"bad trailer line {line[:40]!r}")
