"""The planner's memory numbers against what the real llama-server allocates.

For tiny llama models written here (a few MiB of weights) and CPU plans, the planner's
predicted weights bytes (`plan.memory.weights`) and KV cache bytes (`plan.memory.kv`) must
match what llama-server states in its load log within 10 %, and its compute buffer
(`plan.memory.compute`) within 15 % (the formula models the graph allocator's peak, not
each tensor):

    load_tensors:   CPU_Mapped model buffer size =    40.52 MiB
    llama_kv_cache:        CPU KV buffer size =    32.00 MiB
    llama_kv_cache: size =   32.00 MiB (  8192 cells,   8 layers,  1/1 seqs), K (f16): ...
    sched_reserve:        CPU compute buffer size =    17.01 MiB

The server is started with the argv the operator renders for the plan. Each case prints
predicted and actual numbers (run with -s to see them; docs/planning.md has the table).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.llama_fixtures import (
    CpuCase,
    LoadReport,
    MiB,
    cpu_plan,
    facts_of,
    llama_binary,  # noqa: F401 (fixture)
    rendered_argv,
    start_rendered,
)
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.ports import free_port

pytestmark = pytest.mark.llama

TOLERANCE = 0.10
COMPUTE_TOLERANCE = 0.15

MODELS = {
    # MHA, f32 weights: ~11 MiB of weights, 4 KiB of f16 KV per token.
    "256x4-f32": TinyLlamaSpec(n_ctx_train=16384, n_layer=4, n_embd=256, n_head=4,
                               n_head_kv=4, n_ff=768, dtype="f32", name="truth-256x4"),
    # GQA (8 heads, 2 KV heads), f16 weights: ~36 MiB of weights, 4 KiB of f16 KV per token.
    "512x8-f16-gqa": TinyLlamaSpec(n_ctx_train=16384, n_layer=8, n_embd=512, n_head=8,
                                   n_head_kv=2, n_ff=1024, dtype="f16", name="truth-512x8"),
    # Q8_0 weights (a quantized GGUF file type): ~13 MiB, 3 KiB of f16 KV per token.
    "384x6-q8_0-gqa": TinyLlamaSpec(n_ctx_train=16384, n_layer=6, n_embd=384, n_head=6,
                                    n_head_kv=2, n_ff=1536, dtype="q8_0", name="truth-384x6"),
}
CASES = (
    CpuCase("1x8192-f16", slots=1, context=8192),
    CpuCase("4x2048-f16", slots=4, context=2048),
    CpuCase("2x4096-q8_0-unified", slots=2, context=4096, kv_cache_type="q8_0", kv_unified=True),
    CpuCase("2x3000-q8_0", slots=2, context=3000, kv_cache_type="q8_0"),
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("truth-models")
    return {name: write_tiny_llama(root / f"{name}.gguf", spec) for name, spec in MODELS.items()}


def _mib(value: int) -> str:
    return f"{value / MiB:.2f}"


def _within(predicted: int, actual: int, tolerance: float = TOLERANCE) -> bool:
    return abs(predicted - actual) <= tolerance * actual


def _percent(predicted: int, actual: int) -> str:
    return f"{(predicted / actual - 1) * 100:+.1f} %"


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("model_name", MODELS)
def test_predicted_memory_matches_llama_server(
    model_name: str, case: CpuCase, models: dict[str, Path],
    llama_binary: Path, tmp_path: Path,  # noqa: F811
) -> None:
    model = models[model_name]
    plan = cpu_plan(facts_of(model), case)
    port = free_port()
    with start_rendered(rendered_argv(plan, model, port), port, llama_binary, tmp_path) as server:
        report = LoadReport.parse(server.log_text())

    weights, kv, compute = plan.memory.weights, plan.memory.kv, plan.memory.compute
    print(
        f"\n| {model_name} | {case} | {_mib(weights)} | {_mib(report.model_buffer_bytes)} "
        f"| {_percent(weights, report.model_buffer_bytes)} "
        f"| {_mib(kv)} | {_mib(report.kv_buffer_bytes)} | {_percent(kv, report.kv_buffer_bytes)} "
        f"| {_mib(compute)} | {_mib(report.compute_buffer_bytes)} "
        f"| {_percent(compute, report.compute_buffer_bytes)} |"
    )
    # The summary line and the buffer lines are two views of the same allocation.
    assert abs(report.kv_size_bytes - report.kv_buffer_bytes) <= 0.01 * MiB
    assert _within(weights, report.model_buffer_bytes), (
        f"weights: planner {_mib(weights)} MiB, llama-server {_mib(report.model_buffer_bytes)} MiB"
    )
    assert _within(kv, report.kv_buffer_bytes), (
        f"KV: planner {_mib(kv)} MiB, llama-server {_mib(report.kv_buffer_bytes)} MiB"
    )
    assert report.compute_buffer_bytes > 0, "llama-server's log lacks the compute buffer line"
    assert _within(compute, report.compute_buffer_bytes, COMPUTE_TOLERANCE), (
        f"compute: planner {_mib(compute)} MiB, llama-server "
        f"{_mib(report.compute_buffer_bytes)} MiB"
    )
