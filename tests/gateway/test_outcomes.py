"""How a request ended, as the canary analysis reads it: the pure classification, and the
gateway counting it (outcome label, overdue requests) in front of a scripted engine."""

from __future__ import annotations

import asyncio

import pytest
from glm_operator.gateway.metrics import FAILED_OUTCOMES, REQUEST_OUTCOMES
from glm_operator.gateway.policy.outcomes import (
    STREAM_BROKEN,
    STREAM_TIMED_OUT,
    request_outcome,
)

from .test_pipeline_guards import HOLD, HeldEngine, wait_held
from .test_server import CHAT, base_config, gateway_client, serve


@pytest.mark.parametrize(("status", "error_code", "first_token", "outcome"), [
    (200, None, True, "completed"),
    (200, None, False, "completed"),
    (200, STREAM_BROKEN, True, "engine_broken"),
    (200, STREAM_TIMED_OUT, True, "timed_out"),
    (499, "client_closed", False, "abandoned_before_first_token"),
    (499, "client_closed", True, "abandoned_after_first_token"),
    (504, "engine_timeout", False, "timed_out"),
    (503, "engine_unavailable", False, "server_error"),
    (500, "internal", False, "server_error"),
    (502, "engine_502", False, "server_error"),
    (429, "rate_limit_exceeded", False, "rate_limited"),
    (400, "context_length_exceeded", False, "client_error"),
    (401, "invalid_api_key", False, "client_error"),
    (413, "request_too_large", False, "client_error"),
])
def test_every_ending_has_one_outcome(status: int, error_code: str | None, first_token: bool,
                                      outcome: str) -> None:
    assert request_outcome(status, error_code, first_token) == outcome
    assert outcome in REQUEST_OUTCOMES


def test_failures_are_what_a_waiting_user_suffers() -> None:
    assert set(FAILED_OUTCOMES) == {"server_error", "engine_broken", "timed_out",
                                    "abandoned_before_first_token"}
    assert set(FAILED_OUTCOMES) <= set(REQUEST_OUTCOMES)


async def test_a_stream_the_engine_cuts_short_is_engine_broken_not_completed() -> None:
    server = await serve(HeldEngine(cut_streams=True).app())
    client = await gateway_client(base_config(str(server.make_url("")).rstrip("/")))
    try:
        stream = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        body = await stream.read()
        assert b"[DONE]" not in body
        # (relayed: the engine's own clean end is passed on as it came; an engine that dies
        # mid-stream gets the error event, test_relay.py)
        text = await (await client.get("/metrics")).text()
        assert series(text, "engine_broken") == 1
        assert series(text, "completed") == 0
    finally:
        await client.close()
        await server.close()


def series(text: str, outcome: str) -> float:
    for line in text.splitlines():
        if line.startswith("glm_gateway_requests_total{") and f'outcome="{outcome}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_request_running_past_its_bound_counts_as_overdue_while_it_lasts() -> None:
    engine = HeldEngine()
    server = await serve(engine.app())
    client = await gateway_client(base_config(str(server.make_url("")).rstrip("/"),
                                              request_overdue_seconds=0.3))
    try:
        held = asyncio.create_task(client.post("/v1/chat/completions", json=HOLD))
        await wait_held(engine, 1)
        assert client.gateway.proxy.overdue_now() == 0
        await asyncio.sleep(0.4)
        text = await (await client.get("/metrics")).text()
        assert 'glm_gateway_requests_overdue{model_version="v1",pool="main",service="glm"} 1.0' \
            in text
        engine.release.set()
        assert (await held).status == 200
        assert client.gateway.proxy.overdue_now() == 0
        assert client.gateway.proxy.running == {}
    finally:
        engine.release.set()
        await client.close()
        await server.close()


async def test_answers_are_counted_by_outcome(tmp_path: object) -> None:
    engine = HeldEngine()
    server = await serve(engine.app())
    client = await gateway_client(base_config(str(server.make_url("")).rstrip("/"),
                                              max_body_bytes=100))
    try:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
        assert (await client.post("/v1/chat/completions", data=b"{bad")).status == 400
        text = await (await client.get("/metrics")).text()
        assert series(text, "completed") == 1
        assert series(text, "client_error") == 1
    finally:
        await client.close()
        await server.close()
