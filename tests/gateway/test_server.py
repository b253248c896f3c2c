"""The gateway's request handling against a scripted engine and a scripted scale API.

These pin the logic (error shapes, overflow routing, wake from zero, auth, limits) fast and
without llama-server; e2e/test_gateway*.py runs the same paths against the real engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from glm_operator.gateway.app import Gateway
from glm_operator.gateway.config import ActivityConfig, GatewayConfig, WakeConfig
from glm_operator.gateway.wire.server import HttpServer
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class FakeEngine:
    """Answers like llama-server: a 400 exceed_context_size_error above n_ctx characters."""

    n_ctx: int
    name: str = "main"
    calls: list[dict[str, Any]] = field(default_factory=list)
    ready: asyncio.Event | None = None  # /readyz is 503 until set (a pool that is waking)
    health_status: int = 200  # llama-server: 503 while loading
    health_delay: float = 0.0
    health_calls: int = 0
    metrics_calls: int = 0
    hold: asyncio.Event | None = None  # /health and /metrics wait for it when set

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/props", self.props)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.chat)
        return app

    async def metrics(self, _request: web.Request) -> web.Response:
        self.metrics_calls += 1
        if self.hold is not None:
            await self.hold.wait()
        return web.Response(text="llamacpp:requests_processing 0\n" * 8000)  # about 256 KiB

    async def health(self, _request: web.Request) -> web.Response:
        self.health_calls += 1
        if self.hold is not None:
            await self.hold.wait()
        await asyncio.sleep(self.health_delay)
        if self.health_status != 200:
            return web.json_response({"error": {"code": 503, "message": "Loading model",
                                                "type": "unavailable_error"}},
                                     status=self.health_status)
        return web.json_response({"status": "ok"})

    async def readyz(self, _request: web.Request) -> web.Response:
        ready = self.ready is None or self.ready.is_set()
        return web.json_response({}, status=200 if ready else 503)

    async def props(self, _request: web.Request) -> web.Response:
        return web.json_response({"default_generation_settings": {"n_ctx": self.n_ctx},
                                  "total_slots": 2})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if request.path == "/v1/chat/completions":  # not the gateway's warm-up
            self.calls.append({"body": body, "headers": dict(request.headers)})
        text = json.dumps(body.get("messages", body.get("prompt")))
        if len(text) > self.n_ctx:
            return web.json_response({"error": {
                "code": 400, "type": "exceed_context_size_error", "message": "too long",
                "n_prompt_tokens": len(text), "n_ctx": self.n_ctx}}, status=400)
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for word in ("a", "b"):
                await response.write(
                    f'data: {{"choices":[{{"delta":{{"content":"{word}"}}}}]}}\n\n'.encode())
            await response.write(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],'
                                 b'"timings":{"prompt_n":7,"cache_n":0,"predicted_n":2}}\n\n')
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response({
            "choices": [{"message": {"role": "assistant", "content": f"from {self.name}"}}],
            "usage": {"prompt_tokens": len(text), "completion_tokens": 3},
        })


@dataclass
class FakeScaleApi:
    token: str
    deployment: str
    replicas: int = 0
    patches: list[Any] = field(default_factory=list)
    lease: str = "glm-lc"
    lease_duration: int = 30
    calls: list[tuple[str, Any]] = field(default_factory=list)  # in order: scale and lease

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale",
                             self.scale)
        app.router.add_patch("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
                             self.renew)
        return app

    async def renew(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"reason": "Unauthorized"}, status=401)
        if request.match_info["name"] != self.lease:
            return web.json_response({"reason": "Forbidden"}, status=403)
        assert request.content_type == "application/merge-patch+json"
        assert request.query["fieldManager"] == "glm-gateway"
        patch = await request.json()
        self.calls.append(("lease", patch))
        return web.json_response({"kind": "Lease", "spec": {
            **patch["spec"], "leaseDurationSeconds": self.lease_duration}})

    async def scale(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"reason": "Unauthorized"}, status=401)
        if request.match_info["name"] != self.deployment:
            return web.json_response({"reason": "Forbidden"}, status=403)
        if request.method == "PATCH":
            assert request.content_type == "application/merge-patch+json"
            patch = await request.json()
            self.patches.append(patch)
            self.calls.append(("scale", patch))
            self.replicas = patch["spec"]["replicas"]
        return web.json_response({"kind": "Scale", "spec": {"replicas": self.replicas}})


async def serve(app: web.Application) -> TestServer:
    server = TestServer(app)
    await server.start_server()
    return server


class GatewayClient:
    """A gateway served on a free port (its own HTTP server, as in the pod), and a client."""

    def __init__(self, gateway: Gateway, server: HttpServer, port: int) -> None:
        self.gateway = gateway
        self.server = server
        self.url = f"http://127.0.0.1:{port}"
        self.session = aiohttp.ClientSession()

    async def request(self, method: str, path: str, **kw: Any) -> aiohttp.ClientResponse:
        return await self.session.request(method, self.url + path, **kw)

    async def get(self, path: str, **kw: Any) -> aiohttp.ClientResponse:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, **kw: Any) -> aiohttp.ClientResponse:
        return await self.request("POST", path, **kw)

    async def close(self) -> None:
        await self.session.close()
        await self.server.stop(1.0)
        await self.gateway.stop()


async def gateway_client(config: GatewayConfig) -> GatewayClient:
    gateway = Gateway(config)
    await gateway.start()
    server = gateway.http_server()
    return GatewayClient(gateway, server, await server.start("127.0.0.1", 0))


@pytest.fixture
async def engine() -> AsyncIterator[tuple[FakeEngine, str]]:
    fake = FakeEngine(n_ctx=200)
    server = await serve(fake.app())
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


def base_config(engine_url: str, **changes: Any) -> GatewayConfig:
    return replace(GatewayConfig(engine_url=engine_url, service_name="glm",
                                 model_version="v1"), **changes)


def activity_config(api_server: TestServer, token: Path, lease: str = "glm-lc"
                    ) -> ActivityConfig:
    return ActivityConfig(lease=lease, namespace="ns",
                          api_server=str(api_server.make_url("")).rstrip("/"),
                          token_path=token, ca_path=None, identity="pod-a")


@dataclass
class WakeScene:
    """A main gateway in front of `engine` that wakes a fake long-context pool through a
    fake API server, and marks the wake on the Lease `lease`."""

    api: FakeScaleApi
    long_engine: FakeEngine
    client: GatewayClient
    servers: list[TestServer]

    @classmethod
    async def start(cls, url: str, tmp_path: Path, lease: str = "glm-lc",
                    ready: asyncio.Event | None = None) -> WakeScene:
        long_engine = FakeEngine(n_ctx=10_000, name="long", ready=ready)
        api = FakeScaleApi(token="t", deployment="glm-v1-long")
        long_server, api_server = await serve(long_engine.app()), await serve(api.app())
        token = tmp_path / "token"
        token.write_text("t")
        wake = WakeConfig(deployment="glm-v1-long", namespace="ns",
                          api_server=str(api_server.make_url("")).rstrip("/"), token_path=token,
                          ca_path=None, timeout_seconds=10, poll_seconds=0.05)
        config = base_config(url, long_context_url=str(long_server.make_url("")).rstrip("/"),
                             wake=wake, activity=activity_config(api_server, token, lease))
        return cls(api, long_engine, await gateway_client(config), [long_server, api_server])

    async def close(self) -> None:
        await self.client.close()
        for server in self.servers:
            await server.close()


CHAT = {"model": "glm", "messages": [{"role": "user", "content": "hi"}]}
LONG_CHAT = {"model": "glm", "messages": [{"role": "user", "content": "x" * 400}]}


async def test_chat_models_and_metrics(engine: tuple[FakeEngine, str]) -> None:
    fake, url = engine
    client = await gateway_client(base_config(url, stop_sequences=("<|user|>",)))
    try:
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status == 200
        assert (await response.json())["choices"][0]["message"]["content"] == "from main"
        assert fake.calls[-1]["body"]["stop"] == ["<|user|>"]
        assert response.headers["X-Request-Id"]
        models = await (await client.get("/v1/models")).json()
        assert models["data"][0]["id"] == "glm"
        for _ in range(50):  # the warm-up reads n_ctx from /props
            if models["data"][0]["context_length"] == 200:
                break
            await asyncio.sleep(0.05)
            models = await (await client.get("/v1/models")).json()
        assert models["data"][0]["context_length"] == 200
        stream = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        raw = await stream.read()
        assert raw.startswith(b"data: ") and raw.endswith(b"data: [DONE]\n\n")
        text = await (await client.get("/metrics")).text()
        labels = 'model_version="v1",pool="main",service="glm"'
        assert ('glm_gateway_requests_total{code="200",endpoint="chat",model_version="v1",'
                'outcome="completed",pool="main",service="glm"} 2.0') in text
        assert f"glm_gateway_completion_tokens_total{{{labels}}} 5.0" in text
        assert f'glm_gateway_time_to_first_token_seconds_count{{endpoint="chat",{labels}}} 1.0' \
            in text
        assert f"glm_gateway_requests_in_flight{{{labels}}} 0.0" in text
    finally:
        await client.close()


async def test_overflow_without_pool_says_too_long(engine: tuple[FakeEngine, str]) -> None:
    _, url = engine
    client = await gateway_client(base_config(url))
    try:
        response = await client.post("/v1/chat/completions", json=LONG_CHAT)
        assert response.status == 400
        error = (await response.json())["error"]
        assert error["code"] == "context_length_exceeded"
        assert "too long" in error["message"] and "200" in error["message"]
        assert str(len(json.dumps(LONG_CHAT["messages"]))) in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
    finally:
        await client.close()


async def test_overflow_wakes_the_pool_from_zero(engine: tuple[FakeEngine, str],
                                                 tmp_path: Path) -> None:
    main, url = engine
    ready = asyncio.Event()
    scene = await WakeScene.start(url, tmp_path, ready=ready)
    api, long_engine, client = scene.api, scene.long_engine, scene.client
    try:
        # Short requests never wait on the wake.
        assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
        pending = [asyncio.create_task(client.post("/v1/chat/completions", json=LONG_CHAT,
                                                   headers={"Authorization": "Bearer k"}))
                   for _ in range(3)]
        for _ in range(100):
            if api.patches:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        assert api.patches == [{"spec": {"replicas": 1}}]  # one scale call for three requests
        assert not any(task.done() for task in pending)
        started = asyncio.get_running_loop().time()
        assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
        assert asyncio.get_running_loop().time() - started < 0.5
        metrics = await (await client.get("/metrics")).text()
        assert 'glm_gateway_requests_queued{model_version="v1",pool="main",service="glm"} 3.0' \
            in metrics
        ready.set()
        for response in await asyncio.gather(*pending):
            assert response.status == 200
            assert (await response.json())["choices"][0]["message"]["content"] == "from long"
        assert long_engine.calls[-1]["headers"]["Authorization"] == "Bearer k"
        assert api.patches == [{"spec": {"replicas": 1}}]
        metrics = await (await client.get("/metrics")).text()
        assert 'glm_gateway_overflow_total{model_version="v1",outcome="routed",pool="main",' \
               'service="glm"} 3.0' in metrics
        assert "glm_gateway_long_context_wakes_total" in metrics
    finally:
        await scene.close()
    assert len(main.calls) == 5  # 2 short + 3 long ones refused for context size


async def test_the_wake_is_marked_as_activity_before_the_scale(
        engine: tuple[FakeEngine, str], tmp_path: Path) -> None:
    scene = await WakeScene.start(engine[1], tmp_path)
    api, long_engine, client = scene.api, scene.long_engine, scene.client
    try:
        for _ in range(3):  # short requests never mark the pool as in use
            assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
        assert api.calls == []
        # The fake pool answers /readyz at once: it is awake, so nothing to wake or mark.
        assert (await client.post("/v1/chat/completions", json=LONG_CHAT)).status == 200
        assert api.calls == []
        long_engine.ready = asyncio.Event()  # asleep now: the next long request wakes it
        api.replicas = 0
        pending = asyncio.create_task(client.post("/v1/chat/completions", json=LONG_CHAT))
        for _ in range(100):
            if len(api.calls) >= 2:
                break
            await asyncio.sleep(0.05)
        (kind, mark), (second, scale) = api.calls
        assert (kind, second) == ("lease", "scale")
        assert mark["spec"]["holderIdentity"] == "pod-a"
        assert mark["spec"]["renewTime"].endswith("Z") and "." in mark["spec"]["renewTime"]
        assert scale == {"spec": {"replicas": 1}}
        long_engine.ready.set()
        assert (await pending).status == 200
    finally:
        await scene.close()


async def test_a_failed_mark_does_not_stop_the_wake(engine: tuple[FakeEngine, str],
                                                    tmp_path: Path) -> None:
    scene = await WakeScene.start(engine[1], tmp_path, lease="not-allowed",
                                  ready=asyncio.Event())
    api, long_engine, client = scene.api, scene.long_engine, scene.client
    try:
        pending = asyncio.create_task(client.post("/v1/chat/completions", json=LONG_CHAT))
        for _ in range(100):
            if api.replicas:
                break
            await asyncio.sleep(0.05)
        assert api.patches == [{"spec": {"replicas": 1}}]  # the 403 on the Lease is logged
        long_engine.ready.set()  # type: ignore[union-attr]
        assert (await pending).status == 200
    finally:
        await scene.close()


async def test_the_long_context_gateway_marks_the_requests_it_serves(
        tmp_path: Path) -> None:
    long_engine = FakeEngine(n_ctx=10_000, name="long")
    engine_server = await serve(long_engine.app())
    api = FakeScaleApi(token="t", deployment="none")
    api_server = await serve(api.app())
    token = tmp_path / "token"
    token.write_text("t")
    config = base_config(str(engine_server.make_url("")).rstrip("/"), pool="long-context",
                         activity=activity_config(api_server, token))
    client = await gateway_client(config)
    try:
        assert (await client.get("/readyz")).status in (200, 503)
        assert api.calls == []  # probes and warm-up are no activity
        for _ in range(3):
            assert (await client.post("/v1/chat/completions", json=LONG_CHAT)).status == 200
        for _ in range(100):
            if api.calls:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert [kind for kind, _ in api.calls] == ["lease"]  # throttled: one for three
        assert marker_of(client).renewals == 1
        stream = await client.post("/v1/chat/completions", json={**LONG_CHAT, "stream": True})
        assert (await stream.read()).endswith(b"data: [DONE]\n\n")
        assert marker_of(client).pending_or_in_flight()  # a stream is activity too
        assert (await client.post("/v1/chat/completions", json={"model": "glm"})).status == 400
        await asyncio.sleep(0.1)
        assert len(api.calls) == 1
    finally:
        await client.close()
        await engine_server.close()
        await api_server.close()


def marker_of(client: GatewayClient) -> Any:
    marker = client.gateway.activity
    assert marker is not None
    return marker


async def test_wake_timeout_is_503_with_retry_after(engine: tuple[FakeEngine, str],
                                                    tmp_path: Path) -> None:
    _, url = engine
    api = FakeScaleApi(token="right", deployment="glm-v1-long")
    api_server = await serve(api.app())
    token = tmp_path / "token"
    token.write_text("right")
    wake = WakeConfig(deployment="glm-v1-long", namespace="ns",
                      api_server=str(api_server.make_url("")).rstrip("/"), token_path=token,
                      ca_path=None, timeout_seconds=0.5, poll_seconds=0.05,
                      retry_after_seconds=17)
    config = base_config(url, long_context_url="http://127.0.0.1:9", wake=wake)
    client = await gateway_client(config)
    try:
        response = await client.post("/v1/chat/completions", json=LONG_CHAT)
        assert response.status == 503
        assert response.headers["Retry-After"] == "17"
        error = (await response.json())["error"]
        assert error["code"] == "long_context_unavailable"
        assert "not ready" in error["message"]
        assert api.replicas == 1
        token.write_text("wrong")  # a token the API refuses: 503 says why, no hang
        api.replicas = 0
        response = await client.post("/v1/chat/completions", json=LONG_CHAT)
        assert response.status == 503
        assert "401" in (await response.json())["error"]["message"]
    finally:
        await client.close()
        await api_server.close()


async def test_auth_rate_limit_and_body_limit(engine: tuple[FakeEngine, str],
                                              tmp_path: Path) -> None:
    _, url = engine
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "a").write_text("key-a")
    config = base_config(url, api_keys_path=keys, rate_limit_rps=0.5, rate_limit_burst=2,
                         max_body_bytes=1000)
    client = await gateway_client(config)
    try:
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "invalid_api_key"
        bad = await client.post("/v1/chat/completions", json=CHAT,
                                headers={"Authorization": "Bearer nope"})
        assert bad.status == 401
        auth = {"Authorization": "Bearer key-a"}
        assert (await client.get("/v1/models")).status == 401
        assert (await client.get("/v1/models", headers=auth)).status == 200
        for _ in range(2):
            assert (await client.post("/v1/chat/completions", json=CHAT,
                                      headers=auth)).status == 200
        limited = await client.post("/v1/chat/completions", json=CHAT, headers=auth)
        assert limited.status == 429
        assert int(limited.headers["Retry-After"]) >= 1
        assert (await limited.json())["error"]["code"] == "rate_limit_exceeded"
        big = {"model": "glm", "messages": [{"role": "user", "content": "y" * 2000}]}
        (keys / "b").write_text("key-b")
        await asyncio.sleep(1.1)  # the key store looks again after a second
        response = await client.post("/v1/chat/completions", json=big,
                                     headers={"Authorization": "Bearer key-b"})
        assert response.status == 413
        assert (await response.json())["error"]["code"] == "request_too_large"
        response = await client.post("/v1/chat/completions", data=b"{nope",
                                     headers={"Authorization": "Bearer key-b"})
        assert response.status == 400
    finally:
        await client.close()


async def test_engine_down_is_a_fast_503() -> None:
    config = GatewayConfig(engine_url="http://127.0.0.1:9", service_name="glm",
                           connect_timeout_seconds=1)
    client = await gateway_client(config)
    try:
        started = asyncio.get_running_loop().time()
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status == 503
        assert asyncio.get_running_loop().time() - started < 3
        error = (await response.json())["error"]
        assert error["code"] == "engine_unavailable"
        assert response.headers["Retry-After"]
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/healthz")).status == 200
        missing = await client.get("/v2/nothing")
        assert missing.status == 404 and (await missing.json())["error"]["code"] == "not_found"
    finally:
        await client.close()


async def test_enginez_relays_the_engines_health(engine: tuple[FakeEngine, str],
                                                 tmp_path: Path) -> None:
    """The engine container's probes: the engine's /health through the gateway, without a
    key, fast when the engine is slow or gone, and never in the request metrics."""
    fake, url = engine
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "a").write_text("key-a")
    client = await gateway_client(base_config(url, api_keys_path=keys,
                                              engine_health_timeout_seconds=0.3))
    try:
        response = await client.get("/enginez")  # no Authorization header
        assert response.status == 200
        assert await response.json() == {"status": "ok"}
        fake.health_status = 503
        response = await client.get("/enginez")
        assert response.status == 503
        body = await response.json()
        assert body["engine_status"] == 503 and "Loading model" in body["detail"]
        fake.health_status, fake.health_delay = 200, 2.0
        started = asyncio.get_running_loop().time()
        response = await client.get("/enginez")
        assert response.status == 503
        assert asyncio.get_running_loop().time() - started < 1.5
        assert "0.3 s" in (await response.json())["detail"]
        fake.health_delay = 0.0
        assert (await client.get("/enginez")).status == 200
        metrics = await (await client.get("/metrics")).text()
        assert "glm_gateway_requests_total{" not in metrics
    finally:
        await client.close()
    down = await gateway_client(GatewayConfig(engine_url="http://127.0.0.1:9",
                                              service_name="glm"))
    try:
        response = await down.get("/enginez")
        assert response.status == 503
        assert (await response.json())["engine_status"] is None
        assert (await down.get("/healthz")).status == 200  # the gateway itself is fine
    finally:
        await down.close()


async def test_tokens_per_minute_per_key(engine: tuple[FakeEngine, str], tmp_path: Path) -> None:
    """The fake engine reports usage prompt = len(json(messages)), completion = 3: the budget
    is charged that after each answer and refuses while the key is in deficit."""
    fake, url = engine
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "a").write_text("key-a")
    (keys / "b").write_text("key-b")
    cost = len(json.dumps(CHAT["messages"])) + 3  # 35 + 3 tokens
    client = await gateway_client(base_config(url, api_keys_path=keys,
                                              rate_limit_tokens_per_minute=2 * cost - 1))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    try:
        for _ in range(2):  # the second is admitted on the 37 left, then takes the key below 0
            assert (await client.post("/v1/chat/completions", json=CHAT, headers=a)).status \
                == 200
        calls = len(fake.calls)
        limited = await client.post("/v1/chat/completions", json=CHAT, headers=a)
        assert limited.status == 429
        assert len(fake.calls) == calls  # never reached the engine
        error = (await limited.json())["error"]
        assert (error["code"], error["type"]) == ("rate_limit_exceeded", "tokens")
        assert f"({2 * cost - 1} prompt + completion tokens per minute;" in error["message"]
        # About 1 token in deficit: (1 + 1) / (75 / 60 per s) = 1.6 s -> 2 s.
        assert limited.headers["Retry-After"] == "2"
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=b)).status == 200
        await asyncio.sleep(1.7)
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=a)).status == 200
        metrics = await (await client.get("/metrics")).text()
        assert 'code="429"' in metrics
    finally:
        await client.close()


async def test_the_servers_own_refusals_are_counted_and_audited_where_a_key_is_known(
        engine: tuple[FakeEngine, str], tmp_path: Path) -> None:
    """A 401 from the head and a 503 of the bytes cap reach no handler: each is counted in
    glm_gateway_refusals_total (not in the request series: no version served it), and the
    503, whose key the head check found, is in the audit log as that key's request."""
    _, url = engine
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "a").write_text("key-a")
    audit = tmp_path / "audit.jsonl"
    client = await gateway_client(base_config(url, api_keys_path=keys, audit=str(audit),
                                              max_buffered_bytes=1000))
    try:
        response = await client.post("/v1/chat/completions", json=CHAT)  # no key
        assert response.status == 401
        response = await client.post("/v1/chat/completions", data=b" " * 5000,
                                     headers={"Authorization": "Bearer key-a",
                                              "Content-Type": "application/json",
                                              "X-Request-Id": "squat-1"})
        assert response.status == 503
        assert (await response.json())["error"]["code"] == "server_busy"
        metrics = await (await client.get("/metrics")).text()
    finally:
        await client.close()
    refusals = {(sample.labels["code"], sample.labels["reason"]): sample.value
                for family in text_string_to_metric_families(metrics)
                for sample in family.samples if sample.name == "glm_gateway_refusals_total"}
    assert refusals == {("401", "invalid_api_key"): 1, ("503", "server_busy"): 1}, metrics
    assert "glm_gateway_requests_total{" not in metrics
    (line,) = [json.loads(text) for text in audit.read_text().splitlines()]
    assert line["status"] == 503 and line["error_code"] == "server_busy"
    assert line["request_id"] == "squat-1" and line["key_id"] and "key-a" not in line["key_id"]


