"""The router (router/) in one process: its real HTTP server, real pod gateways'
stand-ins (our own HTTP server answering as a pod's gateway does), and a stand-in endpoint
picker speaking the real ext-proc protocol over gRPC. The real EPP, real gateways and real
llama-servers are e2e/test_routing.py's; here the router's own decisions are pinned down:
exact weights, the pin, the long-context shortcut, the failure modes, holding requests while
a version has no ready pod.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from glm_operator.gateway.wire.messages import Request, Response, Router, Streamed
from glm_operator.gateway.wire.server import HttpServer
from glm_operator.router.app import RouterApp
from glm_operator.router.body import prompt_chars
from glm_operator.router.config import RouterConfig
from glm_operator.router.forward import cache_report
from glm_operator.router.picker import (
    BODY_PIECE_BYTES,
    DESTINATION_HEADER,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
    destination,
    request_bytes,
    request_messages,
)
from glm_operator.router.pods import ready_by_version
from glm_operator.router.table import TableError, WeightedSplit, parse
from glm_operator.wellknown import POOL_LABEL, VERSION_LABEL

# --- the route table ---------------------------------------------------------------------------


def table_json(weights: dict[str, int], *, min_replicas: int = 1, context: int = 0,
               long_context: bool = False, wake_timeout: float = 5.0) -> str:
    return json.dumps({
        "versions": [{"name": name, "weight": weight, "deployment": f"svc-{name}",
                      "minReplicas": min_replicas, "wakeTimeoutSeconds": wake_timeout,
                      "activityLease": None} for name, weight in weights.items()],
        "mainContextTokens": context,
        "longContext": {"contextTokens": 100_000, "minReplicas": 0, "wakeTimeoutSeconds": 5,
                        "activityLease": "svc-long-context-activity",
                        "deployments": {name: f"svc-{name}-long" for name in weights}}
        if long_context else None,
    })


def test_the_table_parses_what_the_operator_writes() -> None:
    table = parse(table_json({"v1": 90, "v2": 10}, context=4096, long_context=True))
    assert table.names == ("v1", "v2")
    assert table.main_context_tokens == 4096
    assert table.long_context is not None
    long_route = table.long_context.route_for(table.versions[1])
    assert long_route is not None and long_route.deployment == "svc-v2-long"
    assert long_route.min_replicas == 0


@pytest.mark.parametrize(("text", "says"), [
    ("not json", "not JSON"),
    ("[]", "must be an object"),
    ('{"versions": []}', "1 to 16"),
    (table_json({"v1": 90, "v2": 20}), "sum to 110"),
    (table_json({"v1": 101}), "weight must be 0..100"),
    ('{"versions": [{"name": "a", "weight": 100}]}', "deployment is missing"),
    ('{"versions": [{"name": "a", "weight": true, "deployment": "d"}]}', "weight must be int"),
    ('{"versions": [{"name": "a", "weight": 50, "deployment": "d"},'
     ' {"name": "a", "weight": 50, "deployment": "e"}]}', "twice"),
    ('{"versions": [{"name": "a", "weight": 100, "deployment": "d", '
     '"wakeTimeoutSeconds": -1}]}', "wakeTimeoutSeconds"),
    ("x" * 70_000, "bytes, over"),
])
def test_a_bad_table_is_refused_naming_the_field(text: str, says: str) -> None:
    with pytest.raises(TableError, match=says):
        parse(text)


def test_the_split_gives_each_version_its_weight_exactly() -> None:
    split = WeightedSplit(parse(table_json({"v1": 90, "v2": 7, "v3": 3})).versions)
    picks = [split.next() for _ in range(500)]
    assert (picks.count("v1"), picks.count("v2"), picks.count("v3")) == (450, 35, 15)
    # exact within one request over any 100 in a row, not only over the whole run
    for start in range(0, 400, 37):
        window = picks[start:start + 100]
        assert abs(window.count("v2") - 7) <= 1 and abs(window.count("v3") - 3) <= 1


def test_a_version_at_zero_weight_gets_nothing() -> None:
    split = WeightedSplit(parse(table_json({"v1": 100, "v2": 0})).versions)
    assert {split.next() for _ in range(50)} == {"v1"}


# --- pods, the picker's messages, the engines' cache counts -----------------------------------


def pod(name: str, version: str, ip: str, ready: bool = True, pool: str = "main",
        **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {VERSION_LABEL: version, POOL_LABEL: pool},
                         **extra},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_only_ready_pods_with_an_address_count() -> None:
    pods = [pod("a", "v1", "10.0.0.1"), pod("b", "v1", "10.0.0.2", ready=False),
            pod("c", "v2", "10.0.0.3"), pod("d", "v1", ""),
            pod("e", "v1", "10.0.0.5", deletionTimestamp="2026-01-01T00:00:00Z"),
            pod("f", "v1", "fd00::6")]
    ready = ready_by_version(pods, 8080)
    assert [e.address for e in ready["main", "v1"]] == ["10.0.0.1:8080", "[fd00::6]:8080"]
    assert [e.address for e in ready["main", "v2"]] == ["10.0.0.3:8080"]
    long_pool = ready_by_version([pod("g", "v1", "10.0.0.7", pool="long-context")], 8080)
    assert list(long_pool) == [("long-context", "v1")]


def test_the_picker_gets_headers_then_the_body_with_the_subset_on_each() -> None:
    body = b"x" * (2 * 1024 * 1024 + 5)
    messages = request_messages({":path": "/v1/chat/completions"}, body, ["1.2.3.4:8080"])
    assert messages[0].HasField("request_headers")
    assert not messages[0].request_headers.end_of_stream
    pieces = [m.request_body for m in messages[1:]]
    assert b"".join(p.body for p in pieces) == body
    assert [p.end_of_stream for p in pieces] == [False, False, True]
    for message in messages:  # the EPP reads the metadata of the message it acts on
        hint = message.metadata_context.filter_metadata[SUBSET_NAMESPACE]
        assert list(hint.fields[SUBSET_KEY].list_value.values[0].string_value
                    for _ in [0]) == ["1.2.3.4:8080"]


def test_the_bytes_sent_are_the_messages_with_their_subset_hint() -> None:
    body = b"y" * (BODY_PIECE_BYTES + 3)
    headers = {":path": "/v1/completions", "x-request-id": "r"}
    for subset in (["1.2.3.4:8080", "5.6.7.8:8080"], ["1.2.3.4:8080"], []):
        sent = [ext_proc.ProcessingRequest.FromString(b)
                for b in request_bytes(headers, body, subset)]
        assert sent == request_messages(headers, body, subset)


def test_the_destination_is_read_from_the_header_mutation() -> None:
    response = headers_response("10.1.2.3:8080,10.1.2.4:8080")
    assert destination(response) == "10.1.2.3:8080"
    assert destination(ext_proc.ProcessingResponse()) is None


@pytest.mark.parametrize(("tail", "expected"), [
    (b'{"timings":{"cache_n":90,"prompt_n":10}}', (100, 90)),
    (b'"usage":{"prompt_tokens":50,"prompt_tokens_details":{"cached_tokens":32}}', (50, 32)),
    (b'"usage":{"prompt_tokens":50}', (50, 0)),
    (b'{"choices":[]}', None),
])
def test_the_engines_cache_counts_are_read_off_the_answer(tail: bytes, expected: Any) -> None:
    report = cache_report(tail)
    assert (None if report is None else (report.prompt_tokens, report.cached_tokens)) == expected


def test_prompt_characters_count_text_only() -> None:
    assert prompt_chars({"messages": [{"role": "user", "content": "abcd"},
                                      {"role": "user", "content": [
                                          {"type": "text", "text": "ef"},
                                          {"type": "image_url", "image_url": {"url": "x" * 99}}
                                      ]}]}) == 6
    assert prompt_chars({"prompt": ["ab", "c"]}) == 3


# --- the router in one process ------------------------------------------------------------------


def headers_response(address: str) -> ext_proc.ProcessingResponse:
    return ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse(
        response=ext_proc.CommonResponse(header_mutation=ext_proc.HeaderMutation(
            set_headers=[base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(
                key=DESTINATION_HEADER, raw_value=address.encode()))]))))


class StandInPicker(ext_proc_grpc.ExternalProcessorServicer):
    """Answers as the EPP does: after the body's end, the header mutation naming a pod. It
    picks `choose` when set and in the subset, else the subset's last; it can be slow."""

    def __init__(self) -> None:
        self.choose: str | None = None
        self.delay = 0.0
        self.subsets: list[list[str]] = []

    async def Process(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        subset: list[str] = []
        async for message in requests:
            hint = message.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
            if hint is not None:
                subset = [v.string_value for v in hint.fields[SUBSET_KEY].list_value.values]
            if message.HasField("request_body") and message.request_body.end_of_stream:
                self.subsets.append(subset)
                if self.delay:
                    await asyncio.sleep(self.delay)
                chosen = self.choose if self.choose in subset else subset[-1]
                yield headers_response(chosen)
                yield ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())


