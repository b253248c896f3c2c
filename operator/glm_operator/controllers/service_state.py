"""What a GLMService should look like right now: desired children and status (pure).

observe (the handler) -> decide (here) -> apply (the handler). Given the service, the
ModelVersions it names, the live children and (when a canary check was due) an analysis
result, `decide_service` returns the children the operator must hold, the live children it
must leave alone, the status to report and when to look again. No I/O, so every branch
(missing model, infeasible plan, each rollout step) is unit-testable.

Versions: `status.stableModelVersion` serves now, rendered from `status.stableSpec`, the spec
it was rolled out with, so a rollout never restarts the stable pods. `spec.modelVersion`, when
it differs, is rolled out by `controllers/rollout.py`. A version whose ModelVersion is gone
cannot be rendered: its live pods are kept as they are, never pruned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from glm_operator.api import (
    AnalysisResult,
    GLMService,
    GLMServiceConditionType,
    GLMServiceStatus,
    ModelVersion,
    PoolStatus,
    RolloutPhase,
    RolloutRecord,
    RolloutStatus,
    Scaler,
    set_condition,
)
from glm_operator.api.conditions import Condition, remove_condition
from glm_operator.api.glmservice import Autoscaling, GLMServiceSpec
from glm_operator.api.glmservice_status import FINISHED_PHASES, HISTORY_LIMIT
from glm_operator.config import OperatorConfig
from glm_operator.decide import rollout as rollouts
from glm_operator.decide.long_context import (
    ActivityReading,
    decide_idle,
    needs_reading,
)
from glm_operator.planning.accelerators import AcceleratorProfile
from glm_operator.planning.from_api import ModelFactsUnknown, plan_request_for
from glm_operator.planning.planner import Plan, PlanInputError, plan
from glm_operator.render.autoscaling import (
    device_memory_check,
    hpa_metrics,
    target_values,
    unusable_targets,
)
from glm_operator.render.deployment import deployment_name
from glm_operator.render.groups import GROUP_ROLE_LABEL, LEADER
from glm_operator.render.keda import keda_hpa_name
from glm_operator.render.meta import owner_reference
from glm_operator.render.names import label_value
from glm_operator.render.pod import PoolContext, ReplicaPolicy, startup_seconds
from glm_operator.render.scaler import choose_scaler
from glm_operator.render.service import (
    Capabilities,
    ServiceInputs,
    main_service_name,
    plan_summary,
    render_service,
    service_name_for,
    service_url,
)
from glm_operator.render.traffic import (
    VersionRoute,
    build_destination_rule,
    build_virtual_service,
    service_host,
)
from glm_operator.wellknown import (
    ABORT_ANNOTATION,
    LONG_CONTEXT_POOL,
    MAIN_POOL,
    POOL_LABEL,
    PROMOTE_ANNOTATION,
    SERVICE_LABEL,
    VERSION_LABEL,
)

Obj = dict[str, Any]
C = GLMServiceConditionType


@dataclass(frozen=True)
class ServiceDecision:
    desired: list[Obj]
    status: GLMServiceStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    # Live children to leave as they are: a serving version that cannot be rendered.
    retained: frozenset[tuple[str, str]] = frozenset()
    requeue_after: float | None = None  # seconds until the rollout or idle check looks again
    # Long-context Deployments to scale to zero now, idle: (name, resourceVersion decided on).
    scale_to_zero: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class _VersionPlan:
    """One ModelVersion's readiness and plan, or why it cannot be served."""

    name: str
    model_version: ModelVersion | None
    plan: Plan | None
    long_context_plan: Plan | None
    model_problem: tuple[str, str] | None  # (reason, message): ModelReady=False
    plan_problem: tuple[str, str] | None  # (reason, message): Planned=False

    @property
    def servable(self) -> bool:
        return self.model_problem is None and self.plan_problem is None


