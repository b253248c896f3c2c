"""The transport-level stream relay: chunk framing followed across any packet split, and
answers framed in each way HTTP/1.1 allows relayed whole, with their usage counted.

The streamed path against aiohttp's own server and against llama-server is covered by
test_server.py and e2e/test_gateway.py; the engines here send the framings those do not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import aiohttp
import pytest
import uvloop
from glm_operator.gateway.wire.engine import EngineAddress, EngineHead, connect, unix_address
from glm_operator.gateway.wire.engine_pool import EnginePool
from glm_operator.gateway.wire.framing import ChunkedBody, EngineProtocolError

from .test_server import CHAT, GatewayClient, base_config, gateway_client

EVENTS = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
          b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],'
          b'"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n',
          b"data: [DONE]\n\n"]


def chunked(pieces: list[bytes], extension: bytes = b";ext=1") -> bytes:
    return b"".join(b"%x%b\r\n%b\r\n" % (len(p), extension, p) for p in pieces) + b"0\r\n\r\n"


@pytest.mark.parametrize("extension", [b";ext=1", b""])
def test_chunked_body_across_every_split(extension: bytes) -> None:
    framed = chunked(EVENTS, extension)
    for split in range(1, len(framed)):
        body, out = ChunkedBody(), []
        assert body.feed(framed[:split], out) == split
        assert not body.complete
        used = body.feed(framed[split:] + b"NEXT", out)
        assert used == len(framed) - split, split  # bytes after the body are not its own
        assert body.complete and body.at_boundary is False
        assert b"".join(out) == b"".join(EVENTS)


def test_chunked_body_one_chunk_per_packet_as_engines_send_them() -> None:
    """The usual packet is one whole chunk: its payload comes out whole, and the body stays
    between chunks, whatever the payload holds (here a CRLF and what looks like a size line)."""
    body, out = ChunkedBody(), []
    tricky = b"data: a\r\n5\r\nhello\r\n\n\n"
    for event in [*EVENTS, tricky]:
        packet = b"%x\r\n%b\r\n" % (len(event), event)
        assert body.feed(packet, out) == len(packet)
        assert body.at_boundary and out[-1] == event
    assert body.feed(b"0\r\n\r\nNEXT", out) == 5 and body.complete
    # A size line with an extension is followed; one that is not hex is refused.
    body, out = ChunkedBody(), []
    assert body.feed(b"5;x=1\r\nhello\r\n", out) == 14 and out == [b"hello"]
    with pytest.raises(EngineProtocolError):
        ChunkedBody().feed(b"zz\r\nhello\r\n", [])


def test_chunked_body_boundary_and_bad_framing() -> None:
    body, out = ChunkedBody(), []
    body.feed(b"5\r\nhello\r\n", out)
    assert body.at_boundary and out == [b"hello"]
    body.feed(b"3\r\nab", out)
    assert not body.at_boundary  # mid-chunk: a zero chunk now would break the framing
    with pytest.raises(EngineProtocolError, match="chunk-size"):
        ChunkedBody().feed(b"zz\r\n", [])
    with pytest.raises(EngineProtocolError, match="too long"):
        ChunkedBody().feed(b"1" * 5000, [])


def test_chunked_body_is_strict_where_a_reader_could_disagree() -> None:
    """RFC 9112 7.1 only (tests/gateway/test_chunk_grammar.py runs it against llhttp): a
    size int() would take, a bare LF, anything but CRLF after a chunk's data, a trailer
    line that is not a field line are refused; a trailer and extensions are followed."""
    for bad in [b"0x5\r\nhello\r\n", b"5\nhello\r\n", b"5\r\nhelloXX", b"5\r\nhello\n",
                b"5 \r\nhello\r\n", b"+5\r\nhello\r\n", b"0\r\n X: y\r\n\r\n",
                b"0\r\nX: y\n\r\n", b"1" * 17 + b"\r\n"]:
        with pytest.raises(EngineProtocolError):
            ChunkedBody().feed(bad, [])
    body, out = ChunkedBody(), []
    framed = b'5;a="b;c"\r\nhello\r\n0;z\r\nX-Count: 3\r\n\r\nNEXT'
    assert body.feed(framed, out) == len(framed) - 4 and body.complete and out == [b"hello"]
    with pytest.raises(EngineProtocolError, match="trailer section too large"):
        ChunkedBody().feed(b"0\r\n" + b"X: %s\r\n" % (b"v" * 4000) * 17, [])


def test_a_refused_packet_counts_as_unread() -> None:
    """What the relay forwarded is the packets before the refused one: the body is between
    chunks after a refusal if it was before that packet (the relay may then end the client's
    stream with an error event), and the refused packet's pieces are not handed out."""
    body, out = ChunkedBody(), []
    body.feed(b"5\r\nhello\r\n", out)
    with pytest.raises(EngineProtocolError, match="chunk-size"):
        body.feed(b"3\r\nabc\r\n0x3\r\nabc\r\n", out)
    assert body.at_boundary and out == [b"hello"]
    with pytest.raises(EngineProtocolError, match="refused already"):
        body.feed(b"0\r\n\r\n", out)
    body = ChunkedBody()
    body.feed(b"5\r\nhel", [])
    with pytest.raises(EngineProtocolError, match="CRLF"):
        body.feed(b"lo\r\r", [])
    assert not body.at_boundary  # mid-chunk before that packet: the client must be dropped


