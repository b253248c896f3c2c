"""Which optional CRDs a cluster serves, as one `Capabilities` value (pure).

The operator asks the API server about each CRD (controllers/runtime.py, cached for
capabilityRecheckSeconds); `glm-operator render` is told them (`--cluster-has`,
`--api-resources`). Both build the value here, from the same CRD names, so the offline
render decides with the very observation the running operator would make.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from glm_operator.render.groups import LEADER_WORKER_SET_CRD
from glm_operator.render.inference_pool import (
    HTTP_ROUTE_CRD,
    INFERENCE_GATEWAY_CRDS,
    INFERENCE_OBJECTIVE_CRD,
    INFERENCE_POOL_CRD,
)
from glm_operator.render.keda import SCALED_OBJECT_CRD
from glm_operator.render.service import Capabilities

SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
# Istio's traffic split needs both: the subsets and the weights.
ISTIO_CRDS = ("virtualservices.networking.istio.io", "destinationrules.networking.istio.io")

# Short names for the command line, each the CRDs one installation brings.
CRD_SETS: dict[str, tuple[str, ...]] = {
    "istio": ISTIO_CRDS,
    "servicemonitor": (SERVICE_MONITOR_CRD,),
    "keda": (SCALED_OBJECT_CRD,),
    "lws": (LEADER_WORKER_SET_CRD,),
    "inference-extension": (INFERENCE_POOL_CRD, INFERENCE_OBJECTIVE_CRD),
    "gateway-api": (HTTP_ROUTE_CRD,),
}
OPTIONAL_CRDS: tuple[str, ...] = tuple(crd for crds in CRD_SETS.values() for crd in crds)


def capabilities_served(served: Callable[[str], bool]) -> Capabilities:
    """The capabilities of a cluster where `served(crd_name)` says whether a CRD is served."""
    return Capabilities(
        service_monitor=served(SERVICE_MONITOR_CRD),
        istio=all(served(crd) for crd in ISTIO_CRDS),
        keda=served(SCALED_OBJECT_CRD),
        leader_worker_set=served(LEADER_WORKER_SET_CRD),
        inference_crds=frozenset(crd for crd in INFERENCE_GATEWAY_CRDS if served(crd)),
    )


def capabilities_of(crds: Iterable[str]) -> Capabilities:
    """The capabilities of a cluster that serves exactly these CRDs (names as
    `kubectl api-resources -o name` prints them: plural.group)."""
    names = frozenset(crds)
    return capabilities_served(names.__contains__)
