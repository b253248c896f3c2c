"""Engine argv from a plan: every planned setting appears as its flag, and argv is a list."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from glm_operator.api import GLMService, ModelVersion
from glm_operator.planning.facts import ArchitectureFacts
from glm_operator.planning.from_api import plan_request_for
from glm_operator.planning.planner import Plan, PlanRequest, plan
from glm_operator.render.engine_args import (
    EngineArgsError,
    engine_argv,
    llamacpp_argv,
    vllm_argv,
)

GLM4_9B = ArchitectureFacts(
    architecture="glm4", block_count=40, embedding_length=4096, head_count=32,
    head_count_kv=2, key_length=128, value_length=128, context_length=131072,
    parameter_count=9_400_000_000,
)
GLM45_AIR = ArchitectureFacts(
    architecture="glm4moe", block_count=46, nextn_predict_layers=1, embedding_length=4096,
    head_count=96, head_count_kv=8, key_length=128, value_length=128, context_length=131072,
    parameter_count=106_000_000_000, expert_count=128, expert_used_count=8,
)


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} appears {argv.count(name)} times in {argv}"
    return argv[argv.index(name) + 1]


def llama_plan(**kw: Any) -> Plan:
    request = PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                          accelerator="nvidia-a10", context_length=32768, concurrency=4)
    return plan(replace(request, **kw))


def test_llamacpp_argv_carries_every_planned_setting() -> None:
    p = llama_plan()
    s = p.llamacpp
    assert s is not None
    argv = llamacpp_argv(p, "/models/glm.gguf", 8081, "chat", ["--jinja"])
    assert argv[0] == "llama-server"
    assert flag(argv, "--model") == "/models/glm.gguf"
    # Loopback and an abstract socket: only the pod's gateway reaches either.
    assert flag(argv, "--host") == "127.0.0.1,@glm-engine.sock"
    assert flag(argv, "--port") == "8081"
    assert flag(argv, "--alias") == "chat"
    assert flag(argv, "--ctx-size") == str(s.ctx_size) == str(32768 * 4)
    assert flag(argv, "--parallel") == "4"
    assert flag(argv, "--n-gpu-layers") == str(s.n_gpu_layers) == "41"
    assert flag(argv, "--cache-type-k") == s.cache_type_k
    assert flag(argv, "--cache-type-v") == s.cache_type_v
    assert flag(argv, "--flash-attn") == "on"
    assert flag(argv, "--threads") == str(s.threads)
    assert flag(argv, "--batch-size") == str(s.batch_size)
    assert flag(argv, "--ubatch-size") == str(s.ubatch_size)
    assert flag(argv, "--cache-ram") == str(s.cache_ram_mib)
    assert flag(argv, "--load-mode") == "mmap"
    assert flag(argv, "--fit") == "off"  # the pinned build fits by default: the plan rules
    assert "--no-kv-unified" in argv and "--kv-unified" not in argv
    assert "--metrics" in argv
    assert argv[-1] == "--jinja"  # user args last
    assert "--tensor-split" not in argv
    assert all(isinstance(a, str) and a for a in argv)


def test_llamacpp_kv_unified_no_mmap_and_layer_split() -> None:
    p = llama_plan(kv_unified=True, mmap=False, accelerator="nvidia-a100-80gb", count=2)
    argv = llamacpp_argv(p, "/models/m.gguf", 9000, "svc")
    assert "--kv-unified" in argv and "--no-kv-unified" not in argv
    assert flag(argv, "--load-mode") == "none"
    assert flag(argv, "--split-mode") == "layer"
    assert flag(argv, "--tensor-split") == "21,20"  # 41 units over 2 GPUs


def test_llamacpp_cpu_threads_come_from_the_cpu_request() -> None:
    p = llama_plan(accelerator="cpu", cpu_cores=12)
    argv = llamacpp_argv(p, "/models/m.gguf", 8081, "svc")
    assert flag(argv, "--n-gpu-layers") == "0"
    assert flag(argv, "--threads") == "12"
    assert p.resources.cpu_request == 12


def test_llamacpp_flash_attention_off_where_the_profile_has_none() -> None:
    p = llama_plan(accelerator="ascend-310p", context_length=4096, concurrency=1)
    assert flag(llamacpp_argv(p, "/m", 1, "a"), "--flash-attn") == "off"


def test_vllm_argv_and_glm_parsers() -> None:
    request = PlanRequest(facts=GLM45_AIR, quantization="fp8", engine="vllm",
                          accelerator="nvidia-h200", count=2, context_length=65536,
                          concurrency=8)
    p = plan(request)
    s = p.vllm
    assert s is not None
    argv = vllm_argv(p, "/models/air", 8081, "air", ["--enable-prefix-caching"])
    assert argv[:3] == ["vllm", "serve", "/models/air"]
    assert flag(argv, "--served-model-name") == "air"
    assert flag(argv, "--host") == "127.0.0.1"  # vLLM's default would be 0.0.0.0
    assert flag(argv, "--port") == "8081"
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert flag(argv, "--max-model-len") == "65536"
    assert flag(argv, "--max-num-seqs") == "8"
    assert flag(argv, "--gpu-memory-utilization") == "0.9"
    assert flag(argv, "--kv-cache-dtype") == s.kv_cache_dtype
    assert flag(argv, "--tool-call-parser") == "glm45"
    assert flag(argv, "--reasoning-parser") == "glm45"
    assert argv[-1] == "--enable-prefix-caching"


def test_vllm_argv_without_glm_parsers_for_other_architectures() -> None:
    p = plan(PlanRequest(facts=GLM4_9B, quantization="bf16", engine="vllm",
                         accelerator="nvidia-a100-80gb"))
    assert "--tool-call-parser" not in vllm_argv(p, "/m", 1, "a")
    assert engine_argv(p, "/m", 1, "a")[:2] == ["vllm", "serve"]


def test_wrong_engine_settings_raise() -> None:
    with pytest.raises(EngineArgsError, match="no vLLM settings"):
        vllm_argv(llama_plan(), "/m", 1, "a")


def test_plan_request_from_api_objects_prefers_measured_facts() -> None:
    mv = ModelVersion.model_validate({
        "metadata": {"name": "air"},
        "spec": {"source": {"uri": "https://h/air.gguf"}, "format": "gguf",
                 "facts": {"parameterCount": 106_000_000_000, "feedForwardLength": 10944}},
        "status": {"sizeBytes": 70_000_000_000, "facts": {
            "architecture": "glm4moe", "blockCount": 47, "nextnPredictLayers": 1,
            "embeddingLength": 4096, "headCount": 96, "headCountKv": 8, "keyLength": 128,
            "valueLength": 128, "contextLength": 131072, "fileType": "Q4_K_M",
            "expertFeedForwardLength": 1408}},
    })
    svc = GLMService.model_validate({"metadata": {"name": "s"}, "spec": {
        "modelVersion": "air", "accelerator": {"profile": "nvidia-h200"},
        "longContext": {"contextLength": 131072},
        "gateway": {"access": "Open"}}})
    request = plan_request_for(svc, mv)
    assert request.engine == "llamacpp"
    assert request.quantization == "Q4_K_M"
    assert request.facts.block_count == 46  # the header's 47 includes the nextn layer
    assert request.facts.parameter_count == 106_000_000_000  # declared, kept
    assert request.facts.weights_bytes == 70_000_000_000
    # FFN widths (compute buffer): declared and measured merge field by field.
    assert (request.facts.feed_forward_length, request.facts.expert_feed_forward_length) == (
        10944, 1408)
    lc = plan_request_for(svc, mv, long_context=True)
    assert (lc.context_length, lc.concurrency, lc.long_context) == (131072, 1, True)


def test_plan_request_without_facts_is_a_clear_error() -> None:
    from glm_operator.planning.from_api import ModelFactsUnknown
    mv = ModelVersion.model_validate({
        "metadata": {"name": "bare"},
        "spec": {"source": {"uri": "https://h/m.gguf"}, "format": "gguf",
                 "quantization": "Q4_K_M"}})
    svc = GLMService.model_validate({"metadata": {"name": "s"}, "spec": {
        "modelVersion": "bare", "accelerator": {"profile": "cpu"},
        "gateway": {"access": "Open"}}})
    with pytest.raises(ModelFactsUnknown, match=r"bare: model facts unknown \(architecture, "
                       r"blockCount, embeddingLength, headCount, contextLength\)"):
        plan_request_for(svc, mv)
