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
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # the engine's status line and headers
MAX_LINE_BYTES = 4096  # one chunk-size or trailer line
# Above this many bytes waiting in the client's socket buffer, stop reading from the engine
# until the client has taken them (a slow reader must not make the gateway buffer an answer).
CLIENT_BUFFER_HIGH = 64 * 1024
TAIL_EVENTS = 4  # the last chunks kept: usage / timings always fit in these
STREAM_END = b"data: [DONE]"  # the OpenAI stream's last event (llama-server and vLLM)

DrainFn = Callable[[], Awaitable[None]]  # waits until the client's socket buffer drained
# A spare older than this is dropped, not used: llama-server (cpp-httplib) closes a connection
# that sent no request for 5 s, and a request written into a closing socket would be lost.
SPARE_MAX_AGE_SECONDS = 3.0


class EngineProtocolError(Exception):
    """The engine's answer is not HTTP/1.1 this relay can follow."""


class EngineTimeout(Exception):
    """The engine sent nothing for the read timeout."""


class ClientGone(Exception):
    """The client's connection closed before the answer was relayed."""


@dataclass(frozen=True)
class EngineAddress:
    host: str
    port: int
    authority: str  # the Host header
    # Tried first when set: a Unix socket the engine also listens on ("@name": abstract).
    unix: str | None = None

    @classmethod
    def parse(cls, url: str, unix: str | None = None) -> EngineAddress | None:
        """An http:// URL's address; None where this relay does not apply (https, no port)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
            return None
        return cls(parts.hostname, parts.port or 80, parts.netloc, unix)


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


@dataclass
class EngineHead:
    status: int
    headers: dict[str, str]  # lower-case names

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json")


@dataclass
class StreamCapture:
    """What the relay keeps of a streamed answer for usage, limits and the audit log."""

    count_events: bool = False
    keep_all: bool = False
    tail: deque[bytes] = field(default_factory=lambda: deque(maxlen=TAIL_EVENTS))
    everything: list[bytes] = field(default_factory=list)
    events: int = 0  # `data: ` lines relayed, when count_events
    delivered: bool = False  # the stream's last event reached the client's socket
    first_at: float | None = None  # perf_counter() of the first body bytes relayed


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
        self._capture: StreamCapture | None = None
        self._drain: asyncio.Task[None] | None = None
        self._drain_client: DrainFn | None = None
        self._last_data = loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self.sent = False
        self.lost = False

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, yet have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, path: str, authority: str, body: bytes) -> None:
        """Write the request (a POST of JSON); the read timeout counts from here."""
        assert self.transport is not None
        self.sent = True
        self._last_data = self._loop.time()
        if self._read_timeout:
            self._timer = self._loop.call_later(self._read_timeout, self._check_timeout)
        self.transport.write(
            b"POST %b HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%b"
            % (path.encode(), authority.encode(), len(body), body))

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
        return None  # close our side too; connection_lost settles the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.sent:
            return  # a spare the engine closed: never used, nobody waits on it
        if self._timer is not None:
            self._timer.cancel()
        if self._drain is not None:
            self._drain.cancel()
        if not self.head.done():
            self.head.set_exception(ConnectionResetError(
                f"the engine closed the connection before answering: {exc or 'EOF'}"))
        elif self._until_close and not self.done.done():
            # A body delimited by the connection's end is complete now.
            if self._relay_to is not None and not self._relay_to.is_closing():
                self._relay_to.write(b"0\r\n\r\n")
            self._settle()
        elif not self.done.done():
            self.done.set_exception(ConnectionResetError(
                f"the engine closed the connection mid-answer: {exc or 'EOF'}"))

    # --- reading ---------------------------------------------------------------------------

    def _parse_head(self) -> None:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise EngineProtocolError("response head too large")
            return
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        rest = bytes(self._buffer[end + 4:])
        self._buffer.clear()
        version, _, status_text = lines[0].partition(" ")
        if not version.startswith("HTTP/1.") or not status_text[:3].isdigit():
            raise EngineProtocolError(f"bad status line {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise EngineProtocolError(f"bad header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = ChunkedBody()
        elif "content-length" in headers:
            try:
                self._length = int(headers["content-length"])
            except ValueError:
                raise EngineProtocolError("bad Content-Length") from None
        else:
            self._until_close = True
        status = int(status_text[:3])
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
                future.set_exception(exc)
                break
        self.abort()

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

    def relay(self, client: asyncio.Transport, capture: StreamCapture,
              drain_client: DrainFn) -> None:
        """From now on the body goes to `client` as it arrives; `done` says when it ended.

        The client's response head must be written already, announcing a chunked body: the
        engine's own chunk framing is forwarded unchanged (or made, if it sent none)."""
        self._relay_to = client
        self._capture = capture
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
                         + (b"0\r\n\r\n" if ended else b""))
        if pending:
            self._note(pending)

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
                client.write(b"0\r\n\r\n")
        else:
            assert self._chunked is not None
            used = self._chunked.feed(data, pieces)
            client.write(data if used == len(data) else data[:used])
            ended = self._chunked.complete
        self._note(pieces)
        if ended:
            self._settle()
        elif client.get_write_buffer_size() > CLIENT_BUFFER_HIGH and self._drain is None:
            assert self.transport is not None and self._drain_client is not None
            self.transport.pause_reading()
            self._drain = self._loop.create_task(self._resume_after(self._drain_client))

    def _note(self, pieces: list[bytes]) -> None:
        capture = self._capture
        assert capture is not None
        if capture.first_at is None:
            capture.first_at = time.perf_counter()
        for piece in pieces:
            capture.tail.append(piece)
            if capture.count_events:
                capture.events += piece.count(b"data: ")
            if capture.keep_all:
                capture.everything.append(piece)
            if STREAM_END in piece:
                capture.delivered = True

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

    def end_stream_cleanly(self) -> bool:
        """After the engine broke off: end the client's chunked body if the framing allows
        (True), else leave it to the caller to drop the client's connection (False)."""
        client = self._relay_to
        if client is None or client.is_closing():
            return False
        if self._reframe or (self._chunked is not None and self._chunked.at_boundary):
            client.write(b"0\r\n\r\n")
            return True
        return False

    def abort(self) -> None:
        """Drop the engine connection at once: the engine stops generating for it."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


async def connect(address: EngineAddress, protocol: asyncio.Protocol,
                  timeout: float | None) -> None:
    """Connect `protocol` to the engine within `timeout` seconds: over its Unix socket when
    it has one and accepts, else over TCP."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            if address.unix is not None:
                sock = _unix_socket(address.unix)
                if sock is not None:
                    await loop.create_unix_connection(lambda: protocol, sock=sock)
                    return
            await loop.create_connection(lambda: protocol, address.host, address.port)
    except TimeoutError:
        # Unreachable, not slow: the gateway answers 503, as for a refused connection.
        raise ConnectionError(f"no connection within {timeout:g} s") from None


