"""The HPA's targets against the plan: a device-memory target the plan makes meaningless is
left out (and the status says why), one above the plan is kept as a guard; a percentage
target the HPA's tolerance puts out of reach (above 90 %) is left out too."""

from __future__ import annotations

from typing import Any

import pytest
from glm_operator.api.glmservice import Autoscaling
from glm_operator.render.autoscaling import (
    HIGHEST_REACHABLE_PERCENT,
    HPA_TOLERANCE,
    choose_targets,
    device_memory_check,
    hpa_behavior,
    unusable_targets,
)
from glm_operator.render.service import render_service

from render.cases import inputs, model_key, model_version, service


def planned(engine: str, accelerator: str, targets: dict[str, Any]) -> Any:
    autoscaling = {"maxReplicas": 4, "targets": targets}
    svc = service(engine, accelerator, autoscaling=autoscaling)
    return inputs(svc, model_version(model_key(engine, accelerator)))


def hpas(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]


def test_vllm_takes_its_memory_utilization_so_a_lower_target_is_meaningless() -> None:
    ins = planned("vllm", "a100x2", {"acceleratorMemoryUtilization": 85, "queueLength": 2})
    assert ins.service.spec.autoscaling is not None
    check = device_memory_check(ins.service.spec.autoscaling, ins.plan)
    assert check is not None and not check.usable
    assert check.planned_percent == pytest.approx(90, abs=0.01)  # --gpu-memory-utilization
    assert check.reason == "MemoryTargetBelowPlan"
    message = check.message()
    # vLLM holds 90 %, the most a percentage target may be and still scale: no guard fits.
    for expected in ("acceleratorMemoryUtilization 85 %", "90.0 %", "72.0 of 80.0 GiB",
                     "--gpu-memory-utilization 0.9", "maxReplicas", "kvCacheUtilization",
                     "No device-memory target can act under this plan"):
        assert expected in message, (expected, message)
    [hpa] = hpas(render_service(ins))
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == [
        "glm_gateway_requests_queued"]


def test_above_the_plan_it_is_kept_as_a_guard() -> None:
    ins = planned("llamacpp", "a10", {"acceleratorMemoryUtilization": 60})
    assert ins.service.spec.autoscaling is not None
    check = device_memory_check(ins.service.spec.autoscaling, ins.plan)
    assert check is not None and check.usable and check.reason == "MemoryTargetAbovePlan"
    assert (check.planned_percent or 100) < 60
    assert "kept as a guard" in check.message()
    [hpa] = hpas(render_service(ins))
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == (
        "glm_accelerator_memory_utilization_percent")


def test_the_highest_reachable_percentage_is_the_hpa_tolerance_s() -> None:
    """kube-controller-manager changes the count only when the average is more than the
    tolerance off the target (replica_calculator.go: 1 - t <= ratio <= 1 + t holds it): a
    share at its 100 % ceiling must pass the target by more than that."""
    assert HPA_TOLERANCE == 0.1 and HIGHEST_REACHABLE_PERCENT == 90
    assert 100 / HIGHEST_REACHABLE_PERCENT > 1 + HPA_TOLERANCE
    assert 100 / (HIGHEST_REACHABLE_PERCENT + 1) <= 1 + HPA_TOLERANCE


def test_a_device_memory_guard_out_of_the_hpas_reach_is_left_out() -> None:
    # Above vLLM's 90 %, but every pod at 100 % is within the tolerance of 95: never scales.
    ins = planned("vllm", "a100x2", {"acceleratorMemoryUtilization": 95, "queueLength": 2})
    autoscaling = ins.service.spec.autoscaling
    assert autoscaling is not None
    check = device_memory_check(autoscaling, ins.plan)
    assert check is not None and not check.usable and check.reason == "MemoryTargetUnreachable"
    for expected in ("acceleratorMemoryUtilization 95 %", "out of the HPA's reach",
                     "above 90 %", "90.0 %", "No device-memory target can act"):
        assert expected in check.message(), (expected, check.message())
    assert unusable_targets(autoscaling, ins.plan) == {"acceleratorMemoryUtilization"}
    [hpa] = hpas(render_service(ins))
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == [
        "glm_gateway_requests_queued"]
    # On llama.cpp's A10 plan (about 51 %) the advice gives the range that works.
    a10 = planned("llamacpp", "a10", {"acceleratorMemoryUtilization": 91})
    assert a10.service.spec.autoscaling is not None
    unreachable = device_memory_check(a10.service.spec.autoscaling, a10.plan)
    assert unreachable is not None and unreachable.reason == "MemoryTargetUnreachable"
    assert "a target from 51 to 90 %" in unreachable.message(), unreachable.message()


