"""GLM-5-family facts the layout and recipe tests share (issue 38).

GLM-5 (zai-org/GLM-5 config.json, GlmMoeDsaForCausalLM): 78 trunk layers + 1 nextn, hidden
6144, 64 heads, MLA kv_lora_rank 512 + qk_rope_head_dim 64, the DSA indexer (32 heads of 128),
256 routed experts of 2048 (8 used) and one shared, the first 3 layers dense (12288), vocab
154880, a 202,752-token context. "744B" counts the trunk: 75 MoE layers x 256 x 3 x 6144 x
2048 = 724.8B of routed experts and about 19B of attention, shared experts, dense layers and
embeddings. The nextn (MTP) layer vLLM also loads adds another MoE layer, 9.7B of experts and
0.2B beside: 754B is what an fp8 checkpoint holds, one byte each (its size, when measured).
GLM-5.2 (June 2026): 1M context (max_position_embeddings 1048576) and shared indexers
(index_topk_freq 4, index_skip_topk_offset 3: 21 of the 78 layers run the full indexer).
"""

from __future__ import annotations

from dataclasses import replace

from glm_operator.planning.facts import ArchitectureFacts

GLM5 = ArchitectureFacts(
    architecture="glm-dsa", block_count=78, embedding_length=6144, head_count=64,
    head_count_kv=1, key_length=576, value_length=512, context_length=202752,
    kv_lora_rank=512, rope_dimension_count=64, indexer_head_count=32, indexer_key_length=128,
    nextn_predict_layers=1, expert_count=256, expert_used_count=8,
    parameter_count=754_000_000_000, vocab_size=154880, feed_forward_length=12288,
    expert_feed_forward_length=2048, leading_dense_block_count=3,
)
GLM52 = replace(GLM5, context_length=1_048_576, parameter_count=753_000_000_000,
                indexer_layers=21)

# GLM-4.6 / GLM-4.7 (glm4moe, Glm4MoeForCausalLM): 92 layers + 1 nextn, hidden 5120, 96 heads,
# 8 KV heads of 128, 160 experts of 1536 (8 used), the first 3 layers dense, 202,752 context;
# 355B without the nextn layer, 359B with it.
GLM46 = ArchitectureFacts(
    architecture="glm4moe", block_count=92, embedding_length=5120, head_count=96,
    head_count_kv=8, key_length=128, value_length=128, context_length=202752,
    nextn_predict_layers=1, expert_count=160, expert_used_count=8,
    parameter_count=359_000_000_000, vocab_size=151552, feed_forward_length=12288,
    expert_feed_forward_length=1536, leading_dense_block_count=3,
)
