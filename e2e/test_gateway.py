"""The gateway in front of the real llama-server, driven by the official `openai` SDK.

llama-server is the pinned build from e2e.toolchain (built on first use, never skipped);
the model is a tiny random-weight llama GGUF written by e2e.models. The gateway runs as its
own process (`python -m glm_operator.cli gateway ...`), exactly as in the sidecar.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from e2e.gateway_process import GatewayProcess
from e2e.llama import LlamaServer, http_json, llama_server_binary
from e2e.models import TinyLlamaSpec, prompt_of_tokens, write_tiny_llama

pytestmark = pytest.mark.llama

SERVICE = "glm-test"
KEY = "sk-test-key-1"


@pytest.fixture(scope="module")
def llama_binary() -> Path:
    return llama_server_binary()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf",
                            TinyLlamaSpec(n_ctx_train=65536))


def start_engine(binary: Path, model: Path, log_dir: Path, ctx: int, slots: int) -> LlamaServer:
    return LlamaServer.start(
        [str(binary), "-m", str(model), "-c", str(ctx), "-np", str(slots), "--metrics",
         "-t", "1"],
        log_dir,
    )


@pytest.fixture(scope="module")
def engine(llama_binary: Path, tiny_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    # 2 slots of 4096 tokens each
    with start_engine(llama_binary, tiny_model, tmp_path_factory.mktemp("engine"),
                      8192, 2) as server:
        yield server


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "current").write_text(KEY + "\n")
    return keys


@pytest.fixture
def gateway(engine: LlamaServer, keys_dir: Path, tmp_path: Path) -> Iterator[GatewayProcess]:
    with GatewayProcess.start(
        engine.url, tmp_path / "gw",
        # No KV-cache readings: a /slots call delays llama-server's notice of a client gone
        # from a non-streaming request (see that test). test_gateway_kv_cache.py has its own.
        ["--api-keys", str(keys_dir), "--model-version", "v1",
         "--audit", str(tmp_path / "audit.jsonl"), "--kv-cache-poll-seconds", "0"],
        service_name=SERVICE,
    ) as gw:
        yield gw


def client_for(gateway: GatewayProcess, key: str = KEY, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0,
                         timeout=timeout)


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one series in a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        if series == name and not labels:
            return float(value)
        if series.startswith(name + "{") and all(f'{k}="{v}"' in series
                                                 for k, v in labels.items()):
            return float(value)
    return 0.0


def wait_metric(gateway: GatewayProcess, name: str, expected: float, timeout: float = 5,
                **labels: str) -> None:
    """Wait until a series reaches `expected`: a streamed request is counted just after the
    client has read its last byte."""
    deadline = time.monotonic() + timeout
    while (value := metric_value(gateway.metrics_text(), name, **labels)) != expected:
        assert time.monotonic() < deadline, f"{name}{labels} is {value}, expected {expected}"
        time.sleep(0.05)


def messages(text: str = "Hello there") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_chat_through_the_sdk(gateway: GatewayProcess, tmp_path: Path) -> None:
    client = client_for(gateway)
    raw = client.chat.completions.with_raw_response.create(
        model=SERVICE, messages=messages(), max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True},
    )
    reply = raw.parse()
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    metrics = gateway.metrics_text()
    base = {"service": SERVICE, "model_version": "v1", "pool": "main"}
    assert metric_value(metrics, "glm_gateway_requests_total", code="200", endpoint="chat",
                        **base) == 1
    assert metric_value(metrics, "glm_gateway_completion_tokens_total", **base) == 12
    assert metric_value(metrics, "glm_gateway_prompt_tokens_total", **base) == \
        reply.usage.prompt_tokens
    assert metric_value(metrics, "glm_gateway_request_duration_seconds_count",
                        endpoint="chat", stream="false", **base) == 1
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert len(audit) == 1
    line = audit[0]
    assert line["request_id"] == raw.headers["x-request-id"]
    assert line["key_id"] == hashlib.sha256(KEY.encode()).hexdigest()[:12]
    assert (line["status"], line["model_version"], line["pool"]) == (200, "v1", "main")
    assert (line["prompt_tokens"], line["completion_tokens"]) == (reply.usage.prompt_tokens, 12)
    assert "prompt" not in line and "Hello there" not in json.dumps(audit)


def test_streaming_passes_sse_through(gateway: GatewayProcess) -> None:
    client = client_for(gateway)
    chunks = list(client.chat.completions.create(
        model=SERVICE, messages=messages(), max_tokens=16, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    ))
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    # The raw bytes: standard `data: ` framing, ending in [DONE], several network chunks.
    request = urllib.request.Request(
        gateway.url + "/v1/chat/completions",
        data=json.dumps({"model": SERVICE, "messages": messages(), "max_tokens": 16,
                         "stream": True, "ignore_eos": True}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        body = response.read()
    events = [e for e in body.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events)
    assert events[-1] == b"data: [DONE]"
    base = {"service": SERVICE, "model_version": "v1", "pool": "main"}
    wait_metric(gateway, "glm_gateway_completion_tokens_total", 32, **base)
    metrics = gateway.metrics_text()
    assert metric_value(metrics, "glm_gateway_time_to_first_token_seconds_count",
                        endpoint="chat", **base) == 2


def test_models_and_completions(gateway: GatewayProcess, engine: LlamaServer) -> None:
    client = client_for(gateway)
    models = client.models.list().data
    assert [m.id for m in models] == [SERVICE]
    served = models[0].model_extra or {}
    assert served["context_length"] == 4096  # 8192 over 2 slots, read from llama-server
    assert served["model_version"] == "v1"
    completion = client.completions.create(model=SERVICE, prompt="Once upon", max_tokens=5,
                                           extra_body={"ignore_eos": True})
    assert completion.usage is not None and completion.usage.completion_tokens == 5


def test_errors_map_to_openai_exceptions(gateway: GatewayProcess) -> None:
    client = client_for(gateway)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=SERVICE, messages=messages(), temperature=5)
    assert bad.value.body is not None
    assert bad.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=SERVICE,
                                       messages=[{"role": "wizard", "content": "x"}])  # type: ignore[misc,list-item]
    assert bad.value.body["param"] == "messages[0].role"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        client_for(gateway, key="sk-wrong").chat.completions.create(model=SERVICE,
                                                                     messages=messages())
    # Longer than the 4096-token slot and no long-context pool: a clear 400 with numbers.
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=SERVICE, messages=messages(prompt_of_tokens(5000)),
                                       max_tokens=4)
    error = too_long.value.body
    assert error["code"] == "context_length_exceeded"  # type: ignore[index]
    assert "4096" in error["message"] and "too long" in error["message"]  # type: ignore[index]
    response = httpx.post(gateway.url + "/v1/chat/completions", content=b"{not json",
                          headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_key_rotation_without_restart(gateway: GatewayProcess, keys_dir: Path) -> None:
    pid = gateway.process.pid
    old, new = client_for(gateway), client_for(gateway, key="sk-next-key")
    old.models.list()
    with pytest.raises(openai.AuthenticationError):
        new.models.list()
    (keys_dir / "next").write_text("sk-next-key")  # both keys valid during the rotation
    deadline = time.monotonic() + 5
    while True:
        try:
            new.models.list()
            break
        except openai.AuthenticationError:
            assert time.monotonic() < deadline, "the new key was not picked up"
            time.sleep(0.2)
    old.models.list()
    (keys_dir / "current").unlink()  # the old key is retired
    deadline = time.monotonic() + 5
    while True:
        try:
            old.models.list()
        except openai.AuthenticationError:
            break
        assert time.monotonic() < deadline, "the retired key still works"
        time.sleep(0.2)
    new.models.list()
    assert gateway.process.pid == pid and gateway.process.poll() is None


def test_rate_limit_per_key(engine: LlamaServer, keys_dir: Path, tmp_path: Path) -> None:
    (keys_dir / "other").write_text("sk-other")
    with GatewayProcess.start(engine.url, tmp_path, ["--api-keys", str(keys_dir),
                                                     "--rate-limit-rps", "0.2",
                                                     "--rate-limit-burst", "2"]) as gw:
        client = client_for(gw)
        for _ in range(2):  # the burst
            client.chat.completions.create(model=SERVICE, messages=messages(), max_tokens=1)
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model=SERVICE, messages=messages(), max_tokens=1)
        assert int(limited.value.response.headers["retry-after"]) >= 1
        # another key has its own bucket
        client_for(gw, "sk-other").chat.completions.create(model=SERVICE, messages=messages(),
                                                           max_tokens=1)


def test_token_rate_limit_per_key(engine: LlamaServer, keys_dir: Path, tmp_path: Path) -> None:
    """--rate-limit-tokens-per-minute charges each key what llama-server reports it used
    (usage, or the stream's timings) and refuses the key while it is in deficit, with a
    Retry-After that pays the deficit back; the refused request never reaches the engine."""
    body = {"model": SERVICE, "messages": messages(), "max_tokens": 16, "ignore_eos": True,
            "temperature": 0}
    status, direct = http_json(engine.url + "/v1/chat/completions", body)
    assert status == 200, direct
    cost = direct["usage"]["prompt_tokens"] + direct["usage"]["completion_tokens"]
    assert direct["usage"]["completion_tokens"] == 16
    per_minute = cost + cost // 2  # room for one request and a half
    (keys_dir / "other").write_text("sk-other")
    with GatewayProcess.start(engine.url, tmp_path, [
            "--api-keys", str(keys_dir), "--rate-limit-tokens-per-minute", str(per_minute)],
            ) as gw:
        client = client_for(gw)
        started = time.monotonic()
        first = _ask_16_tokens(client)
        assert first.usage is not None
        assert first.usage.prompt_tokens + first.usage.completion_tokens == cost
        # Admitted on the half request left; streamed, so charged from llama.cpp's timings.
        with client.chat.completions.create(
                model=SERVICE, messages=messages(), max_tokens=16, temperature=0,
                extra_body={"ignore_eos": True}, stream=True) as stream:
            assert sum(1 for _ in stream) > 1
        predicted = _tokens_predicted(engine)
        with pytest.raises(openai.RateLimitError) as limited:
            _ask_16_tokens(client)
        elapsed = time.monotonic() - started
        assert _tokens_predicted(engine) == predicted  # never reached the engine
        assert limited.value.body["type"] == "tokens"  # type: ignore[index]
        # Balance: per_minute - 2 * cost (+ what refilled meanwhile) = about -cost/2.
        rate = per_minute / 60
        deficit = 2 * cost - per_minute
        retry_after = int(limited.value.response.headers["retry-after"])
        print(f"cost {cost} tokens/request, budget {per_minute}/min, Retry-After {retry_after}")
        assert (1 + deficit - elapsed * rate) / rate - 1 <= retry_after \
            <= (1 + deficit) / rate + 1, (retry_after, deficit, rate, elapsed)
        # Another key has its own budget.
        assert _ask_16_tokens(client_for(gw, "sk-other")).usage is not None


def _ask_16_tokens(client: openai.OpenAI) -> Any:
    return client.chat.completions.create(
        model=SERVICE, messages=messages(), max_tokens=16, temperature=0,
        extra_body={"ignore_eos": True})


def _tokens_predicted(engine: LlamaServer) -> float:
    return engine.metric("llamacpp:tokens_predicted_total") or 0.0


def _wait_idle(engine: LlamaServer, timeout: float = 10) -> float:
    started = time.monotonic()
    while engine.busy_slots():
        assert time.monotonic() - started < timeout, "llama-server kept the slot busy"
        time.sleep(0.05)
    return time.monotonic() - started


def test_client_disconnect_mid_stream_frees_the_slot(gateway: GatewayProcess,
                                                     engine: LlamaServer) -> None:
    """A streaming client that goes away stops generation: the slot is freed long before the
    4000 tokens it asked for are made (the gateway closes its engine connection)."""
    _wait_idle(engine)
    before = _tokens_predicted(engine)
    body = {"model": SERVICE, "messages": messages(), "max_tokens": 4000, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as response:
        assert response.status_code == 200
        # Hold the iterator: a dropped one is closed at once, and closing it mid-body closes
        # the connection, which is the disconnect this test makes only after the check.
        chunks = response.iter_bytes()
        for _ in range(5):
            next(chunks)
        assert engine.busy_slots() == 1
    _wait_idle(engine)
    generated = _tokens_predicted(engine) - before
    assert generated < 2000, f"the engine generated {generated} tokens for a gone client"
    wait_metric(gateway, "glm_gateway_requests_total", 1, code="499")
    assert metric_value(gateway.metrics_text(), "glm_gateway_requests_in_flight") == 0


def test_client_disconnect_non_streaming(gateway: GatewayProcess, engine: LlamaServer) -> None:
    """A non-streaming client that goes away is answered 499 in the metrics and the audit at
    once, and the gateway drops its engine connection. The pinned llama-server looks at a
    non-streaming request's connection only when its result queue has been quiet for a whole
    second (any other request's result restarts that wait), so on an otherwise idle engine
    the slot frees a second or two later, long before the 4000 tokens are made. Nothing here
    may call the engine during that wait: a /slots call is such a result."""
    _wait_idle(engine)
    before = _tokens_predicted(engine)
    body = {"model": SERVICE, "messages": messages(), "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gateway.url + "/v1/chat/completions", json=body,
                   headers={"Authorization": f"Bearer {KEY}"},
                   timeout=httpx.Timeout(30, read=0.5))
    left = time.monotonic()
    while metric_value(gateway.metrics_text(), "glm_gateway_requests_total", code="499") < 1:
        assert time.monotonic() - left < 3, "the gateway did not notice the client leaving"
        time.sleep(0.05)
    assert metric_value(gateway.metrics_text(), "glm_gateway_requests_in_flight") == 0
    time.sleep(max(0.0, NON_STREAMING_NOTICE_SECONDS - (time.monotonic() - left)))
    assert engine.busy_slots() == 0, "the engine still works for a client that left"
    generated = _tokens_predicted(engine) - before
    assert generated < 3000, f"the engine generated {generated} tokens for a gone client"


# llama-server's HTTP polling interval is 1 s; a wait starts at most 1 s after the close.
NON_STREAMING_NOTICE_SECONDS = 2.5


def test_engine_down_is_503_not_a_hang(tmp_path: Path) -> None:
    from e2e.ports import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    with GatewayProcess.start(dead, tmp_path, ["--connect-timeout", "1"],
                              wait_ready=False) as gw:
        assert http_json(gw.url + "/readyz")[0] == 503
        started = time.monotonic()
        with pytest.raises(openai.InternalServerError) as down:
            client_for(gw, timeout=10).chat.completions.create(model=SERVICE,
                                                                messages=messages())
        assert time.monotonic() - started < 3
        assert down.value.status_code == 503
        assert down.value.body["code"] == "engine_unavailable"  # type: ignore[index]
