"""Which model versions a GLMService runs, each with its plan (pure).

Two names, used everywhere in decide/:
  wanted  spec.modelVersion, planned with the current spec;
  stable  status.stableModelVersion, the version serving now, planned with
          status.stableSpec (the spec it was rolled out with), so a rollout never restarts
          the stable pods.
When they differ, `decide/rollout.py` moves traffic from stable to wanted. A version whose
ModelVersion is gone cannot be planned or rendered: its live pods are kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from glm_operator.api import ADMITTED, GLMService, ModelVersion
from glm_operator.api.glmservice import GLMServiceSpec
from glm_operator.config import OperatorConfig
from glm_operator.decide.advice import infeasible_message
from glm_operator.decide.cache_placement import cache_placement_problem
from glm_operator.decide.image_architecture import image_architecture_problem
from glm_operator.decide.rollout import RolloutDecision
from glm_operator.planning.accelerators import AcceleratorProfile
from glm_operator.planning.from_api import ModelFactsUnknown, plan_request_for
from glm_operator.planning.planner import Plan, PlanInputError, plan
from glm_operator.render.pod import ReplicaPolicy
from glm_operator.render.traffic import VersionRoute
from glm_operator.wellknown import LONG_CONTEXT_POOL, MAIN_POOL

Obj = dict[str, Any]
Problem = tuple[str, str]  # (reason, message)


@dataclass(frozen=True)
class VersionPlan:
    """One ModelVersion's readiness and plan, or why it cannot be served."""

    name: str
    model_version: ModelVersion | None
    plan: Plan | None
    long_context_plan: Plan | None
    model_problem: Problem | None  # ModelReady=False
    plan_problem: Problem | None  # Planned=False

    @property
    def servable(self) -> bool:
        return self.model_problem is None and self.plan_problem is None

    @property
    def problem(self) -> Problem | None:
        """Why it cannot be served, the plan's problem first."""
        return self.plan_problem or self.model_problem


@dataclass(frozen=True)
class Versions:
    """The versions of one reconcile: wanted, and stable when it is another version."""

    wanted: VersionPlan
    service: GLMService  # as the spec says now
    stable_name: str | None  # status.stableModelVersion (may be the wanted one)
    stable: VersionPlan | None  # planned only while it differs from wanted
    stable_service: GLMService  # the service as its stable version was rolled out

    @property
    def rolling(self) -> bool:
        return self.stable_name is not None and self.stable_name != self.wanted.name

    @property
    def planned(self) -> VersionPlan | None:
        """The version whose plan the status shows: wanted once it has one, else stable."""
        return self.wanted if self.wanted.plan is not None else self.stable


def plan_versions(service: GLMService, model_versions: Mapping[str, Obj],
                  profiles: Mapping[str, AcceleratorProfile],
                  namespace_model_versions: Mapping[str, Obj] | None = None, *,
                  config: OperatorConfig) -> Versions:
    """`namespace_model_versions`: the namespace's ModelVersions, observed only when the
    wanted version's plan does not fit (`siblings_needed`; its advice may name another of
    them); `config` says which architectures the images have builds for."""
    wanted = service.spec.model_version
    stable = service.status.stable_model_version
    rolling = bool(stable) and stable != wanted
    stable_service = _stable_service(service, service.status.stable_spec) if rolling else service
    return Versions(
        wanted=_plan_version(service, wanted, model_versions, profiles, config,
                             namespace_model_versions),
        service=service,
        stable_name=stable,
        stable=(_plan_version(stable_service, stable, model_versions, profiles, config)
                if stable and rolling else None),
        stable_service=stable_service,
    )


def siblings_needed(service: GLMService, model_versions: Mapping[str, Obj],
                    profiles: Mapping[str, AcceleratorProfile], config: OperatorConfig) -> bool:
    """Whether the wanted version's plan does not fit: its Infeasible message then weighs
    the namespace's other ModelVersions, which a reconcile observes only then (reading them
    walks the whole index)."""
    wanted = _plan_version(service, service.spec.model_version, model_versions, profiles,
                           config, advise=False)
    return wanted.plan_problem is not None and wanted.plan_problem[0] == "Infeasible"


