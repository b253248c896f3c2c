"""The planner against cases computed by hand (docs/planning.md walks through the same ones).

Every expected number below is derived in the comments from the formulas, not by calling
the planner: if the code drifts from the documented model, these fail.
"""

from __future__ import annotations

import pytest
from glm_operator.planning.facts import ArchitectureFacts
from glm_operator.planning.memory import ffn_width, llamacpp_compute_bytes
from glm_operator.planning.planner import PlanRequest, plan

MiB = 1024**2
GiB = 1024**3

# GLM-4-9B-class GGUF: glm4, 40 layers, n_embd 4096, FFN 13696, 32 heads, 2 KV heads of 128.
GLM4_9B = ArchitectureFacts(
    architecture="glm4",
    block_count=40,
    embedding_length=4096,
    head_count=32,
    head_count_kv=2,
    key_length=128,
    value_length=128,
    context_length=131072,
    feed_forward_length=13696,
    parameter_count=9_400_000_000,
    vocab_size=151552,
)

# GLM-4.5-Air-class: glm4moe, 46 layers + 1 nextn, 106B total / 12B active, 96 heads, 8 KV heads.
GLM45_AIR = ArchitectureFacts(
    architecture="glm4moe",
    block_count=46,
    nextn_predict_layers=1,
    embedding_length=4096,
    head_count=96,
    head_count_kv=8,
    key_length=128,
    value_length=128,
    context_length=131072,
    parameter_count=106_000_000_000,
    active_parameter_count=12_000_000_000,
    expert_count=128,
    expert_used_count=8,
    feed_forward_length=10944,  # the leading dense layer
    expert_feed_forward_length=1408,
    vocab_size=151552,
)

# GLM-4.6-class: glm4moe, 355B, 92 layers + 1 nextn, n_embd 5120, 96 heads, 8 KV heads.
GLM46 = ArchitectureFacts(
    architecture="glm4moe",
    block_count=92,
    nextn_predict_layers=1,
    embedding_length=5120,
    head_count=96,
    head_count_kv=8,
    key_length=128,
    value_length=128,
    context_length=202752,
    parameter_count=355_000_000_000,
    expert_count=160,
    expert_used_count=8,
    vocab_size=151552,
)

# nvidia-a10: 23028 MiB = 24_146_608_128 bytes; llama.cpp reserve 5 % = 1_207_330_406.
A10_BYTES = 23028 * MiB
A10_RESERVE = 1_207_330_406
# Q4_K_M weights: 9.4e9 x 4.85 / 8 = 5_698_750_000 bytes (5.3 GiB).
GLM4_9B_Q4_K_M = 5_698_750_000
# llama.cpp compute buffer, flash attention on, n_ubatch 512 tokens:
#   FFN phase  512 x 4 x (3 x 13696 + 4 x 4096) = 2048 x 57_472 = 117_702_656
#   KQ mask    512 x n_kv x 2 (f16); n_kv = 32768 per slot       =  33_554_432
#   logits     4 slots x 151552 x 4                              =   2_424_832
#   -> 153_681_920 (0.14 GiB) at 32k x 4.
GLM4_9B_FFN_PHASE = 117_702_656
GLM4_9B_COMPUTE = 153_681_920
NVIDIA_OVERHEAD = 512 * MiB  # 536_870_912


def test_glm4_9b_q4_k_m_on_a10_at_32k_x_4_slots() -> None:
    p = plan(PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                         accelerator="nvidia-a10", context_length=32768, concurrency=4))
    # KV per token: 40 layers x (K 2 heads x 128 x 2 B + V 2 x 128 x 2 B) = 40 x 1024 = 40_960.
    assert p.kv_bytes_per_token == 40_960
    # 4 slots x 32768 = 131_072 tokens x 40_960 = 5_368_709_120 (5.0 GiB).
    assert p.memory.kv == 5_368_709_120
    assert p.memory.weights == GLM4_9B_Q4_K_M
    assert p.memory.compute == GLM4_9B_COMPUTE
    assert p.memory.overhead == NVIDIA_OVERHEAD
    # total 5_698_750_000 + 5_368_709_120 + 153_681_920 + 536_870_912 = 11_758_011_952
    assert p.memory.total == 11_758_011_952
    assert p.memory.available == A10_BYTES == 24_146_608_128
    assert p.memory.reserved == A10_RESERVE
    # headroom 24_146_608_128 - 1_207_330_406 - 11_758_011_952 = 11_181_265_770 (10.4 GiB)
    assert p.memory.headroom == 11_181_265_770
    assert p.feasible
    assert "10.4 GiB headroom" in p.reason
    s = p.llamacpp
    assert s is not None
    assert (s.n_gpu_layers, s.parallel, s.ctx_size, s.ctx_per_slot) == (41, 4, 131072, 32768)
    assert (s.cache_type_k, s.cache_type_v, s.flash_attn, s.kv_unified) == ("f16", "f16", True,
                                                                           False)
    assert p.resources.devices == 1 and p.resources.resource_name == "nvidia.com/gpu"
    assert p.alternatives == ()


