"""config.imageArchitectures in the chart's values: `helm install` refuses what the operator
would refuse at start, and what it accepts reaches the operator's table."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
import yaml
from chart_helm import CHART, KUBE_VERSION, Helm, HelmError  # tests/chart is on sys.path
from glm_operator.config import OperatorConfig

MIRROR = "registry.example.com/mirror/vllm-ascend"

# (imageArchitectures, a fragment of the operator's own error)
REFUSED: list[tuple[Any, str]] = [
    ({MIRROR: ["ppc64le"]}, "'ppc64le' is not an architecture we know"),
    ({MIRROR: []}, "must name at least one architecture"),
    ({MIRROR: "arm64"}, "must be a list of architectures"),
    ({f"{MIRROR}:v0.23.0": ["arm64"]}, "without its tag or digest"),
    ({f"{MIRROR}@sha256:{'0' * 64}": ["arm64"]}, "without its tag or digest"),
    (["arm64"], "must map an image repository"),
]


def _install(helm: Helm, table: Any) -> None:
    values = {"config": {"imageArchitectures": table}}
    helm.run("template", "glm", str(CHART), "--kube-version", KUBE_VERSION, "--values", "-",
             input=yaml.safe_dump(values))


@pytest.mark.parametrize(("table", "operator_says"), REFUSED)
def test_the_chart_refuses_what_the_operator_refuses(helm: Helm, table: Any,
                                                     operator_says: str) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        OperatorConfig.model_validate({"imageArchitectures": table})
    assert operator_says in str(refused.value)
    with pytest.raises(HelmError) as failure:
        _install(helm, table)
    assert "values don't meet the specifications of the schema" in failure.value.stderr


def test_the_chart_accepts_what_the_operator_accepts(helm: Helm) -> None:
    table = {MIRROR: ["arm64"], "localhost:5000/team/llama-server-cann": ["amd64", "arm64"]}
    config = OperatorConfig.model_validate({"imageArchitectures": table})
    assert config.image_architecture_table[MIRROR] == ("arm64",)
    _install(helm, table)