def _plan_version(
    service: GLMService,
    name: str,
    model_versions: Mapping[str, Obj],
    profiles: Mapping[str, AcceleratorProfile],
) -> _VersionPlan:
    body = model_versions.get(name)
    if body is None:
        problem = ("ModelVersionNotFound",
                   f"ModelVersion {name!r} does not exist in namespace "
                   f"{service.metadata.namespace}; waiting for it")
        return _VersionPlan(name, None, None, None, problem, None)
    try:
        mv = ModelVersion.model_validate(body)
    except ValidationError as exc:
        problem = ("ModelVersionInvalid", f"ModelVersion {name!r} is invalid: {exc}")
        return _VersionPlan(name, None, None, None, problem, None)
    engine = service.spec.engine
    fmt = mv.spec.format
    if engine and (engine, fmt) in {("vllm", "gguf"), ("llamacpp", "safetensors")}:
        fix = "llamacpp" if fmt == "gguf" else "vllm"
        problem = ("EngineFormatMismatch",
                   f"engine {engine} cannot serve the {fmt} ModelVersion {name!r}: "
                   f"set spec.engine to {fix} or point spec.modelVersion at a "
                   f"{'safetensors' if engine == 'vllm' else 'gguf'} ModelVersion")
        return _VersionPlan(name, mv, None, None, problem, None)
    model_problem = None
    if mv.status.phase == "Failed":
        failing = (next((c for c in mv.status.conditions
                         if c.type == "Ready" and c.status == "False"), None)
                   or next((c for c in mv.status.conditions if c.status == "False"), None))
        model_problem = ("ModelVersionFailed",
                         f"ModelVersion {name!r} failed"
                         + (f" ({failing.reason}: {failing.message})" if failing else "")
                         + ": fix its source, or point spec.modelVersion at another version")
    elif mv.status.phase != "Ready":
        model_problem = ("ModelVersionNotReady",
                         f"ModelVersion {name!r} is {mv.status.phase}: waiting for the fetch "
                         "Job to download and verify it")
    try:
        main = plan(plan_request_for(service, mv), profiles)
        lc_spec = service.spec.long_context
        long_plan = (plan(plan_request_for(service, mv, long_context=True), profiles)
                     if lc_spec is not None and lc_spec.enabled else None)
    except ModelFactsUnknown as exc:
        return _VersionPlan(name, mv, None, None, model_problem, ("ModelFactsUnknown", str(exc)))
    except (PlanInputError, KeyError, ValueError) as exc:
        return _VersionPlan(name, mv, None, None, model_problem, ("InvalidPlanInput", str(exc)))
    plan_problem = None
    for pool, candidate in ((MAIN_POOL, main), (LONG_CONTEXT_POOL, long_plan)):
        if candidate is not None and not candidate.feasible:
            plan_problem = ("Infeasible", _infeasible_message(pool, candidate))
            break
    return _VersionPlan(name, mv, main, long_plan, model_problem, plan_problem)


def _infeasible_message(pool: str, p: Plan) -> str:
    message = f"{pool} pool does not fit: {p.reason}"
    if p.alternatives:
        options = "; ".join(
            f"{a.change} fits with {a.headroom_bytes / 2**30:.1f} GiB headroom"
            for a in p.alternatives[:4]
        )
        message += f". Nearest that fit: {options}"
    return message


def _plan_message(p: Plan) -> str:
    gib = 2**30
    m = p.memory
    nodes = (f"{p.request.nodes} nodes (one group of pods per replica) x "
             if p.request.nodes > 1 else "")
    return (f"fits on {nodes}{p.request.count} x {p.profile.name}: weights "
            f"{m.weights / gib:.1f} GiB per device + "
            f"KV {m.kv / gib:.1f} GiB + buffers {(m.compute + m.overhead) / gib:.1f} GiB of "
            f"{m.available / gib:.1f} GiB, {m.headroom / gib:.1f} GiB headroom")


def _autoscaling_condition(autoscaling: Autoscaling, p: Plan) -> tuple[bool, str, str]:
    """Whether every autoscaling target can act under the plan (a device-memory target at or
    below the planned steady figure cannot; render/autoscaling.py leaves it out)."""
    check = device_memory_check(autoscaling, p)
    metrics = [m["pods"]["metric"]["name"]
               for m in hpa_metrics(autoscaling, unusable_targets(autoscaling, p))]
    if check is not None and not check.usable:
        rest = (f" The HPA scales on {', '.join(metrics)}." if metrics else
                " No other target is set: no HPA is rendered and the main pool keeps its "
                "size.")
        return False, check.reason, check.message() + rest
    message = f"the HPA scales on {', '.join(metrics)}"
    if check is not None:
        message += f"; {check.message()}"
    return True, "TargetsUsable", message


