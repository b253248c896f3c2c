"""Which autoscaler sizes a service's main pool: the plain HPA or a KEDA ScaledObject (pure).

`spec.autoscaling.scaler` asks; the cluster and the operator config decide what is possible.
KEDA needs its ScaledObject CRD served and a Prometheus address for its triggers (the
operator's `prometheus.url`, the one canary analysis reads). Auto takes KEDA when both hold,
else the HPA. KEDA asked for and not possible renders no autoscaler at all: an HPA put in its
place would need prometheus-adapter, which a cluster that chose KEDA usually lacks, and would
hide the mistake; the pool keeps its replicas and the Autoscaling condition says what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from glm_operator.api.glmservice import Autoscaling, Scaler
from glm_operator.render.keda import SCALED_OBJECT_CRD


@dataclass(frozen=True)
class ScalerChoice:
    scaler: Scaler | None  # HPA or KEDA; None: KEDA was asked for and is not possible
    why: str  # how it was chosen, or what is missing and how to fix it


def choose_scaler(autoscaling: Autoscaling, keda_served: bool,
                  prometheus_url: str | None) -> ScalerChoice:
    asked = autoscaling.scaler
    if asked == Scaler.HPA:
        return ScalerChoice(Scaler.HPA, "spec.autoscaling.scaler is HPA")
    if autoscaling.min_replicas == 0:
        # KEDA would scale a sleeping pool back to its minReplicaCount (or, at 0, to zero on
        # its own clock, fighting the router's wake-up); the API refuses an explicit KEDA.
        return ScalerChoice(Scaler.HPA, "Auto: minReplicas 0 (scale from zero) is built on "
                            "the HPA, not on KEDA yet")
    missing = []
    if not keda_served:
        missing.append(f"KEDA's ScaledObject CRD ({SCALED_OBJECT_CRD}) is not served in "
                       "this cluster")
    if not prometheus_url:
        missing.append("the operator has no Prometheus address for KEDA's triggers "
                       "(prometheus.url in the operator config)")
    if not missing:
        how = ("spec.autoscaling.scaler is KEDA" if asked == Scaler.KEDA else
               f"Auto: {SCALED_OBJECT_CRD} is served and prometheus.url is set")
        return ScalerChoice(Scaler.KEDA, how)
    if asked == Scaler.AUTO:
        return ScalerChoice(Scaler.HPA, "Auto: " + " and ".join(missing))
    fixes = []
    if not keda_served:
        fixes.append("install KEDA")
    if not prometheus_url:
        fixes.append("set prometheus.url in the operator config (helm value prometheus.url)")
    return ScalerChoice(None, (
        "spec.autoscaling.scaler is KEDA but " + " and ".join(missing) + ": "
        + " and ".join(fixes) + ", or set spec.autoscaling.scaler to HPA or Auto. Nothing "
        "scales the main pool meanwhile; it keeps its current replicas"))
