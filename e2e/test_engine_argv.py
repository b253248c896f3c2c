"""The llama-server argv the operator renders, started on the real pinned llama-server.

For a matrix of CPU plans (slots, per-slot context, unified KV, KV cache types, load mode,
batch sizes) the argv from `llamacpp_argv()` is run exactly as rendered: llama-server must
accept every flag, load, turn /health 200 and answer a chat request, and its own report
(load log, /props, /slots) must show the settings the plan decided. A flag the pinned build
does not know makes it exit non-zero, which is what makes this a check of the renderer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from glm_operator.planning.planner import Plan
from glm_operator.render.engine_args import llamacpp_argv

from e2e.llama import http_json, unix_get_status, with_local_sockets
from e2e.llama_fixtures import (
    CpuCase,
    LoadReport,
    cpu_plan,
    facts_of,
    llama_binary,  # noqa: F401 (fixture)
    non_loopback_address,
    refuses_connections,
    rendered_argv,
    run_to_exit,
    start_rendered,
)
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.ports import free_port

pytestmark = pytest.mark.llama

ALIAS = "glm-argv-test"
CASES = (
    CpuCase("1slot-4k-f16", slots=1, context=4096),
    CpuCase("2slots-2k-f16-unified", slots=2, context=2048, kv_unified=True),
    CpuCase("4slots-1k-q8_0", slots=4, context=1024, kv_cache_type="q8_0"),
    CpuCase("2slots-1000-q8_0-unified", slots=2, context=1000, kv_cache_type="q8_0",
            kv_unified=True),
    CpuCase("1slot-8k-q8_0-no-mmap", slots=1, context=8192, kv_cache_type="q8_0", mmap=False),
    CpuCase("2slots-3k-f16-batch512", slots=2, context=3072, batch_size=512, ubatch_size=128),
    CpuCase("4slots-2k-q8_0-unified-batch1024", slots=4, context=2048, kv_cache_type="q8_0",
            kv_unified=True, batch_size=1024, ubatch_size=256),
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyLlamaSpec(n_ctx_train=8192, n_layer=4, n_embd=256, n_head=4, n_head_kv=2,
                         n_ff=512, dtype="f16", name="argv-check")
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "argv-check.gguf", spec)


def _expected_slot_ctx(case: CpuCase, ctx_size: int, ctx_per_slot: int) -> int:
    # Unified: one buffer all slots share, so a slot may grow to the whole context.
    return ctx_size if case.kv_unified else ctx_per_slot


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rendered_argv_serves(case: CpuCase, model: Path, llama_binary: Path,  # noqa: F811
                              tmp_path: Path) -> None:
    plan = cpu_plan(facts_of(model), case)
    settings = plan.llamacpp
    assert settings is not None
    port = free_port()
    argv = rendered_argv(plan, model, port, ALIAS)
    print("rendered:", " ".join(argv))

    with start_rendered(argv, port, llama_binary, tmp_path) as server:
        # Started exactly as rendered, but for its abstract socket's name.
        assert server.argv == with_local_sockets(argv, port)
        # Loopback only: another pod (here: this machine's own outside address) cannot
        # reach the engine and skip the gateway's keys and limits.
        assert refuses_connections(non_loopback_address(), port)
        assert not refuses_connections("127.0.0.1", port)
        # And the socket the pod's gateway sends answers over (abstract: pod-local too).
        assert server.sockets == [f"@glm-engine-{port}.sock"]
        assert unix_get_status(server.sockets[0], "/health") == 200
        status, body = http_json(server.url + "/v1/chat/completions", {
            "model": ALIAS,
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 4,
            "temperature": 0,
        }, timeout=120)
        assert status == 200, body
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["choices"][0]["finish_reason"] in ("length", "stop")
        assert 1 <= body["usage"]["completion_tokens"] <= 4

        status, models = http_json(server.url + "/v1/models")
        assert status == 200
        assert ALIAS in [m["id"] for m in models["data"]]

        expected_slot_ctx = _expected_slot_ctx(case, settings.ctx_size, settings.ctx_per_slot)
        status, slots = http_json(server.url + "/slots")
        assert status == 200, slots
        assert [s["n_ctx"] for s in slots] == [expected_slot_ctx] * settings.parallel
        status, props = http_json(server.url + "/props")
        assert status == 200, props
        assert props["total_slots"] == settings.parallel
        assert props["default_generation_settings"]["n_ctx"] == expected_slot_ctx

        report = LoadReport.parse(server.log_text())

    # What llama.cpp says it set up from the argv, setting by setting.
    context = report.context
    assert int(context["n_ctx"]) == settings.ctx_size
    assert int(context["n_ctx_seq"]) == expected_slot_ctx
    assert int(context["n_seq_max"]) == settings.parallel
    assert int(context["n_batch"]) == min(settings.batch_size, settings.ctx_size)
    assert int(context["n_ubatch"]) == min(settings.ubatch_size, int(context["n_batch"]))
    assert context["flash_attn"] == ("enabled" if settings.flash_attn else "disabled")
    assert context["kv_unified"] == ("true" if settings.kv_unified else "false")
    assert (report.type_k, report.type_v) == (settings.cache_type_k, settings.cache_type_v)
    # One KV stream per slot of per-slot cells, or one stream of the whole context.
    assert report.kv_streams == (1 if settings.kv_unified else settings.parallel)
    assert report.kv_cells == expected_slot_ctx
    assert report.kv_cells * report.kv_streams == settings.ctx_size


def test_q8_0_cases_quantize_both_caches(model: Path) -> None:
    """The CPU profile has flash attention, so a q8_0 request quantizes V too (else the
    matrix above would only ever start f16 V caches)."""
    settings = cpu_plan(facts_of(model), CASES[2]).llamacpp
    assert settings is not None
    assert (settings.cache_type_k, settings.cache_type_v, settings.flash_attn) == (
        "q8_0", "q8_0", True)


def test_unknown_flag_makes_llama_server_exit(model: Path, llama_binary: Path  # noqa: F811
                                              ) -> None:
    """A flag the pinned build does not accept stops it: the matrix above would catch a
    renderer that writes one."""
    plan = cpu_plan(facts_of(model), CASES[0])
    argv = llamacpp_with_extra(plan, model, ["--no-such-flag-in-llama-server", "1"])
    result = run_to_exit(argv, llama_binary)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "--no-such-flag-in-llama-server" in output, output[-3000:]


def test_rejected_value_makes_llama_server_exit(model: Path, llama_binary: Path  # noqa: F811
                                                ) -> None:
    """A known flag with a value the build refuses (here an unknown KV type) also stops it."""
    plan = cpu_plan(facts_of(model), CASES[0])
    argv = llamacpp_with_extra(plan, model, ["--cache-type-k", "q9_9"])
    result = run_to_exit(argv, llama_binary)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "q9_9" in output, output[-3000:]


def llamacpp_with_extra(plan: Plan, model: Path, extra: list[str]) -> list[str]:
    """The rendered argv with user engineArgs appended, through the renderer's own parameter."""
    return llamacpp_argv(plan, model_path=str(model), port=free_port(), alias=ALIAS,
                         extra_args=extra)
