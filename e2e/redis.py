"""A real Redis for the e2e tests: Debian's `redis-server` binary (`make deps`).

    server = RedisServer(password="s3cret").start()   # 127.0.0.1:<free port>, temp dir
    server.address                                     # "127.0.0.1:41234"
    server.kill()                                      # SIGKILL: the store is gone
    server.start()                                     # the same port again, empty
    server.pause() / server.resume()                   # SIGSTOP / SIGCONT: a store that hangs
    server.stop()
    RedisServer(tls=TlsFiles(cert, key, ca))           # TLS only, on the same kind of port

No persistence (a restarted server is empty, as a failed-over cache without replicas is),
no system service, nothing outside its temp dir.

Fixture
-------
redis_server (function)
    A started `RedisServer` with a password, stopped at the end of the test. When the binary
    is missing: in CI (CI=true) the test FAILS ("run `make deps`"); locally it is skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pytest

from e2e.conftest import in_ci
from e2e.ports import free_port

REDIS_BINARY = Path(os.environ.get("GLM_E2E_REDIS", "/usr/bin/redis-server"))
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0


class RedisError(RuntimeError):
    pass


def binary_missing_reason(binary: Path = REDIS_BINARY) -> str | None:
    if binary.is_file() and os.access(binary, os.X_OK):
        return None
    return (f"the real Redis is not installed ({binary} is missing): run `make deps` "
            f"(Debian package `redis-server`)")


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the server's certificate and key, and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


class RedisServer:
    def __init__(self, password: str = "", binary: Path = REDIS_BINARY,
                 tls: TlsFiles | None = None) -> None:
        self.binary = binary
        self.password = password
        self.tls = tls
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="glm-e2e-redis-"))
        self.log_path = self.workdir / "redis.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        """Start on a free port, or on the port it had before (a restart)."""
        reason = binary_missing_reason(self.binary)
        if reason:
            raise RedisError(reason)
        self.port = self.port or free_port()
        ports = ["--port", str(self.port)]
        if self.tls is not None:  # TLS only: the plain port closed
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file",
                     str(self.tls.cert), "--tls-key-file", str(self.tls.key),
                     "--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "no"]
        argv = [str(self.binary), *ports, "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--logfile", str(self.log_path)]
        if self.password:
            argv += ["--requirepass", self.password]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RedisError(f"redis-server exited {self.proc.returncode}:\n"
                                 f"{self.log_tail()}")
            if self.ping():
                return self
            time.sleep(0.05)
        raise RedisError(f"redis-server not answering on {self.address}:\n{self.log_tail()}")

    def ping(self) -> bool:
        """PING over a raw socket (RESP), authenticated when the server has a password."""
        command = b""
        if self.password:
            command += _resp("AUTH", self.password)
        command += _resp("PING")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw:
                sock = raw
                if self.tls is not None:
                    context = ssl.create_default_context(cafile=str(self.tls.ca))
                    context.check_hostname = False
                    sock = context.wrap_socket(raw)
                sock.sendall(command)
                return b"+PONG" in _read_until(sock, b"+PONG\r\n")
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self if self.proc is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _resp(*parts: str) -> bytes:
    out = f"*{len(parts)}\r\n".encode()
    for part in parts:
        data = part.encode()
        out += f"${len(data)}\r\n".encode() + data + b"\r\n"
    return out


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data and not data.startswith(b"-"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def start_or_skip(server: RedisServer) -> RedisServer:
    """Start `server`; when it cannot: FAIL in CI, skip locally (with the reason)."""
    try:
        return server.start()
    except RedisError as exc:
        server.stop()
        message = f"the e2e Redis could not start: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = start_or_skip(RedisServer(password="e2e-" + os.urandom(6).hex()))
    try:
        yield server
    finally:
        server.stop()
