"""ServiceMonitor for the gateways' /metrics (only where the Prometheus Operator CRD exists).

honorLabels keeps the series labels the gateway sets (service = the GLMService,
model_version, pool); Prometheus adds namespace and pod from the target.
"""

from __future__ import annotations

from typing import Any

from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta

SCRAPE_INTERVAL = "30s"


def build_service_monitor(
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any] | None,
    selector: dict[str, str],
    port: str,
) -> dict[str, Any]:
    return render_object(
        "servicemonitor.yaml.j2",
        metadata=object_meta(name, namespace, labels, owner),
        selector=selector,
        port=port,
        interval=SCRAPE_INTERVAL,
    )
