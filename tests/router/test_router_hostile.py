"""The router against clients that mean harm, over raw sockets. It is a server we ship to
every client, in front of every pod: it serves on the gateway's own HTTP server
(gateway/wire/), so the gateway's limits hold here as bytes arrive. These cases run against
the router's own server, with its handlers and a pod behind it, so a router that bypassed
those limits (or buffered for the pod what the client sends) fails them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from gateway.test_http import read_response
from gateway.test_http_hostile import LENIENT_IDS, LENIENT_SIZES, smuggling_body
from glm_operator.gateway.wire.messages import Request, Response, Streamed

from .test_router import PodGateway, Scene, counter, table_json

LIMIT = 100_000


class DripPod(PodGateway):
    """A pod whose streams never end: chunk after chunk while its client reads."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def answer(self, request: Request) -> Response | Streamed:
        self.seen.append(request)
        self.started.set()
        request.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                b"Transfer-Encoding: chunked\r\n\r\n")
        data = b"data: " + b"d" * 65536 + b"\n\n"
        chunk = b"%x\r\n%b\r\n" % (len(data), data)
        try:
            while True:
                request.transport.write(chunk)
                await request.drain()
        except (ConnectionError, asyncio.CancelledError):
            self.cancelled.set()
            raise


async def routed(scene: Scene, **limits: object) -> int:
    app = await scene.start(picker="none", max_body_bytes=LIMIT, **limits)
    await scene.add_pod("a", "")
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    assert app.table is not None
    return scene.port


@pytest.fixture
async def scene(tmp_path):  # type: ignore[no-untyped-def]
    scene = Scene(tmp_path)
    yield scene
    await scene.stop()


async def exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        async with asyncio.timeout(10):
            return await read_response(reader)
    finally:
        writer.close()


def code_of(body: bytes) -> str:
    return str(json.loads(body)["error"]["code"])


async def test_a_head_past_64_kib_is_431_and_never_reaches_the_pod(scene: Scene) -> None:
    port = await routed(scene)
    status, _, body = await exchange(
        port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Long: "
        + b"a" * 70_000 + b"\r\n\r\n")
    assert status == 431 and code_of(body) == "request_header_fields_too_large"
    assert not scene.pods["a"].seen


async def test_a_body_announced_over_the_limit_is_413_unread(scene: Scene) -> None:
    port = await routed(scene)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
                 b"Content-Length: 4000000\r\nExpect: 100-continue\r\n\r\n")
    status, headers, body = await asyncio.wait_for(read_response(reader), 10)
    writer.close()
    assert status == 413 and headers["connection"] == "close"
    assert code_of(body) == "request_too_large"
    assert not scene.pods["a"].seen


async def test_a_chunked_body_past_the_limit_is_refused_as_it_arrives(scene: Scene) -> None:
    port = await routed(scene)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    piece = b"%x\r\n%b\r\n" % (30_000, b"x" * 30_000)
    with contextlib.suppress(ConnectionError):
        for _ in range(5):
            writer.write(piece)
            await writer.drain()
    status, _, _ = await asyncio.wait_for(read_response(reader), 10)
    writer.close()
    assert status == 413
    assert not scene.pods["a"].seen


@pytest.mark.parametrize(("line", "took"), LENIENT_SIZES, ids=LENIENT_IDS)
async def test_a_lenient_chunk_size_is_400_and_the_connection_closes(
        scene: Scene, line: bytes, took: int) -> None:
    """As the gateway (test_http_hostile.py): one 400, counted as bad_request, the connection
    closed, and the GET hidden behind the body never answered; the pod sees nothing."""
    port = await routed(scene)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n" + smuggling_body(line, took))
    try:
        async with asyncio.timeout(10):
            status, headers, body = await read_response(reader)
            assert await reader.read() == b"", "one answer, then the connection's end"
    finally:
        writer.close()
    assert (status, headers["connection"], code_of(body)) == (400, "close", "bad_request")
    assert scene.app is not None and counter(
        scene.app, "glm_router_refusals_total", code="400", reason="bad_request") == 1
    assert not scene.pods["a"].seen


