"""Start the real llama-server for a test: a given argv, a free port, /health 200, log kept.

    binary = llama_server_binary()          # built once by e2e.toolchain, cached
    with LlamaServer.start([str(binary), "-m", str(model), "-c", "512"], log_dir) as server:
        server.url                          # http://127.0.0.1:<free port>
        server.log_text()                   # everything it printed (load sizes, errors)

An argv rendered by the operator can be passed as is: its `--host` / `--port` values are
replaced by 127.0.0.1 and a free port, and a leading `llama-server` by the built binary.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from glm_operator.gateway.wire.engine import unix_address

from e2e import toolchain
from e2e.ports import free_port

COMPONENT = "llama_cpp_python"


class LlamaServerError(RuntimeError):
    """llama-server did not come up; the message carries its log tail."""


def llama_server_binary() -> Path:
    """The pinned llama-server, built on first use (several minutes) and cached."""
    return toolchain.ensure(COMPONENT) / "llama-server"


def local_socket(name: str, port: int) -> str:
    """A rendered abstract socket's name for a process on this machine: the pod's name, made
    unique by the engine's port, since every process here shares one network namespace."""
    return f"{name.removesuffix('.sock')}-{port}.sock" if name.startswith("@") else name


def with_local_sockets(argv: Sequence[str], port: int) -> list[str]:
    """`argv` with each abstract socket in its `--host` list named by local_socket."""
    out = list(argv)
    if "--host" in out:
        at = out.index("--host") + 1
        out[at] = ",".join(local_socket(h, port) for h in out[at].split(","))
    return out


def unix_sockets(argv: Sequence[str]) -> list[str]:
    """The Unix sockets a llama-server argv listens on (hosts ending in .sock)."""
    hosts = argv[argv.index("--host") + 1].split(",") if "--host" in argv else []
    return [h for h in hosts if h.endswith(".sock")]


def _with_host_and_port(argv: Sequence[str], port: int) -> list[str]:
    """On 127.0.0.1:<port>, and on the argv's Unix sockets (named for this machine)."""
    out = list(argv)
    if out and Path(out[0]).name == "llama-server" and not Path(out[0]).exists():
        out[0] = str(llama_server_binary())
    host = ",".join(["127.0.0.1", *(local_socket(s, port) for s in unix_sockets(out))])
    for flag, value in (("--host", host), ("--port", str(port))):
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def unix_get_status(name: str, path: str, timeout: float = 5.0) -> int:
    """The status of a GET over the Unix socket `name` ("@name": abstract)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(unix_address(name))
        sock.sendall(b"GET %b HTTP/1.1\r\nHost: engine\r\nConnection: close\r\n\r\n"
                     % path.encode())
        head = sock.recv(64)
    return int(head.split(b" ", 2)[1])


def http_json(url: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
    """A tiny sync HTTP helper for tests: (status, parsed JSON or text)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


class LlamaServer:
    def __init__(self, argv: list[str], port: int, process: subprocess.Popen[bytes],
                 log_path: Path) -> None:
        self.argv = argv
        self.port = port
        self.process = process
        self.log_path = log_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def sockets(self) -> list[str]:
        """The Unix sockets it listens on besides TCP (from a rendered `--host` list)."""
        return unix_sockets(self.argv)

    @classmethod
    def start(cls, argv: Sequence[str], log_dir: Path, port: int | None = None,
              ready_timeout: float = 180.0, env: dict[str, str] | None = None) -> LlamaServer:
        port = port or free_port()
        full = _with_host_and_port(argv, port)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"llama-server-{port}.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                full, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})}, start_new_session=True,
            )
        server = cls(full, port, process, log_path)
        try:
            server.wait_ready(ready_timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LlamaServerError(
                    f"llama-server exited with {self.process.returncode} before it was ready: "
                    f"{' '.join(self.argv)}\n{self.log_text()[-3000:]}"
                )
            try:
                status, _ = http_json(self.url + "/health", timeout=2)
                if status == 200:
                    return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise LlamaServerError(
            f"llama-server not healthy after {timeout:g} s: {' '.join(self.argv)}\n"
            f"{self.log_text()[-3000:]}"
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str) -> float | None:
        """One value from llama-server's /metrics (needs --metrics), e.g.
        `llamacpp:requests_processing`."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def busy_slots(self) -> int:
        """How many slots are processing a request now (from /slots)."""
        status, slots = http_json(self.url + "/slots", timeout=5)
        if status != 200 or not isinstance(slots, list):
            raise LlamaServerError(f"/slots answered {status}: {slots!r}")
        return sum(1 for slot in slots if slot.get("is_processing"))

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
