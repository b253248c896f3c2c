"""The gateway's HTTP/1.1 server (gateway/wire/http.py) against clients that mean harm, over raw
sockets: the exact bytes a hostile client sends, and exactly what must come back (status
line, the headers that matter, the error's code), with the server's own books (bytes held,
connections open) checked alongside.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import tracemalloc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import uvloop
from glm_operator.gateway.wire.engine import EngineAddress, EngineDropped
from glm_operator.gateway.wire.engine_pool import EnginePool, KeptAliveConnection
from glm_operator.gateway.wire.framing import MAX_HEAD_BYTES
from glm_operator.gateway.wire.http import MAX_PIPELINED, HttpConnection
from glm_operator.gateway.wire.messages import (
    Request,
    Response,
    Router,
    Streamed,
    error_response,
    json_response,
)
from glm_operator.gateway.wire.relay import EngineExchange
from glm_operator.gateway.wire.server import HttpServer

from .test_http import read_response
from .test_server import CHAT, base_config, gateway_client

LIMIT = 100_000  # max_body_bytes of these servers


class Scene:
    """Handlers that say what they saw; a head check that wants an Authorization header."""

    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.checked = 0
        self.calls = 0  # of /64k
        self.traced = (0, 0)  # tracemalloc's current and peak when /hold ran
        self.held = asyncio.Event()

    def router(self) -> Router:
        router = Router(self.echo)
        router.add("POST", "/guarded", self.echo, self.need_key)
        router.add("GET", "/headers", self.headers)
        router.add("POST", "/headers", self.headers)
        router.add("GET", "/slow", self.slow)
        router.add("GET", "/stream", self.stream)
        router.add("GET", "/big", self.big)
        router.add("GET", "/drip", self.drip)
        router.add("GET", "/64k", self.sixty_four_k)
        router.add("POST", "/hold", self.hold)
        return router

    def need_key(self, request: Request) -> Response | None:
        self.checked += 1
        if "authorization" in request.headers:
            return None
        return error_response(401, "Missing API key.", "invalid_api_key",
                              headers={"WWW-Authenticate": 'Bearer realm="test"'})

    async def echo(self, request: Request) -> Response | Streamed:
        self.seen.append(request)
        if request.too_large:
            return json_response({"error": "too large"}, 413)
        return Response(200, request.body, {"Content-Type": "text/plain",
                                            "X-Path": request.path})

    async def headers(self, request: Request) -> Response | Streamed:
        self.seen.append(request)
        return json_response({"headers": request.headers, "body": request.body.decode()})

    async def slow(self, request: Request) -> Response | Streamed:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Response(200, b"slow", {"X-Path": request.path})

    async def stream(self, request: Request) -> Response | Streamed:
        request.transport.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                b"3\r\nabc\r\n0\r\n\r\n")
        return Streamed(complete=True)

    async def big(self, request: Request) -> Response | Streamed:
        return Response(200, b"b" * (32 << 20))  # more than any socket buffer holds

    async def sixty_four_k(self, request: Request) -> Response | Streamed:
        """A cheap answer of 64 KiB (as /metrics, or /metrics/engine fetched anew)."""
        self.calls += 1
        return Response(200, b"m" * 65536)

    async def hold(self, request: Request) -> Response | Streamed:
        """Keeps the request (and its body), says what memory is traced now."""
        self.traced = tracemalloc.get_traced_memory()
        self.seen.append(request)
        self.held.set()
        return Response(200, b"%d" % len(request.body))

    async def drip(self, request: Request) -> Response | Streamed:
        """Writes chunks for ever, waiting on drain() between them (as a stream does)."""
        self.started.set()
        request.transport.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%b\r\n" % (65536, b"d" * 65536)
        try:
            while True:
                request.transport.write(chunk)
                await request.drain()
        except (ConnectionError, asyncio.CancelledError):
            self.cancelled.set()
            raise


Make = Callable[..., Awaitable[tuple[Scene, HttpServer, int]]]


@pytest.fixture
async def make_server() -> AsyncIterator[Make]:
    servers: list[HttpServer] = []

    async def make(**options: Any) -> tuple[Scene, HttpServer, int]:
        scene = Scene()
        server = HttpServer(scene.router(), options.pop("max_body_bytes", LIMIT), **options)
        servers.append(server)
        return scene, server, await server.start("127.0.0.1", 0)

    yield make
    for server in servers:
        await server.stop(1.0)


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def answer(port: int, data: bytes, count: int = 1
                 ) -> list[tuple[int, dict[str, str], bytes]]:
    """Send `data` on a new connection; the `count` answers, then the connection's end."""
    reader, writer = await connect(port)
    writer.write(data)
    try:
        async with asyncio.timeout(10):
            answers = [await read_response(reader) for _ in range(count)]
            assert await reader.read() == b"", "the connection should close after these"
    finally:
        writer.close()
    return answers


