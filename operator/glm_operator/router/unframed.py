"""A stream for an HTTP/1.0 client: the pod's events written as they arrive, with no chunk
framing, and the connection closed at the end (an HTTP/1.0 client reads to it).

The transport-level relay (wire/relay.py) forwards the pod's chunk framing unchanged, which
an HTTP/1.0 client cannot read; so here, as the gateway does for its own HTTP/1.0 clients
(upstream.py's HttpUpstream), aiohttp's client reads the pod's stream and each piece is
written on, the pod's reading paused while the client's socket drains: memory is a piece, not
the stream. Such clients are rare; a request through here is never sent twice (aiohttp cannot
tell a connection closed before the write from one closed after it), except where the
connection was refused, when nothing was sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiohttp

from glm_operator.gateway.policy.audit import CLIENT_CLOSED
from glm_operator.gateway.upstream import SSE
from glm_operator.gateway.wire.framing import head_bytes
from glm_operator.gateway.wire.messages import Request, Response, Streamed, error_response
from glm_operator.router.forward import (
    FORWARDED_HEADERS,
    PASSED_HEADERS,
    TAIL_BYTES,
    CacheReport,
    Forwarded,
    PodUnreachable,
    broken_stream_event,
    cache_report,
)

log = logging.getLogger(__name__)


async def stream_unframed(request: Request, session: aiohttp.ClientSession, address: str,
                          answer_headers: dict[str, str],
                          on_cache: Callable[[CacheReport], None], connect_timeout: float,
                          read_timeout: float) -> Forwarded:
    where = f"the pod {address}"
    headers = {"Content-Type": "application/json"}
    headers.update((name, request.headers[name]) for name in FORWARDED_HEADERS
                   if name in request.headers)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout,
                                    sock_read=read_timeout)
    try:
        upstream = await session.post(f"http://{address}{request.path}", data=request.body,
                                      headers=headers, timeout=timeout)
    except aiohttp.ClientConnectorError as exc:  # refused or unreachable: nothing was sent
        raise PodUnreachable(f"{where}: {exc or type(exc).__name__}") from None
    except TimeoutError:
        return Forwarded.own(error_response(504, f"{where} sent nothing for "
                                            f"{read_timeout:g} s", "upstream_timeout",
                                            "server_error"))
    except (aiohttp.ClientError, OSError) as exc:
        return Forwarded.own(error_response(
            502, f"{where} closed the connection: {exc or type(exc).__name__}. The request "
            "was not sent again, since the pod may have run it.", "upstream_dropped",
            "server_error"))
    try:
        passed = {name.title(): upstream.headers[name] for name in PASSED_HEADERS
                  if name in upstream.headers}
        passed.update(answer_headers)
        content_type = upstream.headers.get("Content-Type", "application/json")
        if not (upstream.status == 200 and content_type.startswith(SSE)):
            try:
                answer = await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                return Forwarded.own(error_response(502, f"{where}: {exc}",
                                                    "upstream_dropped", "server_error"))
            return Forwarded(Response(upstream.status, answer, passed), upstream.status)
        transport = request.transport
        transport.write(head_bytes(200, {"Content-Type": content_type,
                                         "Cache-Control": "no-cache", "Connection": "close",
                                         **passed}, request.version))
        tail = bytearray()
        try:
            async for piece in upstream.content.iter_any():
                if transport.is_closing():
                    return Forwarded(Streamed(complete=False), CLIENT_CLOSED)
                transport.write(piece)
                tail.extend(piece)
                if len(tail) > TAIL_BYTES:
                    del tail[:len(tail) - TAIL_BYTES]
                await request.drain()
        except ConnectionError:
            return Forwarded(Streamed(complete=False), CLIENT_CLOSED)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("the pod %s broke off a stream: %s", address, exc)
            code, event = broken_stream_event(isinstance(exc, TimeoutError), read_timeout)
            if not transport.is_closing():
                # A cut event is ended first, so the error is an event of its own; then the
                # close: this body ends with the connection.
                transport.write(event if not tail or tail.endswith(b"\n\n")
                                else b"\n\n" + event)
            return Forwarded(Streamed(complete=False), 200, code)
        report = cache_report(bytes(tail))
        if report is not None:
            on_cache(report)
        return Forwarded(Streamed(complete=False), 200)  # complete=False: the server closes
    finally:
        upstream.close()  # the pod stops generating for a client gone; never reused
