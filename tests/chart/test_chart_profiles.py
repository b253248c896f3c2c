"""Accelerator profiles in the chart's values: `helm install` refuses what the operator would
refuse at start (a crash loop otherwise), and accepts what it accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from chart_helm import CHART, KUBE_VERSION, Helm, HelmError  # tests/chart is on sys.path
from glm_operator.planning.profile_config import _CONFIG_KEYS, load_profiles

VALID_IMAGE = "registry.example.com/llama-server-cpu:1.2.3"

# (profiles, a fragment of the operator's own error)
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"cpu": {"memorySize": 1}}, "unknown field(s) memorySize"),
    ({"cpu": {"memoryMiB": -1024}}, "memory must be > 0"),
    ({"cpu": {"memoryMiB": 0}}, "memory must be > 0"),
    ({"cpu": {"memoryMiB": "64Gi"}}, "memoryMiB must be an integer"),
    ({"cpu": {"memoryBytes": 1.5}}, "memoryBytes must be an integer"),
    ({"nvidia-l4": {"maxDevicesPerNode": 0}}, "maxDevicesPerNode must be >= 1"),
    ({"cpu": {"cpuCores": 0}}, "cpuCores must be >= 1"),
    ({"cpu": {"runtimeOverheadBytes": -1}}, "runtimeOverheadBytes must be >= 0"),
    ({"cpu": {"flashAttention": "yes"}}, "flashAttention must be true or false"),
    ({"cpu": {"vendor": "amd"}}, "vendor must be one of"),
    ({"cpu": {"engines": ["tgi"]}}, "engines must be a subset"),
    ({"cpu": {"engines": []}}, "engines must be a subset"),
    ({"cpu": {"engines": "llamacpp"}}, "engines must be a list"),
    ({"cpu": {"images": {"llamacpp": ""}}}, "no image for engine llamacpp"),
    ({"cpu": {"images": ["x"]}}, "images must be a mapping"),
    ({"nvidia-l4": {"tolerations": [{"effect": "NoSchedule"}]}}, "needs a key"),
    ({"nvidia-l4": {"tolerations": [{"key": "k", "effect": "Never"}]}},
     "toleration effect must be one of"),
    ({"nvidia-l4": {"tolerations": [{"key": "k", "operator": "In"}]}},
     "toleration operator must be one of"),
    ({"nvidia-l4": {"tolerations": [{"key": "k", "tolerationSeconds": 5}]}},
     "unknown toleration field(s) tolerationSeconds"),
    ({"NVIDIA-X": {"basedOn": "nvidia-l4"}}, "lower-case"),
    ({"cpu": "big"}, "must be a mapping"),
    ({"cpu": {"architectures": ["ppc64le"]}}, "'ppc64le' is not an architecture we know"),
    ({"cpu": {"architectures": []}}, "architectures must name at least one architecture"),
    ({"cpu": {"architectures": "arm64"}}, "architectures must be a list of architectures"),
    ({"cpu": {"architectures": ["arm64", "arm64"]}}, "'arm64' is listed twice"),
]

ACCEPTED: list[dict[str, Any]] = [
    {"cpu": {"memoryMiB": 262144, "cpuCores": 32}},
    {"nvidia-a10-mig": {"basedOn": "nvidia-a10", "memoryMiB": 11000,
                        "nodeLabels": {"nvidia.com/gpu.product": ["A10-MIG-2g.12gb"]},
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}},
    {"edge-cpu": {"vendor": "cpu", "memoryBytes": 8 * 2**30, "engines": ["llamacpp"],
                  "images": {"llamacpp": VALID_IMAGE}, "flashAttention": False}},
    {"ascend-910b": {"architectures": ["amd64", "arm64"]}},  # x86 Atlas hosts beside Kunpeng
]


def _install(helm: Helm, profiles: Any) -> None:
    values = {"config": {"acceleratorProfiles": profiles}}
    helm.run("template", "glm", str(CHART), "--kube-version", KUBE_VERSION, "--values", "-",
             input=yaml.safe_dump(values))


@pytest.mark.parametrize(("profiles", "operator_says"), REFUSED)
def test_the_chart_refuses_what_the_operator_refuses(helm: Helm, profiles: dict[str, Any],
                                                     operator_says: str) -> None:
    with pytest.raises(ValueError) as refused:
        load_profiles(profiles)
    assert operator_says in str(refused.value)
    with pytest.raises(HelmError) as failure:
        _install(helm, profiles)
    assert "values don't meet the specifications of the schema" in failure.value.stderr


@pytest.mark.parametrize("profiles", ACCEPTED)
def test_the_chart_accepts_what_the_operator_accepts(helm: Helm,
                                                     profiles: dict[str, Any]) -> None:
    load_profiles(profiles)
    _install(helm, profiles)


def test_the_schema_names_exactly_the_operators_profile_fields() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    profiles = schema["properties"]["config"]["properties"]["acceleratorProfiles"]
    assert set(profiles["additionalProperties"]["properties"]) == {*_CONFIG_KEYS, "basedOn"}
