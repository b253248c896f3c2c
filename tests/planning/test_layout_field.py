"""spec.engine.vllm.layout: the forced layout reaches the plan, and a layout the planner
offers is a patch that applies (issue 38's field, in v1alpha2's engine settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.api import GLMService, ModelVersion
from glm_operator.planning.from_api import plan_request_for, spec_patch
from glm_operator.planning.planner import plan
from pydantic import ValidationError

# The GLM-5 example's ModelVersion: its facts as declared there.
GLM5_MV: dict[str, Any] = yaml.safe_load(
    (Path(__file__).parents[2] / "examples" / "nvidia-h200-glm5-vllm" / "modelversion.yaml")
    .read_text())
GLM5_MV["metadata"]["namespace"] = "ns"


def service(**vllm: Any) -> GLMService:
    return GLMService.model_validate({
        "apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "GLMService",
        "metadata": {"name": "glm-5", "namespace": "ns"},
        "spec": {"modelVersion": "glm-5-fp8", "engine": {"vllm": vllm},
                 "accelerator": {"profile": "nvidia-h200", "count": 8},
                 "contextLength": 131072, "concurrency": 16, "gateway": {"access": "Open"}}})


def test_the_planner_chooses_when_no_layout_is_forced() -> None:
    chosen = plan(plan_request_for(service(), ModelVersion.model_validate(GLM5_MV)))
    assert chosen.feasible and chosen.vllm is not None
    assert chosen.vllm.layout != "tp"  # TP8 copies the latent cache: 16 x 128k do not fit
    assert {lc.layout for lc in chosen.layouts} >= {"tp", "dcp", "dep"}


@pytest.mark.parametrize("layout", ["tp", "dcp", "dep"])
def test_a_forced_layout_is_planned_as_asked(layout: str) -> None:
    request = plan_request_for(service(layout=layout), ModelVersion.model_validate(GLM5_MV))
    assert request.layout == layout
    forced = plan(request)
    assert forced.vllm is not None and forced.vllm.layout == layout


def test_rank_tensor_parallel_reaches_the_plan_and_needs_dep() -> None:
    request = plan_request_for(service(layout="dep", rankTensorParallel=2),
                               ModelVersion.model_validate(GLM5_MV))
    assert (request.layout, request.rank_tensor_parallel) == ("dep", 2)
    with pytest.raises(ValidationError, match="needs layout dep"):
        service(layout="tp", rankTensorParallel=2)


def test_a_layout_alternative_is_a_patch_under_the_engine() -> None:
    svc = service(layout="tp")
    assert spec_patch(svc, {"layout": "dcp"}) == {
        "spec": {"engine": {"vllm": {"layout": "dcp"}}}}
