"""The operator's /metrics as `glm-operator run --metrics-port` serves it, for
tests/chart/test_dashboards.py (no cluster needed).

This process imports what the operator's command imports (glm_operator.controllers.cli: every
metric it registers and every label set it creates at import is there), serves the default
registry with prometheus_client's `start_http_server`, as `run()` does, and records what a
leader managing one GLMService records, a few times a second until it is terminated:
reconciles of the GLMService and its ModelVersion (timed), the API requests and child writes
they make, the leader-election gauge, and one finished canary rollout that succeeded (through
the operator's own status-change counting). Nothing here rolls back or fails to plan: those
panels must read 0 from what the operator itself creates.

    python tests/chart/operator_exposition.py   # prints its port, then serves
"""

from __future__ import annotations

import random
import sys
import time

from glm_operator.controllers import cli, metrics  # cli: what the operator process imports
from glm_operator.controllers.reconcile_service import _count_status_change
from glm_operator.kube.client import API_REQUESTS
from glm_operator.kube.lease import LEADER
from prometheus_client import start_http_server

LEASE = "glm-glm-operator"  # the chart's default Lease name: the release's full name
TICK_SECONDS = 0.2


def _reconcile(kind: str, rng: random.Random) -> None:
    with metrics.RECONCILE_SECONDS.labels(kind).time():
        API_REQUESTS.labels(verb="get", kind=kind).inc()
        time.sleep(rng.uniform(0.001, 0.02))
    metrics.RECONCILES.labels(kind, "ok").inc()


def main() -> int:
    assert callable(cli.run)  # the operator's command, imported for what it registers
    server, _thread = start_http_server(0, addr="127.0.0.1")
    print(server.server_port, flush=True)
    LEADER.labels(LEASE).set(0)  # LeaderElector.acquire
    LEADER.labels(LEASE).set(1)  # LeaderElector._renewed: this replica leads
    _count_status_change({}, {"rolloutHistory": [{
        "modelVersion": "glm-4-v2", "fromModelVersion": "glm-4-v1", "strategy": "canary",
        "result": "Succeeded", "startedTime": "2025-01-01T00:00:00Z",
        "finishedTime": "2025-01-01T00:10:00Z", "message": "promoted"}]})
    rng = random.Random(20)
    tick = 0
    while True:
        _reconcile("GLMService", rng)
        _reconcile("ModelVersion", rng)
        if tick % 3 == 0:  # a drift repaired now and then
            API_REQUESTS.labels(verb="apply", kind="Deployment").inc()
            metrics.CHILD_WRITES.labels(kind="Deployment", action="apply").inc()
        tick += 1
        time.sleep(TICK_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
