"""The router's ext-proc client (router/picker.py over router/grpc_wire.py) against real gRPC
servers (grpc.aio's, the C core's HTTP/2) and against a hand-written HTTP/2 peer that uses
the parts of the protocol a gRPC server seldom does here (padding, CONTINUATION, PING,
GOAWAY). The real EPP (grpc-go) is e2e/test_routing.py's and bench/routing.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import grpc
import hpack
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from glm_operator.router import grpc_wire
from glm_operator.router.picker import EndpointPicker, PickFailed

from .test_router import StandInPicker, headers_response

HEADERS = {":method": "POST", ":path": "/v1/chat/completions", ":authority": "router",
           "content-type": "application/json"}
PODS = ["10.0.0.1:8080", "10.0.0.2:8080"]


class RecordingPicker(StandInPicker):
    """The stand-in, also keeping each request's body and each caller's address."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []
        self.peers: set[str] = set()
        self.abort: tuple[grpc.StatusCode, str] | None = None
        self.answer: ext_proc.ProcessingResponse | None = None

    async def Process(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        self.peers.add(context.peer())
        if self.abort is not None:
            await context.abort(*self.abort)
        body = b""
        async for message in requests:
            if message.HasField("request_body"):
                body += message.request_body.body
                if message.request_body.end_of_stream:
                    self.bodies.append(body)
                    if self.delay:
                        await asyncio.sleep(self.delay)
                    if self.answer is not None:
                        yield self.answer
                        return
                    yield headers_response(PODS[-1])
                    yield ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())


async def serve(servicer: Any, port: int = 0) -> tuple[Any, int]:
    server = grpc.aio.server()
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


@pytest.fixture
async def picker_and_server() -> AsyncIterator[tuple[EndpointPicker, RecordingPicker]]:
    servicer = RecordingPicker()
    server, port = await serve(servicer)
    picker = EndpointPicker(f"127.0.0.1:{port}", 2.0)
    yield picker, servicer
    await picker.close()
    await server.stop(0)


async def test_a_body_past_every_flow_control_window_arrives_whole(
        picker_and_server: tuple[EndpointPicker, RecordingPicker]) -> None:
    picker, servicer = picker_and_server
    body = bytes(range(256)) * (3 * 4096) + b"tail!!!"  # 3 MiB and 7 bytes: 4 messages
    assert (await picker.pick(HEADERS, body, PODS)).address == PODS[-1]
    assert (await picker.pick(HEADERS, b"{}", PODS)).address == PODS[-1]
    assert servicer.bodies == [body, b"{}"]


async def test_picks_at_once_share_one_connection(
        picker_and_server: tuple[EndpointPicker, RecordingPicker]) -> None:
    picker, servicer = picker_and_server
    servicer.delay = 0.05  # all of them open together
    picks = await asyncio.gather(*(picker.pick(HEADERS, b'{"n": %d}' % i, PODS)
                                   for i in range(40)))
    assert {p.address for p in picks} == {PODS[-1]}
    assert sorted(servicer.bodies) == sorted(b'{"n": %d}' % i for i in range(40))
    assert len(servicer.peers) == 1


async def test_a_refusal_an_error_status_and_an_answer_without_a_pod_are_told_apart(
        picker_and_server: tuple[EndpointPicker, RecordingPicker]) -> None:
    picker, servicer = picker_and_server
    servicer.answer = ext_proc.ProcessingResponse(immediate_response=ext_proc.ImmediateResponse(
        status={"code": 503}, body=b"no pod is a candidate", details="empty subset"))
    with pytest.raises(PickFailed) as refused:
        await picker.pick(HEADERS, b"{}", PODS)
    assert (refused.value.reason, refused.value.status) == ("refused", 503)
    assert refused.value.body == b"no pod is a candidate"
    servicer.answer = ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())
    with pytest.raises(PickFailed, match="ended the stream without a pod") as empty:
        await picker.pick(HEADERS, b"{}", PODS)
    assert empty.value.reason == "invalid"
    # A status in a trailers-only answer: read from headers the peer encoded for a table of
    # 0 bytes (as we advertise), Huffman and all.
    servicer.abort = (grpc.StatusCode.RESOURCE_EXHAUSTED, "no capacity left, try later")
    with pytest.raises(PickFailed) as failed:
        await picker.pick(HEADERS, b"{}", PODS)
    assert failed.value.reason == "unavailable"
    assert str(failed.value) == "RESOURCE_EXHAUSTED: no capacity left, try later"
    servicer.abort, servicer.answer = None, None  # control: the same connection still picks
    assert (await picker.pick(HEADERS, b"{}", PODS)).address == PODS[-1]
    assert len(servicer.peers) == 1