# The workloads that count a pool's replicas: Deployments, and for multi-node replicas the
# leader StatefulSet or the LeaderWorkerSet (one replica = one group; the worker StatefulSets
# carry no pool label). All report replicas, updatedReplicas and readyReplicas alike.
POOL_WORKLOADS = frozenset({"Deployment", "StatefulSet", "LeaderWorkerSet"})


def _caught_up(workload: Obj) -> bool:
    """Its status describes its current spec. LeaderWorkerSet (v0.7) reports no
    observedGeneration: its updatedReplicas, counted against the current template's revision,
    is what says so (a new version is a new object, whose status starts empty)."""
    meta, status = workload.get("metadata", {}), workload.get("status") or {}
    if workload.get("kind") == "LeaderWorkerSet" and "observedGeneration" not in status:
        return True
    return bool(status.get("observedGeneration", 0) >= meta.get("generation", 1))


def _pool_deployments(children: Sequence[Obj], version: str | None, pool: str) -> list[Obj]:
    return [
        c for c in children
        if c.get("kind") in POOL_WORKLOADS
        and c.get("metadata", {}).get("labels", {}).get(POOL_LABEL) == pool
        and (version is None
             or c["metadata"]["labels"].get(VERSION_LABEL) == label_value(version))
    ]


def _rolled_out(deployment: Obj, wanted: int) -> bool:
    """The Deployment has caught up with its spec and has `wanted` ready pods."""
    status = deployment.get("status") or {}
    return bool(
        _caught_up(deployment)
        and status.get("updatedReplicas", 0) >= wanted
        and status.get("readyReplicas", 0) >= wanted
        and status.get("replicas", 0) == status.get("updatedReplicas", 0)
    )


def _ready_pods(deployments: Sequence[Obj]) -> int:
    """Ready pods of the current pod template (0 while the Deployment has not caught up)."""
    total = 0
    for d in deployments:
        status = d.get("status") or {}
        if _caught_up(d):
            total += min(status.get("updatedReplicas", 0), status.get("readyReplicas", 0))
    return total


def _wanted_replicas(service: GLMService) -> int:
    autoscaling = service.spec.autoscaling
    return autoscaling.min_replicas if autoscaling else service.spec.effective_replicas


def _full_size(service: GLMService, stable_deployments: Sequence[Obj]) -> int:
    """Replicas the new version needs to take all traffic: what the stable pool runs now
    when an HPA sizes it (never less than minReplicas), else the spec's count."""
    autoscaling = service.spec.autoscaling
    if autoscaling is None:
        return max(1, service.spec.effective_replicas)
    live = sum(int(d.get("spec", {}).get("replicas") or 0) for d in stable_deployments)
    return max(1, autoscaling.min_replicas, live)


def _stable_service(service: GLMService, frozen: Mapping[str, Any] | None) -> GLMService:
    """The service as its stable version was rolled out (status.stableSpec)."""
    if not frozen:
        return service
    try:
        spec = GLMServiceSpec.model_validate(frozen)
    except ValidationError:
        return service  # written by another operator version; the current spec is the best guess
    return service.model_copy(update={"spec": spec})


def _spec_snapshot(service: GLMService) -> dict[str, Any]:
    return service.spec.model_dump(by_alias=True, mode="json", exclude_none=True)


def _load_seconds(version: _VersionPlan, service: GLMService, config: OperatorConfig) -> float:
    if version.plan is None or version.model_version is None:
        return 0.0
    return float(startup_seconds(PoolContext(
        service=service, model_version=version.model_version, plan=version.plan,
        config=config, pool=MAIN_POOL, namespace=service.metadata.namespace or "")))


@dataclass
class _Render:
    """What to render of one version."""

    version: _VersionPlan
    service: GLMService  # with the spec this version runs
    replicas: ReplicaPolicy | None = None  # None: from that spec (HPA-managed or fixed)
    autoscaler: bool = True


def _awake(deployments: Sequence[Obj]) -> list[Obj]:
    return [d for d in deployments if int(d.get("spec", {}).get("replicas") or 0) > 0]


