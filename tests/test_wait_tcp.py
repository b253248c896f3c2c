"""`glm-operator wait-tcp` against real sockets on loopback."""

from __future__ import annotations

import argparse
import socket
import threading
import time

import pytest
from glm_operator.wait_tcp import parse_address, wait_all

from e2e.ports import free_port


def test_returns_once_every_address_listens_even_if_one_starts_late() -> None:
    early = socket.socket()
    early.bind(("127.0.0.1", 0))
    early.listen()
    late_port = free_port()
    late = socket.socket()

    def listen_later() -> None:
        time.sleep(0.6)
        late.bind(("127.0.0.1", late_port))
        late.listen()
    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        started = time.monotonic()
        missing = wait_all([early.getsockname(), ("127.0.0.1", late_port)], timeout=20,
                           interval=0.1)
        assert missing == []
        assert time.monotonic() - started >= 0.5  # it did wait for the late one
    finally:
        thread.join()
        early.close()
        late.close()


def test_gives_up_after_the_timeout_naming_what_never_answered() -> None:
    port = free_port()
    logged: list[str] = []
    missing = wait_all([("127.0.0.1", port)], timeout=0.3, interval=0.05, log=logged.append)
    assert missing == [("127.0.0.1", port)]


def test_addresses_must_be_host_and_port() -> None:
    assert parse_address("w-1.set.ns.svc.cluster.local:50052") == (
        "w-1.set.ns.svc.cluster.local", 50052)
    assert parse_address("[::1]:8080") == ("::1", 8080)
    for bad in ("host", "host:", ":80", "host:http", "host:70000"):
        with pytest.raises(argparse.ArgumentTypeError, match="HOST:PORT"):
            parse_address(bad)