async def test_a_slow_head_is_408(scene: Scene) -> None:
    from glm_operator.gateway.wire import http

    port = await routed(scene)
    original = http.HEAD_TIMEOUT_SECONDS
    assert original == 10.0  # the router inherits the gateway's 10 s
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n")
    status, _, body = await asyncio.wait_for(read_response(reader), 20)
    writer.close()
    assert status == 408 and code_of(body) == "request_timeout"


async def test_one_connection_over_the_cap_is_503_and_closed(scene: Scene) -> None:
    port = await routed(scene, max_connections=2)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    await asyncio.sleep(0.05)
    status, _, body = await exchange(port, b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n")
    assert status == 503 and code_of(body) == "too_many_connections"
    # A probe is answered all the same, in the probes' reserve (wire/server.py).
    status, _, _ = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n")
    assert status == 200
    for _, writer in held:
        writer.close()


async def test_bodies_past_the_buffered_cap_are_503_unread(scene: Scene) -> None:
    port = await routed(scene, max_buffered_bytes=150_000)
    _, first = await asyncio.open_connection("127.0.0.1", port)
    # Held: 80,000 bytes of its body (counted as they come, never as announced).
    first.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
                b"Content-Length: 90000\r\n\r\n" + b"x" * 80_000)
    await first.drain()
    await asyncio.sleep(0.05)
    status, headers, body = await exchange(
        port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
        b"Content-Length: 90000\r\n\r\n")
    assert status == 503 and code_of(body) == "server_busy" and headers["retry-after"] == "1"
    first.close()


@pytest.mark.parametrize("body", [b"[1,2]", b"{not json", b'"text"', b"[" * 50_000,
                                  b'{"messages": "\xff\xfe"}'])
async def test_a_body_that_is_not_a_json_object_is_400_and_not_sent(scene: Scene,
                                                                    body: bytes) -> None:
    port = await routed(scene)
    status, _, answer = await exchange(
        port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%b"
        % (len(body), body))
    assert status == 400 and code_of(answer) == "invalid_json"
    assert not scene.pods["a"].seen


async def test_a_client_that_stops_reading_a_stream_frees_the_pod(scene: Scene) -> None:
    """The pod's stream is relayed without buffering: a client that reads nothing is dropped
    after the write-stall timeout, and the pod's connection with it."""
    await scene.start(picker="none", max_body_bytes=LIMIT, write_stall_timeout_seconds=0.5)
    pod = DripPod("a")
    await pod.start()
    scene.pods["a"] = pod
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True})
    _, writer = await asyncio.open_connection("127.0.0.1", scene.port, limit=1024)
    writer.transport.pause_reading()  # type: ignore[attr-defined]
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%b"
                 % (len(body), body.encode()))
    await asyncio.wait_for(pod.started.wait(), 5)
    await asyncio.wait_for(pod.cancelled.wait(), 10)
    writer.close()


async def test_a_client_that_hangs_up_mid_stream_frees_the_pod(scene: Scene) -> None:
    await scene.start(picker="none", max_body_bytes=LIMIT)
    pod = DripPod("a")
    await pod.start()
    scene.pods["a"] = pod
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True})
    reader, writer = await asyncio.open_connection("127.0.0.1", scene.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%b"
                 % (len(body), body.encode()))
    await asyncio.wait_for(pod.started.wait(), 5)
    await reader.readexactly(1000)
    writer.transport.abort()  # type: ignore[attr-defined]
    await asyncio.wait_for(pod.cancelled.wait(), 10)


async def test_a_long_version_pin_is_refused_without_echoing_it_whole(scene: Scene) -> None:
    port = await routed(scene)
    pin = b"v" * 30_000
    body = b'{"messages": [{"role": "user", "content": "x"}]}'
    status, _, answer = await exchange(
        port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Glm-Version: %b\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (pin, len(body), body))
    assert status == 400 and code_of(answer) == "unknown_version"
    assert len(answer) < 1000
    assert not scene.pods["a"].seen