@pytest.mark.parametrize(("target", "kept"), [(90, True), (91, False), (100, False)])
def test_a_kv_cache_target_above_90_never_scales_and_is_left_out(target: int,
                                                                  kept: bool) -> None:
    ins = planned("llamacpp", "a10", {"kvCacheUtilization": target, "queueLength": 2})
    autoscaling = ins.service.spec.autoscaling
    assert autoscaling is not None
    choice = choose_targets(autoscaling, ins.plan)
    assert choice.kv_check is not None and choice.kv_check.usable is kept
    [hpa] = hpas(render_service(ins))
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert ("glm_kv_cache_utilization_percent" in names) is kept, names
    if not kept:
        assert choice.failed == [choice.kv_check]
        assert choice.kv_check.reason == "KvCacheTargetUnreachable"
        message = choice.kv_check.message()
        assert f"kvCacheUtilization {target} %" in message and "90 % or less" in message
    # The only target: no HPA at all (one without metrics would scale on CPU).
    alone = planned("llamacpp", "a10", {"kvCacheUtilization": target})
    assert len(hpas(render_service(alone))) == (1 if kept else 0)


def test_llamacpp_plans_weights_kv_and_buffers_per_device() -> None:
    ins = planned("llamacpp", "a10", {"acceleratorMemoryUtilization": 50})
    autoscaling = ins.service.spec.autoscaling
    assert autoscaling is not None
    check = device_memory_check(autoscaling, ins.plan)
    assert check is not None
    memory = ins.plan.memory
    assert check.planned_bytes == memory.weights + memory.kv + memory.compute + memory.overhead
    assert check.device_bytes == memory.available
    assert "weights" in check.message() and "KV cache" in check.message()
    # The boundaries: at the planned figure is meaningless, one percent above is a guard, and
    # so is every target up to the highest the HPA can reach.
    at = int(check.planned_percent or 0)
    for target, usable in ((at, False), (at + 1, True), (HIGHEST_REACHABLE_PERCENT, True),
                           (HIGHEST_REACHABLE_PERCENT + 1, False)):
        guarded = Autoscaling.model_validate(
            {"maxReplicas": 4, "targets": {"acceleratorMemoryUtilization": target}})
        result = device_memory_check(guarded, ins.plan)
        assert result is not None and result.usable is usable, (target, check.planned_percent)


def test_the_only_target_left_out_means_no_hpa_rather_than_one_on_cpu() -> None:
    ins = planned("vllm", "a100x2", {"acceleratorMemoryUtilization": 60})
    assert hpas(render_service(ins)) == []


def test_cpu_has_no_device_memory() -> None:
    ins = planned("llamacpp", "cpu", {"acceleratorMemoryUtilization": 90, "queueLength": 2})
    autoscaling = ins.service.spec.autoscaling
    assert autoscaling is not None
    check = device_memory_check(autoscaling, ins.plan)
    assert check is not None and check.reason == "NoDeviceMemory" and not check.usable
    assert unusable_targets(autoscaling, ins.plan) == {"acceleratorMemoryUtilization"}


def test_no_memory_target_no_check() -> None:
    ins = planned("llamacpp", "a10", {"kvCacheUtilization": 70})
    assert ins.service.spec.autoscaling is not None
    assert device_memory_check(ins.service.spec.autoscaling, ins.plan) is None
    [hpa] = hpas(render_service(ins))
    assert hpa["spec"]["metrics"][0]["pods"] == {
        "metric": {"name": "glm_kv_cache_utilization_percent"},
        "target": {"type": "AverageValue", "averageValue": "70"}}


def test_behavior_defaults_are_overridden_field_by_field() -> None:
    autoscaling = Autoscaling.model_validate({
        "maxReplicas": 4, "targets": {"queueLength": 2},
        "behavior": {"scaleUp": {"selectPolicy": "Min"},
                     "scaleDown": {"policies": [{"type": "Percent", "value": 50,
                                                 "periodSeconds": 60}]}}})
    behavior = hpa_behavior(autoscaling)
    assert behavior["scaleUp"] == {"stabilizationWindowSeconds": 60, "selectPolicy": "Min",
                                   "policies": [{"type": "Pods", "value": 2,
                                                 "periodSeconds": 120}]}
    assert behavior["scaleDown"] == {"stabilizationWindowSeconds": 900, "selectPolicy": "Min",
                                     "policies": [{"type": "Percent", "value": 50,
                                                   "periodSeconds": 60}]}
