"""An architecture the pinned engine cannot load makes the plan infeasible, saying which engine,
version and architecture; e2e/test_engine_architectures.py holds the tables to the engines."""

from __future__ import annotations

from dataclasses import replace

from glm_operator.planning import engine_support
from glm_operator.planning.planner import PlanRequest, plan
from test_planning_cases import GLM4_9B


def test_every_glm_architecture_loads_on_both_engines() -> None:
    for name in ("chatglm", "glm4", "glm4moe", "glm-dsa", "glm5-next"):
        assert engine_support.unsupported("llamacpp", name) is None
        assert engine_support.unsupported("vllm", name) is None
        assert name in engine_support.VLLM_ARCHITECTURES


def test_a_gguf_architecture_the_pinned_tree_lacks_is_refused_by_the_plan() -> None:
    p = plan(PlanRequest(facts=replace(GLM4_9B, architecture="glm6-future"),
                         quantization="Q4_K_M", engine="llamacpp", accelerator="nvidia-a10",
                         context_length=8192, concurrency=1))
    assert not p.feasible
    assert "llama.cpp (llama-cpp-python 0.3.36) cannot load architecture 'glm6-future'" in p.reason


def test_vllm_leaves_names_outside_its_table_to_its_transformers_backend() -> None:
    assert engine_support.unsupported("vllm", "glm6-future") is None
    p = plan(PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                         accelerator="nvidia-a10", context_length=8192, concurrency=1))
    assert p.feasible, p.reason
