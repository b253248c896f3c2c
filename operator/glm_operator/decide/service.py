"""What a GLMService should look like right now: desired children and status (pure).

observe (controllers/reconcile_service.py) -> decide (here) -> apply (controllers/apply.py).
Given one observation (decide/observed.py `ServiceObservation`: the service parsed once,
the ModelVersions it names, its live children, and whatever else the reconcile read before
deciding: Secrets, InferencePools, activity Leases, a canary's analysis), `decide_service`
returns the children the operator must hold, the live children it must leave
alone, the status to report and when to look again. No I/O, so every branch (missing model,
infeasible plan, each rollout step) is unit-testable.

The steps, in order: plan the wanted and stable versions (decide/versions.py), step the
rollout between them (decide/rollout.py), choose what runs and render it, promote, then
write the conditions (decide/conditions.py) from what was decided and rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from glm_operator.api import (
    AnalysisResult,
    Condition,
    GLMService,
    GLMServiceConditionType,
    GLMServiceStatus,
    PoolStatus,
    RolloutRecord,
    RolloutStatus,
    get_condition,
)
from glm_operator.api.glmservice_status import FINISHED_PHASES, HISTORY_LIMIT
from glm_operator.config import OperatorConfig
from glm_operator.decide import main_pool, traffic
from glm_operator.decide import rollout as rollouts
from glm_operator.decide.conditions import ConditionInputs, service_conditions
from glm_operator.decide.gateway import gateway_poll
from glm_operator.decide.long_context import ActivityReading, decide_idle, needs_reading
from glm_operator.decide.observed import ObservedChildren, Ref, ServiceObservation, rolled_out
from glm_operator.decide.references import resolve_references
from glm_operator.decide.versions import (
    Render,
    Serving,
    VersionPlan,
    Versions,
    plan_versions,
    siblings_needed,
    spec_snapshot,
    what_runs,
)
from glm_operator.planning.accelerators import AcceleratorProfile
from glm_operator.render.autoscaling import TargetsChoice, choose_targets
from glm_operator.render.inference_pool import (
    pool_name,
)
from glm_operator.render.names import label_value
from glm_operator.render.pod import PoolContext, startup_seconds
from glm_operator.render.service import (
    Capabilities,
    RenderedService,
    ServiceInputs,
    plan_summary,
    rendered_service,
    service_name_for,
    service_url,
)
from glm_operator.wellknown import (
    ABORT_ANNOTATION,
    LONG_CONTEXT_POOL,
    MAIN_POOL,
    POOL_LABEL,
    PROMOTE_ANNOTATION,
    SERVICE_LABEL,
)

Obj = dict[str, Any]
Event = tuple[str, str, str]  # (type, reason, message)


@dataclass(frozen=True)
class ServiceDecision:
    desired: list[Obj]
    status: GLMServiceStatus
    events: list[Event] = field(default_factory=list)
    # Live children to leave as they are: a serving version that cannot be rendered.
    retained: frozenset[Ref] = frozenset()
    requeue_after: float | None = None  # seconds until the rollout or idle check looks again
    # Deployments to scale to zero now, idle (a long-context pool, or the main pool of a
    # service that scales from zero): (name, resourceVersion decided on).
    scale_to_zero: tuple[tuple[str, str], ...] = ()


@dataclass
class _Rollout:
    """Where a change of spec.modelVersion stands after this reconcile."""

    decision: rollouts.RolloutDecision | None  # None: no other version is serving
    status: RolloutStatus | None
    history: list[RolloutRecord]
    superseded: RolloutRecord | None  # a rollout the spec went back from
    events: list[Event]


@dataclass
class _Rendered:
    desired: list[Obj]
    retained: set[Ref]
    versions: list[tuple[Render, RenderedService]]


def main_pool_reading_due(service: GLMService, observed: ObservedChildren,
                          now: datetime) -> str | None:
    """The main pool's activity Lease to read before deciding (scale from zero: its idle
    deadline passed), or None."""
    return main_pool.reading_due(service, observed, now)


def long_context_reading_due(service: GLMService, observed: ObservedChildren,
                             now: datetime) -> bool:
    """Whether the long-context pool's idle deadline has passed: read its activity Lease
    before deciding (once per idle period of an awake pool)."""
    spec = service.spec.long_context
    if spec is None or not spec.enabled:
        return False
    return needs_reading(spec, bool(observed.awake_long_context()), service.status.long_context,
                         now)


def namespace_model_versions_needed(service: GLMService, model_versions: Mapping[str, Obj],
                                    profiles: Mapping[str, AcceleratorProfile],
                                    config: OperatorConfig) -> bool:
    """Whether to observe every ModelVersion of the namespace before deciding: the wanted
    version's plan does not fit, and its advice may point at another of them."""
    return siblings_needed(service, model_versions, profiles, config)