def long_context_reading_due(service_body: Mapping[str, Any], live_children: Sequence[Obj],
                             now: datetime) -> bool:
    """Whether the long-context pool's idle deadline has passed: read its activity Lease
    before deciding (the only read a reconcile makes, once per idle period)."""
    spec = (service_body.get("spec") or {}).get("longContext")
    if not spec or not spec.get("enabled"):
        return False
    service = GLMService.model_validate(service_body)
    awake = bool(_awake(_pool_deployments(live_children, None, LONG_CONTEXT_POOL)))
    return needs_reading(service.spec.long_context, awake, service.status.long_context, now)


class _Conditions:
    """The status conditions as this reconcile leaves them (stamped with its generation)."""

    def __init__(self, previous: Sequence[Condition], generation: int | None,
                 now: datetime) -> None:
        self.items: list[Condition] = list(previous)
        self._generation = generation
        self._now = now

    def set(self, type_: str, ok: bool, reason: str, message: str) -> None:
        self.items = set_condition(self.items, type_, ok, reason, message, self._generation,
                                   self._now)

    def remove(self, type_: str) -> None:
        self.items = remove_condition(self.items, type_)


@dataclass
class _Rollout:
    """Where a change of spec.modelVersion stands after this reconcile."""

    decision: rollouts.RolloutDecision | None  # None: no other version is serving
    status: RolloutStatus | None
    history: list[RolloutRecord]
    events: list[tuple[str, str, str]]


@dataclass
class _Serving:
    """Which versions run, at what size, with what share of the traffic."""

    renders: list[_Render]
    routes: list[VersionRoute]
    stable: str | None  # the version serving once this reconcile is applied


def decide_service(
    service_body: Mapping[str, Any],
    model_versions: Mapping[str, Obj],
    live_children: Sequence[Obj],
    config: OperatorConfig,
    profiles: Mapping[str, AcceleratorProfile],
    capabilities: Capabilities,
    now: datetime | None = None,
    analysis: AnalysisResult | None = None,
    long_context_activity: ActivityReading | None = None,
) -> ServiceDecision:
    """The decisions of one reconcile, in order: plan the wanted (and stable) version, step a
    rollout, choose what runs, render it, promote, and report."""
    service = GLMService.model_validate(service_body)
    now = now or datetime.now(UTC)
    previous = service.status
    conditions = _Conditions(previous.conditions, service.metadata.generation, now)
    events: list[tuple[str, str, str]] = []

    wanted = service.spec.model_version
    stable = previous.stable_model_version
    rolling = bool(stable) and stable != wanted
    stable_service = _stable_service(service, previous.stable_spec) if rolling else service
    target = _plan_version(service, wanted, model_versions, profiles)
    old = (_plan_version(stable_service, stable, model_versions, profiles)
           if stable and stable != wanted else None)

    events += _model_conditions(conditions, service, target)
    rollout = _step_rollout(conditions, service, target, live_children, config, now, analysis)
    events += rollout.events
    serving = _what_runs(rollout.decision, service, stable_service, target, old)
    desired, retained = _render_versions(serving, live_children, config, capabilities)
    _scaler_condition(conditions.set, serving.renders, capabilities, config)
    if service.spec.autoscaling is None:
        conditions.remove(C.AUTOSCALING)

    wanted_replicas = _wanted_replicas(service)
    target_deployments = _pool_deployments(live_children, wanted, MAIN_POOL)
    new_stable, promoted = _promotion(rollout.decision, serving.stable, stable, wanted, target,
                                      target_deployments, wanted_replicas)
    events += promoted

    if capabilities.istio:
        desired += _traffic_objects(service, serving.routes, target if target.plan else old,
                                    config)
    _traffic_condition(conditions.set, capabilities.istio, rollout.decision, live_children,
                       stable, wanted)

    main = _pool_deployments(live_children, None, MAIN_POOL)
    replicas = sum(d.get("status", {}).get("replicas", 0) for d in main)
    ready = sum(d.get("status", {}).get("readyReplicas", 0) for d in main)
    _progress_conditions(conditions.set, rollout.decision, stable, new_stable, wanted, target,
                         target_deployments, ready, wanted_replicas)
    if rollout.decision is not None and rollout.decision.status.strategy == "canary":
        conditions.set(C.CANARY_PROGRESSING, *_canary_condition(rollout.decision.status))
    _serving_conditions(conditions, rollout.decision, target, new_stable, replicas, ready,
                        wanted_replicas, stable_missing=bool(retained))

    long_context, scale_to_zero, idle_requeue, idle_events = _long_context_pool(
        service, live_children, config, long_context_activity, now)
    events += idle_events

    if new_stable == wanted:
        stable_spec: dict[str, Any] | None = _spec_snapshot(service)
    else:
        stable_spec = previous.stable_spec or (_spec_snapshot(stable_service) if stable else None)
    shown = target if target.plan is not None else old
    status = GLMServiceStatus(
        observed_generation=service.metadata.generation,
        conditions=conditions.items,
        stable_model_version=new_stable,
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
        rollout_history=rollout.history[:HISTORY_LIMIT] or None,
        long_context=long_context,
    )
    requeues = [t for t in (rollout.decision.requeue_after if rollout.decision else None,
                            idle_requeue) if t is not None]
    return ServiceDecision(desired=desired, status=status, events=events,
                           retained=frozenset(retained),
                           requeue_after=min(requeues) if requeues else None,
                           scale_to_zero=scale_to_zero)


