"""The engine as the gateway reaches it: its address, how a connection to it is opened, the
head of its answers, and the engine's own facts the connections are sized by.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

# The pinned llama-server (cpp-httplib) closes a connection that sent no request for 5 s. A
# connection idle for longer than the engine allows is dropped, never used: a request written
# into a socket the engine is closing would be lost. Our own connections (the pool, the relay's
# spare) leave 2 s for a loop busy between taking a connection and writing to it; aiohttp's pool
# (the off-path client) drops its connections a second before the engine does.
ENGINE_IDLE_CLOSE_SECONDS = 5.0
OWN_CONNECTION_MAX_IDLE_SECONDS = ENGINE_IDLE_CLOSE_SECONDS - 2.0
AIOHTTP_KEEPALIVE_SECONDS = ENGINE_IDLE_CLOSE_SECONDS - 1.0


class EngineTimeout(Exception):
    """The engine sent nothing for the read timeout."""


class EngineDropped(ConnectionResetError):
    """The engine closed the connection after the request was written to it, before its
    answer was whole: it may have run the request, so it is not sent again (a 502)."""


class NeverWritten(ConnectionResetError):
    """The connection had closed before the request was written: the engine never saw it,
    so it is sent on another connection."""


def socket_fd(transport: asyncio.BaseTransport) -> int:
    sock = transport.get_extra_info("socket")
    return int(sock.fileno()) if sock is not None else -1


def idle_peer_spoke(fd: int) -> bool:
    """Whether an idle connection has anything to read: EOF (the engine closed it, and the
    loop has not seen it yet) or bytes the engine should not have sent. Either way it is not
    written to: once a request is written, it is never sent again (about 1.5 µs)."""
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def bare(exc: BaseException) -> BaseException:
    """`exc` without its traceback and context, to be kept in a future: their frames hold
    the connection that keeps the future, a cycle only the cycle collector would free."""
    exc.__traceback__ = None
    exc.__context__ = None
    return exc


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


@dataclass
class EngineHead:
    status: int
    headers: dict[str, str]  # lower-case names

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json")


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
