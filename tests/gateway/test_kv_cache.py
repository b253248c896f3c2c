"""Reading the engine's KV-cache share: llama-server's /slots and vLLM's gauge (pure parts).

e2e/test_gateway_kv_cache.py proves the gauge against the real llama-server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from glm_operator.gateway.config import GatewayConfig
from glm_operator.gateway.pools.kv_cache import llamacpp_usage, vllm_usage

from .test_server import gateway_client


def slot(n_ctx: int, processing: bool, tokens: int | None) -> dict[str, Any]:
    # The fields the pinned llama-server puts in each /slots entry (to_json, metrics only).
    out: dict[str, Any] = {"id": 0, "n_ctx": n_ctx, "speculative": False,
                           "is_processing": processing}
    if tokens is not None:
        out |= {"id_task": 7, "n_prompt_tokens": tokens, "n_prompt_tokens_processed": tokens,
                "n_prompt_tokens_cache": 0, "params": {},
                "next_token": [{"has_next_token": processing, "n_decoded": 10}]}
    return out


def test_llamacpp_counts_working_slots_over_the_whole_cache() -> None:
    assert llamacpp_usage([slot(4096, True, 1024), slot(4096, True, 2048)]) == 3072 / 8192
    # An idle slot keeps its last prompt for reuse: cached, not load.
    assert llamacpp_usage([slot(4096, False, 4000), slot(4096, True, 1024)]) == 1024 / 8192
    assert llamacpp_usage([slot(4096, False, None), slot(4096, False, 300)]) == 0.0
    # A slot just assigned, before its first task fields appear.
    assert llamacpp_usage([slot(4096, True, None)]) == 0.0


@pytest.mark.parametrize("answer", [
    None, [], {"error": {"code": 501, "message": "This server does not support slots"}},
    [{"id": 0}], [{"n_ctx": 0, "is_processing": False}], "text",
])
def test_llamacpp_refuses_what_is_not_a_slots_answer(answer: Any) -> None:
    assert llamacpp_usage(answer) is None


VLLM_0_11_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="glm"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="glm"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="glm"} 0.75
# HELP vllm:kv_cache_usage_perc_extra not this one
vllm:kv_cache_usage_perc_extra{engine="0"} 9
"""


def test_vllm_reads_its_kv_cache_gauge() -> None:
    assert vllm_usage(VLLM_0_11_METRICS) == 0.5  # mean over data-parallel engines
    old = 'vllm:gpu_cache_usage_perc{model_name="glm"} 0.125\n'
    assert vllm_usage(old) == 0.125  # the name before 0.10
    assert vllm_usage("llamacpp:requests_processing 1\n") is None
    assert vllm_usage("vllm:kv_cache_usage_perc NaN-ish\n") is None


async def test_the_gateway_publishes_the_engines_reading_and_nothing_before() -> None:
    """The background probe finds the engine kind and fills the gauge; an engine with no
    figure leaves the series absent rather than a false 0."""
    reading = {"text": ""}

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=reading["text"])

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({})

    engine_app = web.Application()
    engine_app.router.add_get("/metrics", metrics)  # vLLM: no /slots
    engine_app.router.add_get("/health", health)
    engine = TestServer(engine_app)
    await engine.start_server()
    config = GatewayConfig(engine_url=str(engine.make_url("")).rstrip("/"), service_name="glm",
                           model_version="v1", warmup=False, kv_cache_poll_seconds=0.02)
    client = await gateway_client(config)
    series = 'glm_gateway_kv_cache_usage_ratio{model_version="v1",pool="main",service="glm"}'
    try:
        await asyncio.sleep(0.2)
        assert series not in await (await client.get("/metrics")).text()
        reading["text"] = VLLM_0_11_METRICS
        for _ in range(100):
            text = await (await client.get("/metrics")).text()
            if f"{series} 0.5" in text:
                break
            await asyncio.sleep(0.02)
        assert f"{series} 0.5" in text
    finally:
        await client.close()
        await engine.close()
