"""Send a request to the pod the picker chose, and its answer back to the client.

The pod's gateway is reached with the gateway's own engine clients (wire/): whole answers over
kept-alive connections, written to the client from the connection's callback the moment they
are parsed; streams relayed at the transport level, chunk framing and all. One pair of them
per pod address, dropped when the pod leaves. A request is written to a pod once, as in the
gateway: a connection that closes after the write is a 502, since the pod may have run it.
A stream the pod breaks off (its connection cut or silent mid-stream) ends as the gateway ends
its engine's: an OpenAI-style error event as the last chunk where the framing allows, else
the client's connection dropped; never a clean end the client takes for a whole answer.

The client's identity goes along (Authorization, X-Request-Id): keys, limits and audit are the
pods' gateways' business. What the engine reports of its prompt cache (llama.cpp's
`timings.cache_n` and `prompt_n`, vLLM's `usage.prompt_tokens_details.cached_tokens` and
`usage.prompt_tokens`) is read off the answer's last bytes for the router's metrics.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from glm_operator.gateway.openai.sse import error_event
from glm_operator.gateway.policy.audit import CLIENT_CLOSED
from glm_operator.gateway.policy.outcomes import STREAM_BROKEN, STREAM_TIMED_OUT
from glm_operator.gateway.upstream import SSE
from glm_operator.gateway.wire.engine import (
    EngineAddress,
    EngineDropped,
    EngineHead,
    EngineTimeout,
)
from glm_operator.gateway.wire.engine_pool import EnginePool
from glm_operator.gateway.wire.framing import EngineProtocolError, head_bytes
from glm_operator.gateway.wire.messages import Request, Response, Streamed, error_response
from glm_operator.gateway.wire.relay import ClientGone, EngineConnector

log = logging.getLogger(__name__)

# Headers of the pod's answer that the client gets too.
PASSED_HEADERS = ("content-type", "retry-after", "www-authenticate", "x-request-id")
FORWARDED_HEADERS = ("authorization", "x-request-id")
TAIL_BYTES = 4096  # of an answer, where the engines put their token counts

_CACHE_N = re.compile(rb'"cache_n"\s*:\s*(\d+)')
_PROMPT_N = re.compile(rb'"prompt_n"\s*:\s*(\d+)')
_CACHED_TOKENS = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


@dataclass(frozen=True, slots=True)
class CacheReport:
    prompt_tokens: int
    cached_tokens: int


def cache_report(tail: bytes) -> CacheReport | None:
    """The prompt's tokens and how many came from the engine's cache, from the answer's last
    bytes; None where the engine said neither."""
    cache_n = _last(_CACHE_N, tail)
    if cache_n is not None:  # llama.cpp: prompt_n counts only the tokens it processed
        return CacheReport(cache_n + (_last(_PROMPT_N, tail) or 0), cache_n)
    prompt = _last(_PROMPT_TOKENS, tail)
    if prompt is None:
        return None
    return CacheReport(prompt, _last(_CACHED_TOKENS, tail) or 0)


def _last(pattern: re.Pattern[bytes], text: bytes) -> int | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - the last match is the one
        pass
    return int(found.group(1)) if found is not None else None


def identity_headers(request: Request, extra: dict[str, str]) -> bytes:
    """Header lines for the pod: the client's identity, and the router's own (`extra`)."""
    lines = [f"{name}: {request.headers[name]}\r\n" for name in FORWARDED_HEADERS
             if name in request.headers]
    lines.extend(f"{name}: {value}\r\n" for name, value in extra.items())
    return "".join(lines).encode("latin-1")


class PodClients:
    def __init__(self, connect_timeout: float, read_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._pools: dict[str, tuple[EnginePool, EngineConnector]] = {}

    def of(self, address: str) -> tuple[EnginePool, EngineConnector]:
        clients = self._pools.get(address)
        if clients is None:
            parsed = EngineAddress.parse(f"http://{address}")
            assert parsed is not None, address
            clients = (EnginePool(parsed, self._connect_timeout, self._read_timeout),
                       EngineConnector(parsed, self._connect_timeout, self._read_timeout,
                                       keep_spare=False))
            self._pools[address] = clients
        return clients

    def keep_only(self, addresses: set[str]) -> None:
        for address in [a for a in self._pools if a not in addresses]:
            pool, connector = self._pools.pop(address)
            pool.close()
            connector.close()

    def close(self) -> None:
        self.keep_only(set())


def _passed(head: EngineHead, extra: dict[str, str]) -> dict[str, str]:
    headers = {name.title(): head.headers[name] for name in PASSED_HEADERS
               if name in head.headers}
    headers.update(extra)
    return headers


@dataclass(slots=True)
class Forwarded:
    """An answer and how it ended, for the router's metrics: the pod's own status (its 401,
    400 or 503 included, also where the answer was written from the connection's callback),
    or the router's; 499 for a client gone mid-stream; `error_code` where a relayed stream
    broke off (policy/outcomes.py)."""

    answer: Response | Streamed
    status: int
    error_code: str | None = None

    @classmethod
    def own(cls, answer: Response) -> Forwarded:
        return cls(answer, answer.status)


class PodUnreachable(Exception):
    """No connection to the pod: nothing was sent, so another pod may take the request."""


async def forward(request: Request, clients: PodClients, address: str, body: bytes,
                  stream: bool, pod_headers: bytes, answer_headers: dict[str, str],
                  on_cache: Callable[[CacheReport], None], read_timeout: float
                  ) -> Forwarded:
    pool, connector = clients.of(address)
    where = f"the pod {address}"
    try:
        if stream and request.http11:
            return await _stream(request, connector, address, body, pod_headers,
                                 answer_headers, on_cache, read_timeout)
        written: Streamed | None = None

        def write_now(head: EngineHead, answer: bytes) -> None:
            nonlocal written
            if request.http11:
                written = request.write_now(Response(head.status, answer,
                                                     _passed(head, answer_headers)))

        head, answer = await pool.post(request.path, body, write_now, pod_headers)
        report = cache_report(answer[-TAIL_BYTES:]) if head.status == 200 else None
        if report is not None:
            on_cache(report)
        return Forwarded(written or Response(head.status, answer,
                                             _passed(head, answer_headers)), head.status)
    except EngineTimeout:
        return Forwarded.own(error_response(504, f"{where} sent nothing for {read_timeout:g} s",
                                            "upstream_timeout", "server_error"))
    except EngineDropped as exc:
        return Forwarded.own(error_response(
            502, f"{where} closed the connection: {exc}. The request was not sent again, "
            "since the pod may have run it.", "upstream_dropped", "server_error"))
    except EngineProtocolError as exc:
        return Forwarded.own(error_response(502, f"{where}: {exc}", "upstream_protocol",
                                            "server_error"))
    except OSError as exc:  # refused, unreachable, or closed before the write
        raise PodUnreachable(f"{where}: {exc or type(exc).__name__}") from None


def broken_stream_event(timed_out: bool, read_timeout: float) -> tuple[str, bytes]:
    """The error code and the OpenAI-style error event (openai/sse.py) that end a stream
    the pod broke off, in the gateway's words for its engine's."""
    if timed_out:
        return STREAM_TIMED_OUT, error_event(
            f"The pod sent nothing for {read_timeout:g} s; the answer is incomplete.",
            STREAM_TIMED_OUT)
    return STREAM_BROKEN, error_event("The pod broke off the stream; the answer is "
                                      "incomplete.", STREAM_BROKEN)


async def _stream(request: Request, connector: EngineConnector, address: str, body: bytes,
                  pod_headers: bytes, answer_headers: dict[str, str],
                  on_cache: Callable[[CacheReport], None], read_timeout: float
                  ) -> Forwarded:
    exchange = await connector.open(request.path, body, pod_headers)
    try:
        head = await exchange.head
        if not (head.status == 200 and head.content_type.startswith(SSE)):
            answer = await exchange.read_body()
            return Forwarded(Response(head.status, answer, _passed(head, answer_headers)),
                             head.status)
        transport = request.transport
        transport.write(head_bytes(200, {
            "Content-Type": head.content_type, "Cache-Control": "no-cache",
            "Transfer-Encoding": "chunked", **_passed(head, answer_headers)}))
        tail = bytearray()

        def keep_tail(pieces: list[bytes]) -> None:
            for piece in pieces:
                tail.extend(piece)
            if len(tail) > TAIL_BYTES:
                del tail[:len(tail) - TAIL_BYTES]

        try:
            exchange.relay(transport, keep_tail, request.drain)
            await exchange.done
        except ClientGone:
            return Forwarded(Streamed(complete=False), CLIENT_CLOSED)
        except (OSError, EngineTimeout, EngineProtocolError) as exc:
            # The pod's gateway ends its own streams with an error event; this is the
            # connection itself breaking (cut, or silent past the read timeout). As the
            # gateway does for its engine: an error event as the last chunk where the framing
            # allows, else the client's connection dropped; never a clean end.
            log.warning("the pod %s broke off a stream: %s", address, exc)
            code, event = broken_stream_event(isinstance(exc, EngineTimeout), read_timeout)
            if not exchange.end_stream_cleanly(event):
                transport.close()
            return Forwarded(Streamed(complete=False), 200, code)
        report = cache_report(bytes(tail))
        if report is not None:
            on_cache(report)
        return Forwarded(Streamed(complete=True), 200)
    finally:
        exchange.abort()
