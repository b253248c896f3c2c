"""Every child of one GLMService at one model version: the entry point controllers call.

    render_service(ServiceInputs(...)) -> [Deployment main, (Deployment long-context),
        Service main, (Service long-context),
        (PodDisruptionBudget main), (PodDisruptionBudget long-context),
        (HPA or KEDA ScaledObject),
        (long-context HPA), (ServiceMonitor),
        (ServiceAccount, Role, RoleBinding for the gateway's wake-up),
        (the long-context activity Lease; ServiceAccount, Role, RoleBinding to renew it),
        (the main pool's activity Lease and the Role to renew it: scale from zero),
        (the routing objects of spec.routing.mode EndpointPicker: render/routing.py)]

With the router in front (EndpointPicker), the client-facing Service `<svc>` selects the
router pods and the engine pods keep `<svc>-engines`.

`rendered_service` returns the same objects with the choices made on the way (which
autoscaler, which targets it scales on), so the status reports what was rendered instead of
deciding it again.

Pure: validated API objects and plans in, plain dicts out, in a fixed order. Children that
belong to the service as a whole (Services, ServiceMonitor, gateway ServiceAccount) carry no
version label; children of one version (Deployments, HPA, Role) do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glm_operator.api.glmservice import GLMService, Scaler
from glm_operator.api.modelversion import ModelVersion
from glm_operator.config import OperatorConfig
from glm_operator.planning.planner import Plan
from glm_operator.render.autoscaling import (
    ScaleTarget,
    TargetsChoice,
    build_hpa,
    build_long_context_hpa,
    choose_targets,
    long_context_hpa_wanted,
)
from glm_operator.render.deployment import (
    ENGINE_COMPONENT,
    LONG_CONTEXT_POOL,
    MAIN_POOL,
    build_deployment,
    deployment_name,
    desired_replicas,
)
from glm_operator.render.disruption import budget, build_pod_disruption_budget, pool_min_replicas
from glm_operator.render.environment import render_object
from glm_operator.render.groups import (
    build_headless_service,
    build_leader_worker_set,
    build_network_policy,
    build_statefulsets,
    group_model,
    group_scale_target,
    group_set_name,
)
from glm_operator.render.keda import build_scaled_object, prometheus_triggers
from glm_operator.render.long_context import (
    activity_lease_name,
    build_activity_lease,
    main_activity_lease_name,
    wake_timeout_seconds,
)
from glm_operator.render.meta import object_meta, owner_reference
from glm_operator.render.monitoring import build_service_monitor
from glm_operator.render.names import (
    POOL_LABEL,
    SERVICE_LABEL,
    VERSION_LABEL,
    common_labels,
    dns_name,
    label_value,
)
from glm_operator.render.pod import (
    GATEWAY_PORT_NAME,
    PoolContext,
    RenderInputError,
    ReplicaPolicy,
    engine_context_and_slots,
    startup_seconds,
    termination,
)
from glm_operator.render.rbac import (
    activity_lease_rules,
    build_role,
    build_role_binding,
    build_service_account,
    scale_rules,
)
from glm_operator.render.routing import (
    LongContextRoute,
    RouteEntry,
    RouterSettings,
    RoutingInputs,
    build_client_service,
    build_routing,
    engines_service_name,
    router_name,
    router_selector,
)
from glm_operator.render.scaler import ScalerChoice, choose_scaler
from glm_operator.render.status import plan_summary

__all__ = [
    "Capabilities",
    "RenderedService",
    "ServiceInputs",
    "plan_summary",
    "render_service",
    "rendered_service",
    "service_name_for",
]


@dataclass(frozen=True)
class Capabilities:
    """Which optional CRDs exist in the cluster."""

    service_monitor: bool = False
    istio: bool = False
    keda: bool = False  # KEDA's ScaledObject CRD
    leader_worker_set: bool = False  # LeaderWorkerSet's CRD (multi-node replicas)
    # Which of render/inference_pool.py's INFERENCE_GATEWAY_CRDS are served.
    inference_crds: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ServiceInputs:
    service: GLMService  # validated, metadata.name/namespace/uid set
    model_version: ModelVersion
    plan: Plan  # main pool plan, feasible
    long_context_plan: Plan | None  # when spec.longContext.enabled
    config: OperatorConfig
    capabilities: Capabilities
    # Offline rendering (`glm-operator render`) has no uid to point ownerReferences at.
    with_owner_references: bool = True
    # Set by a rollout: the main pool's replicas (a canary sized to its weight), and whether
    # the HPA runs yet (not while the rollout owns the new version's size).
    main_replicas: ReplicaPolicy | None = None
    with_autoscaler: bool = True
    # An autoscaled multi-node pool: the groups its leader set runs now (the autoscaler's
    # count, read from the cluster), so each has its workers. None: not created yet.
    live_groups: int | None = None
    # spec.routing.mode EndpointPicker: render the routing objects here, for this version
    # alone at weight 100 (offline rendering). decide/service.py builds them once for every
    # live version instead, from each RenderedService.routing.
    with_routing: bool = True


@dataclass(frozen=True)
class RenderedService:
    """The children of one service at one model version, and what render chose for them."""

    objects: list[dict[str, Any]]
    # The main pool's autoscaler: None unless spec.autoscaling is set and with_autoscaler.
    scaler: ScalerChoice | None = None
    # What the main pool's autoscaler scales on under the plan (set with spec.autoscaling,
    # rendered or not: a rollout sizing the version still has its targets judged).
    targets: TargetsChoice | None = None
    # spec.routing.mode EndpointPicker: the routing objects' inputs, this version alone at
    # weight 100 (its `routes` entry is what the whole table takes from it).
    routing: RoutingInputs | None = None


def main_service_name(service: str) -> str:
    return dns_name(service)


def long_context_service_name(service: str) -> str:
    return dns_name(service, "lc")


def service_name_for(service: GLMService, pool: str) -> str:
    """The Service of one pool ("main" or "long-context") of a GLMService."""
    name = service.metadata.name or ""
    return long_context_service_name(name) if pool == LONG_CONTEXT_POOL else main_service_name(name)


def gateway_service_account_name(service: str) -> str:
    return dns_name(service, "gateway")


def long_context_gateway_service_account_name(service: str) -> str:
    return dns_name(service, "lc-gateway")


def service_url(name: str, namespace: str, config: OperatorConfig) -> str:
    return f"http://{name}.{namespace}.svc.{config.cluster_domain}:{config.gateway_port}"


def build_service(
    name: str,
    namespace: str,
    service: str,
    pool: str,
    owner: dict[str, Any] | None,
    config: OperatorConfig,
) -> dict[str, Any]:
    """Service of one pool; it selects every version (the version split is the Deployments')."""
    labels = common_labels(service, "endpoint")
    labels[POOL_LABEL] = pool
    return render_object(
        "service.yaml.j2",
        metadata=object_meta(name, namespace, labels, owner),
        selector={SERVICE_LABEL: label_value(service), POOL_LABEL: pool},
        ports=[{"name": GATEWAY_PORT_NAME, "port": config.gateway_port,
                "targetPort": GATEWAY_PORT_NAME, "protocol": "TCP"}],
    )


def _check(inputs: ServiceInputs) -> tuple[str, str]:
    meta = inputs.service.metadata
    if not meta.name or not meta.namespace:
        raise RenderInputError("GLMService: metadata.name and metadata.namespace are required")
    if not inputs.model_version.metadata.name:
        raise RenderInputError("ModelVersion: metadata.name is required")
    for what, plan in (("main", inputs.plan), ("long-context", inputs.long_context_plan)):
        if plan is not None and not plan.feasible:
            raise RenderInputError(
                f"GLMService {meta.name}: the {what} pool's plan is not feasible: {plan.reason}"
            )
    lc = inputs.service.spec.long_context
    if lc is not None and lc.enabled and inputs.long_context_plan is None:
        raise RenderInputError(
            f"GLMService {meta.name}: spec.longContext is enabled but no long-context plan "
            "was given"
        )
    return meta.name, meta.namespace


def render_service(inputs: ServiceInputs) -> list[dict[str, Any]]:
    """Every child of the service at inputs.model_version, owner references and labels set."""
    return rendered_service(inputs).objects


def rendered_service(inputs: ServiceInputs) -> RenderedService:
    """`render_service`'s objects, with the autoscaler and targets chosen for them."""
    name, namespace = _check(inputs)
    svc, config = inputs.service, inputs.config
    version = inputs.model_version.metadata.name or ""
    owner = owner_reference(svc) if inputs.with_owner_references else None
    lc_enabled = svc.spec.long_context is not None and svc.spec.long_context.enabled
    lc_plan = inputs.long_context_plan if lc_enabled else None

    lc_deployment = deployment_name(name, version, LONG_CONTEXT_POOL)
    multi_node = inputs.plan.request.nodes > 1
    # Scale from zero: the router renews the version's Lease while it routes to it (every
    # request passes the router, routes.json names the Lease); the pods' gateways keep the
    # long-context pool's, which they mark when their own overflow wakes that pool.
    main_lease = (main_activity_lease_name(name, version)
                  if svc.spec.main_pool_may_sleep and not multi_node else None)
    gateway_sa = gateway_service_account_name(name) if lc_plan is not None else None
    lc_gateway_sa = (long_context_gateway_service_account_name(name)
                     if lc_plan is not None else None)
    lease = activity_lease_name(name) if lc_plan is not None else None
    lc_pool = None
    if lc_plan is not None:
        lc_pool = PoolContext(
            service=svc, model_version=inputs.model_version, plan=lc_plan, config=config,
            pool=LONG_CONTEXT_POOL, namespace=namespace, activity_lease=lease,
            service_account=lc_gateway_sa)
    main = PoolContext(
        service=svc, model_version=inputs.model_version, plan=inputs.plan, config=config,
        pool=MAIN_POOL, namespace=namespace,
        long_context_url=(service_url(long_context_service_name(name), namespace, config)
                          if lc_plan is not None else None),
        long_context_deployment=lc_deployment if lc_plan is not None else None,
        wake_timeout_seconds=(wake_timeout_seconds(startup_seconds(lc_pool))
                              if lc_pool is not None else None),
        activity_lease=lease,
        service_account=gateway_sa,
        replicas=inputs.main_replicas,
    )
    groups: int | None = None
    if multi_node:
        objects, groups = _main_groups(main, inputs.capabilities, owner, inputs.live_groups)
    else:
        objects = [build_deployment(main, owner)]
    if lc_pool is not None:
        objects.append(build_deployment(lc_pool, owner))
    if svc.spec.endpoint_picker:
        objects += [build_client_service(name, namespace, owner, config),
                    build_service(engines_service_name(name), namespace, name, MAIN_POOL,
                                  owner, config)]
    else:
        objects.append(build_service(main_service_name(name), namespace, name, MAIN_POOL,
                                     owner, config))
    if lc_plan is not None:
        objects.append(build_service(long_context_service_name(name), namespace, name,
                                     LONG_CONTEXT_POOL, owner, config))
    budgets = [(MAIN_POOL, budget(pool_min_replicas(svc, MAIN_POOL), groups))]
    if lc_plan is not None:
        budgets.append((LONG_CONTEXT_POOL, budget(pool_min_replicas(svc, LONG_CONTEXT_POOL))))
    objects += [build_pod_disruption_budget(name, namespace, pool, spec, owner)
                for pool, spec in budgets if spec is not None]

    version_labels = common_labels(name, ENGINE_COMPONENT)
    version_labels[VERSION_LABEL] = label_value(version)
    autoscaling = svc.spec.autoscaling
    targets = choose_targets(autoscaling, inputs.plan) if autoscaling is not None else None
    scaler = None
    if autoscaling is not None and targets is not None and inputs.with_autoscaler:
        scaler = choose_scaler(autoscaling, inputs.capabilities.keda, config.prometheus.url)
        target = (group_scale_target(group_set_name(name, version),
                                     inputs.capabilities.leader_worker_set)
                  if multi_node else ScaleTarget(deployment_name(name, version, MAIN_POOL)))
        objects += _main_autoscaler(inputs, scaler, targets, target, name, namespace, version,
                                    version_labels, owner)
    lc_spec = svc.spec.long_context
    if lc_pool is not None and lc_spec is not None and long_context_hpa_wanted(lc_spec):
        objects.append(build_long_context_hpa(
            lc_deployment, namespace, {**version_labels, POOL_LABEL: LONG_CONTEXT_POOL}, owner,
            lc_deployment, lc_spec))
    if inputs.capabilities.service_monitor:
        objects.append(build_service_monitor(
            dns_name(name), namespace, common_labels(name, "monitoring"), owner,
            {SERVICE_LABEL: label_value(name), "app.kubernetes.io/component": "endpoint"},
            GATEWAY_PORT_NAME,
        ))
        if svc.spec.endpoint_picker:  # the router's own series (docs/routing.md)
            objects.append(build_service_monitor(
                router_name(name), namespace, common_labels(name, "monitoring"), owner,
                router_selector(name), GATEWAY_PORT_NAME, engine_metrics=False))
    if gateway_sa is not None and lc_gateway_sa is not None and lease is not None:
        assert lc_spec is not None
        sa_labels = common_labels(name, "gateway")
        role = dns_name(name, version, "lc-scaler")
        objects += [
            build_service_account(gateway_sa, namespace, sa_labels, owner),
            build_role(role, namespace, {**sa_labels, VERSION_LABEL: label_value(version)},
                       owner, [*scale_rules(lc_deployment), *activity_lease_rules(lease)]),
            build_role_binding(role, namespace,
                               {**sa_labels, VERSION_LABEL: label_value(version)}, owner,
                               role, gateway_sa),
        ]
        # Shared by every version: one Lease per service, renewed by every pool's gateways.
        lease_labels = {**common_labels(name, "long-context-activity"),
                        POOL_LABEL: LONG_CONTEXT_POOL}
        lc_role = dns_name(name, "lc-activity")
        objects += [
            build_activity_lease(lease, namespace, lease_labels, owner, lc_spec.idle_seconds),
            build_service_account(lc_gateway_sa, namespace, sa_labels, owner),
            build_role(lc_role, namespace, sa_labels, owner, activity_lease_rules(lease)),
            build_role_binding(lc_role, namespace, sa_labels, owner, lc_role, lc_gateway_sa),
        ]
    if main_lease is not None:
        objects.append(_main_activity_lease(name, namespace, version, main_lease, owner,
                                            svc.spec.idle_seconds))
    routing = None
    if svc.spec.endpoint_picker:
        routing = _routing_inputs(inputs, main, lc_pool, main_lease, owner)
        if inputs.with_routing:
            objects += build_routing(routing)
    return RenderedService(objects, scaler, targets, routing)


def _main_activity_lease(name: str, namespace: str, version: str, lease: str,
                         owner: dict[str, Any] | None, idle_seconds: int) -> dict[str, Any]:
    """A main pool that scales from zero: its version's activity Lease (the router renews
    it, the operator reads it to put the pool to sleep)."""
    lease_labels = {**common_labels(name, "main-activity"), POOL_LABEL: MAIN_POOL,
                    VERSION_LABEL: label_value(version)}
    return build_activity_lease(lease, namespace, lease_labels, owner, idle_seconds)


def _routing_inputs(inputs: ServiceInputs, main: PoolContext, lc_pool: PoolContext | None,
                    main_lease: str | None, owner: dict[str, Any] | None) -> RoutingInputs:
    """The routing objects' inputs as this version sees them: itself at weight 100."""
    svc, config = inputs.service, inputs.config
    name, namespace = main.service_name, main.namespace
    autoscaling = svc.spec.autoscaling
    if inputs.main_replicas is not None and inputs.main_replicas.fixed is not None:
        least = inputs.main_replicas.fixed  # a rollout's size for this version
    else:
        least = autoscaling.min_replicas if autoscaling else svc.spec.effective_replicas
    workload = (group_set_name(name, main.version) if inputs.plan.request.nodes > 1
                else deployment_name(name, main.version, MAIN_POOL))
    entry = RouteEntry(main.version, 100, workload, least,
                       float(wake_timeout_seconds(startup_seconds(main))), main_lease,
                       deployment_name(name, main.version, LONG_CONTEXT_POOL)
                       if lc_pool is not None else None)
    long_context = None
    lc_spec = svc.spec.long_context
    if lc_pool is not None and lc_spec is not None:
        long_context = LongContextRoute(
            service_url(long_context_service_name(name), namespace, config),
            engine_context_and_slots(lc_pool.plan)[0], lc_spec.min_replicas,
            float(wake_timeout_seconds(startup_seconds(lc_pool))),
            activity_lease_name(name) if lc_spec.min_replicas == 0 else None)
    stop = termination(main)
    return RoutingInputs(
        service=svc, config=config, routes=(entry,),
        main_context_tokens=engine_context_and_slots(main.plan)[0], long_context=long_context,
        router=RouterSettings(stop.drain_seconds, stop.endpoint_removal_seconds,
                              stop.exit_margin_seconds),
        owner=owner)


def _main_groups(ctx: PoolContext, capabilities: Capabilities, owner: dict[str, Any] | None,
                 live_groups: int | None) -> tuple[list[dict[str, Any]], int]:
    """A multi-node main pool: one group of pods per replica, as a LeaderWorkerSet when its
    CRD is served, else as StatefulSets and a headless Service. Autoscaled, the set's size
    is the autoscaler's (whole groups) and the workers follow the groups running. Returns
    the objects and the groups running."""
    replicas, initial = desired_replicas(ctx)
    autoscaling = ctx.service.spec.autoscaling
    if replicas is not None:
        groups = replicas
    elif live_groups is None or autoscaling is None:
        groups = initial
    else:  # what the autoscaler runs, within its bounds while it catches up with an edit
        groups = min(max(live_groups, autoscaling.min_replicas), autoscaling.max_replicas)
    model = group_model(ctx, replicas, groups)
    policy = build_network_policy(model, owner)
    if capabilities.leader_worker_set:
        return [build_leader_worker_set(model, owner), policy], groups
    return [*build_statefulsets(model, owner), build_headless_service(model, owner),
            policy], groups


def _main_autoscaler(inputs: ServiceInputs, scaler: ScalerChoice, targets: TargetsChoice,
                     target: ScaleTarget, name: str, namespace: str, version: str,
                     version_labels: dict[str, str],
                     owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The main pool's HPA, or its KEDA ScaledObject (same name), or nothing (KEDA asked for
    and not possible: the Autoscaling condition says why)."""
    autoscaling = inputs.service.spec.autoscaling
    assert autoscaling is not None
    prometheus_url = inputs.config.prometheus.url
    labels = {**version_labels, POOL_LABEL: MAIN_POOL}
    hpa_name = deployment_name(name, version, MAIN_POOL)
    built = None
    if scaler.scaler == Scaler.HPA:
        built = build_hpa(hpa_name, namespace, labels, owner, target, autoscaling, targets)
    elif scaler.scaler == Scaler.KEDA:
        assert prometheus_url is not None
        triggers = prometheus_triggers(autoscaling, prometheus_url, namespace, name, version,
                                       MAIN_POOL, targets.unusable)
        if triggers:  # as for the HPA: no usable target, no autoscaler (the status says why)
            built = build_scaled_object(hpa_name, namespace, labels, owner, target,
                                        autoscaling, triggers)
    return [built] if built is not None else []
