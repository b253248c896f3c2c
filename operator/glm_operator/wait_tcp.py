"""`glm-operator wait-tcp HOST:PORT...`: block until every address accepts a TCP connection.

The init container of a multi-node llama.cpp leader: llama-server aborts when one of its
`--rpc` workers does not answer, and a container that keeps exiting is restarted with a
growing back-off (up to five minutes). Waiting here first lets the engine start once, as soon
as the group's workers listen. Without `--timeout` it waits as long as it takes (the group is
not Ready meanwhile, which the service's status shows); it says which addresses it still
waits for every 30 seconds.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Callable, Sequence

REPORT_EVERY_SECONDS = 30.0


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def reachable(address: tuple[str, int], timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection(address, timeout=timeout):
            return True
    except OSError:  # refused, unresolvable (the worker's DNS name appears with its pod)
        return False


def wait_all(addresses: Sequence[tuple[str, int]], timeout: float | None, interval: float = 1.0,
             probe: Callable[[tuple[str, int]], bool] = reachable,
             log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
             ) -> list[tuple[str, int]]:
    """Wait until every address answers; return those that never did within `timeout`."""
    started = time.monotonic()
    reported = started
    waiting = list(addresses)
    while True:
        waiting = [a for a in waiting if not probe(a)]
        now = time.monotonic()
        if not waiting or (timeout is not None and now - started >= timeout):
            return waiting
        if now - reported >= REPORT_EVERY_SECONDS:
            reported = now
            log(f"still waiting after {now - started:.0f}s for "
                + ", ".join(f"{h}:{p}" for h, p in waiting))
        time.sleep(interval)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("addresses", nargs="+", type=parse_address, metavar="HOST:PORT")
    parser.add_argument("--timeout", type=float, default=None,
                        help="give up after this many seconds (exit 1); default: wait forever")


def run(args: argparse.Namespace) -> int:
    missing = wait_all(args.addresses, args.timeout)
    if missing:
        print("gave up waiting for " + ", ".join(f"{h}:{p}" for h, p in missing),
              file=sys.stderr)
        return 1
    print("every address answers: " + ", ".join(f"{h}:{p}" for h, p in args.addresses),
          file=sys.stderr)
    return 0
