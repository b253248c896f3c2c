"""An engine stand-in for measuring a proxy's own cost: answers like llama-server, at a fixed
pace, spending almost no CPU.

    python -m bench.paced_engine --port P [--unix @NAME|PATH] [--token-gap-ms 2] [--slots 32]

On a two-core machine the real llama-server computes on the same cores as the proxy and the
load generator, so a proxy's every microsecond of CPU also slows the engine, and a time to
first token measures the scheduler as much as the proxy. This server emits one chunk every
`token-gap-ms` (a GPU engine's pace: 2 ms is 500 tokens/s per stream), each in its own
packet as llama-server sends them, so what a path adds over direct is the path alone. Used by
`python -m bench.gateway --engine paced`; never by the tests.

Shapes follow the pinned llama-server: a streamed answer is chunked `text/event-stream` whose
last event carries `usage` and `timings`, then `data: [DONE]`, and the connection closes after
it; a whole answer is JSON with `usage`. `/health`, `/props`, `/slots`, `/metrics` and
`/v1/models` answer what the gateway reads at start-up and while idle. With `--unix` it also
listens on a Unix socket, as the rendered llama-server does (`--host 127.0.0.1,@name.sock`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import time
from typing import Any

from glm_operator.gateway.wire.engine import unix_address

MAX_REQUEST_BYTES = 1 << 20


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class PacedEngine(asyncio.Protocol):
    def __init__(self, gap: float, slots: int, context: int) -> None:
        self.gap = gap
        self.slots = slots
        self.context = context
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.answers: set[asyncio.Task[None]] = set()  # held, so none is collected mid-way

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > MAX_REQUEST_BYTES:
            assert self.transport is not None
            self.transport.close()
            return
        while True:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if not sep:
                return
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            body, self.buffer = rest[:length], rest[length:]
            method, path = head.split(b" ", 2)[:2]
            task = asyncio.ensure_future(self.answer(method.decode(), path.decode(), body))
            self.answers.add(task)
            task.add_done_callback(self.answers.discard)

    def _write(self, status: str, content_type: str, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 %b\r\nContent-Type: %b\r\nContent-Length: %d\r\n\r\n%b"
            % (status.encode(), content_type.encode(), len(body), body))

    def _json(self, payload: Any) -> None:
        self._write("200 OK", "application/json", json.dumps(payload).encode())

    async def answer(self, method: str, path: str, body: bytes) -> None:
        path = path.split("?", 1)[0]
        if method == "GET":
            if path == "/metrics":
                self._write("200 OK", "text/plain; version=0.0.4", b"")
            else:
                self._json({
                    "/health": {"status": "ok"},
                    "/props": {"default_generation_settings": {"n_ctx": self.context},
                               "total_slots": self.slots},
                    "/slots": [{"id": i, "n_ctx": self.context, "is_processing": False}
                               for i in range(self.slots)],
                    "/v1/models": {"object": "list", "data": [{"id": "bench"}]},
                }.get(path, {}))
            return
        request = json.loads(body or b"{}")
        tokens = int(request.get("max_tokens") or 16)
        if request.get("stream"):
            await self.stream(tokens)
        else:
            await asyncio.sleep(self.gap * tokens)
            self._json({"object": "chat.completion", "model": "bench", "choices": [
                {"index": 0, "finish_reason": "length",
                 "message": {"role": "assistant", "content": " tok" * tokens}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": tokens,
                          "total_tokens": tokens + 12}})

    async def stream(self, tokens: int) -> None:
        transport = self.transport
        assert transport is not None
        created = int(time.time())
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        delta = _event({"object": "chat.completion.chunk", "created": created,
                        "model": "bench", "choices": [{"index": 0, "delta": {"content": " tok"}}]})
        for _ in range(tokens):
            await asyncio.sleep(self.gap)
            if transport.is_closing():
                return
            transport.write(_chunk(delta))
        transport.write(_chunk(_event({
            "object": "chat.completion.chunk", "created": created, "model": "bench",
            "choices": [{"index": 0, "finish_reason": "length", "delta": {}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": tokens,
                      "total_tokens": tokens + 12},
            "timings": {"predicted_n": tokens}}) + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        transport.close()


async def serve(port: int, gap: float, slots: int, context: int, unix: str | None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: PacedEngine(gap, slots, context),
                                      "127.0.0.1", port)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(server)
        if unix is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(unix_address(unix))
            await stack.enter_async_context(await loop.create_unix_server(
                lambda: PacedEngine(gap, slots, context), sock=sock))
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paced_engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unix", help="also listen on this Unix socket (@name: abstract)")
    parser.add_argument("--token-gap-ms", type=float, default=2.0)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--context", type=int, default=8192)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.token_gap_ms / 1000, args.slots, args.context, args.unix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