async def test_held_requests_keep_their_bytes_not_their_decoded_json(scene: Scene) -> None:
    """Bodies of ~3 MiB held while their version wakes: each costs about its bytes, not the
    decoded JSON (here many small content parts, about ten times the bytes decoded)."""
    import tracemalloc

    app = await scene.start(picker="none", max_body_bytes=4 * 1024 * 1024)
    scene.publish_table(table_json({"v1": 100}, wake_timeout=30.0))
    scene.publish_pods()  # no ready pod: every request is held
    parts = [{"type": "text", "text": f"p{i}"} for i in range(110_000)]
    body = json.dumps({"messages": [{"role": "user", "content": parts}]}).encode()
    del parts
    assert 2.5 * 2**20 < len(body) < 4 * 2**20
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer k\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
    count = 3
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        writers = []
        for held in range(1, count + 1):
            _, writer = await asyncio.open_connection("127.0.0.1", scene.port)
            writer.write(request)
            await writer.drain()
            writers.append(writer)
            async with asyncio.timeout(30):
                while app.waiting < held:
                    await asyncio.sleep(0.02)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    for writer in writers:
        writer.close()
    assert grown / count < 1.6 * len(body), (grown / count, len(body))


class BreakingPod(PodGateway):
    """A pod whose stream breaks off: one whole event, then (with `mid_chunk`) half a chunk,
    then the connection drops without the last chunk."""

    def __init__(self, name: str, mid_chunk: bool) -> None:
        super().__init__(name)
        self.mid_chunk = mid_chunk

    async def answer(self, request: Request) -> Response | Streamed:
        self.seen.append(request)
        transport = request.transport
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
        data = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        if self.mid_chunk:
            transport.write(b"%x\r\n%b" % (len(data), data[:10]))
        await asyncio.sleep(0.05)
        transport.abort()
        return Streamed(complete=False)


async def read_to_end(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        async with asyncio.timeout(10):
            return await reader.read(-1)
    finally:
        writer.close()


@pytest.mark.parametrize("mid_chunk", [False, True])
async def test_a_stream_the_pod_breaks_off_ends_with_an_error_event(scene: Scene,
                                                                    mid_chunk: bool) -> None:
    """Not a clean end the client takes for a whole answer: an OpenAI-style error event as
    the last chunk where the framing allows it, else the connection dropped without the last
    chunk; counted as the gateway counts its engine's broken streams (200, engine_broken)."""
    app = await scene.start(picker="none", max_body_bytes=LIMIT)
    pod = BreakingPod("a", mid_chunk)
    await pod.start()
    scene.pods["a"] = pod
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True})
    answer = await read_to_end(scene.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
                               b"Content-Length: %d\r\n\r\n%b" % (len(body), body.encode()))
    assert answer.startswith(b"HTTP/1.1 200")
    assert b'"content": "hi"' in answer
    if mid_chunk:  # no way to end the chunked body cleanly: it is cut
        assert not answer.endswith(b"0\r\n\r\n") and b'"error"' not in answer
    else:
        _, _, chunks = answer.partition(b"\r\n\r\n")
        events = []
        while chunks:
            size, _, rest = chunks.partition(b"\r\n")
            events.append(rest[:int(size, 16)])
            chunks = rest[int(size, 16) + 2:]
        assert events[-1] == b""  # the last chunk
        error = json.loads(events[-2].removeprefix(b"data: "))["error"]
        assert error["code"] == "engine_stream_broken" and error["type"] == "server_error"
        assert b"[DONE]" not in answer
    sample = app.metrics.registry.get_sample_value(
        "glm_router_requests_total",
        {"service": "svc", "version": "v1", "code": "200", "outcome": "engine_broken"})
    assert sample == 1


class HeldStreamPod(PodGateway):
    """A pod whose stream sends one event, waits for `release`, then `pieces` events of
    `data` and its end."""

    def __init__(self, name: str, data: bytes, pieces: int) -> None:
        super().__init__(name)
        self.release = asyncio.Event()
        self.ended = False
        self.event = b"data: " + data + b"\n\n"
        self.pieces = pieces

    async def answer(self, request: Request) -> Response | Streamed:
        self.seen.append(request)
        transport = request.transport
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
        first = b'data: {"first": 1}\n\n'
        transport.write(b"%x\r\n%b\r\n" % (len(first), first))
        await self.release.wait()
        for _ in range(self.pieces):
            transport.write(b"%x\r\n%b\r\n" % (len(self.event), self.event))
            await request.drain()
        transport.write(b"0\r\n\r\n")
        self.ended = True
        return Streamed(complete=True)