def test_glm4_9b_at_128k_x_4_does_not_fit_a10_and_names_what_would() -> None:
    p = plan(PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                         accelerator="nvidia-a10", context_length=131072, concurrency=4))
    # KV 40_960 x 524_288 = 21_474_836_480 (20.0 GiB); compute: the mask grows to
    # 512 x 131072 x 2 = 134_217_728, so 117_702_656 + 134_217_728 + 2_424_832 = 254_345_216;
    # total 5_698_750_000 + 21_474_836_480 + 254_345_216 + 536_870_912 = 27_964_802_608;
    # headroom 24_146_608_128 - 1_207_330_406 - 27_964_802_608 = -5_025_524_886 (-4.7 GiB).
    assert p.memory.kv == 21_474_836_480
    assert p.memory.compute == 254_345_216
    assert p.memory.headroom == -5_025_524_886
    assert not p.feasible
    assert "short by 4.7 GiB" in p.reason and "nvidia-a10 has 22.5 GiB" in p.reason
    by_change = {a.change: a for a in p.alternatives}
    # KV q8_0: 40 x 2 x (256 values x 34/32 B) = 21_760 B/token x 524_288 = 11_408_506_880;
    # total 17_898_473_008; headroom 24_146_608_128 - 1_207_330_406 - 17_898_473_008.
    assert by_change["KV cache q8_0"].headroom_bytes == 5_040_804_714
    # 3 slots: KV 40_960 x 393_216 = 16_106_127_360; compute 254_345_216 - 606_208 (one slot's
    # logits) = 253_739_008; total 22_595_487_280; headroom 343_790_442.
    assert by_change["3 concurrent requests"].headroom_bytes == 343_790_442
    # Any smaller quantization still needs the 20 GiB KV: none fits, none is offered.
    assert not [c for c in by_change if c.startswith("quantization")]
    assert "2 x nvidia-a10" in by_change
    assert [a.change for a in p.alternatives][:2] == ["KV cache q8_0", "3 concurrent requests"]
    assert all(a.plan.feasible and a.headroom_bytes >= 0 for a in p.alternatives)


def test_glm45_air_fp8_on_h200_with_vllm() -> None:
    p = plan(PlanRequest(facts=GLM45_AIR, quantization="fp8", engine="vllm",
                         accelerator="nvidia-h200", context_length=32768, concurrency=4))
    # KV per token: (46 + 1 nextn) x 8 KV heads x 128 x 2 B x 2 (K and V) = 47 x 4096 = 192_512.
    assert p.kv_bytes_per_token == 192_512
    # 4 x 32768 = 131_072 tokens -> 25_232_932_864 (23.5 GiB) on the single GPU.
    assert p.memory.kv == 25_232_932_864
    # fp8: 106e9 x 8 / 8 = 106_000_000_000 (98.7 GiB).
    assert p.memory.weights == 106_000_000_000
    # activations: 8192 tokens x 4096 x 2 B = 67_108_864, x (4 + 12/1) = 1_073_741_824;
    # sampler 4 seqs x 151552 x 4 B x 2 = 4_849_664; CUDA graphs 1 GiB -> 2_152_333_312.
    assert p.memory.compute == 2_152_333_312
    assert p.memory.overhead == NVIDIA_OVERHEAD
    # H200: 143771 MiB = 150_754_820_096; budget int(0.90 x) = 135_679_338_086,
    # reserve = 15_075_482_010; total 133_922_137_088 -> headroom 1_757_200_998 (1.6 GiB).
    assert p.memory.available == 150_754_820_096
    assert p.memory.reserved == 15_075_482_010
    assert p.memory.total == 133_922_137_088
    assert p.memory.headroom == 1_757_200_998
    assert p.feasible
    v = p.vllm
    assert v is not None
    assert (v.max_model_len, v.max_num_seqs, v.tensor_parallel_size) == (32768, 4, 1)
    assert (v.gpu_memory_utilization, v.kv_cache_dtype, v.dtype) == (0.90, "auto", "auto")
    # vLLM gives the headroom to KV too: (25_232_932_864 + 1_757_200_998) // 192_512.
    assert v.kv_cache_tokens == (25_232_932_864 + 1_757_200_998) // 192_512