async def test_probes_and_engine_metrics_ask_the_engine_once_at_a_time(
        engine: tuple[FakeEngine, str]) -> None:
    """Forty clients at once on /metrics/engine and forty on /enginez (no key needed): the
    engine is asked once each while they wait, and every client gets the whole answer."""
    fake, url = engine
    # No KV-cache poll: it reads the engine's /metrics too, on its own clock.
    client = await gateway_client(base_config(url, kv_cache_poll_seconds=0))
    try:
        fake.hold = asyncio.Event()  # the engine answers once every client is waiting
        health_before, metrics_before = fake.health_calls, fake.metrics_calls

        async def fetch(path: str) -> tuple[int, bytes]:
            response = await client.get(path)
            return response.status, await response.read()

        waiting = asyncio.gather(*[fetch(path) for path in ("/metrics/engine",
                                                             "/enginez") * 40])
        async with asyncio.timeout(20):
            while client.server.in_flight < 80:  # every handler is running
                await asyncio.sleep(0.01)
        fake.hold.set()
        answers = await waiting
        assert fake.metrics_calls - metrics_before == 1
        assert fake.health_calls - health_before == 1
        metrics = [body for status, body in answers[0::2] if status == 200]
        assert len(metrics) == 40 and all(body.count(b"\n") == 8000 for body in metrics)
        assert all(status == 200 for status, _ in answers[1::2])
        # Once answered, the next request asks again: the answer is as fresh as the call.
        assert (await fetch("/metrics/engine"))[0] == 200
        assert fake.metrics_calls - metrics_before == 2
    finally:
        fake.hold = None
        await client.close()