def decide_service(
    observation: ServiceObservation,
    config: OperatorConfig,
    profiles: Mapping[str, AcceleratorProfile],
) -> ServiceDecision:
    """The decisions of one reconcile, in order: plan the wanted (and stable) version, step a
    rollout, choose what runs, render it, promote, and report; from one observation, with
    the operator's settings (`config`, the accelerator `profiles`)."""
    service, observed = observation.service, observation.children
    capabilities, now = observation.capabilities, observation.now
    previous = service.status
    versions = plan_versions(service, observation.model_versions, profiles,
                             observation.namespace_model_versions, config=config)
    wanted = versions.wanted
    events: list[Event] = []
    if wanted.plan_problem and wanted.plan_problem[0] == "Infeasible":
        events.append(("Warning", "Infeasible", wanted.plan_problem[1]))

    rollout = _step_rollout(versions, observed, config, now, observation.analysis)
    events += rollout.events
    serving = what_runs(rollout.decision, versions)
    rendered = _render_versions(serving, observed, config, capabilities)
    desired = rendered.desired
    if service.spec.endpoint_picker:
        desired += traffic.routing_objects(service, serving.routes, rendered.versions)

    wanted_replicas = _wanted_replicas(service)
    stable_after, promoted = _promotion(rollout.decision, serving.stable, versions, observed,
                                        wanted_replicas)
    events += promoted
    # With the router in front, the router splits the versions by these same weights: a
    # VirtualService on the client Service would route to version subsets of router pods.
    # With an inference gateway the HTTPRoute is the one writer of the weights: Istio's
    # gateway reads it (ENABLE_GATEWAY_API_INFERENCE_EXTENSION), and a VirtualService on the
    # same host would be a second, competing set of the same weights.
    gateway = traffic.gateway_facts(service, capabilities, observation.inference_pools)
    istio = (capabilities.istio and not service.spec.endpoint_picker
             and not service.spec.inference_gateway)
    if istio:
        desired += traffic.traffic_objects(service, serving.routes, versions.planned, config)
    if gateway is not None and not gateway.missing_crds:
        desired += traffic.gateway_objects(service, serving.routes, config, capabilities.istio)

    long_context, scale_to_zero, idle_requeue, idle_events = _long_context_pool(
        service, observed, config, observation.long_context_activity, now)
    events += idle_events
    main_idle = main_pool.decide(service, observed, _sleepable_version(serving),
                                 observation.main_pool_activity, now)
    events += main_idle.events
    scale_to_zero += main_idle.scale_to_zero

    conditions = service_conditions(previous.conditions, service.metadata.generation, now,
                                    ConditionInputs(
        versions=versions, observed=observed, decision=rollout.decision,
        superseded=rollout.superseded,
        wanted_targets=_wanted_targets(service, wanted, rendered),
        autoscaled=next(((r, out) for r, out in rendered.versions if out.scaler is not None),
                        None),
        istio=istio, prometheus_url=config.prometheus.url,
        stable_after=stable_after, wanted_replicas=wanted_replicas,
        stable_missing=bool(rendered.retained),
        references=resolve_references(service, observation.secrets, config),
        router=service.spec.endpoint_picker,
        main_pool_asleep=main_pool.asleep(main_idle, observed),
        gateway=(None if gateway is None else replace(
            gateway, pools=tuple(pool_name(traffic.name_of(service), r.model_version)
                                 for r in serving.routes)))))
    events += _warnings_raised(previous.conditions, conditions)

    if stable_after == wanted.name:
        stable_spec: dict[str, Any] | None = spec_snapshot(service)
    else:
        stable_spec = previous.stable_spec or (spec_snapshot(versions.stable_service)
                                               if versions.stable_name else None)
    shown = versions.planned
    # The serving version's pods (kubectl's Ready replicas): during a rollout the new
    # version's are the canary's, shown beside them while a canary runs.
    serving_version = stable_after or versions.wanted.name
    replicas, ready = observed.version_replicas(serving_version)
    weight = canary_weight(rollout.status)
    canary_ready = (observed.version_replicas(versions.wanted.name)[1]
                    if weight is not None and versions.wanted.name != serving_version else None)
    status = GLMServiceStatus(
        observed_generation=service.metadata.generation,
        conditions=conditions,
        stable_model_version=stable_after,
        stable_spec=stable_spec,
        replicas=replicas,
        ready_replicas=ready,
        selector=(f"{SERVICE_LABEL}={label_value(service.metadata.name or '')},"
                  f"{POOL_LABEL}={MAIN_POOL}"),
        endpoint=_endpoint(service, config, MAIN_POOL),
        plan=(plan_summary(shown.plan, service, shown.name, shown.model_version)
              if shown is not None and shown.plan is not None
              and shown.model_version is not None else previous.plan),
        rollout=rollout.status,
        canary_weight=weight,
        canary_ready_replicas=canary_ready,
        rollout_history=rollout.history[:HISTORY_LIMIT] or None,
        long_context=long_context,
        main_pool=main_idle.status,
    )
    requeues = [t for t in (rollout.decision.requeue_after if rollout.decision else None,
                            idle_requeue, main_idle.requeue_after,
                            gateway_poll(conditions, gateway)) if t is not None]
    return ServiceDecision(desired=desired, status=status, events=events,
                           retained=frozenset(rendered.retained),
                           requeue_after=min(requeues) if requeues else None,
                           scale_to_zero=scale_to_zero)