def _model_conditions(conditions: _Conditions, service: GLMService,
                      target: _VersionPlan) -> list[tuple[str, str, str]]:
    """ModelReady, Planned and AutoscalingTargetsValid describe the version the user asked
    for; an infeasible plan is also an Event."""
    events = []
    if target.model_problem:
        conditions.set(C.MODEL_READY, False, *target.model_problem)
    else:
        conditions.set(C.MODEL_READY, True, "ModelVersionReady",
                       f"ModelVersion {target.name!r} is verified and cached")
    if target.plan_problem:
        conditions.set(C.PLANNED, False, *target.plan_problem)
        if target.plan_problem[0] == "Infeasible":
            events.append(("Warning", "Infeasible", target.plan_problem[1]))
    elif target.plan is not None:
        conditions.set(C.PLANNED, True, "Planned", _plan_message(target.plan))
    if service.spec.autoscaling is None:
        conditions.remove(C.AUTOSCALING_TARGETS_VALID)
    elif target.plan is not None:
        conditions.set(C.AUTOSCALING_TARGETS_VALID,
                       *_autoscaling_condition(service.spec.autoscaling, target.plan))
    return events


def _step_rollout(conditions: _Conditions, service: GLMService, target: _VersionPlan,
                  live_children: Sequence[Obj], config: OperatorConfig, now: datetime,
                  analysis: AnalysisResult | None) -> _Rollout:
    """Advance the rollout from the stable version to spec.modelVersion, if they differ; a
    rollout whose target changed (or went back to the stable version) is superseded."""
    previous = service.status
    wanted, stable = service.spec.model_version, previous.stable_model_version
    status = previous.rollout
    history: list[RolloutRecord] = list(previous.rollout_history or [])
    if stable is None or stable == wanted:
        record = rollouts.superseded(
            status if status and status.model_version != stable else None, now,
            f"spec.modelVersion went back to {wanted}")
        if record is not None:
            history.insert(0, record)
            status = None
            if record.strategy == "canary":
                conditions.set(C.CANARY_PROGRESSING, False, "Superseded", str(record.message))
        return _Rollout(None, status, history, [])
    if status is not None and (status.model_version != wanted
                               or status.from_model_version != stable):
        record = rollouts.superseded(status, now, f"spec.modelVersion changed to {wanted}")
        if record is not None:
            history.insert(0, record)
        status = None
    annotations = service.metadata.annotations
    decision = rollouts.advance(rollouts.RolloutInputs(
        policy=service.spec.rollout, stable=stable, target=wanted,
        new=rollouts.NewVersion(
            servable=target.servable,
            problem=(target.model_problem or target.plan_problem or (None, None))[1],
            ready_replicas=_ready_pods(_pool_deployments(live_children, wanted, MAIN_POOL)),
            load_seconds=_load_seconds(target, service, config)),
        full_size=_full_size(service, _pool_deployments(live_children, stable, MAIN_POOL)),
        now=now, previous=status,
        promote_requested=annotations.get(PROMOTE_ANNOTATION) == wanted,
        abort_requested=annotations.get(ABORT_ANNOTATION) == wanted,
        analysis=analysis, drain_seconds=config.rollout.drain_seconds,
        min_deadline_seconds=config.rollout.min_progress_deadline_seconds,
        deadline_margin_seconds=config.rollout.progress_deadline_margin_seconds,
    ))
    if decision.finished is not None:
        history.insert(0, decision.finished)
    return _Rollout(decision, decision.status, history, list(decision.events))


