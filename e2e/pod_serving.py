"""Serve a kwok pod at its own IP, so what reads pod IPs from the API server reaches it.

kwok runs no containers, and its pods' IPs (10.0.0.0/24 by default) lead nowhere. The nodes
of the `loopback` pool (e2e/nodes.yaml) carry a spec.podCIDR in 127.0.0.0/8, which kwok takes
their pods' IPs from (e2e/cluster.py loopback_pod_cidr), and Linux routes all of 127/8 to lo:
a test process binds a server at `<podIP>:<port>` and the endpoint picker or the router, which
find pods through the API server, reach that server at the address they read.

- `LOOPBACK_PLACEMENT`: the node selector and toleration that put a pod on those nodes (a pod
  spec's fields; a GLMService takes the same under spec.podOverrides);
- `loopback_pod_ip(pod)`: the pod's IP, or an error saying why it is not one to bind;
- `MetricsStandIn`: a small real HTTP server at `<podIP>:<port>` exporting the gateway's
  queue and KV-cache gauges (names and labels as the gateway exports them) with values the
  test sets, and counting what it is asked;
- e2e/hpa_chain.py ServedPod(at_pod_ip=True): the pod's real engine and gateway, the gateway
  bound at `<podIP>:<its rendered --port>`.

Endpoints and EndpointSlices refuse loopback addresses, so a Service selecting such pods has
no endpoints: only what watches Pods (the picker, the router) finds them.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from glm_operator.gateway.metrics import BASE_LABELS, KV_CACHE_USAGE_RATIO, REQUESTS_QUEUED
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

LOOPBACK_LABEL = "e2e.glm-operator.dev/pod-ips"
LOOPBACK_PLACEMENT: dict[str, Any] = {
    "nodeSelector": {LOOPBACK_LABEL: "loopback"},
    "tolerations": [{"key": LOOPBACK_LABEL, "operator": "Equal", "value": "loopback",
                     "effect": "NoSchedule"}],
}


class PodServingError(RuntimeError):
    """A pod cannot be served at its IP; the message says why and what to change."""


def loopback_pod_ip(pod: Mapping[str, Any]) -> str:
    """The pod's status.podIP, checked to be a loopback address this machine can bind."""
    name = pod.get("metadata", {}).get("name", "?")
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        raise PodServingError(f"pod {name} has no status.podIP yet (not bound, or kwok has "
                              "not made it Ready)")
    if not ipaddress.ip_address(ip).is_loopback:
        node = (pod.get("spec") or {}).get("nodeName", "?")
        raise PodServingError(
            f"pod {name} on node {node} has IP {ip}, not a loopback address: only the "
            "`loopback` nodes of e2e/nodes.yaml give their pods one; add "
            "e2e/pod_serving.py LOOPBACK_PLACEMENT to the pod spec (or spec.podOverrides)")
    return str(ip)


class MetricsStandIn:
    """An HTTP server at (host, port) answering GET /metrics with the gateway's queue and
    KV-cache gauges, as prometheus_client renders them in the gateway (same names, same
    `service`/`model_version`/`pool` labels), at the values set with `set()`.

    `names` renames the two series (a control: a picker configured for other names finds
    neither). Every path asked is counted in `hits`."""

    def __init__(self, host: str, port: int, service: str, version: str = "v1",
                 names: tuple[str, str] = (REQUESTS_QUEUED, KV_CACHE_USAGE_RATIO)) -> None:
        self.host, self.port = host, port
        self.hits: dict[str, int] = {}
        self._lock = threading.Lock()
        registry = CollectorRegistry()
        labels = dict(zip(BASE_LABELS, (service, version, "main"), strict=True))
        queued_name, kv_name = names
        self._queued = Gauge(queued_name, "Requests waiting.", BASE_LABELS,
                             registry=registry).labels(**labels)
        self._kv = Gauge(kv_name, "Share of the engine's KV cache in use, 0..1.", BASE_LABELS,
                         registry=registry).labels(**labels)
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                with stand_in._lock:
                    stand_in.hits[path] = stand_in.hits.get(path, 0) + 1
                if path != "/metrics":
                    self.send_error(404)
                    return
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape every 50 ms: not worth a line each

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"metrics-{host}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def set(self, queued: float, kv_cache_usage: float) -> None:
        self._queued.set(queued)
        self._kv.set(kv_cache_usage)

    def scrapes(self) -> int:
        with self._lock:
            return self.hits.get("/metrics", 0)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> MetricsStandIn:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
