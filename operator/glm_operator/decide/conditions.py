"""Every condition of a GLMService's status, written from what one reconcile decided (pure).

`service_conditions` writes them in one fixed order (a new service lists them in that
order; an existing one keeps its own), stamped with the spec's generation:

    ModelReady, Planned, AutoscalingTargetsValid   the wanted version, as the user asked
    ResolvedRefs, OpenAccess                       the Secrets it names, who it serves
    CanaryProgressing, Progressing                 the rollout (one phase -> reason table)
    Autoscaling, TrafficSplit                      what was rendered, as render chose it
    GatewayAccepted                                the inference gateway's word on its pools
    Ready, Degraded                                the main pool's pods

`Unknown` (None here) says that no answer can be given yet, e.g. Planned while the wanted
ModelVersion is missing: without it no plan can be made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from glm_operator.api import (
    Access,
    GLMService,
    GLMServiceConditionType,
    RolloutPhase,
    RolloutRecord,
    RolloutStatus,
    Scaler,
    set_condition,
)
from glm_operator.api.conditions import Condition, get_condition, remove_condition
from glm_operator.api.glmservice_status import FINISHED_PHASES
from glm_operator.decide.gateway import GatewayFacts, pool_acceptance
from glm_operator.decide.observed import ObservedChildren, rolled_out
from glm_operator.decide.references import References
from glm_operator.decide.rollout import RolloutDecision
from glm_operator.decide.versions import Render, Versions
from glm_operator.planning.planner import Plan
from glm_operator.render.autoscaling import TargetsChoice, target_values
from glm_operator.render.deployment import deployment_name
from glm_operator.render.keda import keda_hpa_name
from glm_operator.render.service import RenderedService, main_service_name
from glm_operator.wellknown import MAIN_POOL

C = GLMServiceConditionType
P = RolloutPhase

# A rollout's phase -> (status, reason) of CanaryProgressing. Progressing reads the rows of
# the phases that stop or hold a rollout; a rollout in flight is "moving" there.
PHASE_REASONS: dict[RolloutPhase, tuple[bool, str]] = {
    P.SUCCEEDED: (False, "Succeeded"),
    P.ROLLED_BACK: (False, "RolledBack"),
    P.ABORTED: (False, "Aborted"),
    P.FAILED: (False, "ProgressDeadlineExceeded"),
    P.PAUSED: (True, "Paused"),
    P.PROMOTING: (True, "Promoting"),
}
_HALTED = frozenset({P.ROLLED_BACK, P.ABORTED, P.FAILED, P.PAUSED})
# The last analysis' verdict -> reason of a canary step that holds on it.
_VERDICT_REASONS = {"InsufficientTraffic": "InsufficientTraffic",
                    "Unavailable": "AnalysisUnavailable"}


class Conditions:
    """The status conditions as this reconcile leaves them (stamped with its generation)."""

    def __init__(self, previous: Sequence[Condition], generation: int | None,
                 now: datetime) -> None:
        self.items: list[Condition] = list(previous)
        self._generation = generation
        self._now = now

    def set(self, type_: str, ok: bool | None, reason: str, message: str) -> None:
        """`ok` None: Unknown."""
        self.items = set_condition(self.items, type_, ok, reason, message, self._generation,
                                   self._now)

    def remove(self, type_: str) -> None:
        self.items = remove_condition(self.items, type_)


@dataclass(frozen=True)
class ConditionInputs:
    """What the conditions describe, as `decide_service` found and decided it."""

    versions: Versions
    observed: ObservedChildren
    decision: RolloutDecision | None  # None: no other version is serving
    superseded: RolloutRecord | None  # a rollout the spec went back from
    # What render chose: the targets of the wanted version's main pool (None without
    # spec.autoscaling or a plan), and the first version rendered with an autoscaler.
    wanted_targets: TargetsChoice | None
    autoscaled: tuple[Render, RenderedService] | None
    istio: bool
    prometheus_url: str | None  # the operator's, which KEDA's triggers query
    stable_after: str | None  # the stable version once this reconcile is applied
    wanted_replicas: int
    stable_missing: bool  # the serving version's ModelVersion is gone (its pods retained)
    references: References  # do the Secrets the spec names exist
    router: bool = False  # spec.routing.mode EndpointPicker: the router splits the versions
    # Scale from zero: the serving version's main pool sleeps (or is put to sleep now).
    main_pool_asleep: bool = False
    gateway: GatewayFacts | None = None  # spec.routing.mode InferenceGateway


def service_conditions(previous: Sequence[Condition], generation: int | None, now: datetime,
                       facts: ConditionInputs) -> list[Condition]:
    conditions = Conditions(previous, generation, now)
    service = facts.versions.service
    _model_conditions(conditions, service, facts)
    refs = facts.references
    # Unknown only for lack of any answer: while the operator's view of Secrets is still
    # listing (a restart), the last answer stands rather than flapping to Unknown and back.
    if refs.ok is not None or get_condition(previous, C.RESOLVED_REFS) is None:
        conditions.set(C.RESOLVED_REFS, refs.ok, refs.reason, refs.message)
    conditions.set(C.OPEN_ACCESS, *_access_condition(service))
    if facts.superseded is not None and facts.superseded.strategy == "canary":
        conditions.set(C.CANARY_PROGRESSING, False, "Superseded", str(facts.superseded.message))
    _scaler_condition(conditions, facts.autoscaled, facts.prometheus_url)
    if service.spec.autoscaling is None:
        conditions.remove(C.AUTOSCALING)
    _traffic_condition(conditions, facts)
    _gateway_condition(conditions, facts)
    _progress_condition(conditions, facts)
    if facts.decision is not None and facts.decision.status.strategy == "canary":
        conditions.set(C.CANARY_PROGRESSING, *_canary_condition(facts.decision.status))
    _serving_conditions(conditions, facts)
    return conditions.items


def _model_conditions(conditions: Conditions, service: GLMService,
                      facts: ConditionInputs) -> None:
    """ModelReady, Planned and AutoscalingTargetsValid describe the version the user asked
    for."""
    wanted = facts.versions.wanted
    if wanted.model_problem:
        conditions.set(C.MODEL_READY, False, *wanted.model_problem)
    else:
        conditions.set(C.MODEL_READY, True, "ModelVersionReady",
                       f"ModelVersion {wanted.name!r} is verified and cached")
    if wanted.plan_problem:
        conditions.set(C.PLANNED, False, *wanted.plan_problem)
    elif wanted.plan is not None:
        conditions.set(C.PLANNED, True, "Planned", _plan_message(wanted.plan))
    elif wanted.model_problem:  # no ModelVersion to plan from (missing, invalid, mismatched)
        reason, message = wanted.model_problem
        conditions.set(C.PLANNED, None, reason, f"no plan can be made: {message}")
    autoscaling = service.spec.autoscaling
    if autoscaling is None:
        conditions.remove(C.AUTOSCALING_TARGETS_VALID)
    elif facts.wanted_targets is not None:
        conditions.set(C.AUTOSCALING_TARGETS_VALID,
                       *_autoscaling_condition(facts.wanted_targets))
    elif (problem := wanted.problem) is not None:
        conditions.set(C.AUTOSCALING_TARGETS_VALID, None, "NotPlanned",
                       f"no plan to judge the targets against: {problem[1]}")


def _access_condition(service: GLMService) -> tuple[bool, str, str]:
    """OpenAccess: True (a warning) while anyone who reaches the Service is served."""
    gateway, name = service.spec.gateway, service.metadata.name or ""
    access = gateway.effective_access
    if access == Access.API_KEYS:
        return (False, "APIKeys", f"every /v1 request needs a key from Secret "
                f"{gateway.api_keys_secret}")
    fix = ("name a Secret of API keys in spec.gateway.apiKeysSecret to require a key")
    if access == Access.OPEN:
        return (True, "AccessOpen", f"spec.gateway.access is Open: the endpoint serves "
                f"anyone who reaches Service {main_service_name(name)} without a key; {fix}")
    return (True, "AccessNotChosen", f"the endpoint serves anyone who reaches Service "
            f"{main_service_name(name)} without a key: it was created before "
            "spec.gateway.access existed, and the API server refuses its next change until "
            f"spec.gateway sets apiKeysSecret or access: Open; {fix}")


def _plan_message(p: Plan) -> str:
    gib = 2**30
    m = p.memory
    nodes = (f"{p.request.nodes} nodes (one group of pods per replica) x "
             if p.request.nodes > 1 else "")
    return (f"fits on {nodes}{p.request.count} x {p.profile.name}: weights "
            f"{m.weights / gib:.1f} GiB per device + "
            f"KV {m.kv / gib:.1f} GiB + buffers {(m.compute + m.overhead) / gib:.1f} GiB of "
            f"{m.available / gib:.1f} GiB, {m.headroom / gib:.1f} GiB headroom")


def _autoscaling_condition(targets: TargetsChoice) -> tuple[bool, str, str]:
    """Whether every autoscaling target can act under the plan (a device-memory target at or
    below the planned steady figure cannot, nor a percentage the HPA's tolerance puts out of
    reach; render leaves them out)."""
    check, metrics, failed = targets.check, targets.metric_names, targets.failed
    if failed:
        rest = (f" The HPA scales on {', '.join(metrics)}." if metrics else
                " No other target is set: no HPA is rendered and the main pool keeps its "
                "size.")
        return False, failed[0].reason, " ".join(c.message() for c in failed) + rest
    message = f"the HPA scales on {', '.join(metrics)}"
    if check is not None:
        message += f"; {check.message()}"
    return True, "TargetsUsable", message


def _scaler_condition(conditions: Conditions, autoscaled: tuple[Render, RenderedService] | None,
                      prometheus_url: str | None) -> None:
    """Which autoscaler the rendered version has (the stable one during a rollout), or why
    it has none. Left as it was while no version with an autoscaler is rendered."""
    if autoscaled is None:
        return
    item, rendered = autoscaled
    autoscaling, choice, plan = item.service.spec.autoscaling, rendered.scaler, item.version.plan
    assert autoscaling is not None and choice is not None and plan is not None
    nodes = plan.request.nodes
    name = deployment_name(item.service.metadata.name or "", item.version.name, MAIN_POOL)
    unit = f"groups of {nodes} nodes" if nodes > 1 else "replicas"
    what = (f"the main pool ({autoscaling.min_replicas} to {autoscaling.max_replicas} "
            f"{unit}) on {', '.join(target_values(autoscaling))}")
    if choice.scaler == Scaler.HPA:
        conditions.set(C.AUTOSCALING, True, "HPA",
                       f"HPA {name} scales {what} from the custom metrics API ({choice.why})")
    elif choice.scaler == Scaler.KEDA:
        conditions.set(C.AUTOSCALING, True, "KEDA",
                       f"KEDA ScaledObject {name} scales {what} with Prometheus triggers on "
                       f"{prometheus_url}; KEDA runs it as HPA {keda_hpa_name(name)} "
                       f"({choice.why})")
    else:
        conditions.set(C.AUTOSCALING, False, "KEDAUnavailable", choice.why)


def _traffic_condition(conditions: Conditions, facts: ConditionInputs) -> None:
    decision, stable = facts.decision, facts.versions.stable_name
    wanted = facts.versions.wanted.name
    gateway = facts.gateway
    if gateway is not None and gateway.missing_crds:
        conditions.set(C.TRAFFIC_SPLIT, False, "InferenceGatewayCRDsMissing",
                       f"spec.routing.mode InferenceGateway needs "
                       f"{', '.join(gateway.missing_crds)}, not served in this cluster: "
                       "install the Gateway API Inference Extension's CRDs and Gateway "
                       "API's HTTPRoute (or choose another routing.mode); meanwhile no "
                       "InferencePool or HTTPRoute is written and traffic splits by ready "
                       "pods through the one Service")
        return
    if gateway is not None:
        conditions.set(C.TRAFFIC_SPLIT, True, "InferenceGateway",
                       f"weights are exact: HTTPRoute {service_name(facts)} on Gateway "
                       f"{gateway.gateway} splits between one InferencePool per version by "
                       "the rollout's weights; the header x-glm-version: <modelversion> "
                       "pins one (no VirtualService is written: the route is the one "
                       "writer of the weights)")
        return
    if facts.router:
        conditions.set(C.TRAFFIC_SPLIT, True, "Router",
                       "weights are exact: the router splits requests between versions by "
                       "its route table; the header x-glm-version: <modelversion> pins one")
        return
    if facts.istio:
        conditions.set(C.TRAFFIC_SPLIT, True, "Istio",
                       "weights are exact: an Istio VirtualService routes by version; the "
                       "header x-glm-version: <modelversion> pins one")
        return
    if decision is None or decision.weight in (0, 100) or stable is None:
        conditions.set(C.TRAFFIC_SPLIT, False, "ReplicaRatio",
                       "Istio's CRDs are absent: during a rollout traffic splits by ready pods "
                       "through the one Service")
        return
    stable_ready = facts.observed.ready_pods(stable)
    wanted_ready = facts.observed.ready_pods(wanted)
    share = 100 * wanted_ready / max(1, stable_ready + wanted_ready)
    conditions.set(C.TRAFFIC_SPLIT, False, "ReplicaRatio",
                   f"Istio's CRDs are absent: traffic splits by ready pods, {wanted_ready} of "
                   f"{stable_ready + wanted_ready} ({share:.0f}%) to {wanted} for a "
                   f"{decision.weight}% step; weights are approximate")


def service_name(facts: ConditionInputs) -> str:
    return main_service_name(facts.versions.service.metadata.name or "")


def _gateway_condition(conditions: Conditions, facts: ConditionInputs) -> None:
    """GatewayAccepted, only in mode InferenceGateway with its CRDs served."""
    gateway = facts.gateway
    if gateway is None or gateway.missing_crds:
        conditions.remove(C.GATEWAY_ACCEPTED)
        return
    conditions.set(C.GATEWAY_ACCEPTED, *pool_acceptance(gateway))


def _progress_condition(conditions: Conditions, facts: ConditionInputs) -> None:
    decision, versions = facts.decision, facts.versions
    stable, wanted = versions.stable_name, versions.wanted.name
    if decision is not None and not decision.promote:
        phase = decision.status.phase
        message = decision.status.message or ""
        if phase in _HALTED:
            conditions.set(C.PROGRESSING, *PHASE_REASONS[phase], message)
        else:
            reason = "Canary" if decision.status.strategy == "canary" else "RollingOut"
            conditions.set(C.PROGRESSING, True, reason,
                           f"moving from {stable} to {wanted}: {message}")
        return
    wanted_workloads = facts.observed.workloads(MAIN_POOL, wanted)
    if stable != wanted and facts.stable_after != wanted:  # the first version, not Ready yet
        _, ready = facts.observed.replicas(MAIN_POOL)
        conditions.set(C.PROGRESSING, True, "RollingOut",
                       f"rolling out {wanted}: {ready}/{max(facts.wanted_replicas, 1)} pods "
                       "ready" if versions.wanted.servable else
                       f"waiting for ModelVersion {wanted!r} before rolling out")
    elif not all(rolled_out(w, 0) for w in wanted_workloads):
        if any(w.get("kind") != "Deployment" for w in wanted_workloads):
            conditions.set(C.PROGRESSING, True, "GroupsRestartingInPlace",
                           "multi-node groups are being restarted in place, one at a time: a "
                           "group cannot surge, so one group fewer serves meanwhile (a single "
                           "group is down until it has reloaded); a new ModelVersion rolls by "
                           "surge instead")
        else:
            conditions.set(C.PROGRESSING, True, "RollingOut", "pods are being replaced")
    else:
        conditions.set(C.PROGRESSING, False, "Stable", f"{wanted} is rolled out")


def _canary_condition(status: RolloutStatus) -> tuple[bool, str, str]:
    message = status.message or ""
    if status.phase in PHASE_REASONS:
        return (*PHASE_REASONS[status.phase], message)
    verdict = status.last_analysis.verdict if status.last_analysis else None
    return True, _VERDICT_REASONS.get(verdict or "", "Progressing"), message


def _serving_conditions(conditions: Conditions, facts: ConditionInputs) -> None:
    """Ready and Degraded, from the main pool's pods."""
    decision, stable_after = facts.decision, facts.stable_after
    replicas, ready = facts.observed.replicas(MAIN_POOL)
    wanted_replicas = max(facts.wanted_replicas, 1)
    in_flight = decision is not None and decision.status.phase not in FINISHED_PHASES
    if ready > 0 and stable_after is not None:
        conditions.set(C.READY, True, "Serving",
                       f"{ready}/{replicas} pods ready, serving {stable_after}")
        if facts.stable_missing:
            conditions.set(C.DEGRADED, True, "StableModelVersionMissing",
                           f"ModelVersion {stable_after!r} is serving but no longer exists (or "
                           "is invalid): its pods keep running as they are and cannot be "
                           "re-created or changed; restore it, or roll out another version")
        else:
            degraded = ready < wanted_replicas and not in_flight
            conditions.set(C.DEGRADED, degraded,
                           "ReplicasUnavailable" if degraded else "AsPlanned",
                           f"{ready} of {wanted_replicas} pods ready")
    elif facts.main_pool_asleep and stable_after is not None and not in_flight:
        idle_seconds = facts.versions.service.spec.idle_seconds
        conditions.set(C.READY, True, "ScaledToZero",
                       f"{stable_after} is scaled to zero after {idle_seconds} s "
                       "without a request: the router wakes it on the next one, which waits "
                       "while the model loads")
        conditions.set(C.DEGRADED, False, "ScaledToZero", "no pod runs, as planned")
    else:
        why = (facts.versions.wanted.problem or facts.references.problem
               or ("PodsNotReady", f"0/{wanted_replicas} pods ready"))
        conditions.set(C.READY, False, why[0], why[1])
        conditions.set(C.DEGRADED, False, "NotServing", "nothing is serving yet")