def canary_weight(rollout: RolloutStatus | None) -> int | None:
    """The canary's share of traffic while a canary runs; unset otherwise (a finished
    rollout's weight, 100 or 0, is history, not a canary's share)."""
    if rollout is None or rollout.strategy != "canary" or rollout.phase in FINISHED_PHASES:
        return None
    return rollout.weight


def _warnings_raised(before: Sequence[Condition], after: Sequence[Condition]) -> list[Event]:
    """A Warning Event when a condition turns to what needs someone's attention (not at every
    reconcile: Events are for transitions)."""
    events: list[Event] = []
    for type_, bad in ((GLMServiceConditionType.OPEN_ACCESS, "True"),
                       (GLMServiceConditionType.RESOLVED_REFS, "False")):
        new, old = get_condition(after, type_), get_condition(before, type_)
        if new is not None and new.status == bad and (old is None or old.status != bad):
            events.append(("Warning", new.reason, new.message))
    return events


def _wanted_replicas(service: GLMService) -> int:
    autoscaling = service.spec.autoscaling
    return autoscaling.min_replicas if autoscaling else service.spec.effective_replicas


def _full_size(service: GLMService, stable_replicas: int) -> int:
    """Replicas the wanted version needs to take all traffic: what the stable pool runs now
    when an HPA sizes it (never less than minReplicas), else the spec's count."""
    autoscaling = service.spec.autoscaling
    if autoscaling is None:
        return max(1, service.spec.effective_replicas)
    return max(1, autoscaling.min_replicas, stable_replicas)


def _load_seconds(version: VersionPlan, service: GLMService, config: OperatorConfig) -> float:
    if version.plan is None or version.model_version is None:
        return 0.0
    return float(startup_seconds(PoolContext(
        service=service, model_version=version.model_version, plan=version.plan,
        config=config, pool=MAIN_POOL, namespace=service.metadata.namespace or "")))


def _step_rollout(versions: Versions, observed: ObservedChildren, config: OperatorConfig,
                  now: datetime, analysis: AnalysisResult | None) -> _Rollout:
    """Advance the rollout from the stable version to the wanted one, if they differ; a
    rollout whose target changed (or went back to the stable version) is superseded."""
    service, wanted = versions.service, versions.wanted
    stable = versions.stable_name
    status = service.status.rollout
    history: list[RolloutRecord] = list(service.status.rollout_history or [])
    if not versions.rolling:
        record = rollouts.superseded(
            status if status and status.model_version != stable else None, now,
            f"spec.modelVersion went back to {wanted.name}")
        if record is not None:
            history.insert(0, record)
            status = None
        return _Rollout(None, status, history, record, [])
    assert stable is not None
    if status is not None and (status.model_version != wanted.name
                               or status.from_model_version != stable):
        record = rollouts.superseded(status, now, f"spec.modelVersion changed to {wanted.name}")
        if record is not None:
            history.insert(0, record)
        status = None
    annotations = service.metadata.annotations
    decision = rollouts.advance(rollouts.RolloutInputs(
        policy=service.spec.rollout, stable=stable, target=wanted.name,
        new=rollouts.NewVersion(
            servable=wanted.servable,
            problem=(wanted.model_problem or wanted.plan_problem or (None, None))[1],
            ready_replicas=observed.ready_pods(wanted.name),
            load_seconds=_load_seconds(wanted, service, config)),
        full_size=_full_size(service, observed.spec_replicas(stable)),
        now=now, previous=status,
        promote_requested=annotations.get(PROMOTE_ANNOTATION) == wanted.name,
        abort_requested=annotations.get(ABORT_ANNOTATION) == wanted.name,
        analysis=analysis, drain_seconds=config.rollout.drain_seconds,
        min_deadline_seconds=config.rollout.min_progress_deadline_seconds,
        deadline_margin_seconds=config.rollout.progress_deadline_margin_seconds,
    ))
    if decision.finished is not None:
        history.insert(0, decision.finished)
    return _Rollout(decision, decision.status, history, None, list(decision.events))


