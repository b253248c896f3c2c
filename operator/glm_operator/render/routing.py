"""LLM-aware routing of one GLMService (spec.routing.mode EndpointPicker): the router and
the route table it reads (pure); the endpoint picker (EPP) it asks is render/endpoint_picker.py.

    <svc>-epp     the endpoint picker's six objects (render/endpoint_picker.py).
    <svc>-router  Deployment (routerReplicas), ServiceAccount, Role, RoleBinding,
                  PodDisruptionBudget:
                  `glm-operator router`, which the client-facing Service `<svc>`
                  selects instead of the engine pods; it splits traffic between versions by
                  the rollout's weights, asks the picker which pod of the chosen version
                  serves each request, and wakes a version scaled to zero. A keyed service's
                  router mounts its keys Secret as the pods' gateways do (`--api-keys`): a
                  request without one of them wakes nothing (a mounted Secret needs no RBAC).
    <svc>-routes  ConfigMap, key routes.json: the versions with their weights (the same
                  weights the Istio VirtualService gets), Deployments, wake-up settings and
                  activity Leases; the router watches it through the API server.

Why a picker at all: the Service spreads connections, not requests, and knows nothing of a
pod's queue, its KV cache or the prompt prefix it holds; with more than one replica the
picker sends a conversation back to the pod that has its prefix cached and away from pods
whose queue or KV cache is full.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm_operator.api.glmservice import FailureMode, GLMService
from glm_operator.config import OperatorConfig
from glm_operator.gateway import flags as gateway_flags
from glm_operator.render.disruption import budget

# Re-exported: the EPP's names were this module's before it was split.
from glm_operator.render.endpoint_picker import EPP_COMPONENT as EPP_COMPONENT
from glm_operator.render.endpoint_picker import EPP_GRPC_PORT as EPP_GRPC_PORT
from glm_operator.render.endpoint_picker import container_resources, epp_name, epp_objects
from glm_operator.render.endpoint_picker import endpoint_picker_config as endpoint_picker_config
from glm_operator.render.endpoint_picker import engine_pods_selector as engine_pods_selector
from glm_operator.render.endpoint_picker import epp_args as epp_args
from glm_operator.render.endpoint_picker import epp_rules as epp_rules
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.names import (
    COMPONENT_LABEL,
    SERVICE_LABEL,
    common_labels,
    dns_name,
    label_value,
)
from glm_operator.render.node_architecture import component_affinity
from glm_operator.render.pod import (
    API_KEYS_MOUNT,
    GATEWAY_PORT_NAME,
    api_keys_mount,
    api_keys_volume,
    container_security_context,
    pod_security_context,
    pre_stop_sleep,
    pull_secrets,
)
from glm_operator.render.quantity import memory_quantity
from glm_operator.render.rbac import build_role, build_role_binding, build_service_account

ROUTER_COMPONENT = "router"
ROUTER_CONTAINER = "router"
ROUTES_KEY = "routes.json"
# The picker answers from memory in about a millisecond; 100 ms is far above that and far
# below what a request costs, so a slow picker is noticed and routed around (failureMode).
PICKER_TIMEOUT_SECONDS = 0.1
ROUTER_TMP_SIZE = 64 * 1024 * 1024

FAILURE_MODES = {FailureMode.FAIL_OPEN: "open", FailureMode.FAIL_CLOSE: "closed"}


def router_name(service: str) -> str:
    return dns_name(service, "router")


def routes_configmap_name(service: str) -> str:
    return dns_name(service, "routes")


def engines_service_name(service: str) -> str:
    """With the router in front, the main pool's engine pods keep a Service of their own:
    the ServiceMonitor scrapes their gateways through it (the client-facing Service now
    selects the routers), and it reaches the engines around the router when debugging."""
    return dns_name(service, "engines")


def router_selector(service: str) -> dict[str, str]:
    return {SERVICE_LABEL: label_value(service), COMPONENT_LABEL: ROUTER_COMPONENT}


# ---------------------------------------------------------------- the route table


@dataclass(frozen=True)
class RouteEntry:
    """One version in routes.json."""

    model_version: str
    weight: int  # percent of the service's traffic, as the VirtualService would get it
    deployment: str  # the version's main-pool workload (what the router wakes)
    min_replicas: int  # 0: the version may be asleep, the router wakes it
    wake_timeout_seconds: float  # how long a request waits for it to wake
    activity_lease: str | None  # the Lease the router renews for it (None: never sleeps)
    long_context_deployment: str | None = None  # the version's long-context pool, if any


@dataclass(frozen=True)
class LongContextRoute:
    """The long-context pool: its Service, and (for a router that finds its pods by label and
    wakes it itself) how it sleeps. Its Deployments are per version (RouteEntry)."""

    url: str
    context_tokens: int
    min_replicas: int
    wake_timeout_seconds: float
    activity_lease: str | None


def routes_document(routes: Sequence[RouteEntry], main_context_tokens: int,
                    long_context: LongContextRoute | None) -> dict[str, Any]:
    """routes.json as the router reads it (router/table.py): the contract's fields,
    and for the long-context pool also its Deployment per version and how it wakes."""
    if not routes or sum(r.weight for r in routes) != 100 or any(
            not 0 <= r.weight <= 100 for r in routes):
        raise ValueError(f"routing: weights must be 0..100 and sum to 100, got "
                         f"{[(r.model_version, r.weight) for r in routes]}")
    return {
        "versions": [_version_entry(r) for r in routes],
        "mainContextTokens": main_context_tokens,
        "longContext": (None if long_context is None else {
            "url": long_context.url, "contextTokens": long_context.context_tokens,
            "deployments": {r.model_version: r.long_context_deployment
                            for r in routes if r.long_context_deployment},
            "minReplicas": long_context.min_replicas,
            "wakeTimeoutSeconds": float(long_context.wake_timeout_seconds),
            "activityLease": long_context.activity_lease}),
    }


def _version_entry(route: RouteEntry) -> dict[str, Any]:
    """`name` is the ModelVersion (what x-glm-version pins); `podLabel` its pods' version
    label, given only where the name is longer than a label value may be."""
    entry: dict[str, Any] = {"name": route.model_version}
    label = label_value(route.model_version)
    if label != route.model_version:
        entry["podLabel"] = label
    entry.update({"weight": route.weight, "deployment": route.deployment,
                  "minReplicas": route.min_replicas,
                  "wakeTimeoutSeconds": float(route.wake_timeout_seconds),
                  "activityLease": route.activity_lease})
    return entry


# ---------------------------------------------------------------- the router


@dataclass(frozen=True)
class RouterSettings:
    """What the router's flags say beyond the service's names."""

    drain_seconds: int  # as the main pool's gateways drain (render/pod.py termination)
    endpoint_removal_seconds: int  # its preStop sleep while the endpoints drop it
    exit_margin_seconds: int


def router_flag_values(service: GLMService, config: OperatorConfig,
                       settings: RouterSettings) -> dict[str, Any]:
    """The router's flags by dest (gateway/flags.py ROUTER_FLAGS), in argument order."""
    name = service.metadata.name or ""
    namespace = service.metadata.namespace or ""
    routing = service.spec.routing
    return {
        "port": config.gateway_port,
        "service_name": name,
        "namespace": namespace,
        "routes_configmap": routes_configmap_name(name),
        "picker_address": (f"{epp_name(name)}.{namespace}.svc.{config.cluster_domain}:"
                           f"{EPP_GRPC_PORT}"),
        "picker_timeout": PICKER_TIMEOUT_SECONDS,
        "picker_failure_mode": FAILURE_MODES[routing.failure_mode],
        "pod_port": config.gateway_port,
        "max_waiting": routing.max_waiting_requests,
        # The pods' keys, checked before a request may wake a pool (router/dispatch.py);
        # none for an Open service, which anyone may wake.
        "api_keys": Path(API_KEYS_MOUNT) if service.spec.gateway.api_keys_secret else None,
        "drain_seconds": settings.drain_seconds,
    }


