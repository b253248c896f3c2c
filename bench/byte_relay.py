"""The floor of a relay in this runtime: bytes copied between two sockets, nothing else.

    python -m bench.byte_relay --port P --to HOST:PORT

Each client connection gets a connection of its own to HOST:PORT, and every packet from
either side is written to the other as it comes: one `data_received` and one `write` per
packet, on uvloop, as the gateway's relay does, but with no HTTP parsing, no keys, no limits,
no accounting. `python -m bench.gateway --floor` puts it beside the gateway, so the gateway's
CPU per streamed token can be read against what any Python relay on this machine pays per
token (and vllm-router against what a Rust one pays).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import uvloop


class _Side(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []  # what arrived before the peer was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class _Client(_Side):
    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self.host, self.port = host, port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        upstream = _Side()
        upstream.peer, self.peer = self, upstream
        try:
            await asyncio.get_running_loop().create_connection(
                lambda: upstream, self.host, self.port)
        except OSError:
            assert self.transport is not None
            self.transport.close()
            return
        assert upstream.transport is not None
        for data in self.pending:
            upstream.transport.write(data)
        self.pending.clear()


async def serve(port: int, host: str, to_port: int) -> None:
    server = await asyncio.get_running_loop().create_server(
        lambda: _Client(host, to_port), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.byte_relay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--to", required=True, metavar="HOST:PORT")
    args = parser.parse_args(argv)
    host, _, to_port = args.to.rpartition(":")
    uvloop.run(serve(args.port, host, int(to_port)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
