"""Which objects carry a GLMService's traffic between its live versions (pure).

One writer per routing mode, all given the rollout's weights (decide/service.py chooses the
mode): the Istio DestinationRule and VirtualService, the router's route table and Deployment
(spec.routing.mode EndpointPicker), or an InferencePool per version with its picker and the
HTTPRoute (InferenceGateway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from glm_operator.api import GLMService
from glm_operator.config import OperatorConfig
from glm_operator.decide.gateway import GatewayFacts
from glm_operator.decide.versions import Render, VersionPlan
from glm_operator.render.deployment import deployment_name
from glm_operator.render.inference_pool import (
    INFERENCE_GATEWAY_CRDS,
    GatewayInputs,
    build_inference_gateway,
)
from glm_operator.render.meta import owner_reference
from glm_operator.render.routing import RouteEntry, build_routing
from glm_operator.render.service import Capabilities, RenderedService, main_service_name
from glm_operator.render.traffic import (
    VersionRoute,
    build_destination_rule,
    build_virtual_service,
    service_host,
)
from glm_operator.wellknown import MAIN_POOL

Obj = dict[str, Any]


def name_of(service: GLMService) -> str:
    return service.metadata.name or ""


def routing_objects(service: GLMService, routes: list[VersionRoute],
                    rendered: Sequence[tuple[Render, RenderedService]]) -> list[Obj]:
    """The router's objects, once for the service: its route table holds every routed
    version at the rollout's weight (the VirtualService's numbers). Each rendered version
    gave its own entry; a routed version that could not be rendered (its ModelVersion gone,
    its pods retained) keeps its Deployment's name and the defaults."""
    inputs = [out.routing for _, out in rendered if out.routing is not None]
    if not inputs:
        return []
    own = {entry.model_version: entry for item in inputs for entry in item.routes}
    name = service.metadata.name or ""
    entries = []
    for route in routes:
        entry = own.get(route.model_version)
        if entry is None:
            entry = RouteEntry(route.model_version, route.weight,
                               deployment_name(name, route.model_version, MAIN_POOL), 1,
                               300.0, None)
        entries.append(replace(entry, weight=route.weight))
    # The current spec's settings (router replicas, failure mode) when it was rendered.
    base = next((out.routing for item, out in rendered
                 if out.routing is not None and item.service is service), inputs[0])
    return build_routing(replace(base, service=service, routes=tuple(entries),
                                 owner=owner_reference(service)))


def traffic_objects(service: GLMService, routes: list[VersionRoute],
                    planned: VersionPlan | None, config: OperatorConfig) -> list[Obj]:
    name, namespace = service.metadata.name or "", service.metadata.namespace or ""
    host = service_host(main_service_name(name), namespace, config)
    owner = owner_reference(service)
    autoscaling = service.spec.autoscaling
    replicas = autoscaling.max_replicas if autoscaling else service.spec.effective_replicas
    slots = planned.plan.request.concurrency if planned and planned.plan else 1
    # Every live version's pods can take the pool's full load during a rollout.
    max_requests = slots * max(1, replicas) * max(1, len(routes))
    return [
        build_destination_rule(main_service_name(name), namespace, name, host, routes,
                               max_requests, owner),
        build_virtual_service(main_service_name(name), namespace, name, host, routes, owner),
    ]


def gateway_facts(service: GLMService, capabilities: Capabilities,
                  inference_pools: Sequence[Obj]) -> GatewayFacts | None:
    """spec.routing.mode InferenceGateway: which of its CRDs are missing, and the pools as
    read (their status is the gateway's answer). None in the other modes."""
    if not service.spec.inference_gateway:
        return None
    ref = service.spec.routing.gateway_ref
    assert ref is not None  # the API's rule: InferenceGateway needs gatewayRef
    return GatewayFacts(
        gateway=f"{ref.namespace or service.metadata.namespace}/{ref.name}",
        missing_crds=tuple(c for c in INFERENCE_GATEWAY_CRDS
                           if c not in capabilities.inference_crds),
        observed=tuple(inference_pools))


def gateway_objects(service: GLMService, routes: list[VersionRoute], config: OperatorConfig,
                    istio: bool) -> list[Obj]:
    """Per routed version a picker and an InferencePool, and the HTTPRoute with the
    rollout's weights: the same numbers the VirtualService or the router would get."""
    name, namespace = name_of(service), service.metadata.namespace or ""
    routing = service.spec.routing
    assert routing.gateway_ref is not None
    return build_inference_gateway(GatewayInputs(
        service=name, namespace=namespace, gateway=routing.gateway_ref,
        hostnames=routing.hostnames or [service_host(main_service_name(name), namespace,
                                                     config)],
        routes=routes, failure_mode=routing.failure_mode, config=config,
        owner=owner_reference(service), istio=istio))
