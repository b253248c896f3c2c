"""The memory arithmetic of the GLM architectures beyond plain GQA: MLA (one latent KV head,
no V), the DSA indexer's key cache, glm5-next's recurrent KDA state, and the nextn layers the
pinned llama.cpp does not load (docs/planning.md, "KV cache" and "Compute buffers")."""

from __future__ import annotations

import pytest
from glm_operator.planning import memory as mem
from glm_operator.planning.facts import ArchitectureFacts

GLM5_CLASS = dict(
    architecture="glm-dsa", block_count=78, embedding_length=6144, head_count=64,
    head_count_kv=1, key_length=576, value_length=512, context_length=202752,
    kv_lora_rank=512, rope_dimension_count=64, indexer_head_count=32, indexer_key_length=128,
    nextn_predict_layers=1,
)


def test_mla_caches_the_latent_and_no_v() -> None:
    facts = ArchitectureFacts(**GLM5_CLASS)  # type: ignore[arg-type]
    assert (facts.n_embd_k_gqa, facts.n_embd_v_gqa) == (576, 0)
    # llama.cpp: 78 trunk layers x (576 f16 latent + 128 f16 indexer key)
    assert mem.kv_bytes_per_token(facts, "f16", "f16", nextn=False) == 78 * (576 + 128) * 2
    # vLLM counts the nextn layer too
    assert mem.kv_bytes_per_token(facts, "f16", "f16") == 79 * (576 + 128) * 2
    # q8_0 rows: 576 / 32 x 34 and 128 / 32 x 34
    assert mem.kv_bytes_per_token(facts, "q8_0", "q8_0", nextn=False) == 78 * (612 + 136)


def test_indexer_types_limit_the_indexer_layers() -> None:
    facts = ArchitectureFacts(**{**GLM5_CLASS, "indexer_layers": 20})  # type: ignore[arg-type]
    assert mem.kv_bytes_per_token(facts, "f16", "f16", nextn=False) == (78 * 576 + 20 * 128) * 2


def _glm5_next(**changes: int) -> ArchitectureFacts:
    values = dict(
        architecture="glm5-next", block_count=45, embedding_length=4096, head_count=32,
        head_count_kv=1, key_length=512, context_length=131072, kv_lora_rank=512,
        rope_dimension_count=0, indexer_key_length=128, indexer_kpool=4, recurrent_layers=33,
        kda_head_dim=128, ssm_conv_kernel=4, hyper_connection_count=4, nextn_predict_layers=1,
    )
    return ArchitectureFacts(**{**values, **changes})  # type: ignore[arg-type]


def test_hybrid_kv_covers_the_attention_layers_only() -> None:
    facts = _glm5_next()
    assert facts.attention_layers == 12
    # 12 MLA layers x (512 latent + 3 x 128 k-pool indexer row), f16
    assert mem.kv_bytes_per_token(facts, "f16", "f16", nextn=False) == 12 * (512 + 384) * 2


def test_recurrent_state_is_per_slot_not_per_token() -> None:
    facts = _glm5_next()
    conv = 3 * (4 - 1) * 32 * 128
    state = 128 * 128 * 32
    assert mem.recurrent_state_bytes(facts, 1) == 33 * (conv + state) * 4
    assert mem.recurrent_state_bytes(facts, 4) == 4 * mem.recurrent_state_bytes(facts, 1)
    assert mem.recurrent_state_bytes(ArchitectureFacts(**GLM5_CLASS), 4) == 0  # type: ignore[arg-type]