def test_engine_address() -> None:
    assert EngineAddress.parse("http://127.0.0.1:8080") == EngineAddress(
        "127.0.0.1", 8080, "127.0.0.1:8080")
    assert EngineAddress.parse("http://engine/") == EngineAddress("engine", 80, "engine")
    assert EngineAddress.parse("https://engine:8443") is None  # aiohttp's client does TLS
    assert EngineAddress.parse("http://engine:80/prefix") is None


async def relay_gateway(url: str) -> GatewayClient:
    """A gateway in front of `url` that never calls it unasked (no warm-up, shape given)."""
    return await gateway_client(base_config(url, warmup=False, engine_slots=1,
                                            context_length=100))


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


def by_length(body: bytes) -> list[bytes]:
    return [SSE_HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body[:30], body[30:]]


def until_close(body: bytes) -> list[bytes]:
    return [SSE_HEAD + b"Connection: close\r\n\r\n", body]


def chunked_in_one_packet(body: bytes) -> list[bytes]:
    # The head, every chunk and the last chunk in one write: nothing left to relay.
    return [SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(EVENTS)]


def chunk_split_after_head(body: bytes) -> list[bytes]:
    # The head and part of the first chunk in one packet: the rest of that chunk comes
    # without a size line of its own and must follow the part already relayed.
    framed = chunked(EVENTS)
    return [SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + framed[:25], framed[25:]]


@dataclass
class RawEngine:
    script: list[list[bytes]] = field(default_factory=list)
    posts: int = 0  # connections that carried a request to relay
    idle: set[asyncio.StreamWriter] = field(default_factory=set)  # sent no request yet


@pytest.fixture
async def raw_engine_state() -> AsyncIterator[tuple[RawEngine, str]]:
    """An engine that answers each connection with the next scripted packets, then closes."""
    state = RawEngine()
    script = state.script

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.idle.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return  # closed by either side before a request
        finally:
            state.idle.discard(writer)
        if head.startswith(b"GET"):  # the gateway's health checks
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            writer.close()
            return
        state.posts += 1
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        for packet in script.pop(0):
            writer.write(packet)
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield state, f"http://127.0.0.1:{port}"
    server.close()


@pytest.fixture
def raw_engine(raw_engine_state: tuple[RawEngine, str]) -> tuple[list[list[bytes]], str]:
    return raw_engine_state[0].script, raw_engine_state[1]


