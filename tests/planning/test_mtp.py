"""vLLM's MTP speculative decoding: on where the model has nextn layers vLLM drafts with,
off when asked, refused when asked for a model without them or on llama.cpp."""

from __future__ import annotations

from dataclasses import replace

from glm_operator.planning.planner import PlanRequest, plan
from test_planning_cases import GLM4_9B, GLM45_AIR


def _vllm(**changes: object) -> PlanRequest:
    base = {"facts": GLM45_AIR, "quantization": "fp8", "engine": "vllm",
            "accelerator": "nvidia-h200", "context_length": 32768, "concurrency": 4}
    return PlanRequest(**{**base, **changes})  # type: ignore[arg-type]


def test_a_model_with_a_nextn_layer_drafts_one_token_per_step() -> None:
    p = plan(_vllm())
    assert p.feasible, p.reason
    assert p.vllm is not None and p.vllm.speculative_tokens == 1


def test_multi_token_prediction_false_turns_it_off() -> None:
    p = plan(_vllm(multi_token_prediction=False))
    assert p.vllm is not None and p.vllm.speculative_tokens == 0


def test_the_draft_layers_memory_is_in_the_plan_either_way() -> None:
    """The nextn layer's KV is counted with MTP on and off (vLLM allocates it for the
    drafter; counting it off too is the conservative reading, docs/planning.md)."""
    on, off = plan(_vllm()), plan(_vllm(multi_token_prediction=False))
    without_nextn = plan(_vllm(facts=replace(GLM45_AIR, nextn_predict_layers=0)))
    assert on.kv_bytes_per_token == off.kv_bytes_per_token > without_nextn.kv_bytes_per_token


def test_asking_for_mtp_without_nextn_layers_is_infeasible_with_the_numbers() -> None:
    p = plan(_vllm(facts=replace(GLM45_AIR, nextn_predict_layers=0),
                   multi_token_prediction=True))
    assert not p.feasible
    assert "nextnPredictLayers 0" in p.reason and "glm4moe" in p.reason


def test_models_vllm_has_no_drafter_for_get_none() -> None:
    p = plan(_vllm(facts=replace(GLM4_9B, nextn_predict_layers=0), quantization="bf16"))
    assert p.vllm is not None and p.vllm.speculative_tokens == 0


def test_llama_cpp_does_not_render_mtp() -> None:
    p = plan(PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                         accelerator="nvidia-a10", context_length=8192,
                         multi_token_prediction=True))
    assert not p.feasible and "multiTokenPrediction is rendered for vLLM" in p.reason


def test_a_multi_node_vllm_ascend_group_plans_no_mtp() -> None:
    """vllm-ascend v0.23 refuses MTP with pipeline parallelism (a group spans its nodes by it);
    on one node it drafts, and asking for it across nodes says why not."""
    one = plan(_vllm(quantization="w8a8", accelerator="ascend-910b", count=8,
                     context_length=8192, concurrency=1))
    assert one.vllm is not None and one.vllm.speculative_tokens == 1
    group = plan(_vllm(quantization="w8a8", accelerator="ascend-910b", count=8, nodes=2,
                       context_length=8192, concurrency=1))
    assert group.vllm is not None and group.vllm.speculative_tokens == 0
    asked = plan(_vllm(quantization="w8a8", accelerator="ascend-910b", count=8, nodes=2,
                       context_length=8192, concurrency=1, multi_token_prediction=True))
    assert not asked.feasible
    assert "vllm-ascend refuses MTP with pipeline parallelism" in asked.reason