async def test_an_http10_stream_is_relayed_as_it_arrives_unframed(scene: Scene) -> None:
    """HTTP/1.0 has no chunked framing: the events go out as they arrive and the connection
    closes at the end. The first event reaches the client while the pod's stream is still
    running, and the router never holds the stream (8 MiB here) whole."""
    import tracemalloc

    await scene.start(picker="none", max_body_bytes=LIMIT)
    pieces, data = 64, b"s" * (128 * 1024)
    pod = HeldStreamPod("a", data, pieces)
    await pod.start()
    scene.pods["a"] = pod
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reader, writer = await asyncio.open_connection("127.0.0.1", scene.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.0\r\nHost: r\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(body), body.encode()))
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
            assert await reader.readuntil(b"\n\n") == b'data: {"first": 1}\n\n'
        assert not pod.ended  # the pod's stream still runs
        pod.release.set()
        received = 0
        async with asyncio.timeout(30):
            while piece := await reader.read(65536):
                received += len(piece)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    writer.close()
    assert pod.ended and received == pieces * len(pod.event)  # no framing, ended by the close
    assert peak < pieces * len(pod.event) / 4, peak


async def test_an_http10_stream_the_pod_breaks_off_ends_with_an_error_event(
        scene: Scene) -> None:
    app = await scene.start(picker="none", max_body_bytes=LIMIT)
    pod = BreakingPod("a", mid_chunk=True)
    await pod.start()
    scene.pods["a"] = pod
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True})
    answer = await read_to_end(scene.port, b"POST /v1/chat/completions HTTP/1.0\r\nHost: r\r\n"
                               b"Content-Length: %d\r\n\r\n%b" % (len(body), body.encode()))
    _, _, events = answer.partition(b"\r\n\r\n")
    first, cut, error, rest = events.split(b"\n\n")  # the half event ended, then the error
    assert b'"content": "hi"' in first and cut == b'data: {"ch' and rest == b""
    assert json.loads(error.removeprefix(b"data: "))["error"]["code"] == "engine_stream_broken"
    sample = app.metrics.registry.get_sample_value(
        "glm_router_requests_total",
        {"service": "svc", "version": "v1", "code": "200", "outcome": "engine_broken"})
    assert sample == 1


async def test_the_routers_own_refusals_carry_a_request_id(scene: Scene) -> None:
    port = await routed(scene)
    body = b"[1]"
    for request, given in (
            (b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Request-Id: mine-1\r\n"
             b"Content-Length: %d\r\n\r\n%b" % (len(body), body), "mine-1"),
            (b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Request-Id: a b\r\n"
             b"Content-Length: %d\r\n\r\n%b" % (len(body), body), None),
            (b"GET /nowhere HTTP/1.1\r\nHost: r\r\n\r\n", None)):
        status, headers, _ = await exchange(port, request)
        assert status in (400, 404)
        assert headers["x-request-id"] == given if given else len(headers["x-request-id"]) == 16


async def test_an_unknown_pin_names_how_many_versions_and_a_few(scene: Scene) -> None:
    app = await scene.start(picker="none", max_body_bytes=LIMIT)
    await scene.add_pod("a", "")
    names = {f"v{i}": 0 for i in range(16)}
    names["v1"] = 100
    scene.publish_table(table_json(names))
    scene.publish_pods("a")
    assert app.table is not None and len(app.table.names) == 16
    body = b'{"messages": [{"role": "user", "content": "x"}]}'

    def pinned(pin: bytes) -> bytes:
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Glm-Version: %b\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (pin, len(body), body))

    status, _, answer = await exchange(scene.port, pinned(b"v99"))
    message = json.loads(answer)["error"]["message"]
    assert status == 400 and "16 versions" in message and "v15" not in message
    status, headers, answer = await exchange(scene.port, pinned(b"v1 \t"))
    assert status == 200 and headers["x-glm-version"] == "v1", answer
