"""Free TCP ports for the local servers a test starts.

A port the kernel picks with `bind(0)` comes from the ephemeral range, and so does the source
port of every outgoing connection on this machine. Between handing such a port out and the
server binding it, any connection (a kubectl call, the API server dialling etcd) may take it,
and the server fails with "address in use": a flake that grows with the suite's traffic.

So the ports handed out here lie outside `net.ipv4.ip_local_port_range`, where no outgoing
connection is given a port, and are never handed out twice in one process, so two servers
started back to back cannot be given the same one before either has bound it.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Above the local cluster's fixed ports (e2e.cluster.PORTS, 10xxx-16xxx plus an offset).
_LOW = 20000
_handed_out: set[int] = set()
_lock = threading.Lock()


def _candidates() -> range:
    """Ports no outgoing connection is given: below the ephemeral range, or above it."""
    try:
        first, last = (int(x) for x in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        first, last = 32768, 60999  # Linux's default
    if first - _LOW >= 2000:
        return range(_LOW, first)
    return range(last + 1, 65536)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing holds now and that this process has not handed out."""
    ports = _candidates()
    with _lock:
        for _ in range(200):
            port = random.choice(ports)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1} after 200 tries")
