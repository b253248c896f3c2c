"""planning/architectures.py (which images have builds for which nodes), the profiles'
architectures, and operator config imageArchitectures."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from glm_operator.config import OperatorConfig
from glm_operator.planning.accelerators import builtin_profiles
from glm_operator.planning.architectures import (
    RELEASED_IMAGE_PLATFORMS,
    builtin_image_architectures,
    image_architectures,
    image_repository,
    pod_architectures,
    released_platforms,
)
from glm_operator.planning.profile_config import load_profiles

TABLE = builtin_image_architectures("registry.example.com/team")
CANN = "registry.example.com/team/llama-server-cann:1.0"
OPERATOR = "registry.example.com/team/glm-operator:1.0"


@pytest.mark.parametrize(("reference", "repository"), [
    ("registry.example.com/team/x:1.0", "registry.example.com/team/x"),
    ("localhost:5000/x:1.0", "localhost:5000/x"),
    ("localhost:5000/x", "localhost:5000/x"),  # the port is not a tag
    (f"quay.io/a/b:1@sha256:{'0' * 64}", "quay.io/a/b"),
    (f"quay.io/a/b@sha256:{'0' * 64}", "quay.io/a/b"),
    ("docker.io/vllm/vllm-openai:v0.33.0", "vllm/vllm-openai"),
    ("docker.io/library/debian:12", "debian"),
])
def test_image_repository(reference: str, repository: str) -> None:
    assert image_repository(reference) == repository


def test_the_released_platforms() -> None:
    assert released_platforms("llama-server-cann") == ("linux/arm64",)
    assert released_platforms("llama-server-cuda") == ("linux/amd64",)
    for name in ("glm-operator", "endpoint-picker", "llama-server-cpu"):
        assert released_platforms(name) == ("linux/amd64", "linux/arm64"), name
    assert set(RELEASED_IMAGE_PLATFORMS) == {"glm-operator", "endpoint-picker",
                                             "llama-server-cpu", "llama-server-cuda",
                                             "llama-server-cann"}
    with pytest.raises(ValueError, match="not an image we release"):
        released_platforms("llamacpp-cann")


def test_the_table_resolves_our_images_under_the_registry() -> None:
    assert image_architectures(CANN, TABLE) == ("arm64",)
    assert image_architectures("vllm/vllm-openai:v0.33.0", TABLE) == ("amd64", "arm64")
    # control: the same name under another registry is not ours, so unknown
    assert image_architectures("ghcr.io/glm-operator/llama-server-cann:1.0", TABLE) is None


def test_the_pods_architectures_are_the_intersection() -> None:
    fit = pod_architectures(("amd64", "arm64"), (CANN, OPERATOR), TABLE, nodes="profile x")
    assert (fit.architectures, fit.problem) == (("arm64",), None)
    unknown = pod_architectures(("amd64",), ("own/image:1", OPERATOR), TABLE, nodes="x")
    assert unknown.architectures == ("amd64",)  # an unknown image takes nothing away


def test_no_common_architecture_names_the_facts_and_the_fix() -> None:
    fit = pod_architectures(("amd64",), (OPERATOR, CANN), TABLE,
                            nodes="the nodes of accelerator profile ascend-x86")
    assert fit.architectures == ()
    assert fit.problem == (
        "the nodes of accelerator profile ascend-x86 are amd64, but image "
        f"{CANN} is built for arm64 only: build or mirror it for amd64 and list it in "
        "operator config imageArchitectures (registry.example.com/team/llama-server-cann: "
        "[amd64]), or choose another accelerator profile")


def test_the_profiles_architectures() -> None:
    profiles = builtin_profiles()
    assert profiles["ascend-910b"].architectures == ("arm64",)
    for name in ("ascend-310p", "cpu", "nvidia-h100-80gb", "nvidia-a10"):
        assert profiles[name].architectures == ("amd64", "arm64"), name
    assert profiles["ascend-910b"].to_dict()["architectures"] == ["arm64"]
    x86 = load_profiles({"ascend-910b": {"architectures": ["amd64", "arm64"]}})
    assert x86["ascend-910b"].architectures == ("amd64", "arm64")


@pytest.mark.parametrize(("value", "says"), [
    (["ppc64le"], "profile cpu: architectures: 'ppc64le' is not an architecture we know"),
    ([], "profile cpu: architectures must name at least one architecture"),
    ("amd64", "profile cpu: architectures must be a list of architectures"),
    ([1], "profile cpu: architectures: 1 is not an architecture we know"),
    (["amd64", "amd64"], "'amd64' is listed twice"),
])
def test_a_profiles_architectures_are_validated(value: Any, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        load_profiles({"cpu": {"architectures": value}})
    assert says in str(refused.value)


def test_an_images_override_merges_over_the_base_profiles_map() -> None:
    mirror = "mirror.example.com/vllm-ascend:v0.23.0.post1"
    profiles = load_profiles({"ascend-910b": {"images": {"vllm": mirror}}})
    images = profiles["ascend-910b"].images
    assert images["vllm"] == mirror
    # control: the llama.cpp image of the base profile is still there (it was dropped)
    assert images["llamacpp"] == builtin_profiles()["ascend-910b"].images["llamacpp"]
    derived = load_profiles({"my-910b": {"basedOn": "ascend-910b", "images": {"vllm": mirror}}})
    assert derived["my-910b"].images == images


def test_image_architectures_in_operator_config_merge_over_the_tables() -> None:
    config = OperatorConfig(imageRegistry="registry.example.com/team",
                            imageArchitectures={"registry.example.com/team/llama-server-cann":
                                                ["amd64", "arm64"],
                                                "quay.io/ascend/vllm-ascend": ["arm64"],
                                                "mirror.example.com/own": ["amd64"]})
    table = config.image_architecture_table
    assert table["registry.example.com/team/llama-server-cann"] == ("amd64", "arm64")  # added
    assert table["quay.io/ascend/vllm-ascend"] == ("arm64",)  # narrowed
    assert table["mirror.example.com/own"] == ("amd64",)
    assert table["registry.example.com/team/llama-server-cuda"] == ("amd64",)  # kept
    assert OperatorConfig().image_architecture_table["ghcr.io/glm-operator/glm-operator"] == (
        "amd64", "arm64")


@pytest.mark.parametrize(("value", "says"), [
    ({"x/y": ["s390x"]}, "imageArchitectures[x/y]: 's390x' is not an architecture we know"),
    ({"x/y": []}, "imageArchitectures[x/y] must name at least one architecture"),
    ({"x/y": "arm64"}, "imageArchitectures[x/y] must be a list of architectures"),
    ({"x/y:1.0": ["arm64"]}, "key 'x/y:1.0' must be the image repository without its tag"),
    ({"": ["arm64"]}, "'' is not an image repository"),
    (["x/y"], "imageArchitectures must map an image repository"),
])
def test_image_architectures_are_validated(value: Any, says: str) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        OperatorConfig.model_validate({"imageArchitectures": value})
    assert says in str(refused.value)
