"""Stand-in gateways: the gateway's own metrics, with traffic the test decides.

A `GatewayStandIn` serves, on 127.0.0.1:<free port>/metrics, the registry of the gateway's
real `GatewayMetrics.create(service, model_version, pool)`, and records requests into it
through `GatewayMetrics.record`, the one function the gateway itself records a finished
request with. So the series names, labels and buckets Prometheus scrapes are the gateway's,
and the test only chooses the traffic: how many requests a second, which share fail with a
5xx or a client error, how long they take.

    with GatewayStandIn("ns", "glm-chat", "v2") as canary:
        canary.register(prometheus)           # scraped as pod canary.pod in namespace "ns"
        canary.set_traffic(20, error_ratio=0.5, latency_seconds=0.8)
        ...
        canary.stop_traffic()

Outcomes are spread evenly, not drawn at random: after n requests exactly
floor(n * error_ratio) have failed, so a ratio measured over a window is the one asked for.
Successful requests and 5xx take `latency_seconds` (streams that succeed see their first
token after `ttft_seconds`); client errors (429, 401: refused before the engine) take a
millisecond, as in the gateway.

Fixture
-------
gateway_standins (function)
    `gateway_standins(namespace, service, model_version, pool="main")` makes a stand-in
    already registered with the session's `prometheus`; all are closed and unregistered at
    the end of the test. Import it with `prometheus`
    (`from e2e.gateway_standin import gateway_standins`; `from e2e.prometheus import
    prometheus`).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType

import pytest
from glm_operator.gateway.policy.metrics import GatewayMetrics
from prometheus_client import start_http_server

from e2e.prometheus import PrometheusServer

TRAFFIC_ENDPOINT = "chat"
CLIENT_ERROR_SECONDS = 0.001
TICK_SECONDS = 0.05


@dataclass(frozen=True)
class Traffic:
    requests_per_second: float
    error_ratio: float = 0.0
    latency_seconds: float = 0.05
    ttft_seconds: float = 0.02
    status_code_for_errors: int = 500
    client_error_ratio: float = 0.0
    client_error_codes: tuple[int, ...] = (429, 401)

    def __post_init__(self) -> None:
        if self.requests_per_second < 0:
            raise ValueError("requests_per_second must be >= 0")
        if (min(self.error_ratio, self.client_error_ratio) < 0
                or self.error_ratio + self.client_error_ratio > 1):
            raise ValueError("error_ratio and client_error_ratio must be >= 0 and sum to <= 1")
        if not 500 <= self.status_code_for_errors <= 599:
            raise ValueError("status_code_for_errors must be a 5xx code")
        if self.client_error_ratio and not self.client_error_codes:
            raise ValueError("client_error_codes is empty")


class GatewayStandIn:
    """One gateway's /metrics, fed by a background thread at the rate `set_traffic` says."""

    def __init__(self, namespace: str, service: str, model_version: str,
                 pool: str = "main", pod: str | None = None) -> None:
        self.namespace = namespace
        self.service = service
        self.model_version = model_version
        self.pool = pool
        self.pod = pod or f"{service}-{pool}-{uuid.uuid4().hex[:10]}"
        self.metrics = GatewayMetrics.create(service, model_version, pool)
        self.metrics.ready.labels(**self.metrics.labels).set(1)
        self.requests_recorded = 0
        self._server, self._server_thread = start_http_server(
            0, addr="127.0.0.1", registry=self.metrics.registry)
        self.port = int(self._server.server_port)
        self._prometheus: PrometheusServer | None = None
        self._traffic = Traffic(0)
        self._changed = threading.Condition()
        self._idle = threading.Event()  # set while the thread records nothing
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"standin-{self.pod}",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def target_labels(self) -> dict[str, str]:
        """What the Prometheus Operator adds to a pod's series (honorLabels keeps ours)."""
        return {"namespace": self.namespace, "pod": self.pod}

    # --- Prometheus ------------------------------------------------------------------------

    def register(self, prometheus: PrometheusServer) -> GatewayStandIn:
        prometheus.add_target(self.pod, self.address, self.target_labels)
        self._prometheus = prometheus
        return self

    def unregister(self) -> None:
        if self._prometheus is not None:
            self._prometheus.remove_target(self.pod)
            self._prometheus = None

    # --- traffic ---------------------------------------------------------------------------

    def set_traffic(self, requests_per_second: float, error_ratio: float = 0.0,
                    latency_seconds: float = 0.05, ttft_seconds: float = 0.02,
                    status_code_for_errors: int = 500, client_error_ratio: float = 0.0,
                    client_error_codes: tuple[int, ...] = (429, 401)) -> None:
        """From now on, record `requests_per_second` finished `chat` streams a second."""
        traffic = Traffic(requests_per_second, error_ratio, latency_seconds, ttft_seconds,
                          status_code_for_errors, client_error_ratio, client_error_codes)
        with self._changed:
            self._traffic = traffic
            if traffic.requests_per_second:
                self._idle.clear()
            self._changed.notify_all()

    def stop_traffic(self) -> None:
        """Stop recording; on return no request is recorded any more."""
        self.set_traffic(0)
        if not self._idle.wait(timeout=5):
            raise RuntimeError(f"the traffic thread of {self.pod} did not stop")

    def set_load(self, in_flight: int, queued: int = 0) -> None:
        """The gauges the HPA reads: requests being answered now, and those waiting."""
        self.metrics.in_flight.labels(**self.metrics.labels).set(in_flight)
        self.metrics.queued.labels(**self.metrics.labels).set(queued)

    def set_kv_cache_usage(self, ratio: float) -> None:
        """The share of the engine's KV cache in use (0..1), as the gateway reads it."""
        self.metrics.kv_cache_usage.labels(**self.metrics.labels).set(ratio)

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                traffic = self._traffic
                if traffic.requests_per_second == 0:
                    self._idle.set()
                    self._changed.wait()
                    continue
                self._changed.release()
                try:
                    self._play(traffic)
                finally:
                    self._changed.acquire()

    def _play(self, traffic: Traffic) -> None:
        """Record requests at the traffic's rate until the traffic changes or we close."""
        started = time.monotonic()
        done = errors = client_errors = 0
        while not self._closed and self._traffic is traffic:
            due = math.floor((time.monotonic() - started) * traffic.requests_per_second)
            while done < due and self._traffic is traffic:
                done += 1
                if math.floor(done * traffic.error_ratio) > errors:
                    errors += 1
                    self.metrics.record(TRAFFIC_ENDPOINT, traffic.status_code_for_errors,
                                        traffic.latency_seconds, True)
                elif math.floor(done * traffic.client_error_ratio) > client_errors:
                    code = traffic.client_error_codes[client_errors
                                                      % len(traffic.client_error_codes)]
                    client_errors += 1
                    self.metrics.record(TRAFFIC_ENDPOINT, code, CLIENT_ERROR_SECONDS, True)
                else:
                    self.metrics.record(TRAFFIC_ENDPOINT, 200, traffic.latency_seconds, True,
                                        ttft_seconds=traffic.ttft_seconds)
                self.requests_recorded += 1
            time.sleep(TICK_SECONDS)

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        self.unregister()
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout=5)
        self._server.shutdown()
        self._server.server_close()
        self._server_thread.join(timeout=5)

    def __enter__(self) -> GatewayStandIn:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@pytest.fixture
def gateway_standins(
    prometheus: PrometheusServer,
) -> Iterator[Callable[..., GatewayStandIn]]:
    made: list[GatewayStandIn] = []

    def make(namespace: str, service: str, model_version: str, pool: str = "main",
             pod: str | None = None) -> GatewayStandIn:
        standin = GatewayStandIn(namespace, service, model_version, pool, pod)
        made.append(standin)
        return standin.register(prometheus)

    yield make
    for standin in made:
        standin.close()
