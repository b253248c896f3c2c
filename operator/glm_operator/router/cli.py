"""`glm-operator router`: run the router in front of a service's pools (docs/routing.md).

Its first name, `glm-operator gateway --router`, stays: routers that an operator rendered
before this subcommand existed run it (glm_operator/cli.py sends it here). The process
around it (logging, the event loop, the drain on SIGTERM) is the gateway's (gateway/cli.py).
"""

from __future__ import annotations

import argparse
import logging

from glm_operator.gateway import config as gateway_config
from glm_operator.gateway.cli import add_process_arguments, prepared, serve
from glm_operator.gateway.flags import ROUTER_FLAGS
from glm_operator.router import config as router_config
from glm_operator.router.app import RouterApp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    gateway_config.add_arguments(parser, ROUTER_FLAGS)
    add_process_arguments(parser)


def run(args: argparse.Namespace) -> int:
    ready = prepared(args, router_config.from_args)
    if ready is None:
        return 2
    config, loop = ready
    app = RouterApp(config)
    logging.getLogger(__name__).info(
        "router for %s/%s on %s:%d, picker %s (fails %s)", config.namespace,
        config.service_name, config.host, config.port, config.picker_address or "none",
        config.picker_failure_mode)
    try:
        loop.run_until_complete(serve(app, config.host, config.port, config.drain_seconds))
    finally:
        loop.close()
    return 0