class PodGateway:
    """A pod's gateway, as far as the router sees one: our HTTP server, answering with its
    own name and llama.cpp's cache counts, whole or streamed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[Request] = []
        router = Router(self.answer)
        self.server = HttpServer(router, 10_000_000)
        self.port = 0

    async def start(self, port: int = 0) -> None:
        self.port = await self.server.start("127.0.0.1", port)

    async def answer(self, request: Request) -> Response | Streamed:
        self.seen.append(request)
        body = json.loads(request.body)
        answer = {"pod": self.name, "timings": {"cache_n": 30, "prompt_n": 10}}
        if not body.get("stream"):
            return Response(200, json.dumps(answer).encode(),
                            {"Content-Type": "application/json",
                             "X-Request-Id": request.headers.get("x-request-id", "")})
        transport = request.transport
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
        for event in (json.dumps({"pod": self.name}), json.dumps(answer), "[DONE]"):
            data = f"data: {event}\n\n".encode()
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))
            await asyncio.sleep(0)
        transport.write(b"0\r\n\r\n")
        return Streamed(complete=True)


class Scene:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.pods: dict[str, PodGateway] = {}
        self.picker = StandInPicker()
        self.grpc: Any = None
        self.app: RouterApp | None = None
        self.url = ""

    async def start(self, *, picker: str = "up", failure_mode: str = "open",
                    max_waiting: int = 256, **limits: Any) -> RouterApp:
        address = ""
        if picker == "up":
            self.grpc = grpc.aio.server()
            ext_proc_grpc.add_ExternalProcessorServicer_to_server(self.picker, self.grpc)
            port = self.grpc.add_insecure_port("127.0.0.1:0")
            address = f"127.0.0.1:{port}"
            await self.grpc.start()
        elif picker == "down":  # nothing listens there
            with socket.socket() as closed:
                closed.bind(("127.0.0.1", 0))
                address = f"127.0.0.1:{closed.getsockname()[1]}"
        token = self.tmp_path / "token"
        token.write_text("t")
        config = RouterConfig(service_name="svc", namespace="ns", routes_configmap="svc-routes",
                              api_server="http://127.0.0.1:9", token_path=token, ca_path=None,
                              picker_address=address, picker_timeout_seconds=0.5,
                              picker_failure_mode=failure_mode,  # type: ignore[arg-type]
                              max_waiting=max_waiting, **limits)
        self.app = app = RouterApp(config)
        app.start_picker()
        app.start_keys()
        app._session = aiohttp.ClientSession()
        self.server = app.http_server()
        port = await self.server.start("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        return app

    async def add_pod(self, name: str, version: str) -> PodGateway:
        gateway = PodGateway(name)
        await gateway.start()
        self.pods[name] = gateway
        return gateway

    def publish_pods(self, *names: str) -> None:
        assert self.app is not None
        versions = {"a": "v1", "b": "v1", "c": "v2"}
        self.app._on_pods({name: pod(name, versions.get(name, "v1"), "127.0.0.1",
                                     pool="long-context" if name == "long" else "main")
                           for name in names})
        # all stand-ins share 127.0.0.1: the port tells them apart
        self.app.pods.by_version = {
            key: tuple(e.__class__(e.name, f"127.0.0.1:{self.pods[e.name].port}")
                       for e in endpoints)
            for key, endpoints in self.app.pods.by_version.items()}

    def publish_table(self, text: str) -> None:
        assert self.app is not None
        self.app._on_routes({"svc-routes": {"data": {"routes.json": text}}})

    async def stop(self) -> None:
        await self.server.stop(1)
        if self.app is not None:
            await self.app.stop()
        for gateway in self.pods.values():
            await gateway.server.stop(1)
        if self.grpc is not None:
            await self.grpc.stop(0)


@pytest.fixture
async def scene(tmp_path: Path) -> AsyncIterator[Scene]:
    scene = Scene(tmp_path)
    yield scene
    await scene.stop()


async def chat(scene: Scene, *, stream: bool = False, headers: dict[str, str] | None = None,
               content: str = "hi") -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session, session.post(
        scene.url + "/v1/chat/completions",
        headers=headers or {},
        json={"messages": [{"role": "user", "content": content}], "stream": stream},
    ) as answer:
        return answer.status, dict(answer.headers), await answer.read()


def counter(app: RouterApp, name: str, **labels: str) -> float:
    value = app.metrics.registry.get_sample_value(name, {"service": "svc", **labels})
    return value or 0.0


async def test_weights_are_exact_and_the_pin_wins(scene: Scene) -> None:
    app = await scene.start()
    for name in ("a", "b", "c"):
        await scene.add_pod(name, "")
    scene.publish_table(table_json({"v1": 80, "v2": 20}))
    scene.publish_pods("a", "b", "c")
    served = [json.loads((await chat(scene))[2])["pod"] for _ in range(50)]
    assert served.count("c") == 10, served  # v2's 20 % of 50, exactly
    # the picker saw only the chosen version's pods, and never v2's one pod (a forced pick)
    assert [len(s) for s in scene.picker.subsets] == [2] * 40
    c_address = f"127.0.0.1:{scene.pods['c'].port}"
    assert not any(c_address in s for s in scene.picker.subsets)
    pinned = [await chat(scene, headers={"x-glm-version": "v2"}) for _ in range(10)]
    assert {json.loads(body)["pod"] for _, _, body in pinned} == {"c"}
    assert {headers["X-Glm-Version"] for _, headers, _ in pinned} == {"v2"}
    status, _, body = await chat(scene, headers={"x-glm-version": "v9"})
    assert status == 400 and b"unknown_version" in body and b"v1, v2" in body
    assert counter(app, "glm_router_picks_total", reason="endpoint_picker") == 40
    assert counter(app, "glm_router_picks_total", reason="single") == 20


async def test_the_picker_chooses_and_streams_are_relayed(scene: Scene) -> None:
    app = await scene.start()
    a, b = await scene.add_pod("a", ""), await scene.add_pod("b", "")
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a", "b")
    scene.picker.choose = f"127.0.0.1:{b.port}"
    for _ in range(5):
        status, _, body = await chat(scene, stream=True,
                                     headers={"authorization": "Bearer k1",
                                              "x-request-id": "r-1"})
        assert status == 200 and body.count(b"data: ") == 3 and b'"pod": "b"' in body
    assert not a.seen and len(b.seen) == 5
    assert b.seen[0].headers["authorization"] == "Bearer k1"  # the pod checks the key
    assert b.seen[0].headers["x-request-id"] == "r-1"
    assert counter(app, "glm_router_prompt_tokens_total", version="v1") == 200
    assert counter(app, "glm_router_prompt_tokens_cached_total", version="v1") == 150


@pytest.mark.parametrize("picker", ["down", "slow"])
async def test_a_failing_picker_fails_open_to_a_ready_pod(scene: Scene, picker: str) -> None:
    app = await scene.start(picker="down" if picker == "down" else "up")
    scene.picker.delay = 2.0 if picker == "slow" else 0.0
    await scene.add_pod("a", "")
    await scene.add_pod("b", "")  # two: with one the picker is not asked
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a", "b")
    started = asyncio.get_running_loop().time()
    status, _, body = await chat(scene)
    assert status == 200 and json.loads(body)["pod"] in ("a", "b")
    assert asyncio.get_running_loop().time() - started < 1.9  # the timeout, not the picker
    assert counter(app, "glm_router_picks_total", reason="fail_open") == 1
    reason = "timeout" if picker == "slow" else "unavailable"
    assert counter(app, "glm_router_picker_failures_total", reason=reason) == 1


async def test_a_failing_picker_fails_closed_with_retry_after(scene: Scene) -> None:
    await scene.start(picker="down", failure_mode="closed")
    a, b = await scene.add_pod("a", ""), await scene.add_pod("b", "")
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a", "b")
    status, headers, body = await chat(scene)
    assert status == 503 and headers["Retry-After"] == "1"
    assert b"picker_unavailable" in body and b"FailClose" in body
    assert not a.seen and not b.seen


async def test_a_version_with_one_ready_pod_is_sent_there_without_asking_the_picker(
        scene: Scene) -> None:
    """The pick is forced, so the picker's round trip is saved (reason `single`); even a
    picker slower than its timeout costs nothing then. Control: with a second ready pod the
    same router asks the picker again."""
    app = await scene.start()
    scene.picker.delay = 2.0
    a = await scene.add_pod("a", "")
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    started = asyncio.get_running_loop().time()
    for _ in range(3):
        status, _, body = await chat(scene)
        assert status == 200 and json.loads(body)["pod"] == "a"
    assert asyncio.get_running_loop().time() - started < 0.4  # below one picker timeout
    assert scene.picker.subsets == [] and len(a.seen) == 3
    assert counter(app, "glm_router_picks_total", reason="single") == 3
    scene.picker.delay = 0.0
    b = await scene.add_pod("b", "")
    scene.publish_pods("a", "b")
    scene.picker.choose = f"127.0.0.1:{b.port}"
    status, _, body = await chat(scene)
    assert status == 200 and json.loads(body)["pod"] == "b"
    assert scene.picker.subsets == [[f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]]
    assert counter(app, "glm_router_picks_total", reason="endpoint_picker") == 1


async def test_a_long_prompt_goes_straight_to_the_long_context_pool(scene: Scene) -> None:
    app = await scene.start()
    main, long_pool = await scene.add_pod("a", ""), await scene.add_pod("long", "")
    scene.publish_table(table_json({"v1": 100}, context=100, long_context=True))
    scene.publish_pods("a", "long")
    status, headers, body = await chat(scene, content="x" * 401)  # > 100 tokens at 4 chars
    assert status == 200 and json.loads(body)["pod"] == "long"
    assert headers["X-Glm-Pool"] == "long-context"
    status, _, body = await chat(scene, content="x" * 399)
    assert json.loads(body)["pod"] == "a"
    assert len(main.seen) == 1 and len(long_pool.seen) == 1
    assert counter(app, "glm_router_picks_total", reason="long_context") == 1


async def test_requests_wait_for_a_ready_pod_bounded(scene: Scene) -> None:
    app = await scene.start(max_waiting=2)
    await scene.add_pod("a", "")
    scene.publish_table(table_json({"v1": 100}, wake_timeout=5.0))
    scene.publish_pods()
    waiting = [asyncio.create_task(chat(scene)) for _ in range(2)]
    while app.waiting < 2:
        await asyncio.sleep(0.01)
    status, headers, body = await chat(scene)  # a third is one too many
    assert status == 503 and b"too_many_waiting" in body and headers["Retry-After"] == "5"
    scene.publish_pods("a")  # the pool is up: the held requests are answered
    for task in waiting:
        status, _, body = await task
        assert status == 200 and json.loads(body)["pod"] == "a"
    assert app.waiting == 0


async def test_a_version_that_never_becomes_ready_is_a_503_not_a_hang(scene: Scene) -> None:
    await scene.start()
    scene.publish_table(table_json({"v1": 100}, wake_timeout=0.3))
    scene.publish_pods()
    status, headers, body = await chat(scene)
    assert status == 503 and b"not_ready" in body and b"0.3 s" in body
    assert headers["Retry-After"] == "1"


async def test_a_bad_table_keeps_the_last_good_one(scene: Scene) -> None:
    app = await scene.start()
    await scene.add_pod("a", "")
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    scene.publish_table(table_json({"v1": 50}))
    assert "sum to 50" in app.table_error
    status, _, _ = await chat(scene)
    assert status == 200


async def test_a_woken_pod_that_does_not_listen_yet_is_tried_again(scene: Scene) -> None:
    """Ready is the kubelet's word, a moment ahead of the gateway's socket: a held request
    whose first ready pod refuses the connection is sent again once it listens."""
    await scene.start()
    scene.publish_table(table_json({"v1": 100}, wake_timeout=5.0))
    scene.publish_pods()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    held = asyncio.create_task(chat(scene))
    await asyncio.sleep(0.1)
    late = PodGateway("a")
    late.port = port
    scene.pods["a"] = late
    scene.publish_pods("a")  # ready in the API, nothing listening
    await asyncio.sleep(0.6)
    assert not held.done()
    await late.start(port)
    status, _, body = await held
    assert status == 200 and json.loads(body)["pod"] == "a"


async def test_without_a_wait_a_refusing_pod_is_a_prompt_503(scene: Scene) -> None:
    """The control: a request that did not wait is not held for a pod that refuses."""
    await scene.start()
    scene.publish_table(table_json({"v1": 100}, wake_timeout=5.0))
    dead = PodGateway("a")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead.port = probe.getsockname()[1]
    scene.pods["a"] = dead
    scene.publish_pods("a")
    started = asyncio.get_running_loop().time()
    status, _, body = await chat(scene)
    assert status == 503 and b"could be reached" in body
    assert asyncio.get_running_loop().time() - started < 2


async def test_a_sleeping_pool_that_cannot_be_woken_says_why(scene: Scene) -> None:
    """The long-context pool at zero: the router tries to wake it (here the API server does
    not answer) and the held request ends in a 503 that names the pool and the failure."""
    app = await scene.start()
    await scene.add_pod("a", "")
    table = json.loads(table_json({"v1": 100}, context=100, long_context=True))
    table["longContext"]["wakeTimeoutSeconds"] = 0.5
    scene.publish_table(json.dumps(table))
    scene.publish_pods("a")
    status, headers, body = await chat(scene, content="x" * 401)
    assert status == 503 and b"long-context pool" in body and b"the wake failed" in body
    assert headers["Retry-After"] == "1"
    assert not scene.pods["a"].seen  # never sent to the main pool instead
    assert ("long-context", "v1") in app._wakers


def test_the_router_subcommand_and_its_old_name_run_the_router() -> None:
    """`glm-operator router` parses the router's flags and runs the router; so does its old
    name `glm-operator gateway --router`, which router pods rendered by older operators still
    run; `gateway` without it is the pod's gateway."""
    from unittest import mock

    from glm_operator import cli
    from glm_operator.gateway import cli as gateway_cli
    from glm_operator.router import cli as router_cli

    flags = ["--service-name", "s", "--routes-configmap", "r"]
    for argv in (["router", *flags], ["gateway", "--router", *flags]):
        with mock.patch.object(router_cli, "run", return_value=7) as run:
            assert cli.main(argv) == 7, argv
        (args,), _ = run.call_args
        assert (args.service_name, args.routes_configmap, args.picker_failure_mode) \
            == ("s", "r", "open"), argv
    with mock.patch.object(gateway_cli, "run", return_value=5) as run_gateway:
        assert cli.main(["gateway", "--service-name", "s"]) == 5
    (args,), _ = run_gateway.call_args
    assert args.engine_url.startswith("http://")