async def test_spare_connection_is_used_and_a_closed_one_skipped(
        raw_engine_state: tuple[RawEngine, str]) -> None:
    state, url = raw_engine_state
    client = await relay_gateway(url)
    try:
        framed = [SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(EVENTS)]
        state.script.extend([framed, framed, framed])
        for _ in range(2):
            response = await client.post("/v1/chat/completions",
                                         json={**CHAT, "stream": True})
            assert await response.read() == b"".join(EVENTS)
        # The first request connected and opened a spare; the second used that spare and
        # opened the next one.
        for _ in range(100):
            if state.idle:
                break
            await asyncio.sleep(0.01)
        assert state.posts == 2 and len(state.idle) == 1
        for writer in list(state.idle):  # the engine drops the idle spare
            writer.close()
        await asyncio.sleep(0.05)
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert await response.read() == b"".join(EVENTS)
    finally:
        await client.close()


@pytest.mark.parametrize("framing", [by_length, until_close, chunked_in_one_packet,
                                     chunk_split_after_head])
async def test_relays_each_framing(raw_engine: tuple[list[list[bytes]], str],
                                   framing: Callable[[bytes], list[bytes]]) -> None:
    script, url = raw_engine
    client = await relay_gateway(url)
    try:
        script.append(framing(b"".join(EVENTS)))
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert response.status == 200
        async with asyncio.timeout(10):  # broken framing leaves the client waiting
            assert await response.read() == b"".join(EVENTS)
        text = await (await client.get("/metrics")).text()
        assert 'glm_gateway_completion_tokens_total{model_version="v1",pool="main",' \
               'service="glm"} 2.0' in text
    finally:
        await client.close()


async def test_non_sse_answer_to_a_stream_request_is_passed_whole(
        raw_engine: tuple[list[list[bytes]], str]) -> None:
    script, url = raw_engine
    client = await relay_gateway(url)
    try:
        error = json.dumps({"error": {"code": 500, "message": "boom"}}).encode()
        script.append([b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json"
                       b"\r\nTransfer-Encoding: chunked\r\n\r\n", chunked([error[:9], error[9:]])])
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert response.status == 500
        assert await response.read() == error
    finally:
        await client.close()