async def test_a_slow_answer_times_out_and_the_next_pick_is_answered(
        picker_and_server: tuple[EndpointPicker, RecordingPicker]) -> None:
    picker, servicer = picker_and_server
    picker.timeout = 0.1
    servicer.delay = 0.5
    started = asyncio.get_running_loop().time()
    with pytest.raises(PickFailed) as slow:
        await picker.pick(HEADERS, b"{}", PODS)
    assert slow.value.reason == "timeout"
    assert asyncio.get_running_loop().time() - started < 0.4
    servicer.delay = 0.0
    assert (await picker.pick(HEADERS, b"{}", PODS)).address == PODS[-1]


async def test_a_picker_that_restarts_is_reached_again_after_a_short_back_off() -> None:
    first = RecordingPicker()
    server, port = await serve(first)
    picker = EndpointPicker(f"127.0.0.1:{port}", 0.5)
    try:
        assert (await picker.pick(HEADERS, b"{}", PODS)).address == PODS[-1]
        await server.stop(0)
        with pytest.raises(PickFailed) as down:
            await picker.pick(HEADERS, b"{}", PODS)
        assert down.value.reason == "unavailable"
        # during the back-off a pick fails at once, naming why
        with pytest.raises(PickFailed, match=r"cannot connect|lost"):
            await picker.pick(HEADERS, b"{}", PODS)
        second = RecordingPicker()
        server, _ = await serve(second, port)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3
        while True:
            try:
                pick = await picker.pick(HEADERS, b"{}", PODS)
                break
            except PickFailed:
                assert loop.time() < deadline, "not reconnected within 3 s"
                await asyncio.sleep(0.05)
        assert pick.address == PODS[-1] and second.bodies == [b"{}"]
    finally:
        await picker.close()
        await server.stop(0)


async def test_nothing_listening_fails_at_once() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    picker = EndpointPicker(address, 1.0)
    started = asyncio.get_running_loop().time()
    with pytest.raises(PickFailed, match="cannot connect") as failed:
        await picker.pick(HEADERS, b"{}", PODS)
    assert failed.value.reason == "unavailable"
    assert asyncio.get_running_loop().time() - started < 0.5
    await picker.close()


# --- a hand-written HTTP/2 peer ----------------------------------------------------------------

def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return grpc_wire.frame_bytes(kind, flags, stream_id, payload)