def test_glm45_air_at_128k_x_4_on_one_h200_offers_fp8_kv_and_a_second_gpu() -> None:
    p = plan(PlanRequest(facts=GLM45_AIR, quantization="fp8", engine="vllm",
                         accelerator="nvidia-h200", context_length=131072, concurrency=4))
    # KV 192_512 x 524_288 = 100_931_731_456 (94.0 GiB): far over.
    assert p.memory.kv == 100_931_731_456
    assert not p.feasible
    changes = [a.change for a in p.alternatives]
    assert "2 x nvidia-h200" in changes
    assert "1 concurrent request" in changes
    # fp8 KV halves it to 47.0 GiB: 98.7 + 47.0 + 2.5 > 126.4 GiB budget, so it is not offered.
    assert "KV cache fp8" not in changes


def test_glm46_fp8_on_8_h100_tensor_parallel() -> None:
    p = plan(PlanRequest(facts=GLM46, quantization="fp8", engine="vllm",
                         accelerator="nvidia-h100-80gb", count=8, context_length=131072,
                         concurrency=4))
    # KV per token, whole model: 93 layers x 4096 = 380_928; per GPU 1 of 8 KV heads -> 47_616.
    assert p.kv_bytes_per_token == 380_928
    # 524_288 tokens x 47_616 = 24_964_497_408 (23.2 GiB) per GPU.
    assert p.memory.kv == 24_964_497_408
    # weights 355e9 / 8 = 44_375_000_000 (41.3 GiB) per GPU.
    assert p.memory.weights == 44_375_000_000
    # activations: h = 8192 x 5120 x 2 = 83_886_080; 4h + 12h/8 = 461_373_440;
    # sampler 4_849_664; graphs 1_073_741_824 -> 1_539_964_928.
    assert p.memory.compute == 1_539_964_928
    # overhead 512 MiB + TP communication 512 MiB.
    assert p.memory.overhead == 1_073_741_824
    # H100: 81559 MiB = 85_520_809_984; budget int(0.9 x) = 76_968_728_985;
    # total 71_953_204_160 -> headroom 5_015_524_825 (4.7 GiB).
    assert p.memory.headroom == 5_015_524_825
    assert p.feasible
    assert p.vllm is not None and p.vllm.tensor_parallel_size == 8
    assert p.resources.devices == 8 and p.resources.shared_memory_bytes > 0


def test_glm46_on_4_h100_is_infeasible_and_points_at_8() -> None:
    p = plan(PlanRequest(facts=GLM46, quantization="fp8", engine="vllm",
                         accelerator="nvidia-h100-80gb", count=4, context_length=131072,
                         concurrency=4))
    # weights alone 355e9 / 4 = 88_750_000_000 (82.7 GiB) > 79.6 GiB.
    assert p.memory.weights == 88_750_000_000
    assert not p.feasible
    # 5, 6 and 7 GPUs are not valid TP sizes for 96 heads / 8 KV heads; 8 is the next.
    assert [a.change for a in p.alternatives if "x nvidia-h100" in a.change] == [
        "8 x nvidia-h100-80gb"
    ]