def _what_runs(decision: rollouts.RolloutDecision | None, service: GLMService,
               stable_service: GLMService, target: _VersionPlan,
               old: _VersionPlan | None) -> _Serving:
    wanted, stable = service.spec.model_version, service.status.stable_model_version
    if decision is None:
        return _Serving([_Render(target, service)], [VersionRoute(wanted, 100)], stable)
    if decision.promote:  # as stable: the spec's size, its HPA
        return _Serving([_Render(target, service)], [VersionRoute(wanted, 100)], wanted)
    assert old is not None and stable is not None
    renders: list[_Render] = []
    routes = [VersionRoute(stable, 100 - decision.weight)]
    if decision.new_replicas is not None and target.servable:
        size = decision.new_replicas
        renders.append(_Render(target, service, ReplicaPolicy(fixed=size, initial=size),
                               autoscaler=False))
        routes.append(VersionRoute(wanted, decision.weight))
    renders.append(_Render(old, stable_service))
    return _Serving(renders, routes, stable)


def _render_versions(serving: _Serving, live_children: Sequence[Obj], config: OperatorConfig,
                     capabilities: Capabilities) -> tuple[list[Obj], set[tuple[str, str]]]:
    """The children of every version that runs; a serving version that cannot be rendered
    (its ModelVersion is gone) keeps its live children, retained as they are."""
    desired: list[Obj] = []
    seen: set[tuple[str, str]] = set()
    retained: set[tuple[str, str]] = set()
    for item in serving.renders:
        version = item.version
        if not version.servable:
            if version.name == (serving.stable or ""):
                retained |= _version_children(live_children, version.name)
            continue
        assert version.model_version is not None and version.plan is not None
        inputs = ServiceInputs(service=item.service, model_version=version.model_version,
                               plan=version.plan, long_context_plan=version.long_context_plan,
                               config=config, capabilities=capabilities,
                               main_replicas=item.replicas, with_autoscaler=item.autoscaler,
                               live_groups=_live_groups(live_children, version.name))
        for obj in render_service(inputs):
            key = (obj["kind"], obj["metadata"]["name"])
            if key not in seen:  # Services, RBAC and HPA are shared by every version
                seen.add(key)
                desired.append(obj)
    return desired, retained


def _live_groups(children: Sequence[Obj], version: str) -> int | None:
    """Groups a version's multi-node main pool runs now: its leader set's replicas, which an
    autoscaler sets (None while the set does not exist)."""
    for child in children:
        labels = child.get("metadata", {}).get("labels", {})
        if (child.get("kind") in ("StatefulSet", "LeaderWorkerSet")
                and labels.get(GROUP_ROLE_LABEL) == LEADER
                and labels.get(VERSION_LABEL) == label_value(version)
                and labels.get(POOL_LABEL) == MAIN_POOL):
            replicas = child.get("spec", {}).get("replicas")
            return int(replicas) if replicas is not None else None
    return None


def _promotion(decision: rollouts.RolloutDecision | None, new_stable: str | None,
               stable: str | None, wanted: str, target: _VersionPlan,
               target_deployments: Sequence[Obj], wanted_replicas: int,
               ) -> tuple[str | None, list[tuple[str, str, str]]]:
    """The first version (nothing stable yet) and in-place spec changes are promoted when
    Ready; a rollout promotes by its own decision."""
    if decision is None and stable != wanted and target.servable and any(
            _rolled_out(d, max(wanted_replicas, 1)) for d in target_deployments):
        return wanted, [("Normal", "Promoted", f"ModelVersion {wanted!r} is serving")]
    if decision is not None and decision.promote:
        return new_stable, [("Normal", "Promoted", f"ModelVersion {wanted!r} is serving; "
                                                   f"{stable!r} is being removed")]
    return new_stable, []


