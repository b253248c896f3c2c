"""config.json of the MLA GLMs (GLM-5, glm5-next) -> status.facts in the GGUF vocabulary, as
llama.cpp's converter writes them (conversion/glm.py, conversion/deepseek.py of the pinned
tree), and the operator's plans from those facts (MLA KV without V, the indexer cache, KDA
layers without KV)."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from glm_operator.api.glmservice import GLMService
from glm_operator.api.modelversion import ModelVersion, ModelVersionStatus
from glm_operator.fetch.hf_config import facts_from_config
from glm_operator.fetch.reporter import StatusTarget, success_status
from glm_operator.fetch.snapshot import ManifestEntry, SnapshotResult
from glm_operator.planning import memory as mem
from glm_operator.planning.from_api import model_facts_for, plan_request_for
from glm_operator.planning.planner import plan

# GLM-5's config.json as transformers describes it: the defaults of GlmMoeDsaConfig
# (transformers/models/glm_moe_dsa/configuration_glm_moe_dsa.py in the vLLM 0.33.0 venv,
# `@auto_docstring(checkpoint="zai-org/GLM-5")`). num_nextn_predict_layers (1) is not a field
# of that class; it is the key llama.cpp's GlmMoeDsaModel reads for the appended MTP block
# (its comment: "model.layers.78 -> blk.78 in the 79-block file").
GLM5_CONFIG: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
    "num_hidden_layers": 78, "num_nextn_predict_layers": 1, "hidden_size": 6144,
    "intermediate_size": 12288, "moe_intermediate_size": 2048, "num_attention_heads": 64,
    "num_key_value_heads": 64, "head_dim": 64, "kv_lora_rank": 512, "q_lora_rank": 2048,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 192, "v_head_dim": 256,
    "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "max_position_embeddings": 202752, "vocab_size": 154880,
    "torch_dtype": "bfloat16",
}  # fmt: skip

# glm5-next's config.json: transformers' Glm5NextConfig with the Glm5NextTextConfig defaults
# under text_config (transformers/models/glm5_next/configuration_glm5_next.py, checkpoint
# zai-org/GLM-5.3-Flash), linear_attn_config as llama.cpp's Glm5NextModel reads it
# (num_heads, head_dim, short_conv_kernel_size), no layer_types: transformers then makes
# every layer but each fourth one linear_attention (idx % 4 != 3).
GLM5_NEXT_TEXT: dict[str, Any] = {
    "num_hidden_layers": 45, "num_nextn_predict_layers": 1, "hidden_size": 4096,
    "num_attention_heads": 64, "num_key_value_heads": 64, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 0, "qk_nope_head_dim": 256, "v_head_dim": 256,
    "mla_use_nope": True, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32,
    "index_kpool": 16,
    "linear_attn_config": {"num_heads": 64, "head_dim": 128, "short_conv_kernel_size": 4},
    "hc_mult": 4, "n_routed_experts": 288, "num_experts_per_tok": 8,
    "max_position_embeddings": 1048576, "vocab_size": 154880,
}  # fmt: skip
GLM5_NEXT_CONFIG: dict[str, Any] = {
    "architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
    "text_config": GLM5_NEXT_TEXT,
}


def _model_version(config: dict[str, Any], quantization: str = "bf16") -> ModelVersion:
    """The ModelVersion after its fetch Job: status.facts from config.json, as
    success_status writes them for a safetensors snapshot."""
    result = SnapshotResult(Path("/cache/m"), 10**12, "c" * 64,
                            [ManifestEntry("config.json", 1000, "d" * 64)],
                            facts_from_config(config, 10**12), False, "e" * 40, 0, 1.0)
    obj = {"metadata": {"name": "mv", "generation": 1}, "spec": {}}
    status = success_status(obj, result, StatusTarget("ns", "mv"), "m",
                            datetime(2026, 1, 1, tzinfo=UTC))
    ModelVersionStatus.model_validate(status)
    return ModelVersion.model_validate({
        "metadata": {"name": "mv", "namespace": "ns"},
        "spec": {"source": {"uri": "hf://zai-org/GLM-5"}, "format": "safetensors",
                 "quantization": quantization},
        "status": status,
    })


def test_glm5_config_gives_the_mla_facts_llama_cpp_writes() -> None:
    facts = facts_from_config(GLM5_CONFIG).model_dump(by_alias=True, exclude_none=True)
    # DeepseekV2Model.set_gguf_parameters: MLA converted to MQA, one KV head whose K is
    # kv_lora_rank + qk_rope_head_dim and whose V is the latent; block_count 78 + 1 nextn.
    assert facts["architecture"] == "glm-dsa" and facts["blockCount"] == 79
    assert (facts["headCountKv"], facts["keyLength"], facts["valueLength"]) == (1, 576, 512)
    assert (facts["kvLoraRank"], facts["ropeDimensionCount"]) == (512, 64)
    assert (facts["indexerHeadCount"], facts["indexerKeyLength"]) == (32, 128)
    assert "indexerTypes" not in facts  # every layer runs the full indexer
    assert "headCountKvPerLayer" not in facts  # no KDA layers


def test_glm5_plans_mla_kv_on_vllm_through_the_operator() -> None:
    mv = _model_version(GLM5_CONFIG)
    facts = model_facts_for(mv)
    assert (facts.block_count, facts.nextn_predict_layers) == (78, 1)
    assert (facts.n_embd_k_gqa, facts.n_embd_v_gqa) == (576, 0)
    service = GLMService.model_validate({
        "metadata": {"name": "glm5", "namespace": "ns"},
        "spec": {"modelVersion": "mv", "engine": {"vllm": {}}, "gateway": {"access": "Open"},
                 "accelerator": {"profile": "nvidia-h200", "count": 8},
                 "contextLength": 32768, "concurrency": 4},
    })
    result = plan(plan_request_for(service, mv))
    # vLLM, bf16 ("auto"), 78 + 1 nextn layers: the latent, (512 + 64) x 2 = 1152 bytes,
    # plus the indexer's fp8 keys with one f32 scale per 128, 128 + 4 = 132 bytes:
    # 79 x (1152 + 132) = 101436 bytes per token. Reading config.json's 64 KV heads as GQA
    # (K 192 + 64, V 256 per head) would say 79 x 64 x 512 x 2 = 5177344.
    assert mem.vllm_kv_bytes_per_token(facts, "auto") == 79 * (1152 + 132) == 101436
    # The GLM-5 family's default on an fp8 device is the recipes' fp8 KV cache (issue 38):
    # the latent in one byte per value, the indexer's cache as it was
    assert result.vllm is not None and result.vllm.kv_cache_dtype == "fp8"
    assert result.kv_bytes_per_token == 79 * (576 + 132) == 55932
    # one latent head, replicated on all 8 TP ranks: a rank holds the whole 101436 bytes
    assert mem.vllm_kv_bytes_per_token(facts, "auto", kv_heads_share=Fraction(1, 8)) == 101436
    # llama.cpp (f16, no nextn KV): 78 x (576 + 128) x 2 = 109824
    assert mem.kv_bytes_per_token(facts, "f16", "f16", nextn=False) == 109824


def test_partial_rotary_factor_scales_the_cached_rope_dims() -> None:
    config = {**GLM5_CONFIG, "rope_parameters": {"partial_rotary_factor": 0.5}}
    facts = facts_from_config(config)
    # GlmMoeDsaModel: rope.dimension_count = qk_rope_head_dim x partial_rotary_factor; the
    # key length stays kv_lora_rank + qk_rope_head_dim (DeepseekV2Model)
    assert (facts.rope_dimension_count, facts.key_length) == (32, 576)


def test_glm5_next_config_gives_kda_layers_and_kpool() -> None:
    facts = facts_from_config(GLM5_NEXT_CONFIG)
    assert facts.architecture == "glm5-next" and facts.block_count == 46
    kda = [0 if i % 4 != 3 else 1 for i in range(45)]
    assert facts.head_count_kv_per_layer == [*kda, 1]  # the nextn block is attention
    assert (facts.kda_head_dim, facts.ssm_conv_kernel, facts.hyper_connection_count) == (
        128, 4, 4)
    assert (facts.kv_lora_rank, facts.rope_dimension_count, facts.key_length,
            facts.value_length, facts.head_count_kv) == (512, 0, 512, 512, 1)
    assert (facts.indexer_key_length, facts.indexer_kpool) == (128, 16)

    planned = model_facts_for(_model_version(GLM5_NEXT_CONFIG))
    assert (planned.block_count, planned.recurrent_layers, planned.attention_layers) == (
        45, 34, 11)
    # llama.cpp, f16: 11 MLA layers x (512 latent + 3 x 128 k-pool indexer) x 2 = 19712
    assert mem.kv_bytes_per_token(planned, "f16", "f16", nextn=False) == 19712
    # vLLM, bf16: 12 layers (11 + nextn) x 512 x 2 = 12288, plus one 132-byte indexer entry
    # per 16 tokens in those 12 layers, 12 x 132 / 16 = 99: 12387
    assert mem.vllm_kv_bytes_per_token(planned, "auto") == 12387


def test_vllm_registry_class_and_explicit_layer_types() -> None:
    text = {**GLM5_NEXT_TEXT, "num_hidden_layers": 4, "num_nextn_predict_layers": 0,
            "layer_types": ["linear_attention", "full_attention", "linear_attention",
                            "indexed_attention"],
            "linear_attn_config": None, "linear_head_dim": 64, "linear_conv_kernel_dim": 3}
    facts = facts_from_config({"architectures": ["Glm5NextForCausalLM"], **text})
    assert facts.architecture == "glm5-next" and facts.block_count == 4
    assert facts.head_count_kv_per_layer == [0, 1, 0, 1]
    assert (facts.kda_head_dim, facts.ssm_conv_kernel) == (64, 3)


def test_indexer_schedules_become_indexer_types() -> None:
    shared = facts_from_config({**GLM5_CONFIG, "num_hidden_layers": 6,
                                "indexer_types": ["full", "shared", "full", "shared",
                                                  "shared", "full"]})
    assert shared.indexer_types == [True, False, True, False, False, True]
    # transformers' schedule: full where max(i - offset + 1, 0) % freq == 0
    freq = facts_from_config({**GLM5_CONFIG, "num_hidden_layers": 6, "index_topk_freq": 2})
    assert freq.indexer_types == [True, True, False, True, False, True]
    pattern = facts_from_config({**GLM5_CONFIG, "num_hidden_layers": 4,
                                 "index_topk_pattern": "FSSF"})
    assert pattern.indexer_types == [True, False, False, True]


def test_hostile_mla_values_are_dropped_not_fatal() -> None:
    facts = facts_from_config({**GLM5_CONFIG, "hc_mult": -1, "index_head_dim": "128"})
    assert facts.hyper_connection_count is None and facts.indexer_key_length is None
    assert facts.kv_lora_rank == 512 and facts.block_count == 79
    # a latent rank out of range: the config's attention heads stand (64 KV heads of
    # head_dim 64), which plans more KV than MLA keeps, not less
    gqa = facts_from_config({**GLM5_CONFIG, "kv_lora_rank": 10**9})
    assert (gqa.kv_lora_rank, gqa.head_count_kv, gqa.key_length) == (None, 64, 64)
    long = facts_from_config({**GLM5_NEXT_CONFIG,
                              "text_config": {**GLM5_NEXT_TEXT, "num_hidden_layers": 2000}})
    assert long.head_count_kv_per_layer is None and long.block_count is None
