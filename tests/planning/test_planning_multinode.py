"""Multi-node replicas: hand-derived figures (docs/planning.md, "Multi-node replicas")."""

from __future__ import annotations

from dataclasses import replace

from glm_operator.api.glmservice_status import PlanSummary
from glm_operator.planning.planner import PlanRequest, plan
from test_planning_cases import GLM4_9B, GLM46

BF16_ON_H100 = PlanRequest(facts=GLM46, quantization="bf16", engine="vllm",
                           accelerator="nvidia-h100-80gb", count=8, context_length=131072,
                           concurrency=4)


def test_glm46_bf16_does_not_fit_one_node_and_the_alternative_is_two() -> None:
    p = plan(BF16_ON_H100)
    # 355e9 x 2 bytes / 8 = 88_750_000_000 (82.7 GiB) per GPU: more than an H100 holds.
    assert p.memory.weights == 88_750_000_000 and not p.feasible
    (multi,) = [a for a in p.alternatives if "nodes" in a.settings]
    assert multi.change == "2 nodes x 8 x nvidia-h100-80gb"
    assert dict(multi.settings) == {"nodes": 2, "count": 8}
    # From 4 GPUs the count alternative (8) does not fit either: the same proposal.
    fewer = plan(replace(BF16_ON_H100, count=4))
    assert [a.change for a in fewer.alternatives if "nodes" in a.settings] == [
        "2 nodes x 8 x nvidia-h100-80gb"]


def test_glm46_bf16_on_two_nodes_of_eight_h100() -> None:
    p = plan(replace(BF16_ON_H100, nodes=2))
    assert p.feasible
    # Pipeline stages of 46 layers each: per GPU half the layers' weights, / TP 8:
    # 710e9 x 46/92 / 8 = 44_375_000_000 (41.3 GiB).
    assert p.memory.weights == 44_375_000_000
    # KV per GPU: 47_616 B/token (1 of 8 KV heads, 93 layers) x 46/92 = 23_808;
    # x 524_288 tokens = 12_482_248_704 (11.6 GiB).
    assert p.memory.kv == 12_482_248_704
    # compute and overhead as for one node at TP 8: 1_539_964_928 + 1_073_741_824;
    # total 59_470_955_456 of a 76_968_728_985 budget: 17_497_773_529 (16.3 GiB) headroom.
    assert p.memory.headroom == 17_497_773_529
    assert p.vllm is not None
    assert (p.vllm.tensor_parallel_size, p.vllm.pipeline_parallel_size) == (8, 2)
    assert p.resources.devices == 8  # per pod, one pod per node
    assert [(n.role, n.devices, n.layers) for n in p.per_node] == [
        ("leader", 8, 46), ("worker", 8, 46)]
    # Each node: 355e9 bytes of weights; KV 47_616 x 524_288 x 46/92 x 8 ranks.
    assert {n.weights_bytes for n in p.per_node} == {355_000_000_000}
    assert {n.kv_bytes for n in p.per_node} == {99_857_989_632}


def test_llamacpp_splits_layers_over_every_device_of_the_group_workers_first() -> None:
    p = plan(PlanRequest(facts=GLM46, quantization="Q4_K_M", engine="llamacpp",
                         accelerator="nvidia-a10", count=4, nodes=3, context_length=16384,
                         concurrency=2))
    assert p.llamacpp is not None
    # 92 + 1 nextn + the output layer = 94 units over 3 x 4 = 12 devices: 10 x 8 + 2 x 7.
    assert p.llamacpp.tensor_split == (8,) * 10 + (7, 7)
    assert p.llamacpp.n_gpu_layers == 94 and p.llamacpp.rpc_workers == 2
    # llama-server lists the RPC devices first: the leader's own four are the last.
    assert [(n.role, n.layers) for n in p.per_node] == [
        ("leader", 30), ("worker", 32), ("worker", 32)]
    assert sum(n.weights_bytes for n in p.per_node) <= 355e9 * 4.85 / 8


def test_multi_node_needs_accelerators_and_enough_layers() -> None:
    cpu = plan(PlanRequest(facts=GLM4_9B, quantization="Q4_K_M", engine="llamacpp",
                           accelerator="cpu", nodes=2), with_alternatives=False)
    assert not cpu.feasible and "nodes 1" in cpu.reason
    stages = plan(PlanRequest(facts=GLM4_9B, quantization="bf16", engine="vllm",
                              accelerator="nvidia-a10", nodes=41), with_alternatives=False)
    assert not stages.feasible and "exceed the model's 40 layers" in stages.reason


def test_status_plan_carries_the_per_node_figures() -> None:
    summary = PlanSummary.model_validate(plan(replace(BF16_ON_H100, nodes=2)).summary())
    assert summary.nodes == 2 and summary.count == 8
    assert summary.per_node is not None and [n.role for n in summary.per_node] == [
        "leader", "worker"]
    assert summary.vllm is not None and summary.vllm.pipeline_parallel_size == 2
    single = PlanSummary.model_validate(plan(BF16_ON_H100).summary())
    assert single.nodes == 1 and single.per_node is None


def test_llamacpp_split_places_blocks_and_the_output_layer_as_llama_cpp_does() -> None:
    """llama.cpp keeps the input embeddings in host memory, gives each device its units of
    blocks and the last unit (the output layer) to the last device, which is the leader's
    own: so the leader's 4 units of a 5/4/4 split are 3 blocks and the output matrix."""
    from glm_operator.planning.facts import ArchitectureFacts
    from glm_operator.planning.planner import LayerBytes, _device_holdings, _layer_bytes
    facts = ArchitectureFacts(architecture="llama", block_count=12, embedding_length=256,
                              head_count=4, head_count_kv=4, context_length=8192,
                              vocab_size=1000, weights_bytes=25_000_000, quantization="F16")
    matrix = 1000 * 256 * 2
    layer = _layer_bytes(facts, "F16", 25_000_000, 12)
    assert layer == LayerBytes(host=matrix, block=(25_000_000 - 2 * matrix) // 12, output=matrix)
    tied = _layer_bytes(replace(facts, tied_embeddings=True), "F16", 25_000_000, 12)
    assert tied.block == (25_000_000 - matrix) // 12 and tied.output == matrix
    held = _device_holdings((5, 4, 4), layer, kv_total=1200, n_layers=12)
    assert held == [(5 * layer.block, 500), (4 * layer.block, 400),
                    (3 * layer.block + matrix, 300)]
    p = plan(PlanRequest(facts=facts, quantization="F16", engine="llamacpp",
                         accelerator="nvidia-l4", nodes=3, context_length=2048))
    assert [(n.role, n.layers) for n in p.per_node] == [
        ("leader", 4), ("worker", 5), ("worker", 4)]
    assert p.per_node[0].weights_bytes == 3 * layer.block + matrix
    assert p.memory.weights == 5 * layer.block  # the most loaded device: the first worker
