"""The HPA (autoscaling/v2) of a service's main pool, on per-pod gateway and device metrics.

The metric names are what prometheus-adapter exposes from the gateway's own series and from
the device exporters (DCGM, npu-exporter); docs/autoscaling.md has the adapter rules.
"""

from __future__ import annotations

import copy
from typing import Any

from glm_operator.api.glmservice import Autoscaling, ScalingRules
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.quantity import decimal_quantity

# prometheus-adapter custom metrics (per pod), see docs/autoscaling.md.
REQUESTS_PER_SECOND_METRIC = "glm_gateway_requests_per_second"
QUEUE_LENGTH_METRIC = "glm_gateway_requests_queued"
ACCELERATOR_MEMORY_METRIC = "glm_accelerator_memory_utilization_percent"

# A model pod takes minutes to load and holds scarce devices: add at most two per two
# minutes, remove one per five minutes after fifteen quiet minutes.
_DEFAULT_SCALE_UP: dict[str, Any] = {
    "stabilizationWindowSeconds": 60,
    "selectPolicy": "Max",
    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 120}],
}
_DEFAULT_SCALE_DOWN: dict[str, Any] = {
    "stabilizationWindowSeconds": 900,
    "selectPolicy": "Min",
    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
}


def _pods_metric(name: str, average: str) -> dict[str, Any]:
    return {"type": "Pods", "pods": {
        "metric": {"name": name},
        "target": {"type": "AverageValue", "averageValue": average},
    }}


def hpa_metrics(autoscaling: Autoscaling) -> list[dict[str, Any]]:
    targets = autoscaling.targets
    metrics = []
    if targets.requests_per_second is not None:
        metrics.append(_pods_metric(REQUESTS_PER_SECOND_METRIC,
                                    decimal_quantity(targets.requests_per_second)))
    if targets.queue_length is not None:
        metrics.append(_pods_metric(QUEUE_LENGTH_METRIC, decimal_quantity(targets.queue_length)))
    if targets.accelerator_memory_utilization is not None:
        metrics.append(_pods_metric(ACCELERATOR_MEMORY_METRIC,
                                    decimal_quantity(targets.accelerator_memory_utilization)))
    return metrics


def _rules(default: dict[str, Any], user: ScalingRules | None) -> dict[str, Any]:
    out = copy.deepcopy(default)  # fresh: the result is handed out as is
    if user is not None:
        out.update(user.model_dump(by_alias=True, exclude_none=True))
    return out


def hpa_behavior(autoscaling: Autoscaling) -> dict[str, Any]:
    user = autoscaling.behavior
    return {
        "scaleUp": _rules(_DEFAULT_SCALE_UP, user.scale_up if user else None),
        "scaleDown": _rules(_DEFAULT_SCALE_DOWN, user.scale_down if user else None),
    }


def build_hpa(
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any] | None,
    target_deployment: str,
    autoscaling: Autoscaling,
) -> dict[str, Any]:
    return render_object(
        "horizontalpodautoscaler.yaml.j2",
        metadata=object_meta(name, namespace, labels, owner),
        target=target_deployment,
        min_replicas=autoscaling.min_replicas,
        max_replicas=autoscaling.max_replicas,
        metrics=hpa_metrics(autoscaling),
        behavior=hpa_behavior(autoscaling),
    )