def _serving_conditions(conditions: _Conditions, decision: rollouts.RolloutDecision | None,
                        target: _VersionPlan, new_stable: str | None, replicas: int,
                        ready: int, wanted_replicas: int, stable_missing: bool) -> None:
    """Ready and Degraded, from the main pool's pods."""
    in_flight = decision is not None and decision.status.phase not in FINISHED_PHASES
    if ready > 0 and new_stable is not None:
        conditions.set(C.READY, True, "Serving",
                       f"{ready}/{replicas} pods ready, serving {new_stable}")
        if stable_missing:
            conditions.set(C.DEGRADED, True, "StableModelVersionMissing",
                           f"ModelVersion {new_stable!r} is serving but no longer exists (or "
                           "is invalid): its pods keep running as they are and cannot be "
                           "re-created or changed; restore it, or roll out another version")
        else:
            degraded = ready < max(wanted_replicas, 1) and not in_flight
            conditions.set(C.DEGRADED, degraded,
                           "ReplicasUnavailable" if degraded else "AsPlanned",
                           f"{ready} of {max(wanted_replicas, 1)} pods ready")
    else:
        why = (target.plan_problem or target.model_problem
               or ("PodsNotReady", f"0/{max(wanted_replicas, 1)} pods ready"))
        conditions.set(C.READY, False, why[0], why[1])
        conditions.set(C.DEGRADED, False, "NotServing", "nothing is serving yet")


def _long_context_pool(
    service: GLMService, live_children: Sequence[Obj], config: OperatorConfig,
    activity: ActivityReading | None, now: datetime,
) -> tuple[PoolStatus | None, tuple[tuple[str, str], ...], float | None,
           list[tuple[str, str, str]]]:
    """The long-context pool's status, and whether it is idle long enough to go to zero:
    (status, Deployments to scale to zero, when to look again, events)."""
    deployments = _pool_deployments(live_children, None, LONG_CONTEXT_POOL)
    awake = _awake(deployments)
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
        status = PoolStatus(
            replicas=sum(d.get("status", {}).get("replicas", 0) for d in deployments),
            ready_replicas=sum(d.get("status", {}).get("readyReplicas", 0)
                               for d in deployments),
            endpoint=_endpoint(service, config, LONG_CONTEXT_POOL),
            last_activity_time=idle.last_activity,
            scale_to_zero_time=idle.scale_to_zero_time,
        )
    return status, scale_to_zero, idle.requeue_after, events


def _version_children(children: Sequence[Obj], version: str) -> set[tuple[str, str]]:
    return {(c["kind"], c["metadata"]["name"]) for c in children
            if c.get("metadata", {}).get("labels", {}).get(VERSION_LABEL) == label_value(version)}


def _scaler_condition(condition: Any, renders: Sequence[_Render],
                           capabilities: Capabilities, config: OperatorConfig) -> None:
    """Which autoscaler the rendered version has (the stable one during a rollout), or why
    it has none. Left as it was while no version with an autoscaler can be rendered."""
    item = next((r for r in renders if r.autoscaler and r.version.servable
                 and r.service.spec.autoscaling is not None), None)
    if item is None:
        return
    autoscaling = item.service.spec.autoscaling
    assert autoscaling is not None
    assert item.version.plan is not None
    nodes = item.version.plan.request.nodes
    url = config.prometheus.url
    choice = choose_scaler(autoscaling, capabilities.keda, url)
    name = deployment_name(item.service.metadata.name or "", item.version.name, MAIN_POOL)
    unit = f"groups of {nodes} nodes" if nodes > 1 else "replicas"
    what = (f"the main pool ({autoscaling.min_replicas} to {autoscaling.max_replicas} "
            f"{unit}) on {', '.join(target_values(autoscaling))}")
    if choice.scaler == Scaler.HPA:
        condition(C.AUTOSCALING, True, "HPA",
                  f"HPA {name} scales {what} from the custom metrics API ({choice.why})")
    elif choice.scaler == Scaler.KEDA:
        condition(C.AUTOSCALING, True, "KEDA",
                  f"KEDA ScaledObject {name} scales {what} with Prometheus triggers on {url}; "
                  f"KEDA runs it as HPA {keda_hpa_name(name)} ({choice.why})")
    else:
        condition(C.AUTOSCALING, False, "KEDAUnavailable", choice.why)


def _traffic_objects(service: GLMService, routes: list[VersionRoute],
                     planned: _VersionPlan | None, config: OperatorConfig) -> list[Obj]:
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


