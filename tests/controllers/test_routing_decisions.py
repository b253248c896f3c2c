"""decide_service with spec.routing.mode EndpointPicker: the routing objects once per service
at the rollout's weights, their pruning when the mode goes back to Service, and the idle
decision of a main pool that scales from zero (decide/main_pool.py on decide/idle.py)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from glm_operator.api import GLMService, PoolStatus
from glm_operator.controllers.apply import Step, plan_writes
from glm_operator.decide import idle
from glm_operator.decide.idle import ActivityReading
from glm_operator.decide.observed import ObservedChildren, ServiceObservation
from glm_operator.decide.service import ServiceDecision, decide_service, main_pool_reading_due
from glm_operator.render.service import Capabilities
from test_service_state import (  # tests/controllers is on sys.path
    CONFIG,
    ISTIO,
    as_ready,
    cond,
    decide,
    deployments,
    dump,
    load,
    ready_mv,
    settled_on,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
IDLE = 120
FROM_ZERO = {"minReplicas": 0, "maxReplicas": 2, "targets": {"queueLength": 2}}
PICKER = {"mode": "EndpointPicker"}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def engines(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engine pools' Deployments (not the router's or the picker's)."""
    return [d for d in deployments(objs) if "glm-operator.dev/version" in d["metadata"]["labels"]]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def routes(objs: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, Any] = json.loads(
        find(objs, "ConfigMap", "glm-cpu-routes")["data"]["routes.json"])
    return table


