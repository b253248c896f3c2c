"""A network namespace joined to this machine by a veth pair: a routable address for a local
server that the API server must reach through a Service's endpoints.

Endpoints and EndpointSlices refuse loopback addresses, so an extension API server (the
custom metrics API of e2e/custom_metrics.py) cannot be registered at 127.0.0.1. Inside its
own network namespace it listens on the namespace's end of a veth pair (10.250.a.b+2), and
this machine reaches it on the other end (10.250.a.b+1): a point-to-point /30 link, no
forwarding, no NAT, nothing leaves the machine.

    with VethNamespace.for_cluster() as netns:
        subprocess.Popen(netns.exec_argv(["server", "--bind", netns.inner_ip]))

Each cluster (GLM_E2E_PORT_OFFSET) gets its own namespace name, interface names and /30, so
two clusters on one machine do not clash. Creating one needs root (CAP_NET_ADMIN): CI runs as
root; elsewhere `NetnsError` says so. `create` first removes what a killed run left behind
(its namespace, its host interface, the processes still running in it), and `remove` is safe
to call twice.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

# 10.250.0.0/16 is carved into /30 links, one per port offset: offsets 0..16383 never share.
LINK_RANGE = ipaddress.IPv4Network("10.250.0.0/16")
# A second server of the same cluster (KEDA's metrics API, e2e/keda_controller.py) gets a
# link of its own: its range and the letter in its names.
# The operator serving the conversion webhook (e2e/test_upgrade_v1alpha2.py) gets a third.
LINKS = {"": LINK_RANGE, "k": ipaddress.IPv4Network("10.251.0.0/16"),
         "u": ipaddress.IPv4Network("10.252.0.0/16")}
LINK_PREFIX = 30
COMMAND_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0


class NetnsError(RuntimeError):
    """The namespace cannot be created (not root, no `ip`) or a command on it failed."""


def _port_offset() -> int:
    return int(os.environ.get("GLM_E2E_PORT_OFFSET", "0"))


@dataclass(frozen=True)
class VethNamespace:
    name: str  # the network namespace (ip netns)
    host_if: str  # this machine's end of the veth pair
    inner_if: str  # the namespace's end
    host_ip: str
    inner_ip: str

    @classmethod
    def for_cluster(cls, offset: int | None = None, link: str = "") -> VethNamespace:
        """The namespace of the cluster at `offset` (default: GLM_E2E_PORT_OFFSET); `link`
        (a key of LINKS) picks a second one of the same cluster."""
        offset = _port_offset() if offset is None else offset
        network = LINKS[link]
        links = 2 ** (LINK_PREFIX - network.prefixlen)
        if not 0 <= offset < links:
            raise NetnsError(f"GLM_E2E_PORT_OFFSET={offset} is outside 0..{links - 1}")
        base = network.network_address + offset * 2 ** (32 - LINK_PREFIX)
        # Interface names are limited to 15 characters.
        return cls(name=f"glm-e2e-{link}{offset}", host_if=f"glm{link}h{offset}",
                   inner_if=f"glm{link}n{offset}", host_ip=str(base + 1), inner_ip=str(base + 2))

    # --- commands --------------------------------------------------------------------------

    def kubeconfig_inside(self, kubeconfig: Path, out: Path) -> Path:
        """`kubeconfig` for a process in this namespace, written to `out`: the API server
        through the veth pair (its certificate names localhost, hence tls-server-name)."""
        config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
        for entry in config["clusters"]:
            port = entry["cluster"]["server"].rsplit(":", 1)[1]
            entry["cluster"]["server"] = f"https://{self.host_ip}:{port}"
            entry["cluster"]["tls-server-name"] = "localhost"
        out.write_text(yaml.safe_dump(config))
        return out

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    @staticmethod
    def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False,
                                timeout=COMMAND_TIMEOUT)
        if check and result.returncode != 0:
            raise NetnsError(f"`ip {' '.join(args)}` failed (exit {result.returncode}): "
                             f"{result.stderr.strip()}")
        return result

    def exists(self) -> bool:
        listed = self._ip("netns", "list", check=False).stdout.split()
        return self.name in listed

    def pids(self) -> list[int]:
        """Processes running in the namespace (those a killed run left, or ours)."""
        if not self.exists():
            return []
        out = self._ip("netns", "pids", self.name, check=False).stdout
        return [int(pid) for pid in out.split() if pid.isdigit()]

    # --- lifecycle -------------------------------------------------------------------------

    def create(self) -> VethNamespace:
        if shutil.which("ip") is None:
            raise NetnsError("the `ip` command (Debian package iproute2) is not installed: "
                             "run `make deps`")
        if os.geteuid() != 0:
            raise NetnsError(
                "creating a network namespace and a veth pair needs root (CAP_NET_ADMIN); "
                "the custom metrics API tests give the extension API server a routable "
                "address this way (docs/development.md). Run them as root, as CI does.")
        self.remove()
        try:
            self._ip("netns", "add", self.name)
            self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.inner_if)
            self._ip("link", "set", self.inner_if, "netns", self.name)
            self._ip("addr", "add", f"{self.host_ip}/{LINK_PREFIX}", "dev", self.host_if)
            self._ip("link", "set", self.host_if, "up")
            inner = ["-n", self.name]
            self._ip(*inner, "addr", "add", f"{self.inner_ip}/{LINK_PREFIX}", "dev",
                     self.inner_if)
            self._ip(*inner, "link", "set", self.inner_if, "up")
            self._ip(*inner, "link", "set", "lo", "up")
        except (NetnsError, subprocess.TimeoutExpired):
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Stop what still runs inside, delete the veth pair and the namespace."""
        self._stop_processes()
        # Deleting one end of a veth pair deletes both.
        if self._ip("link", "show", self.host_if, check=False).returncode == 0:
            self._ip("link", "del", self.host_if, check=False)
        if self.exists():
            self._ip("netns", "del", self.name)

    def _stop_processes(self) -> None:
        pids = self.pids()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + STOP_TIMEOUT
            while pids and time.monotonic() < deadline:
                time.sleep(0.1)
                pids = [pid for pid in pids if _running(pid)]
            if not pids:
                return

    def __enter__(self) -> VethNamespace:
        return self.create()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie child waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False
