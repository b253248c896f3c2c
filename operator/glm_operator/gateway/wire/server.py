"""The gateway's HTTP server: it listens, holds the limits every connection shares (the caps,
the timeouts, the bytes held), and stops gracefully (http.py is one connection)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from glm_operator.gateway.wire.http import (
    BODY_TIMEOUT_SECONDS,
    DRAIN_SECONDS,
    HEAD_TIMEOUT_SECONDS,
    KEEPALIVE_SECONDS,
    LINGER_SECONDS,
    MAX_BUFFERED_BYTES,
    MAX_CONNECTIONS,
    MIN_BODY_RATE,
    WRITE_STALL_TIMEOUT_SECONDS,
    HttpConnection,
)
from glm_operator.gateway.wire.messages import (
    REFUSAL_REASONS,
    RefusalHook,
    Request,
    Response,
    Router,
)

log = logging.getLogger(__name__)

# Probes (the kubelet's) must not share fate with client connections: 1,024 silent sockets
# would otherwise make /healthz answer 503 and the kubelet restart the pod (issue 36). Past
# max_connections a connection is let into a small reserve rather than refused at once; its
# first request is answered only if it is a probe (GET or HEAD of one of these paths), and
# the connection then closes. A reserve connection that sends no whole head within
# RESERVE_HEAD_SECONDS is answered 503 and closed, so that silent sockets hold the reserve
# for two seconds at a time, not 75 (a kubelet probe sends its request at once).
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/enginez"})
PROBE_RESERVE = 16
RESERVE_HEAD_SECONDS = 2.0


class HttpServer:
    """Listens, and on stop lets running handlers finish for up to `shutdown_timeout`."""

    def __init__(self, router: Router, max_body_bytes: int, *,
                 max_connections: int = MAX_CONNECTIONS,
                 max_buffered_bytes: int = MAX_BUFFERED_BYTES,
                 write_stall_timeout_seconds: float = WRITE_STALL_TIMEOUT_SECONDS,
                 drain_seconds: float = DRAIN_SECONDS,
                 head_timeout_seconds: float = HEAD_TIMEOUT_SECONDS,
                 body_timeout_seconds: float = BODY_TIMEOUT_SECONDS,
                 min_body_rate: int = MIN_BODY_RATE,
                 keepalive_seconds: float = KEEPALIVE_SECONDS,
                 linger_seconds: float = LINGER_SECONDS,
                 probe_paths: frozenset[str] = PROBE_PATHS,
                 probe_reserve: int = PROBE_RESERVE,
                 reserve_head_seconds: float = RESERVE_HEAD_SECONDS,
                 on_refusal: RefusalHook | None = None) -> None:
        self.router = router
        self.on_refusal = on_refusal
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self.max_buffered_bytes = max_buffered_bytes
        self.write_stall_timeout_seconds = write_stall_timeout_seconds
        self.drain_seconds = drain_seconds
        self.head_timeout_seconds = head_timeout_seconds
        self.body_timeout_seconds = body_timeout_seconds
        self.min_body_rate = min_body_rate  # bytes a second past body_timeout_seconds; 0: off
        self.keepalive_seconds = keepalive_seconds
        self.linger_seconds = linger_seconds
        self.probe_paths = probe_paths
        self.probe_reserve = probe_reserve
        self.reserve_head_seconds = reserve_head_seconds
        # How often each connection's timer looks: each limit is then enforced within half
        # of itself past it.
        self.tick_seconds = max(0.01, min(head_timeout_seconds, body_timeout_seconds,
                                          write_stall_timeout_seconds, keepalive_seconds) / 2)
        self.connections: set[HttpConnection] = set()  # open ones, within max_connections
        self.reserve: set[HttpConnection] = set()  # past it, let in for a probe
        self.buffered_bytes = 0  # held for requests being read or answered, all connections
        self.lingering = 0
        self.in_flight = 0
        self.stopping = False
        self._server: asyncio.Server | None = None

    def refused(self, response: Response, request: Request | None) -> None:
        """Report one of the server's own refusals (a head check's, a cap's, a timeout's, bad
        framing) to `on_refusal`: they never reach a handler, and would otherwise be counted
        nowhere."""
        if self.on_refusal is None:
            return
        reason = response.reason if response.reason in REFUSAL_REASONS else "other"
        try:
            self.on_refusal(response.status, reason, request)
        except Exception:
            log.exception("counting a refusal failed")

    async def start(self, host: str, port: int) -> int:
        """Listen; return the port (a free one when `port` is 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: HttpConnection(self), host, port,
                                                reuse_address=True, backlog=1024)
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def stop(self, shutdown_timeout: float | None = None) -> None:
        """Stop listening, close idle connections, refuse what arrives on the others (503
        shutting_down), and let running handlers finish, and requests being read be
        answered, for up to `shutdown_timeout` (drain_seconds when None); then close every
        connection."""
        timeout = self.drain_seconds if shutdown_timeout is None else shutdown_timeout
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in [*self.connections, *self.reserve]:
            connection.close_if_idle()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (self.in_flight
               or not all(c.is_idle() for c in [*self.connections, *self.reserve])) \
                and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for connection in [*self.connections, *self.reserve]:
            with contextlib.suppress(Exception):
                connection.transport.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
