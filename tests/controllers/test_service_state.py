"""decide_service: the pure heart of the GLMService reconcile."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from glm_operator.api import AnalysisResult
from glm_operator.config import OperatorConfig
from glm_operator.controllers.service_state import ServiceDecision, decide_service
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
    return decide_service(svc, {m["metadata"]["name"]: m for m in mvs}, live or [], CONFIG,
                          CONFIG.profiles, capabilities or Capabilities(), now=now,
                          analysis=analysis)


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
    svc["spec"]["engine"] = "vllm"
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


def test_unchanged_inputs_give_an_identical_status() -> None:
    mv, svc = load("cpu-llamacpp")
    first = decide(svc, [ready_mv(mv)])
    svc["status"] = first.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    again = decide(svc, [ready_mv(mv)])
    assert again.status.model_dump(by_alias=True, mode="json", exclude_none=True) == svc["status"]
