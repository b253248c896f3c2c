"""A client connection's timer (http.py): one per connection, re-armed at each look rather
than one per request, that enforces the limits which are about time: a client that stopped
reading, a head or a body that does not come or comes too slowly, a connection idle too
long. Not on the path of a request's bytes: it runs every few seconds."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glm_operator.gateway.wire.http import HttpConnection

log = logging.getLogger("glm_operator.gateway.wire.http")


def look(c: HttpConnection) -> None:
    """Looks at the connection every few seconds: a client that stopped reading what is
    written to it, a head or a body that does not come, a connection idle too long."""
    c._timer = None
    if c._lost:
        return
    server, transport = c._server, c.transport
    now = c._loop.time()
    pending = transport.get_write_buffer_size()
    # No progress: bytes wait now as at the last look, no fewer, and the client read
    # nothing in between (the transport would have said so: resume_writing).
    if (pending and c._seen_pending and pending >= c._seen_pending
            and c._resumes == c._seen_resumes):
        if now - c._seen_pending_at >= server.write_stall_timeout_seconds:
            # As if it had hung up: its handler is cancelled (a 499), the engine's
            # connection dropped with it.
            log.info("a client left %d bytes unread for %g s: its connection is dropped",
                     pending, server.write_stall_timeout_seconds)
            transport.abort()
            return
    else:
        c._seen_pending_at = now
    c._seen_pending, c._seen_resumes = pending, c._resumes
    if c._reading and not c._paused_reading and not transport.is_closing():
        if c._in_head and c._begun:
            if c._head_started and now - c._head_started >= server.head_timeout_seconds:
                c._refuse(408, "The request head was not complete within "
                                  f"{server.head_timeout_seconds:g} s.", "request_timeout")
        elif c._request is not None:
            stalled, rate = c._body_bytes == c._seen_body, server.min_body_rate
            if not stalled:
                c._seen_body, c._seen_body_at = c._body_bytes, now
            if stalled and now - c._seen_body_at >= server.body_timeout_seconds:
                c._refuse(408, "The request body sent nothing for "
                                  f"{server.body_timeout_seconds:g} s.", "request_timeout")
            elif rate and now - c._body_began >= (server.body_timeout_seconds
                                                     + c._body_bytes / rate):
                c._refuse(408, f"The request body came slower than {rate} bytes a "
                                  "second.", "request_timeout")
        elif (c._task is None and not c._queue
              and now - c._active_at >= server.keepalive_seconds):
            transport.close()
    c._arm_timer()
