"""ServiceMonitor for the gateways' /metrics and the engines' (only where the Prometheus
Operator CRD exists).

honorLabels keeps the series labels the gateway sets (service = the GLMService,
model_version, pool); Prometheus adds namespace and pod from the target. The engines' series
(/metrics/engine, passed through by the gateway) get the same three labels from the pod's.
"""

from __future__ import annotations

import re
from typing import Any

from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.wellknown import POOL_LABEL, SERVICE_LABEL, VERSION_LABEL

SCRAPE_INTERVAL = "30s"


def pod_label_meta(label: str) -> str:
    """Prometheus' discovery name of a pod label (every character not [a-zA-Z0-9_] as _)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


# The gateway's series labels, from the pod labels they mirror.
ENGINE_SERIES_LABELS = ((pod_label_meta(SERVICE_LABEL), "service"),
                        (pod_label_meta(VERSION_LABEL), "model_version"),
                        (pod_label_meta(POOL_LABEL), "pool"))


def build_service_monitor(
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any] | None,
    selector: dict[str, str],
    port: str,
    engine_metrics: bool = True,
) -> dict[str, Any]:
    """`engine_metrics`: also the engines' series the gateway passes through (not for the
    router, whose pods run no engine)."""
    return render_object(
        "servicemonitor.yaml.j2",
        metadata=object_meta(name, namespace, labels, owner),
        selector=selector,
        port=port,
        interval=SCRAPE_INTERVAL,
        engine_relabelings=[{"sourceLabels": [source], "targetLabel": target}
                            for source, target in ENGINE_SERIES_LABELS] if engine_metrics else [],
    )
