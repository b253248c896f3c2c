"""Keys, rate limits, token counting and overflow detection: the gateway's pure parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from glm_operator.gateway import config as gateway_config
from glm_operator.gateway.call import Call
from glm_operator.gateway.openai.usage import context_overflow, token_counts
from glm_operator.gateway.policy.accounting import tokens_to_charge
from glm_operator.gateway.policy.audit import CLIENT_CLOSED, AuditLog, AuditRecord
from glm_operator.gateway.policy.keys import ApiKeyStore, key_id
from glm_operator.gateway.policy.ratelimit import IDLE_EVICT_SECONDS, RateLimiter, TokenBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def secret_dir(root: Path, keys: dict[str, str]) -> Path:
    """Lay keys out the way kubelet mounts a Secret: ..data symlink to a timestamped dir."""
    stamp = root / f"..{len(list(root.glob('..*_2025')))}_2025"
    stamp.mkdir()
    for name, value in keys.items():
        (stamp / name).write_text(value)
    tmp = root / "..data_tmp"
    tmp.symlink_to(stamp.name)
    tmp.replace(root / "..data")
    for name in keys:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    for link in root.iterdir():
        if link.is_symlink() and not link.name.startswith(".") and link.name not in keys:
            link.unlink()
    return root


def test_secret_rotation_without_restart(tmp_path: Path) -> None:
    clock = Clock()
    secret_dir(tmp_path, {"current": "key-one\n"})
    store = ApiKeyStore(tmp_path, clock)
    assert store.check("key-one") == key_id("key-one")
    assert store.check("key-two") is None
    secret_dir(tmp_path, {"current": "key-one", "next": "key-two"})  # both valid at once
    assert store.check("key-two") is None  # not before the 1 s check interval
    clock.now += 1.5
    assert store.check("key-two") == key_id("key-two")
    assert store.check("key-one") == key_id("key-one")
    secret_dir(tmp_path, {"current": "key-two"})  # the old key is retired
    clock.now += 1.5
    assert store.check("key-one") is None
    assert store.check("key-two") is not None
    assert store.count == 1


def test_keys_file_and_plain_dir(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# comment\nalpha\n\n  beta  \n")
    store = ApiKeyStore(keys, Clock())
    assert store.check("alpha") and store.check("beta")
    assert not store.check("# comment")
    plain = tmp_path / "dir"
    plain.mkdir()
    (plain / "k1").write_text("gamma")
    (plain / ".hidden").write_text("delta")
    clock = Clock()
    store = ApiKeyStore(plain, clock)
    assert store.check("gamma") and not store.check("delta")
    (plain / "k1").write_text("epsilon-longer")  # rewritten in place: size and mtime change
    clock.now += 2
    assert store.check("epsilon-longer") and not store.check("gamma")


def test_missing_key_path_refuses_everything(tmp_path: Path) -> None:
    store = ApiKeyStore(tmp_path / "absent", Clock())
    assert store.count == 0
    assert store.check("") is None
    assert store.check("anything") is None


def test_key_id_is_a_sha256_prefix() -> None:
    assert key_id("secret") == "2bb80d537b1d"
    assert "secret" not in key_id("secret")


def test_token_bucket() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=2.0, burst=3, clock=clock)
    assert [limiter.acquire("a") for _ in range(3)] == [0, 0, 0]
    assert limiter.acquire("a") == 1  # empty: one token comes in 0.5 s, rounded up to 1 s
    assert limiter.acquire("b") == 0  # buckets are per key
    clock.now += 0.5
    assert limiter.acquire("a") == 0
    assert limiter.acquire("a") >= 1
    clock.now += 10
    assert [limiter.acquire("a") for _ in range(4)] == [0, 0, 0, 1]  # refills only to burst


def test_slow_rate_retry_after() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=0.1, clock=clock)
    assert limiter.acquire("k") == 0
    assert limiter.acquire("k") == 10


def test_token_budget_admits_on_a_positive_balance_and_charges_usage() -> None:
    clock = Clock()
    budget = TokenBudget(tokens_per_minute=600, clock=clock)  # 10 tokens/s, 600 at most
    assert budget.admit("a") == 0
    budget.charge("a", 550)
    assert budget.admit("a") == 0  # 50 left: still positive
    budget.charge("a", 250)  # the answer was bigger than what was left: 200 in deficit
    assert budget.balance("a") == -200
    assert budget.admit("a") == 21  # (1 - -200) tokens at 10/s, rounded up
    assert budget.admit("b") == 0  # per key
    clock.now += 20
    assert budget.admit("a") == 1  # balance 0: not positive yet
    clock.now += 0.2  # balance 2: positive
    assert budget.admit("a") == 0
    clock.now += 3600
    assert budget.balance("a") == 600  # refills to one minute's worth, no more
    with pytest.raises(ValueError, match="positive"):
        TokenBudget(0)


def test_token_budget_never_forgets_a_deficit() -> None:
    clock = Clock()
    budget = TokenBudget(tokens_per_minute=60, clock=clock)  # 1 token/s
    budget.charge("deep", 5000)  # ~83 minutes of debt
    budget.charge("small", 10)
    clock.now += IDLE_EVICT_SECONDS + 1
    budget.charge("other", 1)  # triggers the sweep
    assert budget.balance("small") == 60
    assert budget.balance("deep") == 60 - 5000 + IDLE_EVICT_SECONDS + 1
    assert budget.admit("deep") > 3000


def test_tokens_charged_per_request() -> None:
    def record(**kw: object) -> Call:
        # what the pipeline keeps beside the audit record: the charge's estimate
        estimate = {k: kw.pop(k) for k in ("request_bytes", "max_tokens", "streamed_events")
                    if k in kw}
        return Call(AuditRecord(request_id="r", endpoint="chat", **kw),  # type: ignore[arg-type]
                    0.0, **estimate)  # type: ignore[arg-type]

    assert tokens_to_charge(record(status=200, prompt_tokens=12, completion_tokens=5,
                                   request_bytes=400)) == 17
    # The client went away: an estimate, never zero once the engine had the request.
    assert tokens_to_charge(record(status=CLIENT_CLOSED, stream=True, request_bytes=400,
                                   streamed_events=7)) == 100 + 7
    assert tokens_to_charge(record(status=CLIENT_CLOSED, request_bytes=400,
                                   max_tokens=4000)) == 100 + 4000
    assert tokens_to_charge(record(status=200, stream=True, request_bytes=40,
                                   streamed_events=3)) == 13  # vLLM streams carry no usage
    # Refused before or by the engine: free.
    assert tokens_to_charge(record(status=429)) == 0
    assert tokens_to_charge(record(status=400, request_bytes=400)) == 0
    assert tokens_to_charge(record(status=CLIENT_CLOSED)) == 0  # left before sending a body


def test_token_counts_from_usage_and_timings() -> None:
    body = json.dumps({"choices": [{"message": {"content": '"usage":{"prompt_tokens":999}'}}],
                       "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                                 "prompt_tokens_details": {"cached_tokens": 0}}}).encode()
    assert token_counts(body) == (12, 5)
    stream_tail = (
        b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
        b'data: {"choices":[{"finish_reason":"length","delta":{}}],"timings":{"cache_n":3,'
        b'"prompt_n":9,"prompt_ms":1.0,"predicted_n":128,"predicted_ms":50.0}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert token_counts(stream_tail) == (12, 128)
    assert token_counts(b'data: {"choices":[]}\n\n') == (None, None)
    assert token_counts(b'"usage":{broken') == (None, None)


def test_context_overflow_detection() -> None:
    llama = json.dumps({"error": {"code": 400, "type": "exceed_context_size_error",
                                  "message": "request exceeds the available context size",
                                  "n_prompt_tokens": 700, "n_ctx": 512}}).encode()
    assert context_overflow(400, llama) == (700, 512)
    vllm = json.dumps({"object": "error", "message": (
        "This model's maximum context length is 4096 tokens. However, you requested 5000 "
        "tokens (4900 in the messages, 100 in the completion)."), "code": 400}).encode()
    assert context_overflow(400, vllm) == (5000, 4096)
    assert context_overflow(400, b'{"error":{"message":"bad temperature"}}') is None
    assert context_overflow(500, llama) is None


def test_audit_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path), {"service": "s", "model_version": "v1", "pool": "main"}, False)
    audit.write(AuditRecord(request_id="r1", endpoint="chat", key_id="abc", status=200,
                            prompt_tokens=3, completion_tokens=4, duration_ms=1.23456,
                            prompt=[{"role": "user", "content": "secret prompt"}]))
    audit.close()
    line = json.loads(path.read_text())
    assert line["request_id"] == "r1" and line["model_version"] == "v1" and line["pool"] == "main"
    assert line["prompt_tokens"] == 3 and line["completion_tokens"] == 4
    assert "prompt" not in line and "secret prompt" not in path.read_text()


def test_config_from_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    monkeypatch.setenv("GLM_GATEWAY_SERVICE_NAME", "glm")
    monkeypatch.setenv("GLM_GATEWAY_STOP", "<|user|>\n<|observation|>")
    monkeypatch.setenv("GLM_GATEWAY_RATE_LIMIT_RPS", "5")
    monkeypatch.setenv("GLM_GATEWAY_RATE_LIMIT_TOKENS_PER_MINUTE", "90000")
    parser = argparse.ArgumentParser()
    gateway_config.add_arguments(parser)
    config = gateway_config.from_args(parser.parse_args([
        "--pool", "main", "--long-context-url", "http://lc:8080/",
        "--long-context-deployment", "glm-v1-long", "--namespace", "ns",
        "--kube-api-server", "https://api:6443/",
    ]))
    assert config.service_name == "glm"
    assert config.stop_sequences == ("<|user|>", "<|observation|>")
    assert config.rate_limit_rps == 5
    assert config.rate_limit_tokens_per_minute == 90000
    assert config.long_context_url == "http://lc:8080"
    assert config.wake is not None and config.wake.deployment == "glm-v1-long"
    assert config.wake.api_server == "https://api:6443"
    with pytest.raises(ValueError, match="long-context"):
        gateway_config.from_args(parser.parse_args(
            ["--pool", "long-context", "--long-context-url", "http://x"]))


def test_engine_socket_names(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    monkeypatch.setenv("GLM_GATEWAY_SERVICE_NAME", "glm")
    monkeypatch.setenv("GLM_GATEWAY_ENGINE_SOCKET", "@glm-engine.sock")
    parser = argparse.ArgumentParser()
    gateway_config.add_arguments(parser)
    assert gateway_config.from_args(parser.parse_args([])).engine_socket == "@glm-engine.sock"
    assert gateway_config.from_args(parser.parse_args(
        ["--engine-socket", "/run/engine.sock"])).engine_socket == "/run/engine.sock"
    for bad, says in (("engine.sock", "absolute path or @name"), ("@", "absolute path"),
                      ("/" + "x" * 107, "longer than 107 bytes")):
        with pytest.raises(ValueError, match=says):
            gateway_config.from_args(parser.parse_args(["--engine-socket", bad]))
    for url in ("https://engine:8443", "http://engine:8081/v1"):
        with pytest.raises(ValueError, match="needs an http:// --engine-url without a path"):
            gateway_config.from_args(parser.parse_args(["--engine-url", url]))


def test_event_loop_choice() -> None:
    import asyncio

    import uvloop
    from glm_operator.gateway.cli import new_event_loop

    for choice, kind in (("auto", uvloop.Loop), ("uvloop", uvloop.Loop),
                         ("asyncio", asyncio.BaseEventLoop)):
        loop = new_event_loop(choice)
        try:
            assert isinstance(loop, kind), choice
            assert choice == "asyncio" or not isinstance(loop, asyncio.BaseEventLoop)
        finally:
            loop.close()


def test_the_gateway_never_imports_the_kubernetes_client() -> None:
    """The sidecar's memory budget (60 MiB) has no room for the official client: its one API
    call (kube.scale) is plain HTTPS. A fresh interpreter shows what importing it pulls in."""
    import subprocess
    import sys

    probe = ("import sys, glm_operator.gateway.cli, glm_operator.gateway.app;"
             "print(sorted(m for m in ('kubernetes', 'kopf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
