"""The HPA (autoscaling/v2) of a service's main pool, on per-pod gateway and device metrics.

The metric names come from the catalogue of signals (render/scaling_metrics.py), which also
generates the prometheus-adapter rules that serve them.
"""

from __future__ import annotations

import copy
from typing import Any

from glm_operator.api.glmservice import Autoscaling, ScalingRules
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.quantity import decimal_quantity
from glm_operator.render.scaling_metrics import SIGNALS

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


def target_values(autoscaling: Autoscaling) -> dict[str, float]:
    """The targets set, by API field name (requestsPerSecond...)."""
    return autoscaling.targets.model_dump(by_alias=True, exclude_none=True)


def hpa_metrics(autoscaling: Autoscaling) -> list[dict[str, Any]]:
    targets = target_values(autoscaling)
    return [_pods_metric(signal.hpa_metric, decimal_quantity(targets[signal.target_field]))
            for signal in SIGNALS if signal.target_field in targets]


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
