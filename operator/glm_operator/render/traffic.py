"""Istio routing of one GLMService's main Service across its live model versions.

    DestinationRule: one subset per live version (by the version label), outlier detection
        that ejects a pod which keeps failing, and a connection pool sized from the plan so
        excess load queues in the mesh instead of timing out inside an engine.
    VirtualService: a header route per version first (`x-glm-version: <modelversion>` pins
        one, for testing), then the weighted route; weights always sum to 100.

Pure: the rollout decides the weights; this module only writes them down.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from glm_operator.config import OperatorConfig
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.names import VERSION_HEADER, VERSION_LABEL, common_labels, dns_name
from glm_operator.render.names import label_value as version_label_value

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# seed 003: an instance that keeps failing is isolated, and comes back after a while.
OUTLIER_DETECTION = {
    "consecutive5xxErrors": 3,
    "consecutiveGatewayErrors": 3,
    "interval": "10s",
    "baseEjectionTime": "30s",
    "maxEjectionPercent": 50,
}


@dataclass(frozen=True)
class VersionRoute:
    model_version: str
    weight: int  # percent of the service's traffic


def subset_name(model_version: str) -> str:
    """Istio subset names are DNS labels; ModelVersion names may hold dots."""
    if _DNS_LABEL.match(model_version):
        return model_version
    digest = hashlib.sha256(model_version.encode()).hexdigest()[:8]
    return f"{dns_name(model_version, limit=54)}-{digest}"


def check_weights(routes: Sequence[VersionRoute]) -> None:
    if not routes:
        raise ValueError("traffic: at least one version must be routed")
    if sum(r.weight for r in routes) != 100 or any(not 0 <= r.weight <= 100 for r in routes):
        raise ValueError(f"traffic: weights must be 0..100 and sum to 100, got "
                         f"{[(r.model_version, r.weight) for r in routes]}")


def build_destination_rule(name: str, namespace: str, service: str, host: str,
                           routes: Sequence[VersionRoute], max_requests: int,
                           owner: dict[str, Any] | None) -> dict[str, Any]:
    """`max_requests`: requests the pool decodes at once (slots x replicas); as many again
    may wait in the mesh."""
    return render_object(
        "destinationrule.yaml.j2",
        metadata=object_meta(name, namespace, common_labels(service, "traffic"), owner),
        host=host,
        traffic_policy={
            "connectionPool": {"http": {"http2MaxRequests": max(1, max_requests),
                                        "http1MaxPendingRequests": max(1, max_requests)}},
            "outlierDetection": dict(OUTLIER_DETECTION),
        },
        subsets=[{"name": subset_name(r.model_version),
                  "labels": {VERSION_LABEL: version_label_value(r.model_version)}}
                 for r in routes],
    )


def build_virtual_service(name: str, namespace: str, service: str, host: str,
                          routes: Sequence[VersionRoute],
                          owner: dict[str, Any] | None) -> dict[str, Any]:
    check_weights(routes)
    http: list[dict[str, Any]] = [
        {"name": f"pin-{subset_name(r.model_version)}"[:63],
         "match": [{"headers": {VERSION_HEADER: {"exact": r.model_version}}}],
         "route": [{"destination": {"host": host, "subset": subset_name(r.model_version)}}]}
        for r in routes
    ]
    http.append({
        "name": "weighted",
        "route": [{"destination": {"host": host, "subset": subset_name(r.model_version)},
                   "weight": r.weight} for r in routes],
    })
    return render_object(
        "virtualservice.yaml.j2",
        metadata=object_meta(name, namespace, common_labels(service, "traffic"), owner),
        hosts=[host],
        http=http,
    )


def service_host(service_name: str, namespace: str, config: OperatorConfig) -> str:
    return f"{service_name}.{namespace}.svc.{config.cluster_domain}"
