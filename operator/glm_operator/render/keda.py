"""The KEDA ScaledObject (keda.sh/v1alpha1) of a service's main pool.

The same scaling as the HPA of render/autoscaling.py, with KEDA as the metrics source: one
`prometheus` trigger per target, whose query is the catalogue's pool_query (the signal summed
over the pool's pods) and whose threshold is the per-pod target. KEDA creates the HPA
`keda-hpa-<name>` with External metrics of type AverageValue, so the HPA divides the pool's sum
by the Deployment's replicas and compares it with the same per-pod number the plain HPA uses.
Bounds and behaviour are the HPA's. Checked against KEDA's real CRD in e2e/test_keda.py.
"""

from __future__ import annotations

from collections.abc import Collection
from decimal import Decimal
from typing import Any

from glm_operator.api.glmservice import Autoscaling
from glm_operator.render.autoscaling import ScaleTarget, hpa_behavior, target_values
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.scaling_metrics import SIGNALS
from glm_operator.wellknown import MANAGED_BY_LABEL

SCALED_OBJECT_API_VERSION = "keda.sh/v1alpha1"
SCALED_OBJECT_CRD = "scaledobjects.keda.sh"
# KEDA copies the ScaledObject's labels onto the HPA it creates; without this, that HPA would
# say it is managed by glm-operator (and land in the operator's index of its own children).
HPA_EXCLUDED_LABELS_ANNOTATION = "scaledobject.keda.sh/hpa-excluded-labels"


def keda_hpa_name(scaled_object: str) -> str:
    """The HPA KEDA creates for a ScaledObject (KEDA's getHPAName)."""
    return f"keda-hpa-{scaled_object}"


def threshold(value: float) -> str:
    """KEDA parses trigger metadata as strings and the threshold with strconv.ParseFloat:
    a plain decimal ("0.5", "30"), never a Kubernetes quantity ("500m") or an exponent."""
    return format(Decimal(str(value)).normalize(), "f")


def prometheus_triggers(autoscaling: Autoscaling, server_address: str, namespace: str,
                        service: str, model_version: str, pool: str,
                        leave_out: Collection[str] = ()) -> list[dict[str, Any]]:
    """One Prometheus trigger per target, in the catalogue's (and the HPA's) order, but for
    the targets left out (those the plan makes meaningless, as in the HPA)."""
    targets = {field: value for field, value in target_values(autoscaling).items()
               if field not in leave_out}
    return [
        {
            "type": "prometheus",
            "name": signal.target_field,
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": server_address,
                "query": signal.pool_query(namespace, service, model_version, pool),
                "threshold": threshold(targets[signal.target_field]),
            },
        }
        for signal in SIGNALS
        if signal.target_field in targets
    ]


def build_scaled_object(
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any] | None,
    target: ScaleTarget,
    autoscaling: Autoscaling,
    triggers: list[dict[str, Any]],
) -> dict[str, Any]:
    return render_object(
        "scaledobject.yaml.j2",
        metadata=object_meta(name, namespace, labels, owner,
                             {HPA_EXCLUDED_LABELS_ANNOTATION: MANAGED_BY_LABEL}),
        target=target,
        min_replicas=autoscaling.min_replicas,
        max_replicas=autoscaling.max_replicas,
        behavior=hpa_behavior(autoscaling),
        triggers=triggers,
    )
