"""The memory model: bytes of weights, KV cache and compute buffers. Pure arithmetic.

Every formula here is written out, with its sources and worked examples, in
docs/planning.md. Change both together.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from glm_operator.planning.facts import ArchitectureFacts

MiB = 1024**2
GiB = 1024**3

WeightFormat = Literal["gguf", "hf"]


@dataclass(frozen=True)
class QuantizationType:
    name: str
    bits_per_weight: float  # whole-model average, including scales and the tensors kept wider
    format: WeightFormat


# Average bits per weight of a whole model in each quantization. GGUF figures are llama.cpp's
# quantization mixes measured over whole models (token embedding and output kept wider, block
# scales included), so they sit above the nominal bit width. HF figures include group scales
# (AWQ/GPTQ int4 with group size 128: 4 + 16/128 scale + zero point ~ 4.25).
# Ordered largest first within each format: "a smaller quantization" is a later entry.
QUANTIZATIONS: tuple[QuantizationType, ...] = (
    QuantizationType("F32", 32.0, "gguf"),
    QuantizationType("F16", 16.0, "gguf"),
    QuantizationType("BF16", 16.0, "gguf"),
    QuantizationType("Q8_0", 8.5, "gguf"),
    QuantizationType("Q6_K", 6.56, "gguf"),
    QuantizationType("Q5_K_M", 5.69, "gguf"),
    QuantizationType("Q5_K_S", 5.54, "gguf"),
    QuantizationType("Q5_1", 6.0, "gguf"),
    QuantizationType("Q5_0", 5.5, "gguf"),
    QuantizationType("Q4_K_M", 4.85, "gguf"),
    QuantizationType("Q4_K_S", 4.58, "gguf"),
    QuantizationType("Q4_1", 5.0, "gguf"),
    QuantizationType("Q4_0", 4.55, "gguf"),
    QuantizationType("IQ4_NL", 4.5, "gguf"),
    QuantizationType("IQ4_XS", 4.25, "gguf"),
    QuantizationType("MXFP4_MOE", 4.25, "gguf"),
    QuantizationType("Q3_K_L", 4.27, "gguf"),
    QuantizationType("Q3_K_M", 3.91, "gguf"),
    QuantizationType("Q3_K_S", 3.5, "gguf"),
    QuantizationType("IQ3_M", 3.66, "gguf"),
    QuantizationType("IQ3_XXS", 3.06, "gguf"),
    QuantizationType("Q2_K", 3.0, "gguf"),
    QuantizationType("IQ2_M", 2.7, "gguf"),
    QuantizationType("IQ2_XS", 2.31, "gguf"),
    QuantizationType("IQ1_M", 1.75, "gguf"),
    QuantizationType("fp32", 32.0, "hf"),
    QuantizationType("bf16", 16.0, "hf"),
    QuantizationType("fp16", 16.0, "hf"),
    QuantizationType("fp8", 8.0, "hf"),
    QuantizationType("int8", 8.0, "hf"),
    QuantizationType("w8a8", 8.0, "hf"),
    # ModelSlim (vllm-ascend): W8A8 with an int8 KV cache ("C8"), and W4A8 (int4 weights
    # with a scale per group of 256 and the int8 layers ModelSlim keeps: about 4.5 bits)
    QuantizationType("w8a8c8", 8.0, "hf"),
    QuantizationType("w4a8", 4.5, "hf"),
    QuantizationType("gptq-int8", 8.25, "hf"),
    QuantizationType("awq", 4.25, "hf"),
    QuantizationType("gptq", 4.25, "hf"),
    QuantizationType("w4a16", 4.25, "hf"),
    QuantizationType("mxfp4", 4.25, "hf"),
)
_QUANT_BY_NAME = {q.name.lower(): q for q in QUANTIZATIONS}
# The ladder the "smaller quantization" alternative walks down, per format.
QUANTIZATION_LADDER: dict[WeightFormat, tuple[str, ...]] = {
    "gguf": ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K"),
    "hf": ("bf16", "fp8", "awq"),
}


def quantization(name: str) -> QuantizationType:
    try:
        return _QUANT_BY_NAME[name.lower()]
    except KeyError:
        known = ", ".join(q.name for q in QUANTIZATIONS)
        raise ValueError(f"unknown quantization {name!r}; known: {known}") from None


# KV cache element types: bytes per value as a fraction (ggml block size / values per block).
KV_CACHE_TYPES: dict[str, Fraction] = {
    "f32": Fraction(4),
    "f16": Fraction(2),
    "bf16": Fraction(2),
    "q8_0": Fraction(34, 32),
    "q5_1": Fraction(24, 32),
    "q5_0": Fraction(22, 32),
    "q4_1": Fraction(20, 32),
    "q4_0": Fraction(18, 32),
    "iq4_nl": Fraction(18, 32),
    # vLLM spellings
    "auto": Fraction(2),
    "fp8": Fraction(1),
    "fp8_e4m3": Fraction(1),
    "fp8_e5m2": Fraction(1),
}
LLAMACPP_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
VLLM_KV_TYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_QUANT_BLOCK = 32  # values per block of every quantized KV type above


def kv_row_bytes(values: int, cache_type: str) -> int:
    """Bytes of one row of `values` elements of a KV type (ggml_row_size)."""
    per_value = KV_CACHE_TYPES[cache_type]
    if per_value.denominator != 1 and values % _QUANT_BLOCK:
        raise ValueError(
            f"KV type {cache_type} stores blocks of {_QUANT_BLOCK}; a row of {values} values "
            "is not a whole number of blocks"
        )
    return int(per_value * values)


def kv_layers(facts: ArchitectureFacts, *, nextn: bool = True) -> int:
    """Layers that hold KV cache: the trunk's attention layers, plus the nextn (MTP) layers
    when `nextn`.

    Counting the nextn layers is the conservative reading and what vLLM with MTP speculative
    decoding allocates. The pinned llama.cpp (llama-cpp-python 0.3.36) filters them out of
    the main context's cache (`il < n_layer()`), so its plans pass `nextn=False`. Recurrent
    (KDA) layers of a hybrid model hold a fixed state instead (`recurrent_state_bytes`).
    """
    return facts.attention_layers + (facts.nextn_predict_layers if nextn else 0)


def indexer_layers(facts: ArchitectureFacts, *, nextn: bool = True) -> int:
    """Layers with a DSA lightning-indexer key cache: the full-indexer trunk layers (every
    attention layer unless the GGUF lists them), plus the nextn layers when `nextn`."""
    if not facts.indexer_row:
        return 0
    trunk = facts.indexer_layers if facts.indexer_layers is not None else facts.attention_layers
    return trunk + (facts.nextn_predict_layers if nextn else 0)


def kv_bytes_per_token(
    facts: ArchitectureFacts, type_k: str, type_v: str, *, kv_heads_share: Fraction = Fraction(1),
    nextn: bool = True,
) -> int:
    """sum over KV layers of n_embd_k_gqa * bytes(type_k) + n_embd_v_gqa * bytes(type_v),
    plus the indexer's keys (indexer_row * bytes(type_k) in each indexer layer).

    MLA stores K only (the latent, n_embd_v_gqa = 0). `kv_heads_share` is the fraction of
    the KV heads one device holds (tensor parallel).
    """
    k = kv_row_bytes(facts.n_embd_k_gqa, type_k)
    v = kv_row_bytes(facts.n_embd_v_gqa, type_v) if facts.n_embd_v_gqa else 0
    attention = kv_layers(facts, nextn=nextn) * (k + v)
    indexer = (indexer_layers(facts, nextn=nextn) * kv_row_bytes(facts.indexer_row, type_k)
               if facts.indexer_row else 0)
    return int((attention + indexer) * kv_heads_share)


VLLM_INDEXER_QUANT_BLOCK = 128  # DeepseekV32Indexer.quant_block_size: one f32 scale per 128


def vllm_indexer_bytes_per_token(facts: ArchitectureFacts) -> Fraction:
    """vLLM 0.33's DSA indexer key cache per token and indexer layer, whatever the KV type:
    fp8 keys plus a 4-byte scale per 128 of them, uint8 (vllm/models/deepseek_v32/
    attention.py DeepseekV32Indexer: `head_dim + head_dim // quant_block_size * 4`); with
    k-pool compression one such entry per index_kpool tokens (vllm/models/glm5next/common/
    attention.py Glm5NextIndexerCache, `tokens_per_state = index_kpool`)."""
    d = facts.indexer_key_length
    if not d:
        return Fraction(0)
    row = d + d // VLLM_INDEXER_QUANT_BLOCK * 4
    kpool = facts.indexer_kpool or 1
    return Fraction(row, kpool) if kpool > 1 else Fraction(row)


def vllm_kv_bytes_per_token(
    facts: ArchitectureFacts, kv_dtype: str, *, kv_heads_share: Fraction = Fraction(1)
) -> int:
    """KV cache bytes per token of vLLM 0.33 (every layer, nextn included: vLLM allocates
    them for MTP), for the device holding `kv_heads_share` of the KV heads.

    - GQA: K and V of the device's heads, in `kv_dtype`.
    - MLA: one latent of kv_lora_rank + qk_rope_head_dim values per token and layer in
      `kv_dtype`, no V, and the same full latent on every TP rank
      (vllm/model_executor/layers/attention/mla_attention.py MLAAttention.get_kv_cache_spec:
      `num_kv_heads=1, max_tp_shards=1, head_size=kv_lora_rank + qk_rope_head_dim`), so
      `kv_heads_share` does not divide it.
    - DSA indexer: its fp8 key cache in each indexer layer and the nextn layers
      (`vllm_indexer_bytes_per_token`; DeepseekV32Attention builds an indexer for every
      layer that is not skip_topk, and for the MTP layers), also replicated.
    """
    layers = kv_layers(facts)
    if facts.is_mla:
        attention: Fraction | int = layers * kv_row_bytes(facts.n_embd_k_gqa, kv_dtype)
    else:
        k = kv_row_bytes(facts.n_embd_k_gqa, kv_dtype)
        v = kv_row_bytes(facts.n_embd_v_gqa, kv_dtype)
        attention = layers * (k + v) * kv_heads_share
    indexer = indexer_layers(facts) * vllm_indexer_bytes_per_token(facts)
    return int(attention + indexer)


RECURRENT_STATE_BYTES_PER_VALUE = 4  # llama.cpp keeps the R and S states in f32


def recurrent_state_bytes(facts: ArchitectureFacts, sequences: int) -> int:
    """The fixed state of the recurrent (KDA) layers for `sequences` sequences (slots).

    Per layer and sequence (llama_hparams::n_embd_r / n_embd_s for KDA): the Q, K and V
    convolution windows, 3 x (d_conv - 1) x n_head x head_dim, and the delta-rule state
    matrix, head_dim^2 x n_head, in f32, whatever the context length.
    """
    if not facts.recurrent_layers:
        return 0
    head_dim, conv = facts.kda_head_dim or 0, facts.ssm_conv_kernel or 0
    r = 3 * (conv - 1) * facts.head_count * head_dim
    s = head_dim * head_dim * facts.head_count
    per_sequence = facts.recurrent_layers * (r + s) * RECURRENT_STATE_BYTES_PER_VALUE
    return per_sequence * max(sequences, 1)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def estimated_parameters(facts: ArchitectureFacts) -> int | None:
    """Total parameters: declared, else back-computed from a measured size."""
    if facts.parameter_count:
        return facts.parameter_count
    if facts.weights_bytes and facts.quantization:
        bpw = quantization(facts.quantization).bits_per_weight
        return int(facts.weights_bytes * 8 / bpw)
    return None


@dataclass(frozen=True)
class WeightsEstimate:
    bytes: int
    measured: bool  # True: the artifact's measured size; False: parameters x bits per weight
    basis: str


def weights_bytes(facts: ArchitectureFacts, quant: str, *, nextn: bool = True) -> WeightsEstimate:
    """Bytes of the weights in `quant`: measured when the facts measured that quantization.

    `nextn=False` (the pinned llama.cpp, which skips the MTP layers' tensors) leaves out
    the nextn layers' measured bytes.
    """
    q = quantization(quant)
    if facts.weights_bytes and facts.quantization and facts.quantization.lower() == quant.lower():
        skipped = 0 if nextn else (facts.nextn_weights_bytes or 0)
        basis = f"measured size of the {q.name} file"
        if skipped:
            basis += f" less its nextn layers ({skipped / MiB:.1f} MiB, not loaded)"
        return WeightsEstimate(facts.weights_bytes - skipped, True, basis)
    params = estimated_parameters(facts)
    if params is None:
        raise ValueError(
            "model facts give neither parameter_count nor a measured size: cannot size the weights"
        )
    return WeightsEstimate(
        int(params * q.bits_per_weight / 8),
        False,
        f"{params / 1e9:.2f}B parameters x {q.bits_per_weight} bits per weight ({q.name})",
    )


def vocab_size(facts: ArchitectureFacts) -> int:
    # GLM-4 family vocabulary (151552) as the fallback: over-estimating logits is safe.
    return facts.vocab_size or 151552


# Without `feed_forward_length` the FFN is taken as 4 x n_embd wide: the classic transformer
# ratio, above GLM's (GLM-4-9B 13696 / 4096 = 3.3; GLM-4.5-Air's 8 routed experts 2.75).
FFN_WIDTH_PER_EMBD_FALLBACK = 4


def ffn_width(facts: ArchitectureFacts) -> int:
    """FFN intermediate values per token in the widest layer.

    Dense: n_ff. MoE: the routed experts' intermediates are one batched tensor of
    n_expert_used x n_ff_exp per token (`ggml_mul_mat_id`); models with leading dense layers
    (glm4moe) take the larger of that and the dense n_ff. A GGUF without
    `expert_feed_forward_length` (llama-style MoE) states the expert width as n_ff.
    """
    if facts.feed_forward_length is None and facts.expert_feed_forward_length is None:
        return FFN_WIDTH_PER_EMBD_FALLBACK * facts.embedding_length
    dense = facts.feed_forward_length or 0
    if not facts.is_moe:
        return dense
    expert = facts.expert_feed_forward_length or dense
    return max(dense, max(facts.expert_used_count, 1) * expert)


def llamacpp_compute_bytes(
    facts: ArchitectureFacts, *, n_tokens: int, n_kv: int, n_outputs: int, flash_attention: bool
) -> int:
    """llama.cpp's compute buffer: the graph allocator's peak over the reserved graphs.

    llama.cpp reserves the prompt-processing graph of one micro-batch (`n_tokens` =
    min(n_ctx, n_ubatch)) with `n_outputs` logit rows (llama-server: one per slot) and sizes
    the buffer to the allocator's peak, which falls in one layer's widest phase (f32 rows of
    n_tokens):

    - FFN: gate, up and their SwiGLU product (3 x ffn_width, all live at once: the GLU op is
      not done in place) plus about 4 rows of n_embd (the residual stream and n_embd-sized
      blocks freed earlier that the wider FFN tensors cannot reuse); with mHC the residual is
      hyper_connection_count x n_embd wide, one more such block;
    - attention without flash attention: one layer's KQ scores (n_head x n_kv) plus the same
      rows of n_embd. With flash attention the scores never exist (work buffer only);
    - MLA: the absorbed queries, 3 x n_head x (kv_lora_rank + n_rot) (q_nope absorbed, q_pe
      and their concatenation), plus the rows of n_embd.

    On top, live through every layer: the KQ mask input (n_kv x n_tokens, f16 with flash
    attention, f32 without), n_kv being the KV length one sequence attends (the per-slot
    context, or the whole context with a unified cache); the f32 logits of the outputs; and
    with a DSA lightning indexer its f32 scores over the n_kv keys and its f16 mask over the
    keys (glm-dsa) or over the n_kv / kpool pools (glm5-next): (4 + 2 / kpool) bytes per
    token and key.
    """
    embd_rows = 4 * facts.embedding_length + facts.hyper_connection_count * facts.embedding_length
    ffn = n_tokens * 4 * (3 * ffn_width(facts) + embd_rows)
    if flash_attention:
        mask = n_tokens * n_kv * 2
        attention = 0
    else:
        mask = n_tokens * n_kv * 4
        attention = n_tokens * 4 * (facts.head_count * n_kv + embd_rows)
    if facts.is_mla:
        mla = n_tokens * 4 * (3 * facts.head_count * facts.n_embd_k_gqa + embd_rows)
        attention = max(attention, mla)
    indexer = 0
    if facts.indexer_row:
        kpool = max(facts.indexer_kpool or 1, 1)
        indexer = n_tokens * n_kv * 4 + n_tokens * n_kv * 2 // kpool
    logits = n_outputs * vocab_size(facts) * 4
    return mask + indexer + max(ffn, attention) + logits


def vllm_activation_bytes(
    facts: ArchitectureFacts, *, max_num_batched_tokens: int, max_num_seqs: int, tp: int
) -> int:
    """vLLM's profiled peak outside weights and KV, per GPU.

    vLLM measures it with a dummy forward pass of max_num_batched_tokens tokens: about 16
    bf16 rows of n_embd per token for the hidden states, QKV and MLP intermediates (split
    across TP ranks except the residual stream), plus the sampler's f32 logits for
    max_num_seqs sequences (kept twice: logits and probabilities).
    """
    hidden = max_num_batched_tokens * facts.embedding_length * 2
    per_gpu = hidden * 4 + hidden * 12 // tp
    sampler = max_num_seqs * vocab_size(facts) * 4 * 2
    return per_gpu + sampler


VLLM_CUDA_GRAPH_BYTES = 1 * GiB  # graph capture for the default batch-size ladder
VLLM_TP_COMMUNICATION_BYTES = 512 * MiB  # NCCL/HCCL buffers and custom all-reduce, when TP > 1


# ---------------------------------------------------------------- expert parallelism


@dataclass(frozen=True)
class MoeWeights:
    """A MoE model's weights in two parts: what every data-parallel rank holds whole
    (attention, the dense layers, shared experts, embeddings, norms, routers) and the routed
    experts, which expert parallelism splits over the EP ranks."""

    replicated: int
    experts: int
    basis: str


def moe_weights(facts: ArchitectureFacts, total: int) -> MoeWeights:
    """Split `total` weight bytes into the replicated part and the routed experts.

    routed expert parameters = MoE layers x expert_count x 3 x n_embd x n_ff_exp (gate, up
    and down of every expert), MoE layers = trunk layers - leading dense layers + nextn
    layers (vLLM loads the MTP layer's experts too); the experts' share of the total is
    their share of the parameters (the quantization scales both alike). GLM-5: 76 x 256 x 3
    x 6144 x 2048 = 734.6B of 744B, so 9.4B stay replicated.

    Without `leading_dense_block_count`, or when the estimate leaves less than the
    embeddings and a dense attention block per layer (4 x n_embd^2, about GLM-5's MLA with
    its indexer), the replicated part is that floor instead: the conservative side, since
    a DEP rank holds every replicated byte.
    """
    params = estimated_parameters(facts)
    n_ff_exp = facts.expert_feed_forward_length or facts.feed_forward_length
    if not facts.is_moe or not params or not n_ff_exp:
        return MoeWeights(total, 0, "not a MoE model with known expert widths: all replicated")
    layers = facts.block_count + facts.nextn_predict_layers
    floor = (2 * vocab_size(facts) * facts.embedding_length
             + layers * 4 * facts.embedding_length ** 2)
    dense = facts.leading_dense_block_count
    moe_layers = layers - (dense or 0)
    expert_params = moe_layers * facts.expert_count * 3 * facts.embedding_length * n_ff_exp
    replicated_params = params - expert_params
    basis = (f"{moe_layers} MoE layers x {facts.expert_count} experts x 3 x "
             f"{facts.embedding_length} x {n_ff_exp}")
    if dense is None or replicated_params < floor:
        replicated_params = min(floor, params)
        basis += (f"; replicated part taken as embeddings + 4 x n_embd^2 per layer "
                  f"({replicated_params / 1e9:.1f}B parameters)")
    replicated = int(total * Fraction(replicated_params, params))
    return MoeWeights(replicated, total - replicated, basis)


# vLLM 0.33's sparse MLA (DSA) prefill buffers, per GPU (vllm/config/attention.py
# sparse_mla_prefill_workspace_factor: 5 when max_model_len <= 256K, else 2;
# v1/attention/backends/mla/indexer.py get_max_prefill_buffer_size; envs.py
# VLLM_SPARSE_INDEXER_MAX_LOGITS_MB 512).
VLLM_SPARSE_MLA_SMALL_CONTEXT = 256 * 1024
VLLM_SPARSE_INDEXER_MAX_LOGITS_BYTES = 512 * MiB


def vllm_sparse_mla_workspace_bytes(facts: ArchitectureFacts, max_model_len: int) -> int:
    """What a DSA model's prefill takes beside the KV cache: FlashMLA sparse gathers a step's
    context latents into a bf16 workspace of factor x max_model_len x 576 x 2 bytes, the
    indexer's prefill key buffer is sized to the same bytes ((576 x 2 // 132) x factor x
    max_model_len entries of 132), and its logits are chunked to 512 MiB."""
    if not (facts.is_mla and facts.indexer_key_length):
        return 0
    factor = 5 if max_model_len <= VLLM_SPARSE_MLA_SMALL_CONTEXT else 2
    latent = facts.n_embd_k_gqa
    workspace = factor * max_model_len * latent * 2
    indexer = max_model_len * (latent * 2 // 132) * factor * 132
    return workspace + indexer + VLLM_SPARSE_INDEXER_MAX_LOGITS_BYTES
