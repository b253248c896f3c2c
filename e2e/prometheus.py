"""A real Prometheus server for the e2e tests: Debian's `prometheus` binary (`make deps`).

    server = PrometheusServer().start()
    server.add_target("pod-a", "127.0.0.1:8123", {"namespace": "ns", "pod": "pod-a"})
    server.wait_for_series('glm_gateway_requests_total{pod="pod-a"}', timeout=20)
    server.query('sum(rate(glm_gateway_requests_total[10s]))')  # [({}, 3.2)]
    server.stop()

It scrapes every second and evaluates every second. Its job `gateway` reads its targets
from `<tmpdir>/targets/*.json` (file_sd_configs), so targets come and go at run time by
writing and removing files: Prometheus sees the change through inotify. The job keeps the
scraped labels over the target's (`honor_labels: true`), as the operator's ServiceMonitor
does with `honorLabels: true`: the gateway's own `service` (the GLMService), `model_version`
and `pool` stay, and the target adds `namespace` and `pod` as the Prometheus Operator's
relabelling does. A second job, `exporters` (`add_target(..., honor_labels=False)`), is a
ServiceMonitor without honorLabels: a scraped `pod` or `namespace` that clashes with the
target's is renamed `exported_pod` / `exported_namespace`, as for a DCGM exporter scraped
that way.

Fixture
-------
prometheus (session)
    A started `PrometheusServer`, stopped at the end of the session. Import it into a test
    module (`from e2e.prometheus import prometheus`); it needs no cluster. When the binary is
    missing: in CI (CI=true) the test FAILS ("run `make deps`"); locally it is skipped with
    the reason. Tests share the server: give targets names of their own and remove them
    (GatewayStandIn.register / close do).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import yaml

from e2e.conftest import in_ci
from e2e.ports import free_port

PROMETHEUS_BINARY = Path(os.environ.get("GLM_E2E_PROMETHEUS", "/usr/bin/prometheus"))
SCRAPE_JOB = "gateway"
UNHONORED_JOB = "exporters"  # honor_labels: false
SCRAPE_INTERVAL = "1s"
START_TIMEOUT = 60.0  # a busy two-core machine takes a few seconds to open the TSDB
STOP_TIMEOUT = 15.0
LOG_TAIL_LINES = 40

Sample = tuple[dict[str, str], float]


class PrometheusError(RuntimeError):
    """Prometheus answered a query with an error (its errorType and error text), or did not
    come up."""


def binary_missing_reason(binary: Path = PROMETHEUS_BINARY) -> str | None:
    if binary.is_file() and os.access(binary, os.X_OK):
        return None
    return (f"the real Prometheus is not installed ({binary} is missing): run `make deps` "
            f"(Debian package `prometheus`)")


class PrometheusServer:
    """A Prometheus process on 127.0.0.1:<free port> with its storage in a temp dir."""

    def __init__(self, binary: Path = PROMETHEUS_BINARY) -> None:
        self.binary = binary
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="glm-e2e-prometheus-"))
        self.targets_dir = self.workdir / "targets"
        self.targets_dir.mkdir()
        self.unhonored_targets_dir = self.workdir / "targets-unhonored"
        self.unhonored_targets_dir.mkdir()
        self.config_path = self.workdir / "prometheus.yml"
        self.log_path = self.workdir / "prometheus.log"
        self.config_path.write_text(yaml.safe_dump(self.config()))

    def config(self) -> dict[str, Any]:
        return {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL,
                       "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [{
                "job_name": SCRAPE_JOB,
                "honor_labels": True,
                # inotify sees each change at once; the re-read is only a fallback.
                "file_sd_configs": [{"files": [str(self.targets_dir / "*.json")],
                                     "refresh_interval": "5s"}],
            }, {
                "job_name": UNHONORED_JOB,
                "honor_labels": False,
                "file_sd_configs": [{"files": [str(self.unhonored_targets_dir / "*.json")],
                                     "refresh_interval": "5s"}],
            }],
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- process ---------------------------------------------------------------------------

    def start(self) -> PrometheusServer:
        reason = binary_missing_reason(self.binary)
        if reason:
            self.stop()
            raise PrometheusError(reason)
        for _attempt in range(3):  # another process may take the free port before we bind it
            self.port = free_port()
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    [str(self.binary),
                     f"--config.file={self.config_path}",
                     f"--storage.tsdb.path={self.workdir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}",
                     "--storage.tsdb.retention.time=1h",
                     "--log.level=info"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
            if self._wait_ready():
                return self
            if self.proc.poll() is None or "address already in use" not in self.log_tail():
                break
        self.stop(failed=True)
        raise PrometheusError(f"Prometheus did not become ready on {self.url}; "
                              f"log tail:\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        return False

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, failed: bool = False) -> None:
        """Terminate (kill after STOP_TIMEOUT), print the log tail when `failed` or when the
        process had already died, and remove the temp dir."""
        proc, self.proc = self.proc, None
        if proc is not None:
            died = proc.poll() is not None
            if not died:
                proc.terminate()
                try:
                    proc.wait(timeout=STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=STOP_TIMEOUT)
                    failed = True
            if failed or died:
                print(f"\n--- prometheus log tail ({self.log_path}) ---\n{self.log_tail()}")
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self if self.proc is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(failed=exc_type is not None)

    # --- targets ---------------------------------------------------------------------------

    def _target_file(self, name: str, honor_labels: bool = True) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"target name {name!r} must be a plain file name")
        directory = self.targets_dir if honor_labels else self.unhonored_targets_dir
        return directory / f"{name}.json"

    def add_target(self, name: str, address: str, labels: Mapping[str, str],
                   honor_labels: bool = True) -> None:
        """Scrape `address` (host:port, path /metrics) with `labels` on its series, from the
        next scrape on. Adding a name again replaces its target. Without `honor_labels`, a
        scraped label that `labels` also sets is kept as `exported_<name>`."""
        self.remove_target(name)  # one name, one job
        path = self._target_file(name, honor_labels)
        staging = path.with_name(f".{path.name}.tmp")  # outside the *.json glob
        staging.write_text(json.dumps([{"targets": [address], "labels": dict(labels)}]))
        os.replace(staging, path)  # Prometheus never reads a half-written file

    def remove_target(self, name: str) -> None:
        for honor_labels in (True, False):
            self._target_file(name, honor_labels).unlink(missing_ok=True)

    def active_targets(self) -> list[dict[str, Any]]:
        """/api/v1/targets' active targets (labels, health, lastError, scrapeUrl)."""
        data = self._api("/api/v1/targets", {"state": "active"})
        return list(data.get("activeTargets", []))

    # --- queries ---------------------------------------------------------------------------

    def _api(self, path: str, params: Mapping[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as err:  # 400 bad_data, 422 execution, 503 timeout
            text = err.read().decode(errors="replace")
            try:
                body = json.loads(text)
            except ValueError:
                raise PrometheusError(f"{path} answered HTTP {err.code}: {text}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus refused {params}: "
                                  f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str) -> list[Sample]:
        """An instant query: one (labels, value) per series; a scalar is one sample with no
        labels. Raises PrometheusError with Prometheus' error text."""
        data = self._api("/api/v1/query", {"query": promql})
        kind, result = data["resultType"], data["result"]
        if kind == "vector":
            return [(dict(item["metric"]), float(item["value"][1])) for item in result]
        if kind == "scalar":
            return [({}, float(result[1]))]
        raise PrometheusError(f"{promql!r} gave a {kind}, not an instant vector or scalar")

    def series(self, match: str) -> list[dict[str, str]]:
        """The label sets of the series `match` selects (/api/v1/series, the last 5 minutes):
        what prometheus-adapter's discovery sees."""
        start = f"{time.time() - 300:.3f}"
        return [dict(item) for item in self._api("/api/v1/series",
                                                 {"match[]": match, "start": start})]

    def value(self, promql: str) -> float | None:
        """The single value of a query that yields one series (None when it yields none)."""
        samples = self.query(promql)
        if len(samples) > 1:
            raise PrometheusError(f"{promql!r} gave {len(samples)} series, expected one: "
                                  f"{samples}")
        return samples[0][1] if samples else None

    def wait_for_series(self, promql: str, timeout: float = 30.0,
                        interval: float = 0.5) -> list[Sample]:
        """Poll until `promql` yields at least one series whose value is a number (not NaN)
        and return the samples; on timeout raise with the last answer and the targets'
        health."""
        return self._poll(promql, timeout, interval, "a series of",
                          lambda samples: bool(samples) and not any(
                              math.isnan(value) for _, value in samples))

    def wait_for_absent(self, promql: str, timeout: float = 30.0,
                        interval: float = 0.5) -> None:
        """Poll until `promql` yields no series (a removed target's series are marked stale
        at once and leave instant queries)."""
        self._poll(promql, timeout, interval, "no series of", lambda samples: not samples)

    def _poll(self, promql: str, timeout: float, interval: float, what: str,
              done: Callable[[list[Sample]], bool]) -> list[Sample]:
        deadline = time.monotonic() + timeout
        while True:
            samples = self.query(promql)
            if done(samples):
                return samples
            if time.monotonic() >= deadline:
                targets = [(t.get("labels", {}).get("pod"), t.get("health"), t.get("lastError"))
                           for t in self.active_targets()]
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} "
                                   f"{promql!r}; last answer: {samples}; targets (pod, "
                                   f"health, error): {targets}")
            time.sleep(interval)


@pytest.fixture(scope="session")
def prometheus() -> Iterator[PrometheusServer]:
    try:
        server = PrometheusServer().start()
    except PrometheusError as exc:
        message = f"the e2e Prometheus could not start: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield server
    finally:
        server.stop()