def test_cpu_only_plan_counts_weights_in_pod_memory() -> None:
    p = plan(PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                         accelerator="cpu", context_length=8192, concurrency=2))
    # KV 40_960 x 16_384 = 671_088_640; compute (flash attention on the CPU too):
    # 117_702_656 + mask 512 x 8192 x 2 = 8_388_608 + logits 2 x 606_208 = 127_303_680;
    # total with weights and the 512 MiB process:
    # 5_698_750_000 + 671_088_640 + 127_303_680 + 536_870_912 = 7_034_013_232.
    assert p.memory.compute == GLM4_9B_FFN_PHASE + 8_388_608 + 1_212_416 == 127_303_680
    assert p.memory.total == 7_034_013_232
    assert p.feasible
    s = p.llamacpp
    assert s is not None
    assert (s.n_gpu_layers, s.threads, s.parallel, s.ctx_size, s.cache_ram_mib) == (
        0, 8, 2, 16384, 0)
    # request = total rounded up to MiB: ceil(7_034_013_232 / 1_048_576) = 6709 MiB.
    assert p.resources.memory_request_bytes == 6709 * MiB
    # limit = total + max(1 GiB, 10 %) = 8_107_755_056 -> 7733 MiB.
    assert p.resources.memory_limit_bytes == 7733 * MiB
    assert p.resources.devices == 0 and p.resources.resource_name is None
    assert "page cache" in p.resources.memory_note


def test_cpu_node_of_8_gib_at_32k_x_4() -> None:
    p = plan(PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                         accelerator="cpu", context_length=32768, concurrency=4,
                         node_memory_bytes=8 * GiB))
    # 8 GiB = 8_589_934_592, reserve 5 % = 429_496_729; weights + 5 GiB KV + compute + 512 MiB
    # process = 11_758_011_952 (as on the A10, the process taking the CUDA overhead's place).
    assert p.memory.total == 11_758_011_952
    assert not p.feasible
    by_change = {a.change: a.headroom_bytes for a in p.alternatives}
    # KV q8_0 (21_760 B/token -> 2_852_126_720) leaves total 9_241_429_552: does not fit;
    # KV q4_0: 40 x 2 x 256 x 18/32 = 11_520 B/token x 131_072 = 1_509_949_440 ->
    # total 7_899_252_272, headroom 8_589_934_592 - 429_496_729 - 7_899_252_272 = 261_185_591.
    assert "KV cache q8_0" not in by_change
    assert by_change["KV cache q4_0"] == 261_185_591
    # 1 slot: KV 1_342_177_280, compute 153_681_920 - 3 x 606_208 = 151_863_296,
    # total 7_729_661_488, headroom 430_776_375.
    assert by_change["1 concurrent request"] == 430_776_375


def test_glm4moe_gguf_header_block_count_includes_nextn() -> None:
    facts = ArchitectureFacts.from_gguf_metadata({
        "general.architecture": "glm4moe",
        "general.file_type": 15,
        "glm4moe.block_count": 47,
        "glm4moe.nextn_predict_layers": 1,
        "glm4moe.context_length": 131072,
        "glm4moe.embedding_length": 4096,
        "glm4moe.attention.head_count": 96,
        "glm4moe.attention.head_count_kv": 8,
        "glm4moe.attention.key_length": 128,
        "glm4moe.attention.value_length": 128,
        "glm4moe.expert_count": 128,
        "glm4moe.expert_used_count": 8,
    }, file_size=72_000_000_000)
    assert (facts.block_count, facts.nextn_predict_layers) == (46, 1)
    assert (facts.quantization, facts.weights_bytes) == ("Q4_K_M", 72_000_000_000)
    p = plan(PlanRequest(facts=facts, quantization="Q4_K_M", engine="llamacpp",
                         accelerator="nvidia-h200", context_length=8192))
    # The pinned llama.cpp caches no KV for the nextn layer: 46 KV layers x 4096 B =
    # 188_416 B/token; measured weights used as is (the header gave no nextn tensor bytes).
    assert p.kv_bytes_per_token == 188_416
    assert p.memory.weights == 72_000_000_000 and p.memory.weights_measured
    # -ngl counts the 47 layers plus the output layer.
    assert p.llamacpp is not None and p.llamacpp.n_gpu_layers == 48


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"engine": "vllm"}, "vLLM serves safetensors"),
        ({"quantization": "fp8"}, "llama.cpp serves GGUF"),
        ({"context_length": 262144}, "exceeds the model's trained context 131072"),
        ({"count": 5}, "exceeds the 4 devices of one node"),
    ],
)
def test_requests_that_cannot_be_planned_say_why(changes: dict[str, object], needle: str) -> None:
    base = {"facts": GLM4_9B, "quantization": "Q4_K_M", "engine": "llamacpp",
            "accelerator": "nvidia-a10", "context_length": 8192}
    p = plan(PlanRequest(**{**base, **changes}))  # type: ignore[arg-type]
    assert not p.feasible
    assert needle in p.reason


