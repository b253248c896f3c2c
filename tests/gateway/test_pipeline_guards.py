"""What the pipeline guards per request and per key: the 401's challenge, the request id a
client may choose, requests in flight per key, the token budget reserved up front, the
engine's metrics passed through, and /readyz while draining."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from .test_server import CHAT, base_config, gateway_client, serve

ENGINE_METRICS = (b"# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
                  b"# TYPE llamacpp:prompt_tokens_total counter\n"
                  b"llamacpp:prompt_tokens_total 42\n")


class HeldEngine:
    """Answers like llama-server; a request whose prompt says "hold" waits for `release`."""

    def __init__(self, with_metrics: bool = True, cut_streams: bool = False) -> None:
        self.release = asyncio.Event()
        self.held = 0
        self.with_metrics = with_metrics
        self.cut_streams = cut_streams  # a stream ends after one event, without [DONE]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/props", self.props)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.chat)
        if self.with_metrics:
            app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def props(self, _request: web.Request) -> web.Response:
        return web.json_response({"default_generation_settings": {"n_ctx": 4096},
                                  "total_slots": 4})

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=ENGINE_METRICS, content_type="text/plain", charset="utf-8")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream") and self.cut_streams:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
            await response.write_eof()
            return response
        if "hold" in json.dumps(body.get("messages")):
            self.held += 1
            await self.release.wait()
        return web.json_response({
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 3}})


@pytest.fixture
async def held() -> AsyncIterator[tuple[HeldEngine, str]]:
    engine = HeldEngine()
    server: TestServer = await serve(engine.app())
    yield engine, str(server.make_url("")).rstrip("/")
    engine.release.set()
    await server.close()


def key_dir(tmp_path: Path, *keys: str) -> Path:
    directory = tmp_path / "keys"
    directory.mkdir()
    for index, key in enumerate(keys):
        (directory / str(index)).write_text(key)
    return directory


HOLD = {"model": "glm", "messages": [{"role": "user", "content": "hold"}]}


async def wait_held(engine: HeldEngine, count: int) -> None:
    async with asyncio.timeout(5):
        while engine.held < count:
            await asyncio.sleep(0.01)


async def test_a_401_carries_a_bearer_challenge(held: tuple[HeldEngine, str],
                                                tmp_path: Path) -> None:
    _, url = held
    client = await gateway_client(base_config(url, api_keys_path=key_dir(tmp_path, "key-a")))
    try:
        missing = await client.post("/v1/chat/completions", json=CHAT)
        assert missing.status == 401
        assert missing.headers["WWW-Authenticate"] == 'Bearer realm="glm-operator"'
        wrong = await client.post("/v1/chat/completions", json=CHAT,
                                  headers={"Authorization": "Bearer nope"})
        assert wrong.status == 401
        assert wrong.headers["WWW-Authenticate"] == \
            'Bearer realm="glm-operator", error="invalid_token"'
        models = await client.get("/v1/models")
        assert models.status == 401 and "WWW-Authenticate" in models.headers
    finally:
        await client.close()


@pytest.mark.parametrize(("given", "kept"), [
    ("req-123_abc.def:9/x", True),
    ("x" * 128, True),
    ("x" * 129, False),
    ("x" * 60_000, False),
    ("two, ids", False),
    ("tab\there", False),
    ("", False),
])
async def test_a_client_request_id_is_kept_only_when_plain(held: tuple[HeldEngine, str],
                                                           given: str, kept: bool) -> None:
    _, url = held
    client = await gateway_client(base_config(url))
    try:
        response = await client.post("/v1/chat/completions", json=CHAT,
                                     headers={"X-Request-Id": given})
        assert response.status == 200
        rid = response.headers["X-Request-Id"]
        if kept:
            assert rid == given
        else:
            assert rid != given and len(rid) == 16 and int(rid, 16) >= 0
    finally:
        await client.close()


async def test_requests_in_flight_per_key_are_bounded(held: tuple[HeldEngine, str],
                                                      tmp_path: Path) -> None:
    engine, url = held
    keys = key_dir(tmp_path, "key-a", "key-b")
    client = await gateway_client(base_config(url, api_keys_path=keys, max_in_flight_per_key=1))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    try:
        first = asyncio.create_task(client.post("/v1/chat/completions", json=HOLD, headers=a))
        await wait_held(engine, 1)
        refused = await client.post("/v1/chat/completions", json=CHAT, headers=a)
        assert refused.status == 429
        error = (await refused.json())["error"]
        assert error["code"] == "too_many_concurrent_requests"
        assert "already has 1 requests running" in error["message"]
        assert refused.headers["Retry-After"] == "1"
        # Another key is not held back by this one.
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=b)).status == 200
        engine.release.set()
        assert (await first).status == 200
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=a)).status == 200
        assert client.gateway.proxy.key_in_flight == {}  # idle keys hold nothing
    finally:
        await client.close()


async def test_the_token_budget_is_reserved_when_a_request_is_admitted(
        held: tuple[HeldEngine, str], tmp_path: Path) -> None:
    """Charged only after the answer, two requests admitted on the same balance would both
    run: reserved up front, the second waits until the first gives back what it did not
    use."""
    engine, url = held
    client = await gateway_client(base_config(url, api_keys_path=key_dir(tmp_path, "key-a"),
                                              rate_limit_tokens_per_minute=1000))
    a = {"Authorization": "Bearer key-a"}
    try:
        first = asyncio.create_task(client.post(
            "/v1/chat/completions", json={**HOLD, "max_tokens": 1000}, headers=a))
        await wait_held(engine, 1)
        refused = await client.post("/v1/chat/completions", json=CHAT, headers=a)
        assert refused.status == 429
        assert (await refused.json())["error"]["type"] == "tokens"
        engine.release.set()
        assert (await first).status == 200  # used 33 tokens: 967 come back
        assert (await client.post("/v1/chat/completions",
                                  json={**CHAT, "max_tokens": 100}, headers=a)).status == 200
        limits = client.gateway.proxy.limits
        assert limits is not None and limits.budget is not None
        # Two answers of 33 tokens each, and the refill meanwhile: nothing else is held.
        assert limits.budget.balance(_key_id(client, "key-a")) >= 1000 - 2 * 33
    finally:
        await client.close()


def _key_id(client: Any, key: str) -> str:
    keys = client.gateway.proxy.keys
    assert keys is not None
    key_id = keys.check(key)
    assert key_id is not None
    return str(key_id)


async def test_the_engines_metrics_come_through_the_gateway(held: tuple[HeldEngine, str]
                                                            ) -> None:
    _, url = held
    client = await gateway_client(base_config(url))
    try:
        response = await client.get("/metrics/engine")
        assert response.status == 200
        assert await response.read() == ENGINE_METRICS
        assert response.headers["Content-Type"].startswith("text/plain")
    finally:
        await client.close()


async def test_an_engine_without_metrics_is_a_502_not_an_empty_scrape() -> None:
    engine = HeldEngine(with_metrics=False)
    server = await serve(engine.app())
    client = await gateway_client(base_config(str(server.make_url("")).rstrip("/")))
    try:
        response = await client.get("/metrics/engine")
        assert response.status == 502
        assert (await response.json())["engine_status"] == 404
    finally:
        await client.close()
        await server.close()


async def test_readyz_answers_503_once_draining(held: tuple[HeldEngine, str]) -> None:
    _, url = held
    client = await gateway_client(base_config(url, warmup=False))
    try:
        assert (await client.get("/readyz")).status == 200
        client.gateway.draining = True
        response = await client.get("/readyz")
        assert response.status == 503
        assert (await response.json())["status"] == "draining"
    finally:
        await client.close()
