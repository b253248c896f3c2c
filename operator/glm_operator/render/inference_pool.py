"""What an inference gateway reads for one GLMService (spec.routing.mode InferenceGateway),
pure.

    <svc>-<version>       InferencePool (inference.networking.k8s.io/v1), one per routed
                          version: the version's main-pool pods by label, the gateway
                          sidecar's port, its picker by endpointPickerRef and
                          spec.routing.failureMode.
    <svc>-epp-<version>   the picker of that pool (render/endpoint_picker.py's six objects,
                          with --pool-name): v1.5.0 binds one picker to one pool.
    <svc>                 HTTPRoute (gateway.networking.k8s.io/v1) under spec.routing.gatewayRef
                          on the service's hostnames: a rule per version that an
                          `x-glm-version` header pins, then the weighted rule with the
                          rollout's weights (summing to 100) over the pools.

The platform's gateway (Istio, agentgateway, NGINX Gateway Fabric) is the data plane: it
asks each pool's picker which pod serves a request and splits the versions by the route's
weights, so the operator runs no router here. Header matches outrank a rule without them in
Gateway API's precedence, so a pin wins over the weights whatever the rules' order; the pins
come first anyway, as in the VirtualService (render/traffic.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from glm_operator.api.glmservice import FailureMode, GatewayRef
from glm_operator.config import OperatorConfig
from glm_operator.render.endpoint_picker import (
    EPP_COMPONENT,
    EPP_GRPC_PORT,
    Picker,
    picker_objects,
    pool_epp_args,
    pool_epp_rules,
)
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.names import (
    VERSION_HEADER,
    VERSION_LABEL,
    common_labels,
    dns_name,
    label_value,
    pool_selector,
)
from glm_operator.render.traffic import VersionRoute, check_weights, subset_name
from glm_operator.wellknown import INFERENCE_POOL_LABEL, MAIN_POOL

INFERENCE_GROUP = "inference.networking.k8s.io"
INFERENCE_POOL_API = f"{INFERENCE_GROUP}/v1"
GATEWAY_GROUP = "gateway.networking.k8s.io"
HTTP_ROUTE_API = f"{GATEWAY_GROUP}/v1"
# What the operator needs served to write for an inference gateway: the pools and the route,
# and the InferenceObjective CRD that a pool's picker watches beside its pool (v1.2.0 did
# not start without it; v1.5.0 watches it where it is served; the Inference Extension's
# manifests install every kind).
INFERENCE_POOL_CRD = f"inferencepools.{INFERENCE_GROUP}"
HTTP_ROUTE_CRD = f"httproutes.{GATEWAY_GROUP}"
INFERENCE_OBJECTIVE_CRD = "inferenceobjectives.inference.networking.x-k8s.io"
INFERENCE_GATEWAY_CRDS = (INFERENCE_POOL_CRD, HTTP_ROUTE_CRD, INFERENCE_OBJECTIVE_CRD)
POOL_COMPONENT = "inference-pool"
# A pool's picker is told from the other versions' by INFERENCE_POOL_LABEL, not by the
# version label: that one marks the engine pods and their workloads (decide/observed.py).
ROUTE_COMPONENT = "http-route"
# Every rule matches every path: written out because the API server would default it, and a
# route read back should be the route written (no drift at every reconcile).
ALL_PATHS = {"type": "PathPrefix", "value": "/"}
# The only backend kind the operator writes; check_route refuses any other.
POOL_BACKEND = {"group": INFERENCE_GROUP, "kind": "InferencePool"}


def pool_name(service: str, model_version: str) -> str:
    return dns_name(service, subset_name(model_version))


def pool_epp_name(service: str, model_version: str) -> str:
    return dns_name(service, "epp", subset_name(model_version))


def route_name(service: str) -> str:
    return dns_name(service)


@dataclass(frozen=True)
class GatewayInputs:
    service: str
    namespace: str
    gateway: GatewayRef
    hostnames: Sequence[str]
    routes: Sequence[VersionRoute]  # the rollout's weights, every routed version
    failure_mode: FailureMode
    config: OperatorConfig
    owner: dict[str, Any] | None
    # Istio is installed too: its gateways reach a picker over TLS only with a
    # DestinationRule saying so (the Inference Extension's chart renders the same one).
    istio: bool = False


def build_inference_pool(inputs: GatewayInputs, model_version: str) -> dict[str, Any]:
    """One version's pool: its main-pool pods, the gateway sidecar's port (the engines sit
    behind it: keys, limits and metrics stay in the pod), and its own picker."""
    labels = {**common_labels(inputs.service, POOL_COMPONENT),
              VERSION_LABEL: label_value(model_version)}
    return render_object(
        "inferencepool.yaml.j2",
        metadata=object_meta(pool_name(inputs.service, model_version), inputs.namespace,
                             labels, inputs.owner),
        selector=pool_selector(inputs.service, model_version, MAIN_POOL),
        target_ports=[{"number": inputs.config.gateway_port}],
        # What the gateway sidecar speaks, HTTP/1.1, and v1.5.0's CRD default: written out so
        # the pool read back is the pool written (no drift at every reconcile).
        app_protocol="http",
        # group and kind as the API server would default them: read back unchanged.
        endpoint_picker_ref={"group": "", "kind": "Service",
                             "name": pool_epp_name(inputs.service, model_version),
                             "port": {"number": EPP_GRPC_PORT},
                             "failureMode": str(inputs.failure_mode)},
    )


def _backend(service: str, model_version: str, weight: int) -> dict[str, Any]:
    return {**POOL_BACKEND, "name": pool_name(service, model_version), "weight": weight}


def build_http_route(inputs: GatewayInputs) -> dict[str, Any]:
    check_weights(inputs.routes)
    parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway",
                              "name": inputs.gateway.name}
    if inputs.gateway.namespace:
        parent["namespace"] = inputs.gateway.namespace
    if inputs.gateway.section_name:
        parent["sectionName"] = inputs.gateway.section_name
    rules: list[dict[str, Any]] = [
        {"matches": [{"path": dict(ALL_PATHS),
                      "headers": [{"type": "Exact", "name": VERSION_HEADER,
                                   "value": r.model_version}]}],
         "backendRefs": [_backend(inputs.service, r.model_version, 1)]}
        for r in inputs.routes
    ]
    rules.append({"matches": [{"path": dict(ALL_PATHS)}],
                  "backendRefs": [_backend(inputs.service, r.model_version, r.weight)
                                  for r in inputs.routes]})
    route = render_object(
        "httproute.yaml.j2",
        metadata=object_meta(route_name(inputs.service), inputs.namespace,
                             common_labels(inputs.service, ROUTE_COMPONENT), inputs.owner),
        parent_refs=[parent], hostnames=list(inputs.hostnames), rules=rules)
    check_route(route)
    return route


def check_route(route: Mapping[str, Any]) -> None:
    """What the HTTPRoute CRD itself admits but the operator must never write: a weighted
    rule whose weights are not percentages summing to 100 (the CRD takes any weight up to
    1,000,000 and any sum), and a backend that is not one of our InferencePools (the CRD
    takes any kind; the gateway would only report it in the route's status)."""
    rules = route["spec"]["rules"]
    for rule in rules:
        for ref in rule["backendRefs"]:
            if {k: ref.get(k) for k in POOL_BACKEND} != POOL_BACKEND:
                raise ValueError(f"HTTPRoute {route['metadata']['name']}: backendRef "
                                 f"{ref.get('name')!r} is {ref.get('group')}/{ref.get('kind')}"
                                 ", not an InferencePool")
    weights = [ref["weight"] for ref in rules[-1]["backendRefs"]]
    if any(not 0 <= w <= 100 for w in weights) or sum(weights) != 100:
        raise ValueError(f"HTTPRoute {route['metadata']['name']}: weights must be 0..100 and "
                         f"sum to 100, got {weights}")


def _picker(inputs: GatewayInputs, model_version: str) -> list[dict[str, Any]]:
    pool = pool_name(inputs.service, model_version)
    name = pool_epp_name(inputs.service, model_version)
    labels = {**common_labels(inputs.service, EPP_COMPONENT), INFERENCE_POOL_LABEL: pool}
    objects = picker_objects(Picker(
        name=name, labels=labels, selector=dict(labels),
        args=pool_epp_args(pool, inputs.namespace),
        rules=pool_epp_rules(pool),
        # The name the Inference Extension's chart gives it (a gRPC port to Istio).
        grpc_port={"name": "grpc-ext-proc", "port": EPP_GRPC_PORT, "targetPort": "grpc",
                   "protocol": "TCP"}),
        inputs.namespace, inputs.config, inputs.owner)
    if inputs.istio:
        objects.append(render_object(
            "destinationrule.yaml.j2",
            metadata=object_meta(name, inputs.namespace, labels, inputs.owner),
            host=f"{name}.{inputs.namespace}.svc.{inputs.config.cluster_domain}",
            # The picker's certificate is its own, self-signed: encrypted, not verified.
            traffic_policy={"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}},
            subsets=None))
    return objects


def build_inference_gateway(inputs: GatewayInputs) -> list[dict[str, Any]]:
    """Every object of the service for its inference gateway, in a fixed order: per version
    its picker then its pool, then the route (which names the pools)."""
    objects: list[dict[str, Any]] = []
    for route in inputs.routes:
        objects += _picker(inputs, route.model_version)
        objects.append(build_inference_pool(inputs, route.model_version))
    objects.append(build_http_route(inputs))
    return objects