def error_of(body: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


# --- 1. head bytes counted as they arrive -----------------------------------------------------


async def test_a_header_line_that_never_ends_is_431_once_the_head_passes_64_kib(
        make_server: Make) -> None:
    """1 MiB of one header line in 16 KiB writes: refused as soon as the head passes 64 KiB,
    never more than that held, and /healthz on another connection answers meanwhile."""
    _, server, port = await make_server()
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, server.buffered_bytes)
            await asyncio.sleep(0)

    sampler = asyncio.create_task(sample())
    reader, writer = await connect(port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Long: ")

    async def attack() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(64):
                writer.write(b"a" * 16384)
                await writer.drain()

    attacker = asyncio.create_task(attack())
    loop = asyncio.get_running_loop()
    began = loop.time()
    status, _, body = (await answer(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                          b"Connection: close\r\n\r\n"))[0]
    assert status == 200 and loop.time() - began < 1.0
    status, headers, body = await asyncio.wait_for(read_response(reader), 10)
    assert (status, headers["connection"]) == (431, "close")
    assert error_of(body)["code"] == "request_header_fields_too_large"
    assert await asyncio.wait_for(reader.read(), 10) == b""  # and closed (our side first)
    await attacker
    writer.close()
    sampler.cancel()
    assert peak <= MAX_HEAD_BYTES
    await until(lambda: not server.connections)
    assert server.buffered_bytes == 0


@pytest.mark.parametrize("over, status", [(0, 200), (1, 431)])
@pytest.mark.parametrize("piece", [None, 1000, 7])
async def test_a_head_of_64_kib_is_served_and_one_byte_more_is_not(
        make_server: Make, over: int, status: int, piece: int | None) -> None:
    _, _, port = await make_server()
    start, end = b"GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"\r\n\r\n"
    head = start + b"p" * (MAX_HEAD_BYTES - len(start) - len(end) + over) + end
    assert len(head) == MAX_HEAD_BYTES + over
    reader, writer = await connect(port)
    for at in range(0, len(head), piece or len(head)):
        writer.write(head[at:at + (piece or len(head))])
        if piece == 7 and at % 7000 == 0:
            await writer.drain()  # many small packets, not one
    got, headers, _ = await asyncio.wait_for(read_response(reader), 10)
    assert got == status
    assert ("connection" in headers) == (status == 431)
    writer.close()


@pytest.mark.parametrize("before", [
    b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
    b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
], ids=["get", "length", "chunked"])
async def test_a_whole_64_kib_head_behind_another_request_in_one_packet_is_served(
        make_server: Make, before: bytes) -> None:
    """A head that begins inside a packet, after another request's end, is counted from its
    own first byte."""
    _, _, port = await make_server()
    start, end = b"GET /b HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"\r\n\r\n"
    head = start + b"p" * (MAX_HEAD_BYTES - len(start) - len(end)) + end
    reader, writer = await connect(port)
    writer.write(before + head)
    first = await asyncio.wait_for(read_response(reader), 10)
    second = await asyncio.wait_for(read_response(reader), 10)
    assert [(s, h["x-path"]) for s, h, _ in (first, second)] == [(200, "/a"), (200, "/b")]
    writer.close()


async def test_a_trailer_line_that_never_ends_is_431(make_server: Make) -> None:
    _, server, port = await make_server()
    reader, writer = await connect(port)
    writer.write(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"3\r\nabc\r\n0\r\nX-Trailer: ")
    with contextlib.suppress(ConnectionError):
        for _ in range(10):
            writer.write(b"t" * 16384)
            await writer.drain()
    status, headers, body = await asyncio.wait_for(read_response(reader), 10)
    assert (status, headers["connection"]) == (431, "close")
    assert "trailer" in error_of(body)["message"]
    writer.close()
    await until(lambda: server.buffered_bytes == 0)


async def test_a_flood_of_pipelined_requests_is_parsed_only_so_far_ahead(make_server: Make
                                                                         ) -> None:
    """300 requests in one write: all answered in order, but never more than MAX_PIPELINED
    of them parsed and waiting at once (the rest wait as the bytes they came as)."""
    _, server, port = await make_server()
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max([peak, *(len(c._queue) for c in server.connections)])
            await asyncio.sleep(0)

    sampler = asyncio.create_task(sample())
    reader, writer = await connect(port)
    writer.write(b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % n for n in range(300)))
    for n in range(300):
        status, headers, _ = await asyncio.wait_for(read_response(reader), 5)
        assert (status, headers["x-path"]) == (200, f"/{n}")
    sampler.cancel()
    assert 1 <= peak <= MAX_PIPELINED
    writer.close()
    await until(lambda: server.buffered_bytes == 0)


# --- 2. the head check, before the body -------------------------------------------------------


async def test_a_head_check_refuses_before_100_continue(make_server: Make) -> None:
    scene, _, port = await make_server()
    reader, writer = await connect(port)
    writer.write(b"POST /guarded HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 b"Content-Length: 4\r\n\r\n")
    status, headers, body = await asyncio.wait_for(read_response(reader), 5)  # not a 100
    assert (status, headers["connection"], headers["www-authenticate"]) == (
        401, "close", 'Bearer realm="test"')
    assert error_of(body)["code"] == "invalid_api_key"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert scene.seen == []  # the handler never ran
    # With the header the check lets it through: 100 Continue, then the handler.
    reader, writer = await connect(port)
    writer.write(b"POST /guarded HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                 b"Expect: 100-continue\r\nContent-Length: 4\r\n\r\n")
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"body")
    assert (await read_response(reader))[::2] == (200, b"body")
    writer.close()


async def test_no_100_continue_is_written_into_the_answer_before_it(make_server: Make
                                                                    ) -> None:
    """Pipelined behind a request being answered, a 100 Continue would land in the middle of
    that answer: none is sent, and the client sends its body after its own wait."""
    scene, _, port = await make_server()
    reader, writer = await connect(port)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"POST /next HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 b"Content-Length: 4\r\n\r\n")
    await asyncio.wait_for(scene.started.wait(), 5)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.3)
    writer.write(b"body")
    scene.release.set()
    answers = [await asyncio.wait_for(read_response(reader), 5) for _ in range(2)]
    assert [(s, b) for s, _, b in answers] == [(200, b"slow"), (200, b"body")]
    writer.close()