def test_v100_runs_vllm_in_float16_and_refuses_fp8() -> None:
    small = ArchitectureFacts(architecture="glm4", block_count=40, embedding_length=4096,
                              head_count=32, head_count_kv=2, context_length=131072,
                              parameter_count=9_400_000_000)
    p = plan(PlanRequest(facts=small, quantization="bf16", engine="vllm",
                         accelerator="nvidia-v100-32gb", context_length=8192))
    assert p.vllm is not None and p.vllm.dtype == "float16"
    assert p.feasible
    p = plan(PlanRequest(facts=small, quantization="fp8", engine="vllm",
                         accelerator="nvidia-v100-32gb", context_length=8192))
    assert not p.feasible and "cannot run fp8" in p.reason


# ------------------------------------------------------------- llama.cpp compute buffer parts


def test_compute_buffer_ffn_width_dense_moe_and_fallback() -> None:
    # Dense: n_ff as is.
    assert ffn_width(GLM4_9B) == 13696
    # glm4moe: the 8 routed experts' 8 x 1408 = 11_264 outweigh the dense layer's 10_944.
    assert ffn_width(GLM45_AIR) == 11_264
    # llama-style MoE (Mixtral): no expert key, feed_forward_length is one expert's width:
    # 2 used x 14_336 = 28_672.
    mixtral = ArchitectureFacts(architecture="llama", block_count=32, embedding_length=4096,
                         head_count=32, head_count_kv=8, context_length=32768,
                         expert_count=8, expert_used_count=2, feed_forward_length=14_336)
    assert ffn_width(mixtral) == 28_672
    # Unknown width: 4 x n_embd = 16_384, above GLM's real ratios (a safe over-estimate).
    unknown = ArchitectureFacts(architecture="glm4", block_count=40, embedding_length=4096,
                         head_count=32, head_count_kv=2, context_length=131072)
    assert ffn_width(unknown) == 16_384


def test_compute_buffer_without_flash_attention_is_the_kq_phase() -> None:
    # Ascend 310P has no flash attention. GLM-4-9B, one slot of 8192, 512-token micro-batch:
    #   mask (f32)       512 x 8192 x 4                      =    16_777_216
    #   attention phase  512 x 4 x (32 heads x 8192 + 4 x 4096) = 2048 x 278_528 = 570_425_344
    #   FFN phase        117_702_656 (smaller, not added: the phases do not overlap)
    #   logits           1 x 151552 x 4                      =       606_208
    #   -> 587_808_768
    assert llamacpp_compute_bytes(GLM4_9B, n_tokens=512, n_kv=8192, n_outputs=1,
                                  flash_attention=False) == 587_808_768
    # With flash attention: 117_702_656 + 512 x 8192 x 2 (8_388_608) + 606_208 = 126_697_472.
    assert llamacpp_compute_bytes(GLM4_9B, n_tokens=512, n_kv=8192, n_outputs=1,
                                  flash_attention=True) == 126_697_472


def test_gguf_header_feed_forward_lengths() -> None:
    facts = ArchitectureFacts.from_gguf_metadata({
        "general.architecture": "glm4moe",
        "glm4moe.block_count": 47,
        "glm4moe.nextn_predict_layers": 1,
        "glm4moe.context_length": 131072,
        "glm4moe.embedding_length": 4096,
        "glm4moe.attention.head_count": 96,
        "glm4moe.feed_forward_length": 10944,
        "glm4moe.expert_feed_forward_length": 1408,
        "glm4moe.expert_count": 128,
        "glm4moe.expert_used_count": 8,
    })
    assert (facts.feed_forward_length, facts.expert_feed_forward_length) == (10944, 1408)
    # A per-layer array (some architectures vary the width) counts its widest layer.
    per_layer = ArchitectureFacts.from_gguf_metadata({
        "general.architecture": "llama",
        "llama.block_count": 3,
        "llama.context_length": 4096,
        "llama.embedding_length": 256,
        "llama.attention.head_count": 4,
        "llama.feed_forward_length": [512, 768, 640],
    })
    assert (per_layer.feed_forward_length, per_layer.expert_feed_forward_length) == (768, None)
