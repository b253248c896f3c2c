"""decide_service: the pure heart of the GLMService reconcile."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from glm_operator.api import AnalysisResult, GLMService, RolloutStatus
from glm_operator.config import OperatorConfig
from glm_operator.decide.long_context import ActivityReading
from glm_operator.decide.observed import ObservedChildren, ServiceObservation
from glm_operator.decide.service import (
    ServiceDecision,
    canary_weight,
    decide_service,
    long_context_reading_due,
)
from glm_operator.render.deployment import INITIAL_REPLICAS_ANNOTATION
from glm_operator.render.service import Capabilities

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIG = OperatorConfig()


def load(example: str) -> tuple[dict[str, Any], dict[str, Any]]:
    mv = yaml.safe_load((EXAMPLES / example / "modelversion.yaml").read_text())
    svc = yaml.safe_load((EXAMPLES / example / "glmservice.yaml").read_text())
    for obj, uid in ((mv, "mv-uid"), (svc, "svc-uid")):
        obj["metadata"].update(namespace="ns", uid=uid, generation=1, resourceVersion="1")
    return mv, svc


def ready_mv(mv: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    mv = copy.deepcopy(mv)
    if name:
        mv["metadata"]["name"] = name
    mv["status"] = {"phase": "Ready"}
    return mv


def decide(svc: dict[str, Any], mvs: list[dict[str, Any]],
           live: list[dict[str, Any]] | None = None, now: datetime | None = None,
           capabilities: Capabilities | None = None,
           analysis: AnalysisResult | None = None) -> ServiceDecision:
    return decide_service(ServiceObservation(
        service=GLMService.model_validate(svc),
        model_versions={m["metadata"]["name"]: m for m in mvs}, live=live or [],
        capabilities=capabilities or Capabilities(), now=now or datetime.now(UTC),
        analysis=analysis), CONFIG, CONFIG.profiles)


def dump(decision: ServiceDecision) -> dict[str, Any]:
    return decision.status.model_dump(by_alias=True, mode="json", exclude_none=True)


def cond(decision: Any, type_: str) -> Any:
    return next(c for c in decision.status.conditions if c.type == type_)


def deployments(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "Deployment"]


def as_ready(deployment: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    live = copy.deepcopy(deployment)
    live["metadata"]["generation"] = 1
    live["status"] = {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
                      "readyReplicas": replicas}
    return live


def test_missing_model_version_creates_nothing_and_says_so() -> None:
    _, svc = load("cpu-llamacpp")
    decision = decide(svc, [])
    assert decision.desired == []
    model = cond(decision, "ModelReady")
    assert model.status == "False" and model.reason == "ModelVersionNotFound"
    assert cond(decision, "Ready").status == "False"


def test_without_its_model_version_the_plan_and_targets_are_unknown() -> None:
    _, svc = load("cpu-llamacpp")
    svc["spec"].pop("replicas", None)
    svc["spec"]["autoscaling"] = {"maxReplicas": 4, "targets": {"queueLength": 2}}
    decision = decide(svc, [])
    planned = cond(decision, "Planned")
    assert (planned.status, planned.reason) == ("Unknown", "ModelVersionNotFound")
    assert planned.message.startswith("no plan can be made: ")
    targets = cond(decision, "AutoscalingTargetsValid")
    assert (targets.status, targets.reason) == ("Unknown", "NotPlanned")


def test_model_not_fetched_yet_waits() -> None:
    mv, svc = load("cpu-llamacpp")
    decision = decide(svc, [mv])
    assert deployments(decision.desired) == []
    assert cond(decision, "ModelReady").reason == "ModelVersionNotReady"
    assert cond(decision, "Planned").status == "True"  # planned from the declared facts


def test_ready_model_renders_pods_and_becomes_ready_when_they_are() -> None:
    mv, svc = load("cpu-llamacpp")
    first = decide(svc, [ready_mv(mv)])
    [deployment] = deployments(first.desired)
    assert cond(first, "Ready").status == "False"
    assert first.status.stable_model_version is None

    second = decide(svc, [ready_mv(mv)], [as_ready(deployment)])
    assert second.status.stable_model_version == mv["metadata"]["name"]
    assert cond(second, "Ready").status == "True"
    assert second.status.ready_replicas == 1
    assert second.status.plan is not None and second.status.plan.llamacpp is not None
    assert second.status.plan.llamacpp.parallel == 2
    assert any(e[1] == "Promoted" for e in second.events)


def test_infeasible_plan_names_numbers_and_alternatives_and_renders_nothing() -> None:
    mv, svc = load("nvidia-a10-llamacpp")
    svc["spec"].update(contextLength=131072, concurrency=16)
    decision = decide(svc, [ready_mv(mv)])
    planned = cond(decision, "Planned")
    assert planned.status == "False" and planned.reason == "Infeasible"
    assert "GiB" in planned.message and "fits with" in planned.message
    assert decision.desired == []


def test_engine_format_mismatch_is_a_model_condition() -> None:
    mv, svc = load("cpu-llamacpp")
    svc["spec"]["engine"] = {"vllm": {}}
    svc["spec"]["accelerator"] = {"profile": "nvidia-a100-80gb", "count": 1}
    decision = decide(svc, [ready_mv(mv)])
    model = cond(decision, "ModelReady")
    assert model.reason == "EngineFormatMismatch" and "llamacpp" in model.message
    assert decision.desired == []


def test_surge_keeps_the_old_version_until_the_new_one_is_ready() -> None:
    mv, svc = load("cpu-llamacpp")
    old, new = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"]["modelVersion"] = "v1"
    first = decide(svc, [old])
    live = [as_ready(d) for d in deployments(first.desired)]
    settled = decide(svc, [old], live)
    assert settled.status.stable_model_version == "v1"

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    svc["spec"]["modelVersion"] = "v2"
    svc["status"] = dump(settled)
    moving = decide(svc, [old, new], live, now=t0)
    names = {d["metadata"]["labels"]["glm-operator.dev/version"]
             for d in deployments(moving.desired)}
    assert names == {"v1", "v2"}
    assert moving.status.stable_model_version == "v1"
    assert cond(moving, "Progressing").status == "True"
    assert cond(moving, "Ready").status == "True"  # v1 keeps serving

    new_live = live + [as_ready(d) for d in deployments(moving.desired)
                       if d["metadata"]["labels"]["glm-operator.dev/version"] == "v2"]
    svc["status"] = dump(moving)
    switched = decide(svc, [old, new], new_live, now=t0 + timedelta(seconds=5))
    assert switched.status.rollout is not None and switched.status.rollout.weight == 100
    assert switched.status.stable_model_version == "v1"  # the old pods drain first
    assert {"v1", "v2"} == {d["metadata"]["labels"]["glm-operator.dev/version"]
                            for d in deployments(switched.desired)}
    svc["status"] = dump(switched)
    done = decide(svc, [old, new], new_live,
                  now=t0 + timedelta(seconds=5 + CONFIG.rollout.drain_seconds))
    assert done.status.stable_model_version == "v2"
    assert {d["metadata"]["labels"]["glm-operator.dev/version"]
            for d in deployments(done.desired)} == {"v2"}
    assert done.status.rollout is not None and done.status.rollout.phase == "Succeeded"
    assert [e[1] for e in done.events].count("Promoted") == 1  # announced once
    assert done.status.canary_weight is None  # a surge has no canary


def test_the_canary_weight_is_shown_only_while_a_canary_runs() -> None:
    running = RolloutStatus(strategy="canary", model_version="v2", phase="Progressing",
                            weight=25)
    assert canary_weight(running) == 25
    for phase in ("Succeeded", "RolledBack", "Aborted", "Failed"):
        assert canary_weight(running.model_copy(update={"phase": phase, "weight": 100})) is None
    assert canary_weight(running.model_copy(update={"strategy": "surge"})) is None
    assert canary_weight(None) is None


def test_unchanged_inputs_give_an_identical_status() -> None:
    mv, svc = load("cpu-llamacpp")
    first = decide(svc, [ready_mv(mv)])
    svc["status"] = first.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    again = decide(svc, [ready_mv(mv)])
    assert again.status.model_dump(by_alias=True, mode="json", exclude_none=True) == svc["status"]


# --- rollouts through decide_service ------------------------------------------------------------

ISTIO = Capabilities(istio=True)


def settled_on(svc: dict[str, Any], mv: dict[str, Any],
               capabilities: Capabilities | None = None) -> tuple[dict[str, Any],
                                                                  list[dict[str, Any]]]:
    """svc serving mv: its status as the operator left it, and the live Deployments."""
    first = decide(svc, [mv], capabilities=capabilities)
    live = [as_ready(d, d["spec"].get("replicas", 1)) for d in deployments(first.desired)]
    svc["status"] = dump(decide(svc, [mv], live, capabilities=capabilities))
    assert svc["status"]["stableModelVersion"] == mv["metadata"]["name"]
    return svc, live


def by_version(objs: list[dict[str, Any]], version: str) -> list[dict[str, Any]]:
    return [o for o in deployments(objs)
            if o["metadata"]["labels"]["glm-operator.dev/version"] == version]


def weights(objs: list[dict[str, Any]]) -> dict[str, int]:
    [vs] = [o for o in objs if o["kind"] == "VirtualService"]
    return {r["destination"]["subset"]: r["weight"] for r in vs["spec"]["http"][-1]["route"]}


def test_canary_with_istio_moves_weights_step_by_step_and_rolls_back() -> None:
    mv, svc = load("cpu-llamacpp")
    v1, v2 = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"].update(modelVersion="v1", replicas=4)
    svc, live = settled_on(svc, v1, ISTIO)
    svc["spec"]["modelVersion"] = "v2"
    svc["spec"]["rollout"] = {"strategy": "canary", "steps": [25, 50], "interval": "30s",
                              "analysis": {"failureThreshold": 1}}
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    start = decide(svc, [v1, v2], live, now=t0, capabilities=ISTIO)
    [canary] = by_version(start.desired, "v2")
    assert canary["spec"]["replicas"] == 1  # 25 % of 4
    assert by_version(start.desired, "v1")[0]["spec"]["replicas"] == 4  # stable untouched
    assert weights(start.desired) == {"v1": 100, "v2": 0}
    vs = next(o for o in start.desired if o["kind"] == "VirtualService")
    assert vs["spec"]["http"][0]["match"] == [{"headers": {"x-glm-version": {"exact": "v1"}}}]
    dr = next(o for o in start.desired if o["kind"] == "DestinationRule")
    assert {s["name"] for s in dr["spec"]["subsets"]} == {"v1", "v2"}
    assert dr["spec"]["trafficPolicy"]["outlierDetection"]["consecutive5xxErrors"] == 3

    svc["status"] = dump(start)
    live2 = [*live, as_ready(canary, 1)]
    step1 = decide(svc, [v1, v2], live2, now=t0 + timedelta(seconds=1), capabilities=ISTIO)
    assert weights(step1.desired) == {"v1": 75, "v2": 25}
    assert cond(step1, "CanaryProgressing").status == "True"
    assert cond(step1, "TrafficSplit").reason == "Istio"
    assert step1.requeue_after == 30
    # kubectl's columns: the stable version's pods, the canary's beside them
    assert (step1.status.replicas, step1.status.ready_replicas) == (4, 4)
    assert (step1.status.canary_weight, step1.status.canary_ready_replicas) == (25, 1)

    svc["status"] = dump(step1)
    bad = AnalysisResult(time=t0, verdict="Failed", message="error rate 40% > 1%",
                         failed_gates=["error rate 40% > 1%"])
    rolled = decide(svc, [v1, v2], live2, now=t0 + timedelta(seconds=32), capabilities=ISTIO,
                    analysis=bad)
    assert weights(rolled.desired) == {"v1": 100}
    assert by_version(rolled.desired, "v2") == []
    canary_cond = cond(rolled, "CanaryProgressing")
    assert (canary_cond.status, canary_cond.reason) == ("False", "RolledBack")
    assert "error rate 40% > 1%" in canary_cond.message
    assert rolled.status.stable_model_version == "v1"
    assert rolled.status.canary_weight is None and rolled.status.canary_ready_replicas is None
    assert rolled.status.rollout_history and rolled.status.rollout_history[0].result == "RolledBack"
    assert ("Warning", "RolledBack") in [e[:2] for e in rolled.events]


def test_version_and_context_change_together_never_touch_the_stable_pods() -> None:
    mv, svc = load("cpu-llamacpp")
    v1, v2 = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"]["modelVersion"] = "v1"
    svc, live = settled_on(svc, v1)
    before = by_version(decide(svc, [v1], live).desired, "v1")[0]

    svc["spec"]["modelVersion"] = "v2"
    svc["spec"]["contextLength"] = svc["spec"].get("contextLength", 8192) // 2
    moving = decide(svc, [v1, v2], live)
    assert by_version(moving.desired, "v1") == [before]  # same pods, same plan
    assert moving.status.plan is not None
    assert moving.status.plan.context_length == svc["spec"]["contextLength"]  # v2's plan
    new_hash, old_hash = (by_version(moving.desired, v)[0]["spec"]["template"]["metadata"]
                          ["annotations"]["glm-operator.dev/plan-hash"] for v in ("v2", "v1"))
    assert new_hash != old_hash


def test_stable_model_version_deleted_keeps_its_pods_and_says_so() -> None:
    mv, svc = load("cpu-llamacpp")
    v1, v2 = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"]["modelVersion"] = "v1"
    svc, live = settled_on(svc, v1)
    svc["spec"]["modelVersion"] = "v2"
    moving = decide(svc, [v2], live)  # v1 is gone
    assert {("Deployment", d["metadata"]["name"]) for d in live} <= moving.retained
    assert cond(moving, "Degraded").reason == "StableModelVersionMissing"
    assert cond(moving, "Ready").status == "True"
    # also when nothing is rolling: the pods of a deleted serving version are never pruned
    svc["spec"]["modelVersion"] = "v1"
    alone = decide(svc, [], live)
    assert {("Deployment", d["metadata"]["name"]) for d in live} <= alone.retained


def test_autoscaled_surge_starts_at_the_stable_pools_current_size() -> None:
    mv, svc = load("cpu-llamacpp")
    v1, v2 = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"].pop("replicas", None)
    svc["spec"].update(modelVersion="v1",
                       autoscaling={"minReplicas": 1, "maxReplicas": 8,
                                    "targets": {"queueLength": 2}})
    svc, live = settled_on(svc, v1)
    live = [dict(d, spec={**d["spec"], "replicas": 5}) for d in live]  # the HPA scaled it
    svc["spec"]["modelVersion"] = "v2"
    moving = decide(svc, [v1, v2], live)
    [new] = by_version(moving.desired, "v2")
    assert new["spec"]["replicas"] == 5
    hpas = [o for o in moving.desired if o["kind"] == "HorizontalPodAutoscaler"]
    assert [h["spec"]["scaleTargetRef"]["name"] for h in hpas] == [
        by_version(moving.desired, "v1")[0]["metadata"]["name"]]


def test_without_istio_the_split_is_by_ready_pods_and_a_condition_says_so() -> None:
    mv, svc = load("cpu-llamacpp")
    v1, v2 = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"].update(modelVersion="v1", replicas=3)
    svc, live = settled_on(svc, v1)
    svc["spec"]["modelVersion"] = "v2"
    svc["spec"]["rollout"] = {"strategy": "canary", "steps": [10]}
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    start = decide(svc, [v1, v2], live, now=t0)
    assert not [o for o in start.desired if o["kind"] == "VirtualService"]
    svc["status"] = dump(start)
    live2 = [*live, as_ready(by_version(start.desired, "v2")[0], 1)]
    step = decide(svc, [v1, v2], live2, now=t0 + timedelta(seconds=1))
    split = cond(step, "TrafficSplit")
    assert (split.status, split.reason) == ("False", "ReplicaRatio")
    assert "1 of 4 (25%)" in split.message


def test_going_back_to_the_stable_version_ends_the_canary_as_superseded() -> None:
    mv, svc = load("cpu-llamacpp")
    v1, v2 = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"].update(modelVersion="v1", replicas=2)
    svc, live = settled_on(svc, v1, ISTIO)
    svc["spec"]["modelVersion"] = "v2"
    svc["spec"]["rollout"] = {"strategy": "canary"}
    svc["status"] = dump(decide(svc, [v1, v2], live, capabilities=ISTIO))
    svc["spec"]["modelVersion"] = "v1"
    back = decide(svc, [v1, v2], live, capabilities=ISTIO)
    assert back.status.rollout is None
    assert back.status.rollout_history and back.status.rollout_history[0].result == "Superseded"
    assert (cond(back, "CanaryProgressing").status, cond(back, "CanaryProgressing").reason) == (
        "False", "Superseded")
    assert by_version(back.desired, "v2") == [] and weights(back.desired) == {"v1": 100}


def test_a_failed_model_version_says_why_instead_of_waiting() -> None:
    mv, svc = load("cpu-llamacpp")
    mv["status"] = {"phase": "Failed", "conditions": [
        {"type": "Verified", "status": "False", "reason": "ChecksumMismatch",
         "message": "sha256 ab.. != cd..", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    decision = decide(svc, [mv])
    model = cond(decision, "ModelReady")
    assert model.reason == "ModelVersionFailed"
    assert "ChecksumMismatch: sha256 ab.. != cd.." in model.message
    assert "waiting" not in model.message


def test_a_device_memory_target_below_the_plan_is_left_out_with_the_numbers() -> None:
    mv, svc = load("nvidia-a100-80gb-vllm-tp2")
    svc["spec"].pop("replicas", None)
    svc["spec"]["autoscaling"] = {"maxReplicas": 4, "targets": {
        "acceleratorMemoryUtilization": 80, "queueLength": 2}}
    decision = decide(svc, [ready_mv(mv)])
    check = cond(decision, "AutoscalingTargetsValid")
    assert (check.status, check.reason) == ("False", "MemoryTargetBelowPlan")
    assert "80 %" in check.message and "90.0 %" in check.message
    assert "kvCacheUtilization" in check.message
    assert "The HPA scales on glm_gateway_requests_queued." in check.message
    [hpa] = [o for o in decision.desired if o["kind"] == "HorizontalPodAutoscaler"]
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == [
        "glm_gateway_requests_queued"]

    # Above the plan, but out of the HPA's reach: nothing above vLLM's 90 % can scale.
    svc["spec"]["autoscaling"]["targets"]["acceleratorMemoryUtilization"] = 95
    svc["status"] = dump(decision)
    decision = decide(svc, [ready_mv(mv)])
    unreachable = cond(decision, "AutoscalingTargetsValid")
    assert (unreachable.status, unreachable.reason) == ("False", "MemoryTargetUnreachable")
    assert "out of the HPA's reach" in unreachable.message

    # A KV cache target above 90 % as well: both are named, device memory's reason first.
    svc["spec"]["autoscaling"]["targets"]["kvCacheUtilization"] = 95
    svc["status"] = dump(decision)
    decision = decide(svc, [ready_mv(mv)])
    both = cond(decision, "AutoscalingTargetsValid")
    assert (both.status, both.reason) == ("False", "MemoryTargetUnreachable")
    assert "kvCacheUtilization 95 %" in both.message
    assert "The HPA scales on glm_gateway_requests_queued." in both.message

    svc["spec"]["autoscaling"]["targets"] = {"kvCacheUtilization": 90, "queueLength": 2}
    svc["status"] = dump(decision)
    kept = cond(decide(svc, [ready_mv(mv)]), "AutoscalingTargetsValid")
    assert (kept.status, kept.reason) == ("True", "TargetsUsable")
    assert "glm_kv_cache_utilization_percent" in kept.message

    svc["spec"].pop("autoscaling")
    svc["spec"]["replicas"] = 1
    fixed = decide(svc, [ready_mv(mv)])
    assert "AutoscalingTargetsValid" not in {c.type for c in fixed.status.conditions}


# --- the long-context pool's idle decision, carried out ----------------------------------------

LC_T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def lc_at(seconds: float) -> datetime:
    return LC_T0 + timedelta(seconds=seconds)


def _service_with_pool(idle: int = 60) -> tuple[dict[str, Any], dict[str, Any]]:
    mv, svc = load("cpu-llamacpp")
    svc["spec"]["longContext"] = {"contextLength": 16384, "idleSeconds": idle}
    return ready_mv(mv), svc


def _live(svc: dict[str, Any], mv: dict[str, Any], lc_replicas: int) -> list[dict[str, Any]]:
    main, lc = deployments(decide(svc, [mv]).desired)
    live_lc = as_ready(lc, lc_replicas)
    live_lc["spec"]["replicas"] = lc_replicas
    live_lc["metadata"]["resourceVersion"] = "77"
    return [as_ready(main), live_lc]


def test_decide_service_sleeps_an_idle_pool_through_its_scale() -> None:
    mv, svc = _service_with_pool()
    live = _live(svc, mv, 2)
    woken = decide(svc, [mv], live, now=lc_at(0))
    status = woken.status.long_context
    assert status is not None and status.scale_to_zero_time == lc_at(60)
    assert woken.scale_to_zero == () and woken.requeue_after == 60

    svc = copy.deepcopy(svc)
    svc["status"] = woken.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    service, observed = GLMService.model_validate(svc), ObservedChildren(live)
    assert not long_context_reading_due(service, observed, lc_at(59))
    assert long_context_reading_due(service, observed, lc_at(60))
    lc_name = deployments(live)[1]["metadata"]["name"]
    idle = decide_service_with(svc, mv, live, lc_at(61), ActivityReading(lc_at(-10)))
    assert idle.scale_to_zero == ((lc_name, "77"),)
    assert any(reason == "LongContextIdle" for _, reason, _ in idle.events)
    asleep = idle.status.long_context
    assert asleep is not None and asleep.scale_to_zero_time is None
    # The operator's applied intent never holds the pool's replicas.
    (lc,) = [d for d in deployments(idle.desired) if d["metadata"]["name"] == lc_name]
    assert "replicas" not in lc["spec"]


def test_decide_service_keeps_a_pool_with_recent_activity() -> None:
    mv, svc = _service_with_pool()
    live = _live(svc, mv, 1)
    svc["status"] = {"longContext": {"lastActivityTime": "2026-11-30T12:00:00Z",
                                     "scaleToZeroTime": "2026-11-30T12:01:00Z"}}
    decision = decide_service_with(svc, mv, live, lc_at(61), ActivityReading(lc_at(50)))
    assert decision.scale_to_zero == ()
    status = decision.status.long_context
    assert status is not None and status.scale_to_zero_time == lc_at(110)
    assert decision.requeue_after == 49


def decide_service_with(svc: dict[str, Any], mv: dict[str, Any], live: list[dict[str, Any]],
                        now: datetime, reading: ActivityReading) -> Any:
    return decide_service(ServiceObservation(
        service=GLMService.model_validate(svc), model_versions={mv["metadata"]["name"]: mv},
        live=live, capabilities=Capabilities(), now=now, long_context_activity=reading),
        CONFIG, CONFIG.profiles)


def statefulsets(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "StatefulSet"]


def test_multi_node_replicas_are_groups_counted_by_their_leaders() -> None:
    mv, svc = load("nvidia-h100-multinode-vllm")
    svc["spec"]["replicas"] = 2
    first = decide(svc, [ready_mv(mv)])
    assert deployments(first.desired) == []
    leader, *workers = statefulsets(first.desired)
    assert leader["spec"]["replicas"] == 2 and len(workers) == 2
    assert {o["kind"] for o in first.desired} >= {"Service", "NetworkPolicy"}
    planned = cond(first, "Planned")
    assert planned.status == "True" and "2 nodes (one group of pods per replica)" in planned.message
    assert first.status.plan is not None and first.status.plan.nodes == 2

    # One group ready (its leader Ready: the engine loaded across both nodes) is not enough.
    half = decide(svc, [ready_mv(mv)], [as_ready(leader, 1), *workers])
    assert half.status.stable_model_version is None
    # Workers' StatefulSets never count as replicas: only the leaders' does.
    ready = decide(svc, [ready_mv(mv)], [as_ready(leader, 2), *(as_ready(w) for w in workers)])
    assert ready.status.stable_model_version == mv["metadata"]["name"]
    assert (ready.status.replicas, ready.status.ready_replicas) == (2, 2)
    assert cond(ready, "Ready").status == "True"


def autoscaled_groups() -> tuple[dict[str, Any], dict[str, Any]]:
    mv, svc = load("nvidia-h100-multinode-vllm")
    del svc["spec"]["replicas"]
    svc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 3,
                                  "targets": {"queueLength": 4}}
    return mv, svc


def test_autoscaled_groups_are_sized_by_an_hpa_on_the_leader_set() -> None:
    """The HPA adds and removes whole groups through the leader StatefulSet's scale
    subresource (whose selector picks the leaders, where the gateways run); the set's size is
    left out of the intent after it is created with minReplicas."""
    mv, svc = autoscaled_groups()
    decision = decide(svc, [ready_mv(mv)])
    (hpa,) = [o for o in decision.desired if o["kind"] == "HorizontalPodAutoscaler"]
    leader, *workers = statefulsets(decision.desired)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                             "name": leader["metadata"]["name"]}
    assert "replicas" not in leader["spec"]
    assert leader["metadata"]["annotations"][INITIAL_REPLICAS_ANNOTATION] == "1"
    assert len(workers) == 1
    autoscaling = cond(decision, "Autoscaling")
    assert autoscaling.status == "True" and autoscaling.reason == "HPA"
    assert "1 to 3 groups of 2 nodes" in autoscaling.message


def test_the_workers_follow_the_groups_the_autoscaler_runs() -> None:
    mv, svc = autoscaled_groups()
    leader = statefulsets(decide(svc, [ready_mv(mv)]).desired)[0]
    for live_groups, expected in ((3, 3), (2, 2), (1, 1), (7, 3)):  # 7: clamped to max
        scaled = copy.deepcopy(leader)
        scaled["spec"]["replicas"] = live_groups
        _, *workers = statefulsets(decide(svc, [ready_mv(mv)], [scaled]).desired)
        assert [w["metadata"]["name"] for w in workers] == [
            f"{leader['metadata']['name']}-{g}" for g in range(expected)]


def test_autoscaled_leader_worker_set_is_the_hpa_target() -> None:
    mv, svc = autoscaled_groups()
    decision = decide(svc, [ready_mv(mv)], capabilities=Capabilities(leader_worker_set=True))
    (hpa,) = [o for o in decision.desired if o["kind"] == "HorizontalPodAutoscaler"]
    (lws,) = [o for o in decision.desired if o["kind"] == "LeaderWorkerSet"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1",
                                             "kind": "LeaderWorkerSet",
                                             "name": lws["metadata"]["name"]}
    assert "replicas" not in lws["spec"]


def test_multi_node_service_is_a_leader_worker_set_when_its_crd_is_served() -> None:
    mv, svc = load("nvidia-h100-multinode-vllm")
    decision = decide(svc, [ready_mv(mv)], capabilities=Capabilities(leader_worker_set=True))
    assert statefulsets(decision.desired) == []
    (lws,) = [o for o in decision.desired if o["kind"] == "LeaderWorkerSet"]
    live = copy.deepcopy(lws)
    live["metadata"]["generation"] = 3
    # The status LeaderWorkerSet v0.7.0's controller writes (seen on the local control plane):
    # no observedGeneration, anywhere.
    live["status"] = {"replicas": 1, "updatedReplicas": 1, "hpaPodSelector": "x",
                      "conditions": [{"type": "Available", "status": "True",
                                      "reason": "AllGroupsReady"}]}
    lws_served = Capabilities(leader_worker_set=True)
    starting = decide(svc, [ready_mv(mv)], [live], capabilities=lws_served)
    assert starting.status.stable_model_version is None
    assert cond(starting, "Ready").status == "False"
    live["status"]["readyReplicas"] = 1
    ready = decide(svc, [ready_mv(mv)], [live], capabilities=lws_served)
    assert ready.status.stable_model_version == mv["metadata"]["name"]
    assert cond(ready, "Ready").status == "True"


def test_a_plan_change_under_the_same_version_says_groups_restart_in_place() -> None:
    mv, svc = load("nvidia-h100-multinode-vllm")
    first = decide(svc, [ready_mv(mv)])
    leader = statefulsets(first.desired)[0]
    live = [as_ready(leader)]
    settled = decide(svc, [ready_mv(mv)], live)
    assert cond(settled, "Progressing").reason == "Stable"
    live[0]["metadata"]["generation"] = 2  # the new plan's template, not rolled out yet
    svc["status"] = dump(settled)
    rolling = decide(svc, [ready_mv(mv)], live)
    progressing = cond(rolling, "Progressing")
    assert (progressing.status, progressing.reason) == ("True", "GroupsRestartingInPlace")
    assert "cannot surge" in progressing.message