def test_the_prefix_index_predicts_what_a_pod_was_sent() -> None:
    from glm_operator.router.prefix import BLOCK_CHARS, PrefixIndex, prompt_text

    index = PrefixIndex(blocks_per_pod=100)
    system = "s" * (10 * BLOCK_CHARS)
    first = prompt_text({"messages": [{"role": "system", "content": system},
                                      {"role": "user", "content": "a" * 200}]})
    second = prompt_text({"messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": "b" * 200}]})
    assert index.predict_and_record("p1", first) == 0
    assert index.predict_and_record("p1", second) >= 10 * BLOCK_CHARS  # the shared system part
    assert index.predict_and_record("p2", second) == 0  # another pod holds none of it
    # a block matches only with its whole prefix: the same text after another start does not
    assert index.predict_and_record("p1", "x" + first) == 0
    small = PrefixIndex(blocks_per_pod=5)  # evicted: predicted no longer
    small.predict_and_record("p", first)
    small.predict_and_record("p", "z" * 1000)
    assert small.predict_and_record("p", first) == 0


async def test_the_router_counts_what_it_predicted_beside_what_the_engine_cached(
        scene: Scene) -> None:
    app = await scene.start()
    await scene.add_pod("a", "")
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    await chat(scene, content="q" * 640)
    await chat(scene, content="q" * 640)
    total = counter(app, "glm_router_prompt_chars_total", version="v1")
    predicted = counter(app, "glm_router_prompt_chars_predicted_cached_total", version="v1")
    assert total > 1280 and 640 <= predicted < total / 2 + 64


