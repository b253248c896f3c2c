"""The accelerator catalog and user profiles from operator config."""

from __future__ import annotations

import pytest
from glm_operator.planning.accelerators import PROFILES, builtin_profiles, get_profile
from glm_operator.planning.profile_config import load_profiles

MiB = 1024**2

EXPECTED = {
    "nvidia-a10", "nvidia-l4", "nvidia-a100-40gb", "nvidia-a100-80gb", "nvidia-h100-80gb",
    "nvidia-h200", "nvidia-v100-32gb", "ascend-910b", "ascend-310p", "cpu",
    # issue 38: the cards the field runs GLM on
    "nvidia-h20", "nvidia-h800", "nvidia-a800", "nvidia-l20", "nvidia-b200", "nvidia-t4",
    "nvidia-rtx-4090", "nvidia-rtx-4060", "ascend-910c",
}


def test_catalog_has_every_profile_the_api_names() -> None:
    assert set(PROFILES) == EXPECTED


def test_every_image_is_pinned_and_every_engine_has_one() -> None:
    for profile in PROFILES.values():
        for engine in profile.engines:
            image = profile.images[engine]
            assert not image.endswith(":latest") and ":" in image.rsplit("/", 1)[-1], image


def test_device_facts() -> None:
    a10 = PROFILES["nvidia-a10"]
    assert a10.memory_bytes == 23028 * MiB
    assert a10.node_labels == {"nvidia.com/gpu.product": ("NVIDIA-A10",)}
    assert a10.tolerations[0].to_dict() == {
        "key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert PROFILES["nvidia-a100-80gb"].node_labels["nvidia.com/gpu.product"][0] == (
        "NVIDIA-A100-SXM4-80GB")
    assert "NVIDIA-H100-80GB-HBM3" in PROFILES["nvidia-h100-80gb"].node_labels[
        "nvidia.com/gpu.product"]
    assert PROFILES["nvidia-v100-32gb"].bf16 is False
    ascend = PROFILES["ascend-910b"]
    assert ascend.resource_name == "huawei.com/Ascend910"
    assert ascend.node_labels["accelerator"] == ("huawei-Ascend910",)
    assert "module-910b-8" in ascend.node_labels["accelerator-type"]
    assert ascend.images["vllm"].startswith("quay.io/ascend/vllm-ascend:")
    assert PROFILES["ascend-310p"].resource_name == "huawei.com/Ascend310P"
    assert PROFILES["cpu"].engines == ("llamacpp",) and PROFILES["cpu"].resource_name is None
    assert PROFILES["nvidia-h200"].images["vllm"].startswith("vllm/vllm-openai:v")


def test_registry_is_configurable() -> None:
    profiles = builtin_profiles(registry="registry.example.com/ml/", tag="1.2.3")
    assert profiles["cpu"].images["llamacpp"] == "registry.example.com/ml/llama-server-cpu:1.2.3"