def router_rules(routes: Sequence[RouteEntry], routes_configmap: str,
                 long_context: LongContextRoute | None) -> list[dict[str, Any]]:
    """Watch the pods (label selectors cannot narrow RBAC) and its own route table; wake,
    and mark the activity of, exactly the pools in that table."""
    deployments = sorted({r.deployment for r in routes}
                         | {r.long_context_deployment for r in routes
                            if r.long_context_deployment and long_context is not None})
    leases = sorted({r.activity_lease for r in routes if r.activity_lease}
                    | ({long_context.activity_lease}
                       if long_context is not None and long_context.activity_lease else set()))
    rules: list[dict[str, Any]] = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        # The router lists and watches it with fieldSelector metadata.name, which RBAC
        # matches against resourceNames.
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [routes_configmap],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": deployments,
         "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"],
         "resourceNames": deployments, "verbs": ["get", "patch", "update"]},
    ]
    if leases:
        rules.append({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": leases, "verbs": ["get", "update", "patch"]})
    return rules


def router_args(service: GLMService, config: OperatorConfig,
                settings: RouterSettings) -> list[str]:
    """`glm-operator router` and its flags (routers rendered before it run the same program
    as `glm-operator gateway --router`, which the command still takes)."""
    return ["router", *gateway_flags.write_router(router_flag_values(service, config,
                                                                     settings))]


def _http_probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": GATEWAY_PORT_NAME}, "periodSeconds": period,
            "timeoutSeconds": 5, "failureThreshold": failures}


def _router_objects(service: GLMService, config: OperatorConfig, routes: Sequence[RouteEntry],
                    long_context: LongContextRoute | None, settings: RouterSettings,
                    owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    name, namespace = service.metadata.name or "", service.metadata.namespace or ""
    router = router_name(name)
    labels = common_labels(name, ROUTER_COMPONENT)
    selector = router_selector(name)
    keys_secret = service.spec.gateway.api_keys_secret
    container = {
        "name": ROUTER_CONTAINER,
        "image": config.operator_image,
        "command": ["glm-operator"],
        "args": router_args(service, config, settings),
        "ports": [{"name": GATEWAY_PORT_NAME, "containerPort": config.gateway_port,
                   "protocol": "TCP"}],
        "lifecycle": pre_stop_sleep(settings.endpoint_removal_seconds),
        "resources": container_resources(config.router_resources),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         *([api_keys_mount()] if keys_secret else [])],
        "startupProbe": _http_probe("/healthz", 2, 30),
        # /readyz: its route table read and its pod watch synced.
        "readinessProbe": _http_probe("/readyz", config.probes.readiness_period_seconds, 3),
        "livenessProbe": _http_probe("/healthz", 20, 3),
        "securityContext": container_security_context(config),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    spread = [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
               "labelSelector": {"matchLabels": dict(selector)},
               "matchLabelKeys": ["pod-template-hash"]}
              for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")]
    pod_spec = {
        "serviceAccountName": router,
        "automountServiceAccountToken": True,  # pods, its route table, wake-ups, Leases
        "enableServiceLinks": False,
        "securityContext": pod_security_context(config),
        **pull_secrets(config),
        "affinity": component_affinity(config.operator_image, config),
        "topologySpreadConstraints": spread,
        "terminationGracePeriodSeconds": (settings.endpoint_removal_seconds
                                          + settings.drain_seconds
                                          + settings.exit_margin_seconds),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {
            "sizeLimit": memory_quantity(ROUTER_TMP_SIZE)}},
            *([api_keys_volume(keys_secret)] if keys_secret else [])],
    }
    return [  # the account and its Role first, as for the picker
        build_service_account(router, namespace, labels, owner),
        build_role(router, namespace, labels, owner,
                   router_rules(routes, routes_configmap_name(name), long_context)),
        build_role_binding(router, namespace, labels, owner, router, router),
        _router_budget(router, namespace, labels, selector, owner,
                       service.spec.routing.router_replicas),
        render_object(
            "component-deployment.yaml.j2",
            metadata=object_meta(router, namespace, labels, owner),
            replicas=service.spec.routing.router_replicas,
            selector=selector,
            strategy={"type": "RollingUpdate",
                      "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            pod_labels=dict(labels),
            pod_annotations={},
            pod_spec=pod_spec,
        ),
    ]


def _router_budget(name: str, namespace: str, labels: dict[str, str],
                   selector: dict[str, str], owner: dict[str, Any] | None,
                   replicas: int) -> dict[str, Any]:
    """Every request of the service passes a router: a drain takes one at a time, as the
    engine pools' budgets do (render/disruption.py; one router: it must not be evicted
    before its replacement runs)."""
    spec = budget(replicas)
    assert spec is not None  # routerReplicas >= 1
    return render_object(
        "poddisruptionbudget.yaml.j2",
        metadata=object_meta(name, namespace, labels, owner),
        selector={"matchLabels": dict(selector)},
        min_available=spec.min_available,
        max_unavailable=spec.max_unavailable,
    )


def build_client_service(service: str, namespace: str, owner: dict[str, Any] | None,
                         config: OperatorConfig) -> dict[str, Any]:
    """The client-facing Service `<svc>` with the router in front: it selects the routers."""
    return render_object(
        "service.yaml.j2",
        metadata=object_meta(dns_name(service), namespace,
                             common_labels(service, ROUTER_COMPONENT), owner),
        selector=router_selector(service),
        ports=[{"name": GATEWAY_PORT_NAME, "port": config.gateway_port,
                "targetPort": GATEWAY_PORT_NAME, "protocol": "TCP"}],
    )


# ---------------------------------------------------------------- all of it


@dataclass(frozen=True)
class RoutingInputs:
    service: GLMService  # validated, metadata.name/namespace set, routing mode EndpointPicker
    config: OperatorConfig
    routes: Sequence[RouteEntry]
    main_context_tokens: int
    long_context: LongContextRoute | None
    router: RouterSettings
    owner: dict[str, Any] | None


def build_routing(inputs: RoutingInputs) -> list[dict[str, Any]]:
    """Every routing object of the service, in a fixed order: the route table, the picker's
    six, the router's five, each component's account and Role before its Deployment. (The
    client-facing Service is the service renderer's.)"""
    svc = inputs.service
    name, namespace = svc.metadata.name or "", svc.metadata.namespace or ""
    table = routes_document(inputs.routes, inputs.main_context_tokens, inputs.long_context)
    routes = render_object(
        "configmap.yaml.j2",
        metadata=object_meta(routes_configmap_name(name), namespace,
                             common_labels(name, ROUTER_COMPONENT), inputs.owner),
        data={ROUTES_KEY: json.dumps(table, indent=2) + "\n"},
    )
    return [routes, *epp_objects(name, namespace, inputs.config, inputs.owner),
            *_router_objects(svc, inputs.config, inputs.routes, inputs.long_context,
                             inputs.router, inputs.owner)]