def test_the_pods_gateway_never_loads_grpc() -> None:
    """grpc is the router's alone: the pod gateway's memory budget has no room for it, nor
    for the router's own modules."""
    import subprocess
    import sys

    code = ("import sys, glm_operator.gateway.app, glm_operator.gateway.cli; "
            "print(sorted(m for m in ('grpc', 'envoy', 'google.protobuf', 'hpack', "
            "'glm_operator.router') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


class RefusingPod(PodGateway):
    """A pod's gateway that answers whole, with the status its prompt names."""

    async def answer(self, request: Request) -> Response | Streamed:
        self.seen.append(request)
        status = int(json.loads(request.body)["messages"][0]["content"])
        return Response(status, b'{"error": {"message": "no", "type": "x", "param": null, '
                        b'"code": "x"}}', {"Content-Type": "application/json"})


async def test_the_pods_own_status_is_counted_not_200(scene: Scene) -> None:
    """Whole answers (written from the pod connection's callback) and a stream's refusal
    are counted by the pod's status code, with the gateway's outcome."""
    app = await scene.start(picker="none")
    refusing = RefusingPod("a")
    await refusing.start()
    scene.pods["a"] = refusing
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    for code, stream in (("401", False), ("400", False), ("503", False), ("401", True),
                         ("200", False)):
        status, _, _ = await chat(scene, stream=stream, content=code)
        assert status == int(code)
    assert counter(app, "glm_router_requests_total", version="v1", code="401",
                   outcome="client_error") == 2
    assert counter(app, "glm_router_requests_total", version="v1", code="400",
                   outcome="client_error") == 1
    assert counter(app, "glm_router_requests_total", version="v1", code="503",
                   outcome="server_error") == 1
    assert counter(app, "glm_router_requests_total", version="v1", code="200",
                   outcome="completed") == 1


class Marks:
    """Stands in for a version's activity Lease: counts what would renew it."""

    def __init__(self) -> None:
        self.begun = 0

    def begin(self) -> None:
        self.begun += 1

    def end(self) -> None:
        pass


def keys_dir(tmp_path: Path, **keys: str) -> Path:
    """A Secret volume as the kubelet mounts it: one file per key."""
    folder = tmp_path / "api-keys"
    folder.mkdir(exist_ok=True)
    for name, key in keys.items():
        (folder / name).write_text(key + "\n")
    return folder


BAD_KEYS = ({}, {"authorization": ""}, {"authorization": "Basic azE="},
            {"authorization": "Bearer "}, {"authorization": "Bearer wrong"},
            {"authorization": "Bearer k1x"})


def assert_gateways_401(status: int, headers: dict[str, str], body: bytes) -> None:
    """The pods' gateways' own 401: OpenAI's error shape, the Bearer challenge, an id."""
    assert status == 401, body
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert headers["WWW-Authenticate"].startswith('Bearer realm="glm-operator"')
    assert "x-request-id" in {name.lower() for name in headers}


async def test_a_keyed_routers_request_without_a_valid_key_wakes_nothing(
        scene: Scene) -> None:
    """A keyed service's router checks the pods' keys before a wake: no key, another scheme,
    an empty or a wrong key is the gateway's 401, and neither the version's main pool nor the
    long-context pool (a long prompt, a pinned version) is woken or waited for. Control: a
    valid key is held while the version wakes."""
    app = await scene.start(picker="none",
                            api_keys_path=keys_dir(scene.tmp_path, current="k1"))
    table = json.loads(table_json({"v1": 100}, min_replicas=0, context=100,
                                  long_context=True, wake_timeout=5.0))
    scene.publish_table(json.dumps(table))
    scene.publish_pods()
    main_waker, long_waker = app._wakers["main", "v1"], app._wakers["long-context", "v1"]
    for headers in BAD_KEYS:
        for extra, content in (({}, "x"), ({}, "x" * 401), ({"x-glm-version": "v1"}, "x")):
            assert_gateways_401(*await chat(scene, headers={**headers, **extra},
                                            content=content))
    assert main_waker._task is None and long_waker._task is None and app.waiting == 0
    assert counter(app, "glm_router_refusals_total", code="401",
                   reason="invalid_api_key") == 3 * len(BAD_KEYS)
    held = asyncio.create_task(chat(scene, headers={"authorization": "Bearer k1"}))
    async with asyncio.timeout(5):
        while app.waiting < 1:
            await asyncio.sleep(0.01)
    assert main_waker._task is not None and long_waker._task is None
    held.cancel()


async def test_a_keyed_routers_refusal_renews_no_lease_asks_no_picker_relays_nothing(
        scene: Scene) -> None:
    """With ready pods: a request without a valid key reaches neither the picker nor a pod
    and keeps no version awake; the same request with the key does all three."""
    app = await scene.start(api_keys_path=keys_dir(scene.tmp_path, current="k1"))
    a, b = await scene.add_pod("a", ""), await scene.add_pod("b", "")
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a", "b")  # two: the picker is asked
    marks = Marks()
    app._activity["v1"] = marks  # type: ignore[assignment]
    for headers in BAD_KEYS:
        assert_gateways_401(*await chat(scene, headers=headers))
    assert scene.picker.subsets == [] and not a.seen and not b.seen and marks.begun == 0
    status, _, body = await chat(scene, headers={"authorization": "Bearer k1"})
    assert status == 200 and json.loads(body)["pod"] in ("a", "b")
    assert len(scene.picker.subsets) == 1 and len(a.seen + b.seen) == 1 and marks.begun == 1
    assert (a.seen + b.seen)[0].headers["authorization"] == "Bearer k1"  # checked again there


async def test_a_keyed_router_refuses_from_the_head_before_reading_the_body(
        scene: Scene) -> None:
    """The 401 comes from the request's head: a body announced and never sent is not waited
    for (nor buffered), as the gateway refuses it."""
    await scene.start(api_keys_path=keys_dir(scene.tmp_path, current="k1"))
    await scene.add_pod("a", "")
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    reader, writer = await asyncio.open_connection("127.0.0.1", scene.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
                 b"Authorization: Bearer wrong\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000000\r\n\r\n{")
    await writer.drain()
    # A hang guard, not a speed bound: a check after the body would wait for bytes that never
    # come (then 408 after the 30 s body timeout), never answer 401.
    async with asyncio.timeout(10):
        status_line = await reader.readline()
    assert status_line.startswith(b"HTTP/1.1 401"), status_line
    writer.close()
    assert not scene.pods["a"].seen


async def test_a_rotated_key_is_accepted_without_a_restart(scene: Scene) -> None:
    """The router reloads the keys Secret as the gateways do: a second key added to the
    directory is accepted within seconds, both are valid during the rotation, and the old
    one stops working once removed."""
    folder = keys_dir(scene.tmp_path, current="k1")
    await scene.start(picker="none", api_keys_path=folder)
    await scene.add_pod("a", "")
    scene.publish_table(table_json({"v1": 100}))
    scene.publish_pods("a")
    old, new = {"authorization": "Bearer k1"}, {"authorization": "Bearer k2"}
    assert (await chat(scene, headers=new))[0] == 401
    keys_dir(scene.tmp_path, next="k2")
    async with asyncio.timeout(5):
        while (await chat(scene, headers=new))[0] != 200:
            await asyncio.sleep(0.1)
    assert (await chat(scene, headers=old))[0] == 200
    (folder / "current").unlink()
    async with asyncio.timeout(5):
        while (await chat(scene, headers=old))[0] != 401:
            await asyncio.sleep(0.1)
    assert (await chat(scene, headers=new))[0] == 200


async def test_an_open_routers_keyless_request_wakes_the_pool_and_keeps_it_awake(
        scene: Scene) -> None:
    """`access: Open` (the router has no keys): anyone may use the service, so a request
    without any Authorization header is held while the version wakes, and, served, counts
    as the version's activity."""
    app = await scene.start(picker="none")
    scene.publish_table(table_json({"v1": 100}, min_replicas=0, wake_timeout=5.0))
    scene.publish_pods()
    waker = app._wakers["main", "v1"]
    marks = Marks()
    app._activity["v1"] = marks  # type: ignore[assignment]
    held = asyncio.create_task(chat(scene))
    async with asyncio.timeout(5):
        while app.waiting < 1:
            await asyncio.sleep(0.01)
    assert waker._task is not None
    await scene.add_pod("a", "")
    scene.publish_pods("a")
    status, _, body = await held
    assert status == 200 and json.loads(body)["pod"] == "a"
    assert marks.begun == 1
    assert "authorization" not in scene.pods["a"].seen[0].headers