def test_recurrent_layers_need_their_sizes() -> None:
    with pytest.raises(ValueError, match="kda_head_dim"):
        _glm5_next(kda_head_dim=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attention layer"):
        _glm5_next(recurrent_layers=45)


def test_llamacpp_weights_leave_out_the_nextn_tensors() -> None:
    facts = ArchitectureFacts(**{**GLM5_CLASS, "weights_bytes": 10 * mem.GiB,  # type: ignore[arg-type]
                                 "quantization": "Q4_K_M", "nextn_weights_bytes": mem.GiB})
    assert mem.weights_bytes(facts, "Q4_K_M").bytes == 10 * mem.GiB
    estimate = mem.weights_bytes(facts, "Q4_K_M", nextn=False)
    assert estimate.bytes == 9 * mem.GiB and estimate.measured
    assert "nextn" in estimate.basis


def test_compute_counts_the_mla_phase_and_the_indexer() -> None:
    facts = ArchitectureFacts(**{**GLM5_CLASS, "feed_forward_length": 12288,  # type: ignore[arg-type]
                                 "vocab_size": 154880})
    n_tokens, n_kv = 512, 32768
    got = mem.llamacpp_compute_bytes(facts, n_tokens=n_tokens, n_kv=n_kv, n_outputs=1,
                                     flash_attention=True)
    embd_rows = 4 * 6144
    mla = n_tokens * 4 * (3 * 64 * 576 + embd_rows)
    ffn = n_tokens * 4 * (3 * 12288 + embd_rows)
    mask, indexer = n_tokens * n_kv * 2, n_tokens * n_kv * (4 + 2)
    assert got == mask + indexer + max(mla, ffn) + 154880 * 4
    # k-pool: the indexer's f16 mask is over n_kv / kpool pools; mHC widens the residual
    hybrid = _glm5_next(feed_forward_length=12288, vocab_size=154880)
    got = mem.llamacpp_compute_bytes(hybrid, n_tokens=n_tokens, n_kv=n_kv, n_outputs=1,
                                     flash_attention=True)
    embd_rows = 8 * 4096
    mla = n_tokens * 4 * (3 * 32 * 512 + embd_rows)
    ffn = n_tokens * 4 * (3 * 12288 + embd_rows)
    assert got == n_tokens * n_kv * (2 + 4) + n_tokens * n_kv * 2 // 4 + max(mla, ffn) \
        + 154880 * 4


def test_facts_from_gguf_metadata_of_a_hybrid_model() -> None:
    arch = "glm5-next"
    metadata = {
        "general.architecture": arch, f"{arch}.block_count": 7, f"{arch}.nextn_predict_layers": 1,
        f"{arch}.embedding_length": 256, f"{arch}.context_length": 65536,
        f"{arch}.attention.head_count": 8, f"{arch}.attention.head_count_kv": [0, 0, 1, 0, 0, 1, 1],
        f"{arch}.attention.key_length": 128, f"{arch}.attention.kv_lora_rank": 128,
        f"{arch}.rope.dimension_count": 0, f"{arch}.attention.indexer.key_length": 64,
        f"{arch}.attention.indexer.kpool": 4, f"{arch}.kda.head_dim": 32,
        f"{arch}.ssm.conv_kernel": 4, f"{arch}.hyper_connection.count": 4,
        f"{arch}.attention.indexer.types": [1, 0, 1, 1, 0, 1],
    }
    facts = ArchitectureFacts.from_gguf_metadata(metadata, file_size=1000,
                                                 nextn_weights_bytes=100)
    assert (facts.block_count, facts.recurrent_layers, facts.attention_layers) == (6, 4, 2)
    assert (facts.head_count_kv, facts.n_embd_k_gqa, facts.n_embd_v_gqa) == (1, 128, 0)
    assert (facts.indexer_row, facts.indexer_layers) == (192, 4)
    assert (facts.hyper_connection_count, facts.nextn_weights_bytes) == (4, 100)


def test_vllm_keeps_one_latent_per_rank_and_an_fp8_indexer() -> None:
    """vLLM 0.33: MLAAttention.get_kv_cache_spec (vllm/model_executor/layers/attention/
    mla_attention.py) caches num_kv_heads=1, max_tp_shards=1, head_size = kv_lora_rank +
    qk_rope_head_dim in the KV dtype, on every TP rank; DeepseekV32Indexer (vllm/models/
    deepseek_v32/attention.py) caches head_dim + head_dim // 128 * 4 uint8 per token in
    every indexer layer and the MTP layer; Glm5NextIndexerCache one entry per index_kpool
    tokens."""
    from fractions import Fraction

    facts = ArchitectureFacts(**GLM5_CLASS)  # type: ignore[arg-type]
    # 79 layers x (576 x 2 bf16 latent + 132 indexer bytes), the same on each of 8 ranks
    assert mem.vllm_kv_bytes_per_token(facts, "auto") == 79 * (1152 + 132)
    assert mem.vllm_kv_bytes_per_token(facts, "auto", kv_heads_share=Fraction(1, 8)) == \
        79 * (1152 + 132)
    # fp8 KV: the latent in 1 byte a value; the indexer cache is fp8 whatever the KV type
    assert mem.vllm_kv_bytes_per_token(facts, "fp8") == 79 * (576 + 132)
    # glm5-next: 12 MLA trunk layers + the nextn one, k-pool 4: 13 x 132 / 4 = 429
    hybrid = _glm5_next()
    assert mem.vllm_kv_bytes_per_token(hybrid, "auto") == 13 * 512 * 2 + 13 * 132 // 4
    # GQA is unchanged: K and V of the rank's heads
    gqa = ArchitectureFacts(architecture="glm4", block_count=40, embedding_length=4096,
                            head_count=32, head_count_kv=2, context_length=131072,
                            key_length=128, value_length=128)
    half = Fraction(1, 2)
    assert mem.vllm_kv_bytes_per_token(gqa, "auto", kv_heads_share=half) == \
        mem.kv_bytes_per_token(gqa, "auto", "auto", kv_heads_share=half) == 40 * 256 * 2
