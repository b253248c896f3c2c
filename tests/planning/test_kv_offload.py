"""spec.engine.vllm.kvOffloadGiB: vLLM's host-memory KV tier (--kv-offloading-size, the
native OffloadingConnector), planned from the device KV it backs and counted in the pod's
memory (issue 38, item 8; docs/planning.md "Host-memory KV tier")."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.api import GLMService, ModelVersion
from glm_operator.planning.from_api import applicable_alternatives, plan_request_for, spec_patch
from glm_operator.planning.memory import GiB
from glm_operator.planning.planner import PlanRequest, plan
from glm_operator.render.engine_args import vllm_argv

GLM5_MV: dict[str, Any] = yaml.safe_load(
    (Path(__file__).parents[2] / "examples" / "nvidia-h200-glm5-vllm" / "modelversion.yaml")
    .read_text())
GLM5_MV["metadata"]["namespace"] = "ns"
CONTEXT = 131072


def service(concurrency: int = 16, **vllm: Any) -> GLMService:
    return GLMService.model_validate({
        "apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "GLMService",
        "metadata": {"name": "glm-5", "namespace": "ns"},
        "spec": {"modelVersion": "glm-5-fp8", "engine": {"vllm": vllm},
                 "accelerator": {"profile": "nvidia-h200", "count": 8},
                 "contextLength": CONTEXT, "concurrency": concurrency,
                 "gateway": {"access": "Open"}}})


def request(**vllm: Any) -> PlanRequest:
    return plan_request_for(service(**vllm), ModelVersion.model_validate(GLM5_MV))


def tier_alternatives(p: Any) -> list[Any]:
    return [a for a in p.alternatives if set(a.settings) == {"kv_offload_gib"}]


def test_the_field_reaches_the_plan_and_the_argv() -> None:
    r = request(layout="tp", kvOffloadGiB=80)
    assert r.kv_offload_gib == 80
    p = plan(r)
    assert p.vllm is not None and p.vllm.kv_offloading_size == 80
    argv = vllm_argv(p, "/models/glm-5", 8000, "glm-5")
    at = argv.index("--kv-offloading-size")
    assert argv[at:at + 4] == ["--kv-offloading-size", "80", "--kv-offloading-backend", "native"]
    assert "--kv-offloading-size" not in vllm_argv(plan(request(layout="tp")), "/m", 8000, "m")


def test_the_memory_request_and_dev_shm_grow_by_the_tier() -> None:
    without = plan(request(layout="tp"))
    tier = plan(request(layout="tp", kvOffloadGiB=80))
    grew = 80 * GiB
    assert tier.resources.memory_request_bytes - without.resources.memory_request_bytes == grew
    assert tier.resources.memory_limit_bytes - without.resources.memory_limit_bytes == grew
    # on CUDA the tier is one mmap of /dev/shm per engine core (an emptyDir in memory)
    assert tier.resources.shared_memory_bytes - without.resources.shared_memory_bytes == grew


def test_each_data_parallel_rank_has_its_own_tier() -> None:
    dep = plan(request(layout="dep", kvOffloadGiB=10))
    base = plan(request(layout="dep"))
    assert dep.vllm is not None and dep.vllm.data_parallel_size == 8
    assert (dep.resources.memory_request_bytes - base.resources.memory_request_bytes
            == 8 * 10 * GiB)


def test_the_tier_holds_an_mla_latent_once_and_adds_no_decoding_room() -> None:
    alone = plan(request(layout="tp"))
    [alt] = tier_alternatives(alone)
    size = alt.settings["kv_offload_gib"]
    p = plan(request(layout="tp", kvOffloadGiB=size))
    assert p.vllm is not None and alone.vllm is not None
    # TP8 replicates the latent on every rank; vLLM's offload stores it once per engine core
    assert p.vllm.kv_offload_tokens == size * GiB // p.kv_bytes_per_token
    # and it holds what the devices cannot of the 16 requests
    assert p.vllm.kv_offload_tokens >= 16 * CONTEXT - p.vllm.kv_cache_tokens
    # the device's KV capacity (what decodes at once) is the same with or without the tier
    assert p.vllm.kv_cache_tokens == alone.vllm.kv_cache_tokens
    held = p.vllm.kv_cache_tokens // CONTEXT
    assert 1 <= held < 16
    assert p.feasible and not alone.feasible, (p.reason, alone.reason)
    assert any(f"holds {held} of the 16 requests" in w for w in p.warnings)
    assert next(lc for lc in p.layouts if lc.chosen).requests_at_context == held


def test_the_alternative_appears_exactly_when_the_device_kv_falls_short() -> None:
    mv = ModelVersion.model_validate(GLM5_MV)
    short = plan(plan_request_for(service(layout="tp"), mv))
    assert not short.feasible
    [alt] = tier_alternatives(short)
    size = alt.settings["kv_offload_gib"]
    # the smallest whole GiB: one less does not hold the requests the device cannot
    assert not plan(plan_request_for(service(layout="tp", kvOffloadGiB=size - 1), mv)).feasible
    held = short.vllm.kv_cache_tokens // CONTEXT if short.vllm else 0
    assert f"{held} of 16 requests decode at full context at once" in alt.change
    # fits on the devices: no alternative at all, and the tier is not forced on anyone
    fits = plan(plan_request_for(service(concurrency=4, layout="tp"), mv))
    assert fits.feasible and not fits.alternatives
    # the weights do not fit (one H200): not one request fits, so no tier can help
    one = plan(replace(plan_request_for(service(layout="tp"), mv), count=1, layout=None))
    assert not one.feasible and tier_alternatives(one) == []


def test_the_alternative_is_a_patch_that_applies() -> None:
    mv = ModelVersion.model_validate(GLM5_MV)
    svc = service(layout="tp")
    short = plan(plan_request_for(svc, mv))
    [alt] = tier_alternatives(short)
    patch = {"spec": {"engine": {"vllm": {"kvOffloadGiB": alt.settings["kv_offload_gib"]}}}}
    assert spec_patch(svc, alt.settings) == patch
    applied, _ = applicable_alternatives(svc, mv, short)
    assert patch in [a.patch for a in applied]


def test_a_layout_that_holds_every_request_comes_before_one_that_leans_on_the_tier() -> None:
    p = plan(request(kvOffloadGiB=80))  # TP8 fits with the tier; DCP8 and DEP8 without it
    assert p.feasible and p.vllm is not None and p.vllm.layout != "tp"
    assert p.vllm.kv_cache_tokens >= 16 * CONTEXT


@pytest.mark.parametrize(("change", "reason"), [
    ({"accelerator": "ascend-910b", "count": 8, "layout": None}, "NVIDIA only"),
    ({"nodes": 2}, "one node"),
])
def test_where_the_tier_is_not_planned(change: dict[str, Any], reason: str) -> None:
    p = plan(replace(request(layout="tp", kvOffloadGiB=8), **change))
    assert not p.feasible and reason in p.reason


def test_the_tier_is_bounded_by_the_devices_memory() -> None:
    p = plan(request(layout="tp", kvOffloadGiB=4096))  # 8 x 140 GiB of HBM: 1123 GiB
    assert not p.feasible and "bound" in p.reason


def test_the_tier_rolls_the_pods_and_its_absence_does_not() -> None:
    from glm_operator.render.deployment import plan_hash

    without, tier = plan(request(layout="tp")), plan(request(layout="tp", kvOffloadGiB=80))
    # a plan without the tier hashes as before the field existed: the render goldens hold it
    assert plan_hash(without) != plan_hash(tier)
