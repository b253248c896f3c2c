"""e2e.ports: ports for local test servers that no outgoing connection can be holding."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from e2e import ports


def test_ports_lie_outside_the_ephemeral_range_and_are_never_repeated() -> None:
    first, last = (int(x) for x in
                   Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    handed = [ports.free_port() for _ in range(300)]
    assert len(set(handed)) == len(handed)
    assert all(not first <= port <= last for port in handed)


def test_a_port_something_holds_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        picks = iter([taken, *range(20000, 20200)])
        monkeypatch.setattr(ports.random, "choice", lambda _: next(picks))
        monkeypatch.setattr(ports, "_handed_out", set())
        assert ports.free_port() != taken
