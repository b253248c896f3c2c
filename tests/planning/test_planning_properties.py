"""Invariants of the planner over many generated requests (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from glm_operator.planning.accelerators import PROFILES
from glm_operator.planning.facts import ArchitectureFacts
from glm_operator.planning.planner import PlanRequest, plan
from hypothesis import given, settings
from hypothesis import strategies as st


@st.composite
def model_facts(draw: st.DrawFn) -> ArchitectureFacts:
    head_dim = draw(st.sampled_from([64, 128]))
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4, 8, 12]))
    return ArchitectureFacts(
        architecture=draw(st.sampled_from(["glm4", "glm4moe", "llama"])),
        block_count=draw(st.integers(2, 96)),
        nextn_predict_layers=draw(st.integers(0, 1)),
        embedding_length=heads * head_dim,
        head_count=heads,
        head_count_kv=kv_heads,
        context_length=262144,
        parameter_count=draw(st.integers(100_000_000, 400_000_000_000)),
        vocab_size=draw(st.sampled_from([32000, 151552])),
    )


@st.composite
def requests(draw: st.DrawFn) -> PlanRequest:
    engine = draw(st.sampled_from(["llamacpp", "vllm"]))
    profile = draw(st.sampled_from([p for p in PROFILES.values() if engine in p.engines]))
    quant = draw(st.sampled_from(
        ["Q4_K_M", "Q8_0", "F16"] if engine == "llamacpp" else ["bf16", "fp8", "awq"]))
    count = 1 if profile.is_cpu else draw(st.sampled_from([1, 2, 4, 8]))
    kv = draw(st.sampled_from(
        [None, "q8_0", "q4_0"] if engine == "llamacpp" else [None, "fp8"]))
    return PlanRequest(
        facts=draw(model_facts()),
        quantization=quant,
        engine=engine,
        accelerator=profile.name,
        count=min(count, profile.max_devices_per_node),
        context_length=draw(st.integers(256, 131072)),
        concurrency=draw(st.integers(1, 16)),
        kv_cache_type=kv,
        kv_unified=draw(st.booleans()),
    )


@settings(max_examples=150, deadline=None)
@given(requests(), st.integers(1, 65536))
def test_more_context_never_needs_less_memory(request: PlanRequest, extra: int) -> None:
    longer = replace(request, context_length=request.context_length + extra)
    a = plan(request, with_alternatives=False)
    b = plan(longer, with_alternatives=False)
    assert b.memory.total >= a.memory.total
    assert b.memory.kv >= a.memory.kv


@settings(max_examples=150, deadline=None)
@given(requests(), st.integers(1, 8))
def test_more_concurrency_never_needs_less_memory(request: PlanRequest, extra: int) -> None:
    a = plan(request, with_alternatives=False)
    b = plan(replace(request, concurrency=request.concurrency + extra), with_alternatives=False)
    assert b.memory.total >= a.memory.total


@settings(max_examples=200, deadline=None)
@given(requests())
def test_feasible_plans_fit_within_device_memory(request: PlanRequest) -> None:
    p = plan(request, with_alternatives=False)
    if p.feasible:
        assert p.memory.total + p.memory.reserved <= p.memory.available
        assert p.memory.headroom >= 0
        assert "fits" in p.reason
    else:
        assert p.reason and "fits:" not in p.reason


@settings(max_examples=60, deadline=None)
@given(requests())
def test_alternatives_fit_and_each_changes_one_thing(request: PlanRequest) -> None:
    p = plan(request)
    if p.feasible:
        assert p.alternatives == ()
    for alt in p.alternatives:
        assert alt.plan.feasible
        assert alt.headroom_bytes == alt.plan.memory.headroom >= 0
        # One change; a multi-node layout is one change of two fields (nodes, devices each).
        assert len(alt.settings) == 1 or set(alt.settings) == {"nodes", "count"}


@settings(max_examples=100, deadline=None)
@given(requests())
def test_engine_settings_match_the_request(request: PlanRequest) -> None:
    p = plan(request, with_alternatives=False)
    if request.engine == "llamacpp":
        s = p.llamacpp
        assert s is not None and p.vllm is None
        assert s.ctx_per_slot >= request.context_length
        assert s.ctx_per_slot % 256 == 0
        assert s.ctx_size == s.ctx_per_slot * s.parallel
        assert s.parallel == request.concurrency
    else:
        v = p.vllm
        assert v is not None and p.llamacpp is None
        assert v.max_model_len == request.context_length
        assert v.max_num_seqs == request.concurrency
        assert v.tensor_parallel_size == request.count
