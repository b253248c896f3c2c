"""What a GLMService should look like right now: desired children and status (pure).

observe (the handler) -> decide (here) -> apply (the handler). Given the service, the
ModelVersions it names, and the live children, `decide_service` returns the children the
operator must hold and the status to report. No I/O, so every branch (missing model,
infeasible plan, a surge from one version to the next) is unit-testable.

Rollout, surge strategy: while `spec.modelVersion` differs from `status.stableModelVersion`,
both versions are rendered; the old one keeps serving until the new one's main pool is fully
ready, then `stableModelVersion` moves and the old Deployment is no longer desired (pruned).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from glm_operator.api import (
    GLMService,
    GLMServiceConditionType,
    GLMServiceStatus,
    ModelVersion,
    PoolStatus,
    set_condition,
)
from glm_operator.api.conditions import Condition
from glm_operator.config import OperatorConfig
from glm_operator.planning.accelerators import AcceleratorProfile
from glm_operator.planning.from_api import ModelFactsUnknown, plan_request_for
from glm_operator.planning.planner import Plan, PlanInputError, plan
from glm_operator.render.names import POOL_LABEL, VERSION_LABEL, label_value
from glm_operator.render.service import (
    Capabilities,
    ServiceInputs,
    plan_summary,
    render_service,
    service_name_for,
    service_url,
)

Obj = dict[str, Any]
C = GLMServiceConditionType
MAIN_POOL = "main"
LONG_CONTEXT_POOL = "long-context"


@dataclass(frozen=True)
class ServiceDecision:
    desired: list[Obj]
    status: GLMServiceStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


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
    if mv.status.phase != "Ready":
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
    return (f"fits on {p.request.count} x {p.profile.name}: weights {m.weights / gib:.1f} GiB + "
            f"KV {m.kv / gib:.1f} GiB + buffers {(m.compute + m.overhead) / gib:.1f} GiB of "
            f"{m.available / gib:.1f} GiB, {m.headroom / gib:.1f} GiB headroom")


def _pool_deployments(children: Sequence[Obj], version: str | None, pool: str) -> list[Obj]:
    return [
        c for c in children
        if c.get("kind") == "Deployment"
        and c.get("metadata", {}).get("labels", {}).get(POOL_LABEL) == pool
        and (version is None
             or c["metadata"]["labels"].get(VERSION_LABEL) == label_value(version))
    ]


def _rolled_out(deployment: Obj, wanted: int) -> bool:
    """The Deployment has caught up with its spec and has `wanted` ready pods."""
    meta, status = deployment.get("metadata", {}), deployment.get("status", {})
    return bool(
        status.get("observedGeneration", 0) >= meta.get("generation", 1)
        and status.get("updatedReplicas", 0) >= wanted
        and status.get("readyReplicas", 0) >= wanted
        and status.get("replicas", 0) == status.get("updatedReplicas", 0)
    )


def _wanted_replicas(service: GLMService) -> int:
    autoscaling = service.spec.autoscaling
    return autoscaling.min_replicas if autoscaling else service.spec.effective_replicas


def decide_service(
    service_body: Mapping[str, Any],
    model_versions: Mapping[str, Obj],
    live_children: Sequence[Obj],
    config: OperatorConfig,
    profiles: Mapping[str, AcceleratorProfile],
    capabilities: Capabilities,
    now: datetime | None = None,
) -> ServiceDecision:
    service = GLMService.model_validate(service_body)
    generation = service.metadata.generation
    previous = service.status
    conditions: list[Condition] = list(previous.conditions)
    events: list[tuple[str, str, str]] = []

    def condition(type_: str, ok: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, type_, ok, reason, message, generation, now)

    wanted_version = service.spec.model_version
    stable = previous.stable_model_version
    target = _plan_version(service, wanted_version, model_versions, profiles)
    old = (_plan_version(service, stable, model_versions, profiles)
           if stable and stable != wanted_version else None)

    # ModelReady / Planned describe the version the user asked for.
    if target.model_problem:
        condition(C.MODEL_READY, False, *target.model_problem)
    else:
        condition(C.MODEL_READY, True, "ModelVersionReady",
                  f"ModelVersion {wanted_version!r} is verified and cached")
    if target.plan_problem:
        condition(C.PLANNED, False, *target.plan_problem)
        if target.plan_problem[0] == "Infeasible":
            events.append(("Warning", "Infeasible", target.plan_problem[1]))
    elif target.plan is not None:
        condition(C.PLANNED, True, "Planned", _plan_message(target.plan))

    serving = [v for v in (target, old) if v is not None and v.servable]
    desired: list[Obj] = []
    seen: set[tuple[str, str]] = set()
    for version in serving:
        assert version.model_version is not None and version.plan is not None
        inputs = ServiceInputs(service=service, model_version=version.model_version,
                               plan=version.plan, long_context_plan=version.long_context_plan,
                               config=config, capabilities=capabilities)
        for obj in render_service(inputs):
            key = (obj["kind"], obj["metadata"]["name"])
            if key not in seen:  # Services, RBAC and HPA are shared by every version
                seen.add(key)
                desired.append(obj)

    # Surge: promote the target once its main pool is fully ready.
    wanted_replicas = _wanted_replicas(service)
    target_deployments = _pool_deployments(live_children, wanted_version, MAIN_POOL)
    target_ready = target.servable and any(
        _rolled_out(d, max(wanted_replicas, 1)) for d in target_deployments)
    new_stable = stable
    if target_ready and stable != wanted_version:
        new_stable = wanted_version
        events.append(("Normal", "Promoted",
                       f"ModelVersion {wanted_version!r} is serving"
                       + (f"; {stable!r} is being removed" if stable else "")))
        # The old version is not desired any more: drop its pods from the intent.
        desired = [o for o in desired
                   if o.get("metadata", {}).get("labels", {}).get(VERSION_LABEL)
                   in (None, label_value(wanted_version))]

    main = _pool_deployments(live_children, None, MAIN_POOL)
    replicas = sum(d.get("status", {}).get("replicas", 0) for d in main)
    ready = sum(d.get("status", {}).get("readyReplicas", 0) for d in main)
    progressing = stable != wanted_version and new_stable != wanted_version
    if progressing:
        condition(C.PROGRESSING, True, "RollingOut",
                  f"moving from {stable or 'nothing'} to {wanted_version}: "
                  f"{ready}/{max(wanted_replicas, 1)} pods of {wanted_version} ready"
                  if target.servable else
                  f"waiting for ModelVersion {wanted_version!r} before rolling out")
    elif not all(_rolled_out(d, 0) for d in target_deployments):
        condition(C.PROGRESSING, True, "RollingOut", "pods are being replaced")
    else:
        condition(C.PROGRESSING, False, "Stable", f"{wanted_version} is rolled out")

    if ready > 0 and new_stable is not None:
        condition(C.READY, True, "Serving", f"{ready}/{replicas} pods ready, serving {new_stable}")
        degraded = ready < max(wanted_replicas, 1) and not progressing
        condition(C.DEGRADED, degraded, "ReplicasUnavailable" if degraded else "AsPlanned",
                  f"{ready} of {max(wanted_replicas, 1)} pods ready")
    else:
        why = (target.plan_problem or target.model_problem
               or ("PodsNotReady", f"0/{max(wanted_replicas, 1)} pods ready"))
        condition(C.READY, False, why[0], why[1])
        condition(C.DEGRADED, False, "NotServing", "nothing is serving yet")

    long_context = None
    lc_deployments = _pool_deployments(live_children, None, LONG_CONTEXT_POOL)
    if service.spec.long_context and service.spec.long_context.enabled:
        long_context = PoolStatus(
            replicas=sum(d.get("status", {}).get("replicas", 0) for d in lc_deployments),
            ready_replicas=sum(d.get("status", {}).get("readyReplicas", 0)
                               for d in lc_deployments),
            endpoint=_endpoint(service, config, LONG_CONTEXT_POOL),
        )

    shown = target if target.plan is not None else old
    status = GLMServiceStatus(
        observed_generation=generation,
        conditions=conditions,
        stable_model_version=new_stable,
        replicas=replicas,
        ready_replicas=ready,
        selector=(f"glm-operator.dev/service={label_value(service.metadata.name or '')},"
                  f"{POOL_LABEL}={MAIN_POOL}"),
        endpoint=_endpoint(service, config, MAIN_POOL),
        plan=(plan_summary(shown.plan, service, shown.name, shown.model_version)
              if shown is not None and shown.plan is not None
              and shown.model_version is not None else previous.plan),
        canary=previous.canary,
        long_context=long_context,
    )
    return ServiceDecision(desired=desired, status=status, events=events)


def _endpoint(service: GLMService, config: OperatorConfig, pool: str) -> str:
    return service_url(service_name_for(service, pool), service.metadata.namespace or "",
                       config) + "/v1"