async def test_engine_breaking_off_mid_chunk_drops_the_client(
        raw_engine: tuple[list[list[bytes]], str]) -> None:
    script, url = raw_engine
    client = await relay_gateway(url)
    try:
        framed = chunked(EVENTS)
        script.append([SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n", framed[:20]])
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    finally:
        await client.close()


class KeepAliveEngine(asyncio.Protocol):
    """Answers every POST with a small JSON body on the same connection; counts connections
    and can close a connection after answering (as a restarted or idle-timing engine does)."""

    connections = 0
    close_after_answer = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""
        self.counted = False

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            if not head.startswith(b"POST "):  # the gateway's probes: not what is counted
                self.buffer = rest
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")  # type: ignore[attr-defined]
                continue
            if not self.counted:
                type(self).connections += 1  # connections that carried a request
                self.counted = True
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            body = json.dumps({"choices": [{"message": {"content": "ok"}}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"  # type: ignore[attr-defined]
                                 b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            if type(self).close_after_answer:
                self.transport.close()


async def test_whole_answers_reuse_one_engine_connection_and_survive_its_closing() -> None:
    loop = asyncio.get_running_loop()
    KeepAliveEngine.connections, KeepAliveEngine.close_after_answer = 0, False
    server = await loop.create_server(KeepAliveEngine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = await relay_gateway(url)
    try:
        for _ in range(5):
            response = await client.post("/v1/chat/completions", json=CHAT)
            assert response.status == 200 and (await response.json())["usage"]
        assert KeepAliveEngine.connections == 1  # kept alive, not one per request
        # The engine closes each connection after its answer, without saying so: the pooled
        # one is found closed before anything is written to it, and a new one is opened.
        KeepAliveEngine.close_after_answer = True
        for _ in range(3):
            response = await client.post("/v1/chat/completions", json=CHAT)
            assert response.status == 200
        assert KeepAliveEngine.connections >= 3
    finally:
        await client.close()
        server.close()


async def test_the_answer_hook_sees_each_answer_once_even_when_it_was_sent_again() -> None:
    loop = asyncio.get_running_loop()
    KeepAliveEngine.connections, KeepAliveEngine.close_after_answer = 0, True
    server = await loop.create_server(KeepAliveEngine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = EnginePool(EngineAddress("127.0.0.1", port, f"127.0.0.1:{port}"), 5, 5)
    seen: list[tuple[int, bytes]] = []

    def hook(head: EngineHead, body: bytes) -> None:
        seen.append((head.status, body))

    try:
        for n in range(4):  # each pooled connection is closed by the time of the next post
            head, body = await pool.post("/v1/chat/completions", b"{}", hook)
            assert seen[-1] == (head.status, body) and len(seen) == n + 1
    finally:
        pool.close()
        server.close()


class SilentEngine(asyncio.Protocol):
    """Reads requests and never answers; or, with `hang_up`, closes on the first byte."""

    hang_up = False
    lost = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if type(self).hang_up:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        type(self).lost += 1


@pytest.mark.parametrize("hang_up, status, code", [
    # An engine that hangs up once it has the request may have run it: 502, not sent again.
    (False, 504, "engine_timeout"), (True, 502, "engine_dropped")])
async def test_whole_answer_engine_silent_or_hanging_up(hang_up: bool, status: int,
                                                        code: str) -> None:
    loop = asyncio.get_running_loop()
    SilentEngine.hang_up = hang_up
    server = await loop.create_server(SilentEngine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = await gateway_client(base_config(url, warmup=False, engine_slots=1,
                                              context_length=100, read_timeout_seconds=0.3))
    try:
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status == status
        assert (await response.json())["error"]["code"] == code
    finally:
        await client.close()
        server.close()


async def test_a_client_leaving_a_whole_answer_drops_the_engine_connection() -> None:
    loop = asyncio.get_running_loop()
    SilentEngine.hang_up, SilentEngine.lost = False, 0
    server = await loop.create_server(SilentEngine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = await gateway_client(base_config(url, warmup=False, engine_slots=1,
                                              context_length=100))
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.post("/v1/chat/completions", json=CHAT)
        await client.session.close()  # the client's connection goes
        async with asyncio.timeout(5):
            while not SilentEngine.lost:  # so the engine stops working for nobody
                await asyncio.sleep(0.02)
    finally:
        await client.close()
        server.close()


class LabelledEngine(asyncio.Protocol):
    """Answers each POST, whole or streamed alike, with a JSON body naming the listener it
    came in on; counts the requests per listener."""

    posts: dict[str, int] = {}

    def __init__(self, label: str) -> None:
        self.label = label
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        if len(rest) < length:
            return
        self.buffer = rest[length:]
        LabelledEngine.posts[self.label] = LabelledEngine.posts.get(self.label, 0) + 1
        body = json.dumps({"choices": [{"message": {"content": self.label}}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%b" % (len(body), body))


async def unix_listener(name: str, label: str) -> asyncio.AbstractServer:
    """A listener on `name` ("@name": abstract), bound by hand as the engine's own is."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(unix_address(name))
    return await asyncio.get_running_loop().create_unix_server(
        lambda: LabelledEngine(label), sock=sock)


LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("kind", ["abstract", "path"])
def test_answers_and_streams_go_over_the_engines_socket(loop: str, kind: str,
                                                        tmp_path: Path) -> None:
    name = (f"@glm-test-{uuid.uuid4().hex}.sock" if kind == "abstract"
            else str(tmp_path / "engine.sock"))

    async def scenario() -> None:
        LabelledEngine.posts = {}
        tcp = await asyncio.get_running_loop().create_server(
            lambda: LabelledEngine("tcp"), "127.0.0.1", 0)
        unix = await unix_listener(name, "unix")
        url = f"http://127.0.0.1:{tcp.sockets[0].getsockname()[1]}"
        client = await gateway_client(base_config(
            url, engine_socket=name, warmup=False, engine_slots=1, context_length=100))
        try:
            for stream in (False, True, False, True):
                response = await client.post("/v1/chat/completions",
                                             json={**CHAT, "stream": stream})
                assert response.status == 200
                assert (await response.json())["choices"][0]["message"]["content"] == "unix"
            assert LabelledEngine.posts == {"unix": 4}
        finally:
            await client.close()
            tcp.close()
            unix.close()

    LOOPS[loop](scenario())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_socket_that_refuses_leaves_answers_on_tcp_and_says_so_once(
        loop: str, caplog: pytest.LogCaptureFixture) -> None:
    name = f"@glm-test-{uuid.uuid4().hex}.sock"

    async def scenario() -> None:
        LabelledEngine.posts = {}
        tcp = await asyncio.get_running_loop().create_server(
            lambda: LabelledEngine("tcp"), "127.0.0.1", 0)
        port = tcp.sockets[0].getsockname()[1]
        address = EngineAddress("127.0.0.1", port, f"127.0.0.1:{port}", name)
        client = await gateway_client(base_config(
            f"http://127.0.0.1:{port}", engine_socket=name, warmup=False, engine_slots=1,
            context_length=100))
        try:
            for stream in (False, True, True):
                response = await client.post("/v1/chat/completions",
                                             json={**CHAT, "stream": stream})
                assert (await response.json())["choices"][0]["message"]["content"] == "tcp"
            # The engine's socket appears (an engine that was still starting): new
            # connections take it.
            unix = await unix_listener(name, "unix")
            engine = LabelledEngine("client")
            await connect(address, engine, 5)
            assert engine.transport.get_extra_info("socket").family == socket.AF_UNIX
            engine.transport.close()
            unix.close()
        finally:
            await client.close()
            tcp.close()

    with caplog.at_level(logging.INFO, logger="glm_operator.gateway.wire.engine"):
        LOOPS[loop](scenario())
    said = [r.getMessage() for r in caplog.records if r.name == "glm_operator.gateway.wire.engine"]
    assert said == [f"the engine's socket {name} refused ([Errno 111] Connection refused): "
                    "its answers go over TCP", f"the engine's socket {name} accepts again"]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_socket_whose_accept_queue_is_full_leaves_that_connection_on_tcp(
        loop: str, caplog: pytest.LogCaptureFixture) -> None:
    """A Unix socket's connect fails with EAGAIN when the listener's queue is full; the
    loops' sock_connect would report such a socket connected. The engine's is not used then."""
    name = f"@glm-test-{uuid.uuid4().hex}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(unix_address(name))
    listener.listen(0)  # and never accepts
    queued: list[socket.socket] = []
    while True:  # fill its queue
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(unix_address(name))
        except BlockingIOError:
            sock.close()
            break
        queued.append(sock)

    async def scenario() -> None:
        tcp = await asyncio.get_running_loop().create_server(
            lambda: LabelledEngine("tcp"), "127.0.0.1", 0)
        port = tcp.sockets[0].getsockname()[1]
        engine = LabelledEngine("client")
        try:
            await connect(EngineAddress("127.0.0.1", port, f"127.0.0.1:{port}", name), engine, 5)
            assert engine.transport.get_extra_info("socket").family == socket.AF_INET
            engine.transport.close()
        finally:
            tcp.close()

    try:
        with caplog.at_level(logging.INFO, logger="glm_operator.gateway.wire.engine"):
            LOOPS[loop](scenario())
    finally:
        for sock in queued:
            sock.close()
        listener.close()
    assert not [r for r in caplog.records if r.name == "glm_operator.gateway.wire.engine"]


@pytest.mark.parametrize("relayed", [True, False])
async def test_a_stream_the_engine_breaks_off_ends_with_an_error_event(
        raw_engine: tuple[list[list[bytes]], str], relayed: bool) -> None:
    """The engine dies between two chunks: the client's stream ends cleanly, but with an
    OpenAI-style error event last (no `data: [DONE]`), and the request is counted as
    engine_broken, not completed. Relayed (HTTP/1.1) and through aiohttp's client (1.0)."""
    script, url = raw_engine
    client = await relay_gateway(url)
    try:
        head = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        script.append([head + b"%x\r\n%b\r\n" % (len(EVENTS[0]), EVENTS[0])])  # then closes
        version = aiohttp.HttpVersion11 if relayed else aiohttp.HttpVersion10
        async with aiohttp.ClientSession(version=version) as session, \
                session.post(client.url + "/v1/chat/completions",
                             json={**CHAT, "stream": True}) as response, \
                asyncio.timeout(10):
            body = await response.read()
        assert body.startswith(EVENTS[0]) and b"[DONE]" not in body
        last = json.loads(body[len(EVENTS[0]):].removeprefix(b"data: "))
        assert last["error"]["code"] == "engine_stream_broken"
        assert "incomplete" in last["error"]["message"]
        text = await (await client.get("/metrics")).text()
        assert 'outcome="engine_broken"' in text and 'outcome="completed"' not in text
    finally:
        await client.close()


async def test_a_lenient_chunk_size_from_the_engine_is_an_engine_error(
        raw_engine: tuple[list[list[bytes]], str], caplog: pytest.LogCaptureFixture) -> None:
    """`0x..` took int(line, 16) for a size, while the client's parser refuses it: relayed as
    it came, the two would disagree on where the body ends. Now the packet is not relayed:
    the client's stream ends after the last whole chunk with an error event, and the log
    says why; a whole answer with it is the engine error (503) naming the line."""
    script, url = raw_engine
    client = await relay_gateway(url)
    try:
        head = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        first = b"%x\r\n%b\r\n" % (len(EVENTS[0]), EVENTS[0])
        script.append([head + first, b"0x%x\r\n%b\r\n" % (len(EVENTS[1]), EVENTS[1])])
        async with aiohttp.ClientSession() as session, \
                session.post(client.url + "/v1/chat/completions",
                             json={**CHAT, "stream": True}) as response, \
                asyncio.timeout(10):
            body = await response.read()
        assert body.startswith(EVENTS[0]) and b"0x" not in body and b"[DONE]" not in body
        assert json.loads(body[len(EVENTS[0]):].removeprefix(b"data: "))["error"]["code"] \
            == "engine_stream_broken"
        assert any("bad chunk-size line b'0x" in r.getMessage() for r in caplog.records)

        error = json.dumps({"error": {"code": 500, "message": "boom"}}).encode()
        script.append([b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json"
                       b"\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n" + error[:16]
                       + b"\r\n0\r\n\r\n"])
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert response.status == 503
        assert "bad chunk-size line b'1_0'" in (await response.json())["error"]["message"]
    finally:
        await client.close()


@pytest.mark.parametrize(("head", "said"), [
    (b"Content-Length: 1_0\r\n", "bad Content-Length b'1_0'"),
    (b"Content-Length: +5\r\n", "bad Content-Length b'+5'"),
    (b"Transfer-Encoding: gzip, chunked\r\n", "Transfer-Encoding 'gzip, chunked'"),
    (b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "both Transfer-Encoding"),
    (b"Content-Length : 5\r\n", "bad header line b'Content-Length : 5'"),
    (b"X-A: 1\r\n folded\r\n", "bad header line b' folded'"),
    (b"Content-Length: 5\r\nContent-Length: 6\r\n", "differing Content-Length"),
])
async def test_a_head_the_rfc_refuses_is_an_engine_error_never_relayed(
        raw_engine: tuple[list[list[bytes]], str], head: bytes, said: str) -> None:
    """The relay's own reading of the engine's head (framing.response_head): a head RFC 9112
    does not allow, or that leaves where the body ends open, is the engine error (503)
    naming what was wrong and counted as such; none of the engine's bytes reach the client."""
    script, url = raw_engine
    client = await relay_gateway(url)
    try:
        script.append([SSE_HEAD + head + b"\r\n" + chunked(EVENTS)])
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert response.status == 503
        raw = await response.read()
        assert b"data:" not in raw and b"hello" not in raw
        assert said in json.loads(raw)["error"]["message"]
        text = await (await client.get("/metrics")).text()
        assert 'glm_gateway_requests_total{code="503",endpoint="chat",model_version="v1",' \
               'outcome="server_error",pool="main",service="glm"} 1.0' in text
    finally:
        await client.close()
