"""`glm-operator gateway`: run the OpenAI-compatible sidecar in front of one engine."""

from __future__ import annotations

import argparse
import logging

from aiohttp import web

from glm_operator.gateway import config as gateway_config
from glm_operator.gateway.server import Gateway

SHUTDOWN_TIMEOUT_SECONDS = 25.0  # below the pod's default 30 s grace period


def add_arguments(parser: argparse.ArgumentParser) -> None:
    gateway_config.add_arguments(parser)
    parser.add_argument("--log-level", default="INFO", help="Python logging level")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = gateway_config.from_args(args)
    except ValueError as exc:
        logging.getLogger(__name__).error("invalid configuration: %s", exc)
        return 2
    gateway = Gateway(config)
    logging.getLogger(__name__).info(
        "gateway for %s (version %s, pool %s) on %s:%d -> %s",
        config.service_name, config.model_version or "-", config.pool, config.host, config.port,
        config.engine_url,
    )
    web.run_app(
        gateway.app(), host=config.host, port=config.port, access_log=None, print=None,
        handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS,
    )
    return 0