class RawPeer:
    """An h2c server that answers each call with every frame split or padded where the
    protocol allows, a PING first, and (when told) GOAWAY after the answer."""

    def __init__(self) -> None:
        self.connections = 0
        self.ping_acks = 0
        self.settings_acks = 0
        self.client_settings: dict[int, int] = {}
        self.resets: list[int] = []
        self.go_away = False
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    def answer(self, stream_id: int) -> bytes:
        encoder = hpack.Encoder()
        encoder.header_table_size = 0  # as the client advertised
        head = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
        trailers = encoder.encode([("grpc-status", "0"), ("grpc-message", "")])
        message = grpc_wire.grpc_message(headers_response(PODS[0]).SerializeToString())
        padding = 7
        return b"".join([
            frame(grpc_wire.PING, 0, 0, b"12345678"),
            # the headers in two pieces, the first padded and with a priority
            frame(grpc_wire.HEADERS, grpc_wire.PADDED | grpc_wire.PRIORITY_FLAG, stream_id,
                  bytes([padding]) + b"\x00\x00\x00\x00\x10" + head[:3] + b"\x00" * padding),
            frame(grpc_wire.CONTINUATION, grpc_wire.END_HEADERS, stream_id, head[3:]),
            # the message in two DATA frames, the second padded
            frame(grpc_wire.DATA, 0, stream_id, message[:4]),
            frame(grpc_wire.DATA, grpc_wire.PADDED, stream_id,
                  bytes([padding]) + message[4:] + b"\x00" * padding),
            frame(grpc_wire.HEADERS, grpc_wire.END_HEADERS | grpc_wire.END_STREAM, stream_id,
                  trailers),
        ])

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        self.connections += 1
        try:
            assert await reader.readexactly(len(grpc_wire.PREFACE)) == grpc_wire.PREFACE
            writer.write(frame(grpc_wire.SETTINGS, 0, 0,
                               struct.pack(">HI", grpc_wire.SETTINGS_MAX_FRAME_SIZE, 32_768)))
            while True:
                head = await reader.readexactly(9)
                high, low, kind, flags, stream_id = struct.unpack(">HBBBI", head)
                payload = await reader.readexactly((high << 8) | low)
                if kind == grpc_wire.SETTINGS and flags & grpc_wire.ACK:
                    self.settings_acks += 1
                elif kind == grpc_wire.SETTINGS:
                    self.client_settings.update(struct.unpack(">HI", payload[i:i + 6])
                                                for i in range(0, len(payload), 6))
                    writer.write(frame(grpc_wire.SETTINGS, grpc_wire.ACK, 0))
                elif kind == grpc_wire.PING and flags & grpc_wire.ACK:
                    assert payload == b"12345678"
                    self.ping_acks += 1
                elif kind == grpc_wire.RST_STREAM:
                    self.resets.append(stream_id)
                elif kind == grpc_wire.DATA and flags & grpc_wire.END_STREAM:
                    writer.write(self.answer(stream_id))
                    if self.go_away:
                        writer.write(frame(grpc_wire.GOAWAY, 0, 0,
                                           struct.pack(">II", stream_id, 0)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw_peer() -> AsyncIterator[tuple[EndpointPicker, RawPeer]]:
    peer = RawPeer()
    port = await peer.start()
    picker = EndpointPicker(f"127.0.0.1:{port}", 2.0)
    yield picker, peer
    await picker.close()
    await peer.stop()


async def test_split_and_padded_frames_and_a_ping_are_read(
        raw_peer: tuple[EndpointPicker, RawPeer]) -> None:
    picker, peer = raw_peer
    for _ in range(3):
        assert (await picker.pick(HEADERS, b"{}", PODS)).address == PODS[0]
    for _ in range(50):  # the acks follow the answers
        if peer.ping_acks == 3:
            break
        await asyncio.sleep(0.01)
    assert (peer.connections, peer.ping_acks, peer.settings_acks) == (1, 3, 1)
    assert peer.client_settings[grpc_wire.SETTINGS_HEADER_TABLE_SIZE] == 0
    assert peer.client_settings[grpc_wire.SETTINGS_ENABLE_PUSH] == 0


async def test_goaway_moves_the_next_pick_to_a_new_connection(
        raw_peer: tuple[EndpointPicker, RawPeer]) -> None:
    picker, peer = raw_peer
    peer.go_away = True
    assert (await picker.pick(HEADERS, b"{}", PODS)).address == PODS[0]
    await asyncio.sleep(0.05)  # the GOAWAY is read
    peer.go_away = False
    assert (await picker.pick(HEADERS, b"{}", PODS)).address == PODS[0]
    assert peer.connections == 2


async def test_a_frame_over_the_limit_closes_the_connection_and_fails_the_call() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(grpc_wire.PREFACE))
        writer.write(frame(grpc_wire.SETTINGS, 0, 0)
                     + frame(grpc_wire.DATA, 0, 1, b"x" * (grpc_wire.MAX_FRAME_BYTES + 1)))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
            await reader.read()  # until the client closes
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    picker = EndpointPicker(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", 2.0)
    try:
        with pytest.raises(PickFailed, match="frame of 16385 bytes") as failed:
            await picker.pick(HEADERS, b"{}", PODS)
        assert failed.value.reason == "unavailable"
    finally:
        await picker.close()
        server.close()