def test_user_overrides_and_new_profiles() -> None:
    profiles = load_profiles({
        "cpu": {"memoryMiB": 262144, "cpuCores": 32},
        "nvidia-a10-mig": {"basedOn": "nvidia-a10", "resourceName": "nvidia.com/mig-3g.12gb",
                           "memoryMiB": 11776, "maxDevicesPerNode": 1},
        "kunlun-p800": {
            "vendor": "cpu", "memoryMiB": 98304, "engines": ["llamacpp"],
            "images": {"llamacpp": "registry.local/llama-kunlun:b1"},
        },
    })
    assert profiles["cpu"].memory_bytes == 262144 * MiB and profiles["cpu"].cpu_cores == 32
    assert profiles["cpu"].engines == ("llamacpp",)  # untouched fields kept
    mig = profiles["nvidia-a10-mig"]
    assert (mig.resource_name, mig.memory_bytes, mig.vendor) == (
        "nvidia.com/mig-3g.12gb", 11776 * MiB, "nvidia")
    assert get_profile("kunlun-p800", profiles).memory_bytes == 98304 * MiB
    assert PROFILES["cpu"].memory_bytes != 262144 * MiB  # the shipped catalog is not mutated


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"cpu": {"memorySize": 1}}, "profile cpu: unknown field(s) memorySize"),
        ({"x": {"vendor": "nvidia"}}, "profile x: a new profile needs"),
        ({"x": {"basedOn": "nope"}}, "basedOn 'nope' is not a profile"),
        ({"cpu": {"images": {"llamacpp": "repo/llama:latest"}}}, "pinned tag"),
        ({"cpu": {"images": {"llamacpp": "repo/llama"}}}, "pinned tag"),
        ({"cpu": {"engines": ["tgi"]}}, "engines must be a subset"),
        ({"nvidia-l4": {"maxDevicesPerNode": 0}}, "maxDevicesPerNode must be >= 1"),
        ({"cpu": {"memoryMiB": 0}}, "memory must be > 0"),
    ],
)
def test_invalid_user_profiles_are_rejected_naming_the_field(
    extra: dict[str, dict[str, object]], needle: str
) -> None:
    with pytest.raises(ValueError, match=None) as info:
        load_profiles(extra)
    assert needle in str(info.value)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown accelerator profile 'nvidia-gb300'"):
        get_profile("nvidia-gb300")


def test_the_issue_38_profiles() -> None:
    """Each new profile's facts as docs/planning.md states them, with their sources."""
    h20, t4, a3 = PROFILES["nvidia-h20"], PROFILES["nvidia-t4"], PROFILES["ascend-910c"]
    assert (h20.memory_bytes, h20.fp8, h20.cuda_sm) == (97871 * MiB, True, 90)
    assert h20.node_labels == {"nvidia.com/gpu.product": ("NVIDIA-H20",)}
    assert (t4.cuda_sm, t4.bf16, t4.fp8, t4.nvlink) == (75, False, False, False)
    assert "llamacpp" in t4.engines  # the CUDA image carries sm_75 kernels
    assert PROFILES["nvidia-b200"].cuda_sm == 100
    for geforce in ("nvidia-rtx-4090", "nvidia-rtx-4060"):
        assert not PROFILES[geforce].nvlink and PROFILES[geforce].max_devices_per_node == 4
    assert PROFILES["nvidia-rtx-4060"].memory_bytes == 8188 * MiB
    assert (a3.max_devices_per_node, a3.memory_bytes) == (16, 65536 * MiB)
    assert a3.resource_name == "huawei.com/Ascend910" and a3.architectures == ("arm64",)
    assert "module-a3-16" in a3.node_labels["accelerator-type"]


def test_llama_cpp_is_refused_where_the_cuda_image_has_no_kernels() -> None:
    """A V100 profile given llama.cpp in operator config: sm_70 is below the image's oldest
    target (LLAMACPP_CUDA_SM, the Dockerfile's CUDA_ARCHITECTURES), so the plan refuses with
    the reason instead of rendering pods that cannot load."""
    import re
    from pathlib import Path

    from glm_operator.planning.accelerators import LLAMACPP_CUDA_SM
    from glm_operator.planning.planner import PlanRequest, plan
    from test_planning_cases import GLM4_9B

    dockerfile = Path(__file__).resolve().parents[2] / "runtime-images/llamacpp/Dockerfile.cuda"
    built = re.search(r'ARG CUDA_ARCHITECTURES="([\d;]+)"', dockerfile.read_text())
    assert built and tuple(int(sm) for sm in built.group(1).split(";")) == LLAMACPP_CUDA_SM
    profiles = load_profiles({"v100-llama": {
        "basedOn": "nvidia-v100-32gb", "engines": ["llamacpp", "vllm"],
        "images": {"llamacpp": "registry.local/llama-server-cuda:1.0"}}})
    refused = plan(PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                               accelerator="v100-llama", context_length=8192), profiles)
    assert not refused.feasible and "sm_70" in refused.reason and "sm_75" in refused.reason
    t4 = plan(PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                          accelerator="nvidia-t4", context_length=8192))
    assert t4.feasible, t4.reason