def _plan_version(service: GLMService, name: str, model_versions: Mapping[str, Obj],
                  profiles: Mapping[str, AcceleratorProfile], config: OperatorConfig,
                  namespace_model_versions: Mapping[str, Obj] | None = None,
                  advise: bool = True) -> VersionPlan:
    """`advise` False: an Infeasible plan without its message (no alternatives planned)."""
    body = model_versions.get(name)
    if body is None:
        problem = ("ModelVersionNotFound",
                   f"ModelVersion {name!r} does not exist in namespace "
                   f"{service.metadata.namespace}; waiting for it")
        return VersionPlan(name, None, None, None, problem, None)
    try:
        mv = ModelVersion.model_validate(body)
    except ValidationError as exc:
        problem = ("ModelVersionInvalid", f"ModelVersion {name!r} is invalid: {exc}")
        return VersionPlan(name, None, None, None, problem, None)
    engine = service.spec.engine_name
    fmt = mv.spec.format
    if engine and (engine, fmt) in {("vllm", "gguf"), ("llamacpp", "safetensors")}:
        fix = "llamacpp" if fmt == "gguf" else "vllm"
        problem = ("EngineFormatMismatch",
                   f"engine {engine} cannot serve the {fmt} ModelVersion {name!r}: "
                   f"set spec.engine to {{{fix}: {{}}}} or point spec.modelVersion at a "
                   f"{'safetensors' if engine == 'vllm' else 'gguf'} ModelVersion")
        return VersionPlan(name, mv, None, None, problem, None)
    model_problem = _model_problem(name, mv)
    try:
        main = plan(plan_request_for(service, mv), profiles)
        lc_spec = service.spec.long_context
        long_plan = (plan(plan_request_for(service, mv, long_context=True), profiles)
                     if lc_spec is not None and lc_spec.enabled else None)
    except ModelFactsUnknown as exc:
        return VersionPlan(name, mv, None, None, model_problem, ("ModelFactsUnknown", str(exc)))
    except (PlanInputError, KeyError, ValueError) as exc:
        return VersionPlan(name, mv, None, None, model_problem, ("InvalidPlanInput", str(exc)))
    plan_problem = None
    for pool, candidate in ((MAIN_POOL, main), (LONG_CONTEXT_POOL, long_plan)):
        if candidate is not None and not candidate.feasible:
            if not advise:
                return VersionPlan(name, mv, main, long_plan, model_problem, ("Infeasible", ""))
            siblings = (namespace_model_versions if namespace_model_versions is not None
                        else model_versions)
            plan_problem = ("Infeasible", infeasible_message(
                pool, candidate, service, mv, _parsed(siblings), profiles, config))
            break
    if plan_problem is None:
        plan_problem = cache_placement_problem(service, mv, main, long_plan)
    if plan_problem is None:
        plan_problem = image_architecture_problem(service, main, long_plan, config)
    return VersionPlan(name, mv, main, long_plan, model_problem, plan_problem)


def _model_problem(name: str, mv: ModelVersion) -> Problem | None:
    if mv.status.phase == "Failed":
        failing = (next((c for c in mv.status.conditions
                         if c.type == "Ready" and c.status == "False"), None)
                   or next((c for c in mv.status.conditions if c.status == "False"), None))
        return ("ModelVersionFailed",
                f"ModelVersion {name!r} failed"
                + (f" ({failing.reason}: {failing.message})" if failing else "")
                + ": fix its source, or point spec.modelVersion at another version")
    if mv.status.phase != "Ready":
        progress = mv.status.progress
        return ("ModelVersionNotReady",
                f"ModelVersion {name!r} is {mv.status.phase}"
                + (f" ({progress.summary})" if progress is not None else "")
                + ": waiting for the fetch Job to download and verify it")
    return None


def _parsed(model_versions: Mapping[str, Obj]) -> list[ModelVersion]:
    parsed = []
    for body in model_versions.values():
        try:
            parsed.append(ModelVersion.model_validate(body))
        except ValidationError:
            continue
    return parsed


def _stable_service(service: GLMService, frozen: Mapping[str, Any] | None) -> GLMService:
    """The service as its stable version was rolled out (status.stableSpec)."""
    if not frozen:
        return service
    try:
        # Recorded by an earlier reconcile from an admitted spec, perhaps before newer rules.
        spec = GLMServiceSpec.model_validate(frozen, context={ADMITTED: True})
    except ValidationError:
        return service  # written by another operator version; the current spec is the best guess
    return service.model_copy(update={"spec": spec})


def spec_snapshot(service: GLMService) -> dict[str, Any]:
    """The spec as status.stableSpec records it."""
    return service.spec.model_dump(by_alias=True, mode="json", exclude_none=True)


# --- which versions run -------------------------------------------------------------------------


@dataclass
class Render:
    """What to render of one version."""

    version: VersionPlan
    service: GLMService  # with the spec this version runs
    replicas: ReplicaPolicy | None = None  # None: from that spec (HPA-managed or fixed)
    autoscaler: bool = True


@dataclass
class Serving:
    """Which versions run, at what size, with what share of the traffic."""

    renders: list[Render]
    routes: list[VersionRoute]
    stable: str | None  # the stable version once this reconcile is applied


def what_runs(decision: RolloutDecision | None, versions: Versions) -> Serving:
    """The wanted version alone (nothing else serves, or the rollout promotes it), else the
    stable version beside the wanted one at the size and weight the rollout gives it."""
    wanted, service = versions.wanted, versions.service
    if decision is None:
        return Serving([Render(wanted, service)], [VersionRoute(wanted.name, 100)],
                       versions.stable_name)
    if decision.promote:  # as stable: the spec's size, its HPA
        return Serving([Render(wanted, service)], [VersionRoute(wanted.name, 100)],
                       wanted.name)
    stable, stable_name = versions.stable, versions.stable_name
    assert stable is not None and stable_name is not None
    renders: list[Render] = []
    routes = [VersionRoute(stable_name, 100 - decision.weight)]
    if decision.new_replicas is not None and wanted.servable:
        size = decision.new_replicas
        renders.append(Render(wanted, service, ReplicaPolicy(fixed=size, initial=size),
                              autoscaler=False))
        routes.append(VersionRoute(wanted.name, decision.weight))
    renders.append(Render(stable, versions.stable_service))
    return Serving(renders, routes, stable_name)
