"""decide_service with KEDA: which scaler object is desired, across switches and rollouts,
and the Autoscaling condition that says why."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from glm_operator.api import GLMService
from glm_operator.config import OperatorConfig
from glm_operator.decide.observed import ServiceObservation
from glm_operator.decide.service import ServiceDecision, decide_service
from glm_operator.render.service import Capabilities

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
URL = "http://prometheus.monitoring:9090"
CONFIG = OperatorConfig(prometheus={"url": URL})
KEDA = Capabilities(keda=True)
SCALERS = ("HorizontalPodAutoscaler", "ScaledObject")


def service(scaler: str = "Auto") -> tuple[dict[str, Any], dict[str, Any]]:
    mv = yaml.safe_load((EXAMPLES / "cpu-llamacpp" / "modelversion.yaml").read_text())
    svc = yaml.safe_load((EXAMPLES / "cpu-llamacpp" / "glmservice.yaml").read_text())
    for obj, uid in ((mv, "mv-uid"), (svc, "svc-uid")):
        obj["metadata"].update(namespace="ns", uid=uid, generation=1, resourceVersion="1")
    mv["status"] = {"phase": "Ready"}
    svc["spec"].pop("replicas", None)
    svc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4, "scaler": scaler,
                                  "targets": {"queueLength": 2, "requestsPerSecond": 1.5}}
    return mv, svc


def named(mv: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(mv)
    out["metadata"]["name"] = name
    return out


def decide(svc: dict[str, Any], mvs: list[dict[str, Any]], live: list[dict[str, Any]],
           capabilities: Capabilities = KEDA, config: OperatorConfig = CONFIG,
           now: datetime | None = None) -> ServiceDecision:
    return decide_service(ServiceObservation(
        service=GLMService.model_validate(svc),
        model_versions={m["metadata"]["name"]: m for m in mvs}, live=live,
        capabilities=capabilities, now=now), config, config.profiles)


def scalers(decision: ServiceDecision) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in decision.desired if o["kind"] in SCALERS]


def autoscaling(decision: ServiceDecision) -> Any:
    return next((c for c in decision.status.conditions if c.type == "Autoscaling"), None)


def as_ready(deployment: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    live = copy.deepcopy(deployment)
    live["metadata"]["generation"] = 1
    live["spec"]["replicas"] = replicas
    live["status"] = {"observedGeneration": 1, "replicas": replicas,
                      "updatedReplicas": replicas, "readyReplicas": replicas}
    return live


def settle(svc: dict[str, Any], mv: dict[str, Any]) -> list[dict[str, Any]]:
    first = decide(svc, [mv], [])
    live = [as_ready(o) for o in first.desired if o["kind"] == "Deployment"]
    svc["status"] = decide(svc, [mv], live).status.model_dump(by_alias=True, mode="json",
                                                              exclude_none=True)
    return live


def test_auto_with_keda_and_prometheus_desires_a_scaled_object_and_no_hpa() -> None:
    mv, svc = service()
    decision = decide(svc, [mv], [])
    name = "glm-cpu-" + mv["metadata"]["name"]
    assert scalers(decision) == [("ScaledObject", name)]
    cond = autoscaling(decision)
    assert (cond.status, cond.reason) == ("True", "KEDA")
    assert f"keda-hpa-{name}" in cond.message and URL in cond.message
    assert "queueLength" in cond.message and "1 to 4 replicas" in cond.message


def test_switching_the_scaler_swaps_one_object_for_the_other() -> None:
    mv, svc = service("HPA")
    name = "glm-cpu-" + mv["metadata"]["name"]
    assert scalers(decide(svc, [mv], [])) == [("HorizontalPodAutoscaler", name)]
    assert autoscaling(decide(svc, [mv], [])).reason == "HPA"
    svc["spec"]["autoscaling"]["scaler"] = "KEDA"
    assert scalers(decide(svc, [mv], [])) == [("ScaledObject", name)]
    svc["spec"]["autoscaling"]["scaler"] = "Auto"
    without_crd = decide(svc, [mv], [], capabilities=Capabilities())
    assert scalers(without_crd) == [("HorizontalPodAutoscaler", name)]
    assert "Auto: KEDA's ScaledObject CRD" in autoscaling(without_crd).message


def test_keda_asked_for_without_keda_is_a_false_condition_with_the_fix() -> None:
    mv, svc = service("KEDA")
    decision = decide(svc, [mv], [], capabilities=Capabilities(), config=OperatorConfig())
    assert scalers(decision) == []
    cond = autoscaling(decision)
    assert (cond.status, cond.reason) == ("False", "KEDAUnavailable")
    assert "install KEDA" in cond.message and "prometheus.url" in cond.message
    assert "keeps its current replicas" in cond.message


def test_the_condition_goes_with_spec_autoscaling() -> None:
    mv, svc = service()
    svc["status"] = decide(svc, [mv], []).status.model_dump(by_alias=True, mode="json",
                                                           exclude_none=True)
    del svc["spec"]["autoscaling"]
    svc["spec"]["replicas"] = 1
    assert autoscaling(decide(svc, [mv], [])) is None


def test_a_rollout_moves_the_scaled_object_as_it_moves_the_hpa() -> None:
    mv, svc = service()
    v1, v2 = named(mv, "v1"), named(mv, "v2")
    svc["spec"]["modelVersion"] = "v1"
    live = settle(svc, v1)
    svc["spec"]["modelVersion"] = "v2"
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    moving = decide(svc, [v1, v2], live, now=t0)
    # The rollout sizes the new version; the stable one keeps its ScaledObject.
    assert scalers(moving) == [("ScaledObject", "glm-cpu-v1")]
    new = next(o for o in moving.desired if o["kind"] == "Deployment"
               and o["metadata"]["name"] == "glm-cpu-v2")
    assert new["spec"]["replicas"] == 1
    svc["status"] = moving.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    live2 = [*live, as_ready(new)]
    switched = decide(svc, [v1, v2], live2, now=t0 + timedelta(seconds=5))
    svc["status"] = switched.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    done = decide(svc, [v1, v2], live2,
                  now=t0 + timedelta(seconds=5 + CONFIG.rollout.drain_seconds))
    assert done.status.stable_model_version == "v2"
    assert scalers(done) == [("ScaledObject", "glm-cpu-v2")]
    # handed over like the HPA's: the promoted Deployment leaves replicas to the autoscaler
    promoted = next(o for o in done.desired if o["kind"] == "Deployment")
    assert "replicas" not in promoted["spec"]
