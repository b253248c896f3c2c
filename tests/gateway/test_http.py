"""The gateway's HTTP/1.1 server (gateway/wire/http.py), spoken to over raw sockets: what a front
door must get right besides the happy path."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from glm_operator.gateway.wire.messages import (
    Request,
    Response,
    Router,
    Streamed,
    json_response,
)
from glm_operator.gateway.wire.server import HttpServer

LIMIT = 1000


class Scene:
    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def echo(self, request: Request) -> Response | Streamed:
        self.seen.append(request)
        if request.too_large:
            return json_response({"error": "too large"}, 413)
        return Response(200, request.body, {"Content-Type": "text/plain",
                                            "X-Path": request.path})

    async def slow(self, request: Request) -> Response | Streamed:
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Response(200)

    async def stream(self, request: Request) -> Response | Streamed:
        request.transport.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                b"3\r\nabc\r\n0\r\n\r\n")
        return Streamed(complete=True)

    async def broken(self, request: Request) -> Response | Streamed:
        raise RuntimeError("a bug")

    async def early(self, request: Request) -> Response | Streamed:
        """Answers at once, then works on (as the gateway counts usage after the write)."""
        answered = request.write_now(Response(200, b"early", {"Content-Type": "text/plain"}))
        await self.release.wait()
        return answered


@pytest.fixture
async def served() -> AsyncIterator[tuple[Scene, int, HttpServer]]:
    scene = Scene()
    router = Router(scene.echo)
    router.add("GET", "/slow", scene.slow)
    router.add("GET", "/stream", scene.stream)
    router.add("GET", "/broken", scene.broken)
    router.add("GET", "/early", scene.early)
    server = HttpServer(router, LIMIT)
    port = await server.start("127.0.0.1", 0)
    yield scene, port, server
    await server.stop(1.0)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            body += await reader.readexactly(size + 2)
            if not size:
                break
    else:
        body = await reader.read()
    return status, headers, body


async def test_keep_alive_and_pipelined_requests_answered_in_order(
        served: tuple[Scene, int, HttpServer]) -> None:
    _, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
                 b"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"2\r\ntw\r\n1\r\no\r\n0\r\n\r\n"
                 b"GET /c?q=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"GET http://gw:8080/d?q=2 HTTP/1.1\r\nHost: gw\r\n\r\n")
    answers = [await read_response(reader) for _ in range(4)]
    assert [(s, h["x-path"], b) for s, h, b in answers] == [
        (200, "/a", b"one"), (200, "/b", b"two"), (200, "/c", b""), (200, "/d", b"")]
    writer.close()


async def test_an_answer_written_now_goes_out_before_its_handler_ends_and_in_order(
        served: tuple[Scene, int, HttpServer]) -> None:
    scene, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /early HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = await asyncio.wait_for(read_response(reader), 5)
    assert (status, body, headers["content-length"]) == (200, b"early", "5")
    # The pipelined request waits for the first handler to end, not just for its answer.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.2)
    scene.release.set()
    status, headers, _ = await asyncio.wait_for(read_response(reader), 5)
    assert (status, headers["x-path"]) == (200, "/next")
    writer.close()


async def test_expect_continue_and_a_body_over_the_limit(
        served: tuple[Scene, int, HttpServer]) -> None:
    scene, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 b"Content-Length: 4\r\n\r\n")
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"body")
    assert (await read_response(reader))[2] == b"body"
    # Announced over the limit: refused before the body, no 100 Continue, then closed.
    writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 b"Content-Length: 5000\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert (status, headers["connection"], json.loads(body)) == (
        413, "close", {"error": "too large"})
    assert await reader.read() == b""
    assert scene.seen[-1].too_large and scene.seen[-1].body == b""


async def test_a_chunked_body_over_the_limit_is_not_kept(
        served: tuple[Scene, int, HttpServer]) -> None:
    scene, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    chunk = b"x" * 600
    writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + (b"%x\r\n%b\r\n" % (len(chunk), chunk)) * 2 + b"0\r\n\r\n")
    assert (await read_response(reader))[0] == 413
    assert scene.seen[-1].too_large and scene.seen[-1].body == b""


async def test_http10_head_and_streamed_answers(served: tuple[Scene, int, HttpServer]) -> None:
    _, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /old HTTP/1.0\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK") and b"Connection: close" in head
    assert await reader.read() == b""  # HTTP/1.0 without keep-alive: closed after it

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"Content-Length: 0" in head  # the echo of an empty body, and no body after it
    assert await read_response(reader) == (200, {"transfer-encoding": "chunked"}, b"abc\r\n\r\n")
    writer.close()


@pytest.mark.parametrize("request_bytes, status", [
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
])
async def test_bad_requests_are_refused_and_closed(
        served: tuple[Scene, int, HttpServer], request_bytes: bytes, status: int) -> None:
    _, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes)
    got, headers, body = await read_response(reader)
    assert (got, headers["connection"]) == (status, "close")
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


async def test_a_client_that_hangs_up_cancels_its_handler(
        served: tuple[Scene, int, HttpServer]) -> None:
    scene, port, server = served
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(scene.started.wait(), 5)
    assert server.in_flight == 1
    writer.close()
    await asyncio.wait_for(scene.cancelled.wait(), 5)
    await asyncio.sleep(0.05)
    assert server.in_flight == 0


async def test_a_handler_bug_is_a_500_and_the_connection_lives_on(
        served: tuple[Scene, int, HttpServer]) -> None:
    _, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await read_response(reader))[0] == 500
    assert (await read_response(reader))[1]["x-path"] == "/after"
    writer.close()