_refusing_sockets: set[str] = set()  # logged once until they accept again


def unix_address(name: str) -> str:
    """The socket address of `name`: a path, or "@name" for Linux's abstract namespace (as
    llama-server and cpp-httplib write it), whose address starts with a NUL byte."""
    return "\0" + name[1:] if name.startswith("@") else name


def _unix_socket(name: str) -> socket.socket | None:
    """A socket connected to the engine's Unix socket, or None where this connection goes
    over TCP instead: the socket refuses (an engine build without it, or one still starting:
    TCP then answers, or fails alike), or its accept queue is full.

    Connected by hand, not by the loop: a Unix socket's connect completes or fails at once,
    never "in progress"; a full accept queue fails it with EAGAIN, which the loops' sock_connect
    mistakes for a connect in progress and then reports as done, handing over a socket that is
    not connected. (uvloop also refuses abstract names in create_unix_connection's path.)"""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(unix_address(name))
    except BlockingIOError:
        # A burst beyond the engine's backlog: TCP's handshake waits in the kernel instead.
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        if name not in _refusing_sockets:
            _refusing_sockets.add(name)
            log.warning("the engine's socket %s refused (%s): its answers go over TCP",
                        name, exc)
        return None
    if name in _refusing_sockets:
        _refusing_sockets.discard(name)
        log.info("the engine's socket %s accepts again", name)
    return sock


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
        if spare.lost or age > SPARE_MAX_AGE_SECONDS:
            spare.abort()
            return None
        return spare

    async def open(self, path: str, body: bytes) -> EngineExchange:
        """Send one POST; return once the answer's head has arrived."""
        exchange = self._take_spare() if self._keep_spare else None
        if self._keep_spare and self._opening is None:
            self._opening = asyncio.create_task(self._open_spare())
        if exchange is not None:
            exchange.send(path, self.address.authority, body)
            try:
                await exchange.head
                return exchange
            except ConnectionResetError:
                # The engine closed the spare before reading the request: send it again on
                # a new connection (the engine never saw it).
                exchange.abort()
            except BaseException:
                exchange.abort()
                raise
        exchange = await self._connect()
        exchange.send(path, self.address.authority, body)
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