def picker_service(**spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    mv, svc = load("cpu-llamacpp")
    svc["spec"].pop("replicas", None)
    svc["spec"].update({"routing": dict(PICKER), "autoscaling": dict(FROM_ZERO),
                        "idleSeconds": IDLE, **spec})
    return ready_mv(mv), svc


def decide_with(svc: dict[str, Any], mv: dict[str, Any], live: list[dict[str, Any]],
                now: datetime, reading: ActivityReading | None = None) -> ServiceDecision:
    return decide_service(ServiceObservation(
        service=GLMService.model_validate(svc), model_versions={mv["metadata"]["name"]: mv},
        live=live, capabilities=Capabilities(), now=now, main_pool_activity=reading),
        CONFIG, CONFIG.profiles)


def serving(svc: dict[str, Any], mv: dict[str, Any],
            replicas: int = 1) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """svc serving mv with its main Deployment at `replicas` (status as the operator left
    it, resourceVersion 41)."""
    svc, live = settled_on(svc, mv)
    (main,) = engines(live)
    main["spec"]["replicas"] = replicas
    main["metadata"]["resourceVersion"] = "41"
    if replicas == 0:
        main["status"] = {"observedGeneration": 1, "replicas": 0}
    return svc, live


# --- the idle decision, generalised ------------------------------------------------------------


def test_the_generic_idle_decision_sleeps_only_a_pool_that_may() -> None:
    rules = idle.IdlePolicy(may_sleep=True, idle_seconds=IDLE)
    first = idle.decide_idle(rules, True, None, None, at(0))
    assert (first.sleep, first.scale_to_zero_time, first.requeue_after) == (False, at(IDLE), IDLE)
    first = PoolStatus(last_activity_time=first.last_activity,
                       scale_to_zero_time=first.scale_to_zero_time)
    assert idle.decide_idle(rules, True, first, ActivityReading(at(-5)), at(IDLE)).sleep
    # The control: the same marks under a policy that never sleeps.
    never = idle.IdlePolicy(may_sleep=False, idle_seconds=IDLE)
    assert not idle.needs_reading(never, True, first, at(IDLE))
    assert not idle.decide_idle(never, True, first, ActivityReading(at(-5)), at(IDLE)).sleep


def test_an_idle_main_pool_goes_to_zero_after_idle_seconds() -> None:
    mv, svc = picker_service()
    svc, live = serving(svc, mv)
    name = mv["metadata"]["name"]
    watched = decide_with(svc, mv, live, at(0))
    status = watched.status.main_pool
    assert status is not None and status.model_version == name
    assert status.scale_to_zero_time == at(IDLE) and watched.requeue_after == IDLE
    assert watched.scale_to_zero == ()

    svc["status"] = dump(watched)
    service, observed = GLMService.model_validate(svc), ObservedChildren(live)
    assert main_pool_reading_due(service, observed, at(IDLE - 1)) is None
    lease = main_pool_reading_due(service, observed, at(IDLE))
    assert lease == f"glm-cpu-{name}-activity"
    asleep = decide_with(svc, mv, live, at(IDLE + 1), ActivityReading(at(-30)))
    (main,) = engines(live)
    assert asleep.scale_to_zero == ((main["metadata"]["name"], "41"),)
    assert any(reason == "MainPoolIdle" for _, reason, _ in asleep.events)
    assert cond(asleep, "Ready").reason == "Serving"  # its pods serve until they stop
    # The applied intent never holds the pool's replicas (the HPA and the router do).
    assert "replicas" not in engines(asleep.desired)[0]["spec"]

    # Asleep: nothing to read, Ready stays True (the router wakes it), no requeue.
    svc["status"] = dump(asleep)
    main["spec"]["replicas"] = 0
    main["status"] = {"observedGeneration": 1, "replicas": 0}
    service, observed = GLMService.model_validate(svc), ObservedChildren(live)
    assert main_pool_reading_due(service, observed, at(IDLE * 10)) is None
    later = decide_with(svc, mv, live, at(IDLE * 10))
    assert later.scale_to_zero == () and later.requeue_after is None
    ready = cond(later, "Ready")
    assert (ready.status, ready.reason) == ("True", "ScaledToZero")


def test_a_recent_request_keeps_the_main_pool_awake() -> None:
    mv, svc = picker_service()
    svc, live = serving(svc, mv)
    svc["status"] = dump(decide_with(svc, mv, live, at(0)))
    kept = decide_with(svc, mv, live, at(IDLE), ActivityReading(at(IDLE - 10)))
    assert kept.scale_to_zero == ()
    status = kept.status.main_pool
    assert status is not None and status.scale_to_zero_time == at(2 * IDLE - 10)
    assert cond(kept, "Ready").reason == "Serving"


def test_min_replicas_one_never_watches_the_main_pool() -> None:
    # The control: the same service, minReplicas 1.
    mv, svc = picker_service(autoscaling={**FROM_ZERO, "minReplicas": 1})
    svc, live = serving(svc, mv)
    decision = decide_with(svc, mv, live, at(10 * IDLE), ActivityReading(at(-10 * IDLE)))
    assert decision.status.main_pool is None and decision.scale_to_zero == ()
    assert main_pool_reading_due(GLMService.model_validate(svc), ObservedChildren(live),
                                 at(10 * IDLE)) is None


def test_a_rollout_in_flight_puts_no_version_to_sleep() -> None:
    mv, svc = picker_service()
    v1, v2 = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"]["modelVersion"] = "v1"
    svc, live = settled_on(svc, v1)
    svc["status"] = dump(decide(svc, [v1], live, now=at(0)))
    svc["spec"]["modelVersion"] = "v2"
    moving = decide(svc, [v1, v2], live, now=at(10 * IDLE))
    assert moving.scale_to_zero == ()
    assert len({d["metadata"]["name"] for d in engines(moving.desired)}) == 2


# --- the routing objects, once per service ------------------------------------------------------


def test_a_canary_puts_both_versions_in_one_route_table_and_no_virtual_service() -> None:
    mv, svc = load("cpu-llamacpp")
    v1, v2 = ready_mv(mv, "v1"), ready_mv(mv, "v2")
    svc["spec"].update(modelVersion="v1", replicas=4, routing={"mode": "EndpointPicker"})
    svc, live = settled_on(svc, v1, ISTIO)
    svc["spec"]["modelVersion"] = "v2"
    svc["spec"]["rollout"] = {"strategy": "canary", "steps": [25, 50], "interval": "30s"}
    start = decide(svc, [v1, v2], live, now=at(0), capabilities=ISTIO)
    svc["status"] = dump(start)
    [canary] = [d for d in engines(start.desired)
                if d["metadata"]["labels"]["glm-operator.dev/version"] == "v2"]
    step = decide(svc, [v1, v2], [*live, as_ready(canary, 1)], now=at(1), capabilities=ISTIO)
    table = routes(step.desired)
    assert [(v["name"], v["weight"]) for v in table["versions"]] == [("v1", 75), ("v2", 25)]
    assert {v["deployment"] for v in table["versions"]} == {"glm-cpu-v1", "glm-cpu-v2"}
    assert [v["minReplicas"] for v in table["versions"]] == [4, 1]  # the canary's: its size
    # One of each routing object, the router allowed to wake both versions.
    names = [(o["kind"], o["metadata"]["name"]) for o in step.desired]
    assert len(names) == len(set(names))
    scale = next(r for r in find(step.desired, "Role", "glm-cpu-router")["rules"]
                 if r["resources"] == ["deployments/scale"])
    assert scale["resourceNames"] == ["glm-cpu-v1", "glm-cpu-v2"]
    # The router splits by these weights: Istio's objects would route subsets of routers.
    assert not [o for o in step.desired if o["kind"] in ("VirtualService", "DestinationRule")]
    assert cond(step, "TrafficSplit").reason == "Router"


def test_istio_still_splits_a_service_without_the_router() -> None:
    # The control of the test above: mode Service keeps the VirtualService.
    mv, svc = load("cpu-llamacpp")
    svc["spec"]["replicas"] = 2
    svc, live = settled_on(svc, ready_mv(mv), ISTIO)
    decision = decide(svc, [ready_mv(mv)], live, capabilities=ISTIO)
    assert [o for o in decision.desired if o["kind"] == "VirtualService"]
    assert not [o for o in decision.desired if o["kind"] == "ConfigMap"]


def _owned(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The desired objects as they would be live: owned by the service (uid svc-uid)."""
    live = copy.deepcopy(objs)
    for obj in live:
        obj["metadata"]["ownerReferences"] = [{"uid": "svc-uid", "controller": True}]
    return live


def test_switching_back_to_mode_service_prunes_every_routing_object() -> None:
    mv, svc = load("cpu-llamacpp")
    svc["spec"].update(replicas=2, routing={"mode": "EndpointPicker"})
    svc, _ = settled_on(svc, ready_mv(mv))
    with_router = decide(svc, [ready_mv(mv)], [])
    live = _owned(with_router.desired)
    routing = {(o["kind"], o["metadata"]["name"]) for o in live
               if o["metadata"]["name"].startswith(("glm-cpu-epp", "glm-cpu-router",
                                                    "glm-cpu-routes", "glm-cpu-engines"))}
    assert len(routing) == 13  # render/routing.py's twelve and <svc>-engines

    svc["spec"]["routing"] = {"mode": "Service"}
    without = decide(svc, [ready_mv(mv)], live)
    writes = plan_writes("svc-uid", without.desired, live, without.retained, {})
    deleted = {(w.obj["kind"], w.obj["metadata"]["name"]) for w in writes
               if w.step is Step.DELETE}
    assert deleted == routing
    client = next(w.obj for w in writes if w.step is Step.APPLY
                  and (w.obj["kind"], w.obj["metadata"]["name"]) == ("Service", "glm-cpu"))
    assert client["spec"]["selector"]["glm-operator.dev/pool"] == "main"
    # The control: with the mode unchanged nothing routing is deleted.
    again = decide(svc | {"spec": {**svc["spec"], "routing": {"mode": "EndpointPicker"}}},
                   [ready_mv(mv)], live)
    writes = plan_writes("svc-uid", again.desired, live, again.retained, {})
    assert not [w for w in writes if w.step is Step.DELETE]
