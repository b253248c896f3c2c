"""`glm-operator gateway`: run the OpenAI-compatible sidecar in front of one engine."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Callable
from typing import Protocol, TypeVar

from glm_operator.gateway import config as gateway_config
from glm_operator.gateway.app import Gateway
from glm_operator.gateway.wire.server import HttpServer

_C = TypeVar("_C")


class Served(Protocol):
    """What `serve` runs: the pod's gateway, or the router (router/cli.py)."""

    draining: bool

    async def start(self) -> None: ...

    def http_server(self) -> HttpServer: ...

    async def stop(self) -> None: ...

EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    gateway_config.add_arguments(parser)
    add_process_arguments(parser)


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="INFO", help="Python logging level")
    parser.add_argument(
        "--event-loop", choices=EVENT_LOOPS,
        default=os.environ.get("GLM_GATEWAY_EVENT_LOOP", "auto"),
        help="auto = uvloop when installed (less CPU per streamed chunk, on the cores the "
             "engine shares), else asyncio's [GLM_GATEWAY_EVENT_LOOP]")


def new_event_loop(choice: str) -> asyncio.AbstractEventLoop:
    if choice in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def prepared(args: argparse.Namespace, from_args: Callable[[argparse.Namespace], _C]
             ) -> tuple[_C, asyncio.AbstractEventLoop] | None:
    """Logging set up, the configuration parsed and the event loop made; None (logged) when
    either is refused."""
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = from_args(args)
    except ValueError as exc:
        logging.getLogger(__name__).error("invalid configuration: %s", exc)
        return None
    try:
        return config, new_event_loop(args.event_loop)
    except ImportError:
        logging.getLogger(__name__).error("--event-loop uvloop: uvloop is not installed")
        return None


def run(args: argparse.Namespace) -> int:
    ready = prepared(args, gateway_config.from_args)
    if ready is None:
        return 2
    config, loop = ready
    gateway = Gateway(config)
    logging.getLogger(__name__).info(
        "gateway for %s (version %s, pool %s) on %s:%d -> %s%s (event loop %s)",
        config.service_name, config.model_version or "-", config.pool, config.host, config.port,
        config.engine_url,
        f", answers over unix socket {config.engine_socket}" if config.engine_socket else "",
        type(loop).__module__.split(".")[0],
    )
    try:
        loop.run_until_complete(serve(gateway, config.host, config.port, config.drain_seconds))
    finally:
        loop.close()
    return 0


async def serve(gateway: Served, host: str, port: int, drain_seconds: float) -> None:
    """Serve until SIGTERM or SIGINT, then drain: /readyz answers 503, the listener closes, a
    request arriving on a kept-alive connection is refused (503, Connection: close), and the
    running ones get up to `drain_seconds` to finish (a long generation included: the
    operator sizes it, and the pod's grace period above it, from the service's longest
    generation). The pod's preStop wait comes before the SIGTERM, so by then the endpoints
    no longer send it new connections."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await gateway.start()
    server = gateway.http_server()
    try:
        await server.start(host, port)
        await stop.wait()
        gateway.draining = True
        logging.getLogger(__name__).info("draining: finishing %d requests (up to %g s)",
                                         server.in_flight, drain_seconds)
        await server.stop(drain_seconds)
    finally:
        await gateway.stop()