def _render_versions(serving: Serving, observed: ObservedChildren, config: OperatorConfig,
                     capabilities: Capabilities) -> _Rendered:
    """The children of every version that runs; a serving version that cannot be rendered
    (its ModelVersion is gone) keeps its live children, retained as they are."""
    out = _Rendered([], set(), [])
    seen: set[Ref] = set()
    for item in serving.renders:
        version = item.version
        if not version.servable:
            if version.name == (serving.stable or ""):
                out.retained |= observed.of_version(version.name)
            continue
        assert version.model_version is not None and version.plan is not None
        inputs = ServiceInputs(service=item.service, model_version=version.model_version,
                               plan=version.plan, long_context_plan=version.long_context_plan,
                               config=config, capabilities=capabilities,
                               main_replicas=item.replicas, with_autoscaler=item.autoscaler,
                               live_groups=observed.live_groups(version.name),
                               with_routing=False)
        rendered = rendered_service(inputs)
        out.versions.append((item, rendered))
        for obj in rendered.objects:
            key = (obj["kind"], obj["metadata"]["name"])
            if key not in seen:  # Services, RBAC and HPA are shared by every version
                seen.add(key)
                out.desired.append(obj)
    return out


def _sleepable_version(serving: Serving) -> str | None:
    """The version whose main pool may sleep: the one running alone with its autoscaler (no
    rollout in flight; decide/main_pool.py says why)."""
    if len(serving.renders) != 1:
        return None
    only = serving.renders[0]
    if only.replicas is not None or not only.autoscaler or not only.version.servable:
        return None
    return only.version.name


def _wanted_targets(service: GLMService, wanted: VersionPlan,
                    rendered: _Rendered) -> TargetsChoice | None:
    """What the wanted version's autoscaler scales on under its plan: as render chose it, or,
    for a version planned but not rendered (its ModelVersion is not Ready, or a finished
    rollout dropped its pool), judged from its plan directly."""
    autoscaling = service.spec.autoscaling
    if autoscaling is None or wanted.plan is None:
        return None
    for item, out in rendered.versions:
        if item.version is wanted and item.service is service:
            return out.targets
    return choose_targets(autoscaling, wanted.plan)


def _promotion(decision: rollouts.RolloutDecision | None, stable_after: str | None,
               versions: Versions, observed: ObservedChildren,
               wanted_replicas: int) -> tuple[str | None, list[Event]]:
    """The first version (nothing stable yet) and in-place spec changes are promoted when
    Ready; a rollout promotes by its own decision."""
    wanted, stable = versions.wanted, versions.stable_name
    if decision is None and stable != wanted.name and wanted.servable and any(
            rolled_out(w, max(wanted_replicas, 1))
            for w in observed.workloads(MAIN_POOL, wanted.name)):
        return wanted.name, [("Normal", "Promoted", f"ModelVersion {wanted.name!r} is serving")]
    # A rollout's promotion is announced by the rollout's own decision (decide/rollout.py):
    # one Promoted event, not two.
    return stable_after, []


def _long_context_pool(
    service: GLMService, observed: ObservedChildren, config: OperatorConfig,
    activity: ActivityReading | None, now: datetime,
) -> tuple[PoolStatus | None, tuple[tuple[str, str], ...], float | None, list[Event]]:
    """The long-context pool's status, and whether it is idle long enough to go to zero:
    (status, Deployments to scale to zero, when to look again, events)."""
    awake = observed.awake_long_context()
    idle = decide_idle(service.spec.long_context, bool(awake), service.status.long_context,
                       activity, now)
    scale_to_zero: tuple[tuple[str, str], ...] = ()
    events = []
    if idle.sleep:
        scale_to_zero = tuple((d["metadata"]["name"], d["metadata"].get("resourceVersion", ""))
                              for d in awake)
        assert service.spec.long_context is not None
        events.append(("Normal", "LongContextIdle",
                       f"no long request for {service.spec.long_context.idle_seconds} s (last "
                       f"{idle.last_activity:%Y-%m-%dT%H:%M:%SZ}): scaling the long-context "
                       "pool to zero"))
    status = None
    if service.spec.long_context and service.spec.long_context.enabled:
        replicas, ready = observed.replicas(LONG_CONTEXT_POOL)
        status = PoolStatus(
            replicas=replicas, ready_replicas=ready,
            endpoint=_endpoint(service, config, LONG_CONTEXT_POOL),
            last_activity_time=idle.last_activity,
            scale_to_zero_time=idle.scale_to_zero_time,
        )
    return status, scale_to_zero, idle.requeue_after, events


def _endpoint(service: GLMService, config: OperatorConfig, pool: str) -> str:
    return service_url(service_name_for(service, pool), service.metadata.namespace or "",
                       config) + "/v1"