async def test_a_refused_4_mb_body_is_never_buffered(make_server: Make) -> None:
    """A 4 MB body behind a head the check refuses: the refusal comes, the body is read only
    to be dropped (the answer is not lost to a reset), and nothing of it is held."""
    scene, server, port = await make_server(max_body_bytes=8 << 20)
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, server.buffered_bytes)
            await asyncio.sleep(0)

    sampler = asyncio.create_task(sample())
    reader, writer = await connect(port)
    head = b"POST /guarded HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (4 << 20)
    writer.write(head)

    async def send_body() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(64):
                writer.write(b"x" * 65536)
                await writer.drain()

    sender = asyncio.create_task(send_body())
    status, headers, _ = await asyncio.wait_for(read_response(reader), 10)
    assert (status, headers["connection"]) == (401, "close")
    await sender
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    sampler.cancel()
    assert scene.seen == [] and scene.checked == 1
    assert peak < len(head)  # the head's fields at most, never a byte of the body
    await until(lambda: not server.connections)
    assert server.buffered_bytes == 0


async def test_a_body_in_2_byte_chunks_costs_about_its_bytes_in_memory(make_server: Make
                                                                        ) -> None:
    """1 MiB of body in 2-byte chunks: kept as one growing buffer, it costs about its bytes
    (the bytearray, then the request's copy of it), not 28 bytes of memory per byte as a list
    of pieces did; --max-buffered-bytes counts what a body costs."""
    payload = 1 << 20
    scene, _, port = await make_server(max_body_bytes=2 * payload)
    reader, writer = await connect(port)
    writer.write(b"POST /hold HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    await writer.drain()
    piece = b"2\r\nab\r\n" * 8192  # 16 KiB of payload in 57 KiB
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(payload // 16384):
            writer.write(piece)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await asyncio.wait_for(scene.held.wait(), 60)
    finally:
        tracemalloc.stop()
    current, peak = scene.traced
    assert current - base < 1.5 * payload  # the request's body, held by the handler
    assert peak - base < 2.5 * payload
    assert (await asyncio.wait_for(read_response(reader), 10))[::2] == (200, b"%d" % payload)
    assert scene.seen[0].body == b"ab" * (payload // 2)
    writer.close()


# --- 3. caps and slow clients -----------------------------------------------------------------


async def test_one_connection_over_the_cap_is_answered_503_and_closed(make_server: Make
                                                                      ) -> None:
    _, server, port = await make_server(max_connections=3)
    held = [await connect(port) for _ in range(3)]
    await until(lambda: len(server.connections) == 3)
    reader, writer = await connect(port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = await asyncio.wait_for(read_response(reader), 5)
    assert (status, headers["connection"], headers["retry-after"]) == (503, "close", "1")
    assert error_of(body)["code"] == "too_many_connections"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert len(server.connections) == 3
    # Only open connections count: one closes, and the next one is served.
    held.pop()[1].close()
    await until(lambda: len(server.connections) == 2)
    status, _, _ = (await answer(port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close"
                                       b"\r\n\r\n"))[0]
    assert status == 200
    for _, other in held:
        other.close()


async def test_probes_are_answered_past_the_connection_cap(make_server: Make) -> None:
    """max_connections silent sockets: a probe still answers 200 within a second (let into
    the probes' reserve, then closed), anything else past the cap is 503; silent sockets that
    fill the reserve too are answered 503 after reserve_head_seconds, and probes come back."""
    _, server, port = await make_server(max_connections=64, reserve_head_seconds=0.5)
    held = [await connect(port) for _ in range(64)]
    await until(lambda: len(server.connections) == 64)
    for probe in (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                  b"GET /readyz HTTP/1.0\r\n\r\n", b"HEAD /enginez HTTP/1.1\r\nHost: x\r\n\r\n"):
        status, headers, _ = (await answer(port, probe))[0]
        assert (status, headers.get("x-path")) == (200, probe.split(b" ")[1].decode())
        assert len(server.connections) == 64  # answered while the silent sockets hold the cap
    for other in (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
                  b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"):
        status, headers, body = (await answer(port, other))[0]
        assert (status, headers["connection"]) == (503, "close")
        assert error_of(body)["code"] == "too_many_connections"
    silent = [await connect(port) for _ in range(server.probe_reserve)]
    await until(lambda: len(server.reserve) == server.probe_reserve)
    status, _, body = (await answer(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))[0]
    assert status == 503 and error_of(body)["code"] == "too_many_connections"
    for reader, writer in silent:  # answered and closed, so the reserve empties
        status, _, body = await asyncio.wait_for(read_response(reader), 3)
        assert status == 503 and error_of(body)["code"] == "too_many_connections"
        writer.close()
    await until(lambda: not server.reserve)
    status, _, _ = (await answer(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))[0]
    assert status == 200
    assert len(server.connections) == 64
    for _, writer in held:
        writer.close()
    await until(lambda: not server.connections and server.buffered_bytes == 0)


async def test_bodies_past_the_buffered_bytes_cap_are_503_unread_and_the_count_comes_back(
        make_server: Make) -> None:
    scene, server, port = await make_server(max_buffered_bytes=10_000)
    # One request holds 7,000 bytes of its body (counted as they come) and some of its head.
    reader, writer = await connect(port)
    writer.write(b"POST /first HTTP/1.1\r\nHost: x\r\nContent-Length: 8000\r\n\r\n"
                 + b"a" * 7000)
    await until(lambda: server.buffered_bytes >= 7000)
    # A body announced past what is left is refused on its head; one that comes in pieces
    # is refused at the piece that would pass the cap (never held).
    for second in (b"POST /second HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n",
                   b"POST /second HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + b"%x\r\n%b\r\n" % (2500, b"c" * 2500) * 2):
        status, headers, body = (await answer(port, second))[0]
        assert (status, headers["connection"], headers["retry-after"]) == (503, "close", "1")
        assert error_of(body)["code"] == "server_busy"
    writer.write(b"a" * 1000)
    status, _, body = await asyncio.wait_for(read_response(reader), 5)
    assert (status, len(body)) == (200, 8000)
    await until(lambda: server.buffered_bytes == 0)  # answered: given back
    assert [r.path for r in scene.seen] == ["/first"]
    status, _, _ = (await answer(port, b"POST /third HTTP/1.1\r\nHost: x\r\nConnection: close"
                                       b"\r\nContent-Length: 5000\r\n\r\n" + b"t" * 5000))[0]
    assert status == 200
    # A client that leaves mid-body gives its bytes back too.
    writer.write(b"POST /gone HTTP/1.1\r\nHost: x\r\nContent-Length: 9000\r\n\r\n"
                 + b"g" * 6000)
    await until(lambda: server.buffered_bytes >= 6000)
    writer.close()
    await until(lambda: server.buffered_bytes == 0)


@pytest.mark.parametrize("sent, message", [
    (b"GET /x HTTP/1.1\r\nHost: x\r\nX-Slow: ", "head was not complete"),
    # Stalled, or too slow: whichever the connection's timer sees first.
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", "request body"),
], ids=["head", "body"])
async def test_slowloris_gets_408(make_server: Make, sent: bytes, message: str) -> None:
    _, server, port = await make_server(head_timeout_seconds=0.3, body_timeout_seconds=0.3)
    reader, writer = await connect(port)
    writer.write(sent)
    loop = asyncio.get_running_loop()
    began = loop.time()
    status, headers, body = await asyncio.wait_for(read_response(reader), 5)
    assert (status, headers["connection"]) == (408, "close")
    assert message in error_of(body)["message"]
    assert 0.3 <= loop.time() - began < 3
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await until(lambda: server.buffered_bytes == 0)


async def test_a_slow_body_that_keeps_moving_is_served(make_server: Make) -> None:
    # 1 byte a second past the first 0.3 s: each byte buys a second more.
    _, _, port = await make_server(head_timeout_seconds=0.3, body_timeout_seconds=0.3,
                                   min_body_rate=1)
    reader, writer = await connect(port)
    writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n")
    for byte in b"trickled":  # 1.2 s in all, never 0.3 s without a byte
        writer.write(bytes([byte]))
        await asyncio.sleep(0.15)
    assert (await asyncio.wait_for(read_response(reader), 5))[::2] == (200, b"trickled")
    writer.close()


async def test_heads_announcing_large_bodies_reserve_nothing(make_server: Make) -> None:
    """Buffer squatting: 10 heads announce 9 KB bodies and send a byte each. Counted as
    announced they filled 90 KB of a 100 KB cap and made every other body 503; counted as
    they come they hold a few hundred bytes, and another client's 20 KB body is served."""
    _, server, port = await make_server(max_buffered_bytes=100_000)
    squatters = []
    for _ in range(10):
        reader, writer = await connect(port)
        writer.write(b"POST /squat HTTP/1.1\r\nHost: x\r\nContent-Length: 9000\r\n\r\nx")
        squatters.append((reader, writer))
    await until(lambda: len(server.connections) == 10 and all(
        c._body_bytes == 1 for c in server.connections))
    assert server.buffered_bytes < 1000
    status, _, body = (await answer(port, b"POST /victim HTTP/1.1\r\nHost: x\r\n"
                                          b"Connection: close\r\nContent-Length: 20000\r\n\r\n"
                                          + b"v" * 20000))[0]
    assert (status, len(body)) == (200, 20000)
    for _, writer in squatters:
        writer.close()
    await until(lambda: not server.connections and server.buffered_bytes == 0)


async def test_a_body_that_trickles_below_the_minimum_rate_gets_408(make_server: Make
                                                                    ) -> None:
    """A byte every 0.1 s never stalls for the body timeout (0.3 s), but past it each byte
    buys only 1/100 s: refused 408 within about half a second, where a byte now and then
    held the connection and its bytes for ever."""
    _, server, port = await make_server(body_timeout_seconds=0.3, min_body_rate=100)
    reader, writer = await connect(port)
    writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
    loop = asyncio.get_running_loop()
    began = loop.time()

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(100):
                writer.write(b"t")
                await asyncio.sleep(0.1)

    trickler = asyncio.create_task(trickle())
    status, headers, body = await asyncio.wait_for(read_response(reader), 30)
    assert (status, headers["connection"]) == (408, "close")
    # The rate's refusal, not the stall's: the trickle never stopped for the body timeout.
    assert "slower than 100 bytes a second" in error_of(body)["message"]
    assert loop.time() - began >= 0.3  # never before the body timeout
    trickler.cancel()
    writer.close()
    await until(lambda: not server.connections and server.buffered_bytes == 0)


# --- 4. connections freed without the cycle collector -------------------------------------------


def instances(cls: type) -> int:
    return sum(1 for obj in gc.get_objects() if isinstance(obj, cls))


async def close_many_ways(port: int, scene: Scene) -> None:
    """Connections closed idle, mid-head, mid-body, after answers and a stream, during a
    handler, after a refusal of each kind."""
    whole = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
    for data, answers in [
        (b"", 0), (b"GET /x HTTP/1.1\r\nHost: x\r\nX-Part", 0),
        (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", 0),
        (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc", 0),
        (whole * 3, 3), (b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n" + whole, 2),
        (b"POST /guarded HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", 1),
        (b"GET /x HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70_000, 1),
        (whole + b"GARBAGE\r\n\r\n", 2), (b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n", 0),
    ]:
        reader, writer = await connect(port)
        writer.write(data)
        for _ in range(answers):
            await asyncio.wait_for(read_response(reader), 5)
        if data.startswith(b"GET /slow"):
            await asyncio.wait_for(scene.started.wait(), 5)
        await asyncio.sleep(0.02)
        writer.close()
        await writer.wait_closed()


async def freed_without_collector() -> None:
    scene = Scene()
    server = HttpServer(scene.router(), LIMIT)
    port = await server.start("127.0.0.1", 0)
    refs: list[weakref.ref[HttpConnection]] = []

    def watch() -> None:
        refs.extend(weakref.ref(c) for c in server.connections
                    if all(r() is not c for r in refs))

    gc.collect()
    gc.disable()
    try:
        watching = True

        async def keep_watching() -> None:
            while watching:
                watch()
                await asyncio.sleep(0)

        watcher = asyncio.create_task(keep_watching())
        for _ in range(3):
            await close_many_ways(port, scene)
        watching = False
        await watcher
        await until(lambda: not server.connections and not server.in_flight)
        await asyncio.sleep(0.1)  # the loop lets go of the closed transports
        scene.seen.clear()  # the handlers' own references to requests
        assert len(refs) >= 30
        assert [r for r in refs if r() is not None] == []
        assert instances(HttpConnection) == 0
        assert server.buffered_bytes == 0
    finally:
        gc.enable()
        await server.stop(1.0)


async def test_connections_are_freed_without_the_cycle_collector() -> None:
    await freed_without_collector()


def test_connections_are_freed_without_the_cycle_collector_on_uvloop() -> None:
    uvloop.run(freed_without_collector())


class LoopingEngine(asyncio.Protocol):
    """Answers whole requests on a kept-alive connection, and streams 3 events to a stream
    request; `forever`: streams until the gateway hangs up (and says so)."""

    forever = False
    requests = 0
    on_lost: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.buffer = b""
        self.streaming: asyncio.Task[None] | None = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]) \
                if b"content-length" in head.lower() else 0
            if len(rest) < length:
                return
            body, self.buffer = rest[:length], rest[length:]
            if not head.startswith(b"POST"):  # the gateway's probes
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                continue
            type(self).requests += 1
            if b'"stream": true' in body:
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\n")
                self.streaming = asyncio.get_running_loop().create_task(self.stream())
                return
            answer = json.dumps({"choices": [{"message": {"content": "ok"}}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
                                ).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%b" % (len(answer), answer))

    async def stream(self) -> None:
        event = b'data: {"choices":[{"delta":{"content":"%b"}}]}\n\n'
        count = 0
        while type(self).forever or count < 3:
            if self.transport.is_closing():
                return
            payload = event % (b"x" * 4000 if type(self).forever else b"a")
            self.transport.write(b"%x\r\n%b\r\n" % (len(payload), payload))
            count += 1
            await asyncio.sleep(0 if type(self).forever else 0.005)
        done = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}\n\n'
        self.transport.write(b"%x\r\n%b\r\n" % (len(done), done) + b"e\r\ndata: [DONE]\n\n\r\n"
                             b"0\r\n\r\n")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.streaming is not None:
            self.streaming.cancel()
        self.transport = None
        if self.streaming is not None and LoopingEngine.on_lost is not None:
            LoopingEngine.on_lost()


async def test_gateway_connections_and_engine_connections_are_freed_without_the_collector(
        ) -> None:
    """Through the gateway: whole answers over the engine pool, streams through the relay,
    clients that leave mid-stream; once all are closed, nothing is left for the collector."""
    loop = asyncio.get_running_loop()
    LoopingEngine.forever, LoopingEngine.requests = False, 0
    engine = await loop.create_server(LoopingEngine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{engine.sockets[0].getsockname()[1]}"
    gc.collect()
    gc.disable()
    try:
        client = await gateway_client(base_config(url, warmup=False, engine_slots=1,
                                                  context_length=100))
        port = int(client.url.rsplit(":", 1)[1])
        whole = json.dumps(CHAT).encode()
        stream = json.dumps({**CHAT, "stream": True}).encode()
        try:
            for round_ in range(4):
                for body in (whole, stream):
                    reader, writer = await connect(port)
                    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                 b"Content-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
                    if round_ % 2:  # the client leaves before the answer is read
                        await asyncio.sleep(0.02)
                    else:
                        status, _, _ = await asyncio.wait_for(read_response(reader), 5)
                        assert status == 200
                    writer.close()
                    await writer.wait_closed()
            await until(lambda: not client.server.connections and not client.server.in_flight)
        finally:
            await client.close()
        await asyncio.sleep(0.2)
        assert LoopingEngine.requests >= 4
        for cls in (HttpConnection, KeptAliveConnection, EngineExchange):
            assert instances(cls) == 0, cls.__name__
    finally:
        gc.enable()
        engine.close()


# --- 5. trailers -----------------------------------------------------------------------------


async def test_trailer_fields_are_never_request_headers(make_server: Make) -> None:
    _, _, port = await make_server()
    status, _, body = (await answer(
        port, b"POST /headers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              b"X-Request-Id: mine\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"4\r\nbody\r\n0\r\nAuthorization: Bearer sk-stolen\r\nX-Request-Id: evil\r\n"
              b"X-Other: 1\r\n\r\n"))[0]
    assert status == 200
    seen = json.loads(body)
    assert seen["body"] == "body"
    assert seen["headers"] == {"host": "x", "connection": "close", "x-request-id": "mine",
                               "transfer-encoding": "chunked"}


# --- 6. a client that stops reading ---------------------------------------------------------


async def small_buffer_connection(port: int) -> tuple[asyncio.StreamReader,
                                                      asyncio.StreamWriter]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


@pytest.mark.parametrize("path", ["/big", "/drip"])
async def test_a_client_that_stops_reading_is_dropped_after_the_write_stall_timeout(
        make_server: Make, path: str) -> None:
    scene, server, port = await make_server(write_stall_timeout_seconds=0.4)
    _, writer = await small_buffer_connection(port)
    writer.write(b"GET %b HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    loop = asyncio.get_running_loop()
    began = loop.time()
    await until(lambda: len(server.connections) == 1)
    await until(lambda: not server.connections, timeout=10)  # and never read a byte
    assert 0.4 <= loop.time() - began < 5
    if path == "/drip":  # the handler that waited on drain() ended with it
        await asyncio.wait_for(scene.cancelled.wait(), 5)
        await until(lambda: server.in_flight == 0)
    writer.close()


async def test_a_stream_to_a_client_that_stops_reading_ends_and_frees_the_engine() -> None:
    """A stream from an engine that streams for ever to a client that reads nothing: after
    the write-stall timeout the client's connection is dropped as if it hung up (a 499), and
    the engine sees its connection closed (its slot freed)."""
    loop = asyncio.get_running_loop()
    lost = asyncio.Event()
    LoopingEngine.forever, LoopingEngine.requests = True, 0
    LoopingEngine.on_lost = lost.set
    engine = await loop.create_server(LoopingEngine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{engine.sockets[0].getsockname()[1]}"
    client = await gateway_client(base_config(url, warmup=False, engine_slots=1,
                                              context_length=100, kv_cache_poll_seconds=0,
                                              write_stall_timeout_seconds=0.5))
    try:
        port = int(client.url.rsplit(":", 1)[1])
        _, writer = await small_buffer_connection(port)
        body = json.dumps({**CHAT, "stream": True}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        began = loop.time()
        await asyncio.wait_for(lost.wait(), 10)
        assert 0.5 <= loop.time() - began < 6
        assert LoopingEngine.requests == 1
        await until(lambda: not client.gateway.proxy.in_flight)
        text = await (await client.get("/metrics")).text()
        assert 'code="499"' in text
        writer.close()
    finally:
        LoopingEngine.on_lost = None
        await client.close()
        engine.close()


async def test_pipelined_answers_nobody_reads_wait_for_the_client(make_server: Make) -> None:
    """2,000 pipelined GETs of a 64 KiB answer, never read: the next handler runs only once
    the client has read the answers before it, so what waits for the client stays about one
    answer (not 125 MiB), few handlers run, and a probe on another connection is answered
    meanwhile."""
    scene, server, port = await make_server()
    _, writer = await small_buffer_connection(port)
    writer.write(b"GET /64k HTTP/1.1\r\nHost: x\r\n\r\n" * 2000)
    await until(lambda: len(server.connections) == 1)
    (connection,) = server.connections
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, connection.transport.get_write_buffer_size())
            await asyncio.sleep(0)

    sampler = asyncio.create_task(sample())
    await asyncio.sleep(0.5)
    calls = scene.calls
    status, _, _ = (await answer(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                       b"Connection: close\r\n\r\n"))[0]
    # Answered while the unread answers still hold the other connection: the probe waited
    # for nothing of it (no time bound: a loaded machine is slow for both).
    assert status == 200 and scene.calls == calls and not connection.transport.is_closing()
    sampler.cancel()
    # Held here: one answer past the high-water mark at most. The kernel's socket buffers
    # (up to 4 MiB on Linux) took a few dozen answers; without the wait all 2,000 run.
    assert peak < 256 * 1024
    assert scene.calls < 200
    assert len(connection._queue) <= MAX_PIPELINED
    writer.close()
    await until(lambda: not server.connections)
    assert server.buffered_bytes == 0


# --- 7. protocol edges ------------------------------------------------------------------------


H2C = (b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
       b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n")


async def test_upgrade_h2c_is_ignored_the_request_answered_then_closed(make_server: Make
                                                                       ) -> None:
    _, _, port = await make_server()
    # What follows the request may be the other protocol: not parsed, and the connection
    # closes after the answer.
    status, headers, body = (await answer(
        port, b"GET /up HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\n"
              b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))[0]
    assert (status, headers["x-path"], headers["connection"], body) == (200, "/up", "close",
                                                                      b"")
    assert "upgrade" not in headers
    # curl --http2 sends a POST's body with the Upgrade: it is read, and answered.
    status, headers, body = (await answer(
        port, b"POST /up HTTP/1.1\r\nHost: x\r\n" + H2C + b"Content-Length: 11\r\n\r\n"
              b"hello world"))[0]
    assert (status, body, headers["connection"]) == (200, b"hello world", "close")


@pytest.mark.parametrize("request_bytes, status, code", [
    (b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 405,
     "method_not_allowed"),
    (b"GET /x HTTP/1.1\r\n\r\n", 400, "bad_request"),  # HTTP/1.1 without Host
    (b"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "bad_request"),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
     "not_implemented"),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc", 501,
     "not_implemented"),
    (b"GET /x HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
    (b"GET /x HTTP/3.0\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
    (b"GET /x HTTP/0.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
    (b"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 400,
     "bad_request"),
    # Smuggling: llhttp's strictness holds.
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n", 400, "bad_request"),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
     b"0\r\n\r\n", 400, "bad_request"),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400,
     "bad_request"),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "bad_request"),
    (b"GET /x HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n", 400, "bad_request"),
    (b"GET /x HTTP/1.1\nHost: x\n\n", 400, "bad_request"),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400, "bad_request"),
    (b"GET /x HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "bad_request"),
    (b"GET /x HTTP/1.1\r\nHost: user@evil.example\r\n\r\n", 400, "bad_request"),
    (b"GET /x HTTP/1.1\r\nHost: evil.example/path\r\n\r\n", 400, "bad_request"),
    (b"GET /x HTTP/1.1\r\nHost: gw:80x\r\n\r\n", 400, "bad_request"),
    (b"GET /x HTTP/1.0\r\nHost: <script>\r\n\r\n", 400, "bad_request"),
], ids=["connect", "no-host", "two-hosts", "gzip-chunked", "gzip", "http2", "http3", "http09",
        "http10-chunked",
        "cl-te", "te-cl", "two-cl", "two-te", "obs-fold", "bare-lf", "negative-cl",
        "host-space", "host-userinfo", "host-path", "host-port", "host-http10"])
async def test_protocol_edges_are_answered_and_closed(
        make_server: Make, request_bytes: bytes, status: int, code: str) -> None:
    scene, _, port = await make_server()
    got, headers, body = (await answer(port, request_bytes))[0]
    assert (got, headers["connection"], headers["content-type"]) == (
        status, "close", "application/json")
    assert error_of(body)["code"] == code
    if status == 405:
        assert headers["allow"] == "GET, HEAD, POST"
    assert scene.seen == []


# Chunk-size lines that int(line, 16) took, each with what it took them for: a reader that did
# would end the body elsewhere and answer the GET behind it as a request of its own.
LENIENT_SIZES = [(b"0x10", 16), (b"0X10", 16), (b"1_0", 16), (b" 10", 16), (b"10 ", 16),
                 (b"+10", 16), (b"0x0", 0), (b"-0", 0), (b" 0", 0),
                 ("\uff10".encode(), 0), (b"10 ;a=b", 16), (b"10\n", 16)]
LENIENT_IDS = ["0x10", "0X10", "1_0", "lead-space", "trail-space", "plus", "0x0", "minus-0",
               "space-0", "fullwidth-0", "space-ext", "bare-lf"]


def smuggling_body(line: bytes, took: int) -> bytes:
    """A chunked body whose size line is `line`, the body a lenient reader would have read
    after it, then a pipelined GET: answered only by a reader that took `line` for `took`."""
    rest = (b"a" * took + b"\r\n0\r\n\r\n") if took else b"\r\n"
    return line + (b"" if line.endswith(b"\n") else b"\r\n") + rest + \
        b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize(("line", "took"), LENIENT_SIZES, ids=LENIENT_IDS)
async def test_a_lenient_chunk_size_is_400_and_the_connection_closes(
        make_server: Make, line: bytes, took: int) -> None:
    """llhttp refuses what RFC 9112 7.1 does not allow (tests/gateway/test_chunk_grammar.py):
    one 400, reported as bad_request, then the connection closes, and the GET behind the
    body is never answered as a request of its own: nothing reaches a handler."""
    seen: list[tuple[int, str]] = []
    scene, _, port = await make_server(on_refusal=lambda s, r, _: seen.append((s, r)))
    (status, headers, body), = await answer(  # then the connection's end: no second answer
        port, b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              + smuggling_body(line, took))
    assert (status, headers["connection"]) == (400, "close")
    assert error_of(body)["code"] == "bad_request" and "chunk size" in error_of(body)["message"]
    assert seen == [(400, "bad_request")] and scene.seen == []


async def test_a_request_and_garbage_in_one_packet_answers_both(make_server: Make) -> None:
    _, _, port = await make_server()
    first, second = await answer(port, b"GET /valid HTTP/1.1\r\nHost: x\r\n\r\n"
                                       b"GARBAGE\r\n\r\n", count=2)
    assert (first[0], first[1]["x-path"], "connection" in first[1]) == (200, "/valid", False)
    assert (second[0], second[1]["connection"]) == (400, "close")
    assert error_of(second[2])["code"] == "bad_request"


async def test_http10_without_host_is_served(make_server: Make) -> None:
    _, _, port = await make_server()
    status, headers, _ = (await answer(port, b"GET /old HTTP/1.0\r\n\r\n"))[0]
    assert (status, headers["x-path"], headers["connection"]) == (200, "/old", "close")


# --- 8. the graceful stop ---------------------------------------------------------------------


async def test_stop_closes_idle_connections_and_refuses_what_arrives_on_the_others(
        make_server: Make) -> None:
    scene, server, port = await make_server()
    # Busy: a handler runs.
    busy_reader, busy = await connect(port)
    busy.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(scene.started.wait(), 5)
    # Idle, kept alive after an answer.
    idle_reader, idle = await connect(port)
    idle.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await read_response(idle_reader))[0] == 200
    # Half a head.
    partial_reader, partial = await connect(port)
    partial.write(b"GET /late HTTP/1.1\r\nHost:")
    await until(lambda: len(server.connections) == 3
                and sum(not c.is_idle() for c in server.connections) == 2)  # busy, partial

    stopping = asyncio.create_task(server.stop(5.0))
    await until(lambda: server.stopping)
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # idle: closed at once
    with pytest.raises(OSError):
        await connect(port)  # not listening
    busy.write(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")  # behind the running request
    partial.write(b" x\r\n\r\n")
    status, headers, body = await asyncio.wait_for(read_response(partial_reader), 5)
    assert (status, headers["connection"], headers["retry-after"]) == (503, "close", "1")
    assert error_of(body)["code"] == "shutting_down"
    assert await asyncio.wait_for(partial_reader.read(), 5) == b""
    await asyncio.sleep(0.1)
    assert not stopping.done()  # the running handler is waited for
    scene.release.set()
    status, headers, body = await asyncio.wait_for(read_response(busy_reader), 5)
    assert (status, body, "connection" in headers) == (200, b"slow", False)
    status, headers, body = await asyncio.wait_for(read_response(busy_reader), 5)
    assert (status, headers["connection"], headers["retry-after"]) == (503, "close", "1")
    assert error_of(body)["code"] == "shutting_down"
    assert await asyncio.wait_for(busy_reader.read(), 5) == b""
    await asyncio.wait_for(stopping, 5)
    for writer in (busy, idle, partial):
        writer.close()


async def test_stop_gives_running_handlers_up_to_the_timeout(make_server: Make) -> None:
    scene, server, port = await make_server(drain_seconds=0.3)
    _, writer = await connect(port)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(scene.started.wait(), 5)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await server.stop()  # drain_seconds
    assert 0.3 <= loop.time() - began < 2
    await asyncio.wait_for(scene.cancelled.wait(), 5)  # then closed: the handler cancelled
    writer.close()


# --- 9. a whole answer is sent to the engine once ----------------------------------------------


class ReadThenClose(asyncio.Protocol):
    """Reads each request whole, then closes without answering (an engine that died on it)."""

    requests = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        if not head.startswith(b"POST"):  # a probe
            self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")  # type: ignore[attr-defined]
            self.buffer = rest
            return
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        if len(rest) >= length:
            type(self).requests += 1
            self.transport.close()


async def test_the_pool_sends_a_request_once_when_the_engine_dies_after_reading_it() -> None:
    loop = asyncio.get_running_loop()
    ReadThenClose.requests = 0
    engine = await loop.create_server(ReadThenClose, "127.0.0.1", 0)
    port = engine.sockets[0].getsockname()[1]
    pool = EnginePool(EngineAddress("127.0.0.1", port, f"127.0.0.1:{port}"), 5, 5)
    try:
        with pytest.raises(EngineDropped):
            await pool.post("/v1/chat/completions", b"{}")
        assert ReadThenClose.requests == 1
    finally:
        pool.close()
        engine.close()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("client", ["own", "aiohttp"])
async def test_the_gateway_answers_502_and_sends_nothing_again(stream: bool, client: str
                                                              ) -> None:
    """Our engine pool and relay, and aiohttp's client (an engine URL with a path, as the
    long-context pool's is reached): an engine that died once it had the request."""
    loop = asyncio.get_running_loop()
    ReadThenClose.requests = 0
    engine = await loop.create_server(ReadThenClose, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{engine.sockets[0].getsockname()[1]}"
    if client == "aiohttp":
        url += "/engine"
    client = await gateway_client(base_config(url, warmup=False, engine_slots=1,
                                              context_length=100))
    try:
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert response.status == 502
        assert (await response.json())["error"]["code"] == "engine_dropped"
        assert ReadThenClose.requests == 1
    finally:
        await client.close()
        engine.close()


async def test_a_pooled_connection_the_engine_closed_while_idle_is_not_written_to() -> None:
    """The engine closes a kept-alive connection right after its answer, without saying so
    (the loop may not have seen the EOF yet): the next request goes on a new connection."""
    loop = asyncio.get_running_loop()
    connections: list[int] = []

    class AnswerThenClose(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            connections.append(1)

        def data_received(self, data: bytes) -> None:
            if b"\r\n\r\n{}" in data:
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                self.transport.close()

    engine = await loop.create_server(AnswerThenClose, "127.0.0.1", 0)
    port = engine.sockets[0].getsockname()[1]
    pool = EnginePool(EngineAddress("127.0.0.1", port, f"127.0.0.1:{port}"), 5, 5)
    try:
        for _ in range(5):
            head, body = await pool.post("/v1/chat/completions", b"{}")
            assert (head.status, body) == (200, b"ok")
        assert len(connections) == 5
    finally:
        pool.close()
        engine.close()


async def test_every_refusal_of_the_servers_own_is_reported(make_server: Make) -> None:
    """Refusals reach no handler: each is reported to on_refusal with its status and a reason
    from the bounded list, with the request where there was one."""
    seen: list[tuple[int, str, str | None]] = []

    def on_refusal(status: int, reason: str, request: Request | None) -> None:
        seen.append((status, reason, request.path if request is not None else None))

    scene, server, port = await make_server(
        on_refusal=on_refusal, max_connections=1, probe_reserve=0, head_timeout_seconds=0.2)
    (status, _, _), = await answer(port, b"POST /guarded HTTP/1.1\r\nHost: x\r\n"
                                         b"Content-Length: 2\r\n\r\nhi")
    assert status == 401 and seen[-1] == (401, "invalid_api_key", "/guarded")
    await until(lambda: not server.connections)  # one at a time: the cap is one
    (status, _, _), = await answer(port, b"GET / HTTP/1.1\r\nHost: x\r\nX: "
                                         + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
    assert status == 431 and seen[-1] == (431, "request_header_fields_too_large", None)
    await until(lambda: not server.connections)
    (status, _, _), = await answer(port, b"GET / HTTP/1.1\r\nHost: x\r\n"
                                         b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n")
    assert status == 400 and seen[-1] == (400, "bad_request", None)
    await until(lambda: not server.connections)
    (status, _, _), = await answer(port, b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finished
    assert status == 408 and seen[-1] == (408, "request_timeout", None)
    # One connection open, the cap: the next is refused at the connection, before a head.
    await until(lambda: not server.connections)
    _, silent = await connect(port)
    try:
        await until(lambda: len(server.connections) == 1)
        (status, _, body), = await answer(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503 and error_of(body)["code"] == "too_many_connections"
        assert seen[-1] == (503, "too_many_connections", None)
    finally:
        silent.close()
    assert len(seen) == 5 and scene.seen == []  # no handler ran for any of them


async def test_a_refusal_hook_that_fails_does_not_fail_the_answer(make_server: Make) -> None:
    def broken(status: int, reason: str, request: Request | None) -> None:
        raise RuntimeError("the metrics backend is broken")

    _, _, port = await make_server(on_refusal=broken)
    (status, _, _), = await answer(port, b"POST /guarded HTTP/1.1\r\nHost: x\r\n"
                                         b"Content-Length: 2\r\n\r\nhi")
    assert status == 401


@pytest.mark.parametrize("host", [b"gw", b"gw:8080", b"10.0.0.7:80", b"[::1]:8443",
                                  b"glm-chat.team-a.svc.cluster.local", b"", b"xn--d1acj3b"])
async def test_a_well_formed_host_is_served(make_server: Make, host: bytes) -> None:
    scene, _, port = await make_server()
    (status, _, _), = await answer(port, b"GET /x HTTP/1.1\r\nHost: " + host +
                                   b"\r\nConnection: close\r\n\r\n")
    assert status == 200 and len(scene.seen) == 1