def _traffic_condition(condition: Any, istio: bool, decision: rollouts.RolloutDecision | None,
                       live_children: Sequence[Obj], stable: str | None, target: str) -> None:
    if istio:
        condition(C.TRAFFIC_SPLIT, True, "Istio",
                  "weights are exact: an Istio VirtualService routes by version; the header "
                  "x-glm-version: <modelversion> pins one")
        return
    if decision is None or decision.weight in (0, 100) or stable is None:
        condition(C.TRAFFIC_SPLIT, False, "ReplicaRatio",
                  "Istio's CRDs are absent: during a rollout traffic splits by ready pods "
                  "through the one Service")
        return
    old_ready = _ready_pods(_pool_deployments(live_children, stable, MAIN_POOL))
    new_ready = _ready_pods(_pool_deployments(live_children, target, MAIN_POOL))
    share = 100 * new_ready / max(1, old_ready + new_ready)
    condition(C.TRAFFIC_SPLIT, False, "ReplicaRatio",
              f"Istio's CRDs are absent: traffic splits by ready pods, {new_ready} of "
              f"{old_ready + new_ready} ({share:.0f}%) to {target} for a {decision.weight}% "
              "step; weights are approximate")


def _progress_conditions(condition: Any, decision: rollouts.RolloutDecision | None,
                         stable: str | None, new_stable: str | None, wanted: str,
                         target: _VersionPlan, target_deployments: Sequence[Obj], ready: int,
                         wanted_replicas: int) -> None:
    if decision is not None and not decision.promote:
        phase = decision.status.phase
        message = decision.status.message or ""
        if phase == RolloutPhase.FAILED:
            condition(C.PROGRESSING, False, "ProgressDeadlineExceeded", message)
        elif phase == RolloutPhase.ROLLED_BACK:
            condition(C.PROGRESSING, False, "RolledBack", message)
        elif phase == RolloutPhase.ABORTED:
            condition(C.PROGRESSING, False, "Aborted", message)
        elif phase == RolloutPhase.PAUSED:
            condition(C.PROGRESSING, True, "Paused", message)
        else:
            reason = "Canary" if decision.status.strategy == "canary" else "RollingOut"
            condition(C.PROGRESSING, True, reason,
                      f"moving from {stable} to {wanted}: {message}")
        return
    if stable != wanted and new_stable != wanted:  # the first version, not Ready yet
        condition(C.PROGRESSING, True, "RollingOut",
                  f"rolling out {wanted}: {ready}/{max(wanted_replicas, 1)} pods ready"
                  if target.servable else
                  f"waiting for ModelVersion {wanted!r} before rolling out")
    elif not all(_rolled_out(d, 0) for d in target_deployments):
        if any(d.get("kind") != "Deployment" for d in target_deployments):
            condition(C.PROGRESSING, True, "GroupsRestartingInPlace",
                      "multi-node groups are being restarted in place, one at a time: a "
                      "group cannot surge, so one group fewer serves meanwhile (a single "
                      "group is down until it has reloaded); a new ModelVersion rolls by "
                      "surge instead")
        else:
            condition(C.PROGRESSING, True, "RollingOut", "pods are being replaced")
    else:
        condition(C.PROGRESSING, False, "Stable", f"{wanted} is rolled out")


def _canary_condition(status: RolloutStatus) -> tuple[bool, str, str]:
    message = status.message or ""
    phase = status.phase
    if phase == RolloutPhase.SUCCEEDED:
        return False, "Succeeded", message
    if phase == RolloutPhase.ROLLED_BACK:
        return False, "RolledBack", message
    if phase == RolloutPhase.ABORTED:
        return False, "Aborted", message
    if phase == RolloutPhase.FAILED:
        return False, "ProgressDeadlineExceeded", message
    if phase == RolloutPhase.PAUSED:
        return True, "Paused", message
    if phase == RolloutPhase.PROMOTING:
        return True, "Promoting", message
    verdict = status.last_analysis.verdict if status.last_analysis else None
    if verdict == "InsufficientTraffic":
        return True, "InsufficientTraffic", message
    if verdict == "Unavailable":
        return True, "AnalysisUnavailable", message
    return True, "Progressing", message


def _endpoint(service: GLMService, config: OperatorConfig, pool: str) -> str:
    return service_url(service_name_for(service, pool), service.metadata.namespace or "",
                       config) + "/v1"
