"""Run `glm-operator gateway` as its own process for a test or the benchmark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from e2e.llama import http_json
from e2e.ports import free_port
from e2e.procstat import cpu_seconds


class GatewayProcess:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log_path: Path,
                 host: str = "127.0.0.1") -> None:
        self.process = process
        self.port = port
        self.log_path = log_path
        self.host = host

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def start(cls, engine_url: str, log_dir: Path, args: Sequence[str] = (),
              service_name: str = "glm-test", wait_ready: bool = True,
              timeout: float = 60.0, env: Mapping[str, str] | None = None,
              port: int | None = None, host: str = "127.0.0.1") -> GatewayProcess:
        """`env`: added to this process's environment (secrets the gateway reads only there);
        `port`: a fixed port (a URL given to another gateway beforehand), else a free one;
        `host`: the listen address (a kwok pod's loopback IP: e2e/pod_serving.py)."""
        port = port or free_port()
        argv = [sys.executable, "-m", "glm_operator.cli", "gateway", "--host", host,
                "--port", str(port), "--engine-url", engine_url, "--service-name", service_name,
                *args]
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"gateway-{port}.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       env={**os.environ, **env} if env else None)
        gateway = cls(process, port, log_path, host)
        try:
            gateway.wait("/readyz" if wait_ready else "/healthz", timeout)
        except BaseException:
            gateway.stop()
            raise
        return gateway

    def wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited {self.process.returncode}:\n{self.log_text()}")
            try:
                if http_json(self.url + path, timeout=2)[0] == 200:
                    return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway {path} not 200 after {timeout:g} s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used (e2e.procstat)."""
        return cpu_seconds(self.process.pid)

    def metrics_text(self) -> str:
        status, text = http_json(self.url + "/metrics")
        assert status == 200
        return str(text)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def __enter__(self) -> GatewayProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
