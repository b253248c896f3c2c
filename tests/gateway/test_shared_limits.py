"""The pure parts of the shared rate limits: key names, replies, the store's health, and what
KeyLimits does when the store answers, fails or hangs (a scripted store; the real Redis is
in e2e/test_gateway_shared_limits.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import dataclass, field

import pytest
from glm_operator.gateway import config as gateway_config
from glm_operator.gateway.config import RateLimitStoreConfig, split_address
from glm_operator.gateway.metrics import RATE_LIMIT_STORE_ERRORS_TOTAL, RATE_LIMIT_STORE_UP
from glm_operator.gateway.openai.errors import GatewayError
from glm_operator.gateway.policy.limits import KeyLimits, error_reason
from glm_operator.gateway.policy.metrics import GatewayMetrics
from glm_operator.gateway.policy.ratelimit_store import (
    ADMITTED,
    Limits,
    StoreHealth,
    Verdict,
    bucket_keys,
    parse_admit_reply,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


def test_bucket_keys_name_the_service_and_key_id_in_one_hash_slot() -> None:
    tokens, requests = bucket_keys("team-a", "chat", "0123456789ab")
    assert tokens == "glm-ratelimit:{team-a/chat/0123456789ab}:tokens"
    assert requests == "glm-ratelimit:{team-a/chat/0123456789ab}:requests"
    # Another namespace or service never shares a bucket.
    assert bucket_keys("team-b", "chat", "0123456789ab")[1] != requests
    assert bucket_keys("team-a", "code", "0123456789ab")[1] != requests


def test_admit_replies() -> None:
    assert parse_admit_reply([0, 0, b""]) == ADMITTED
    assert parse_admit_reply([1, 7, b"-12.5"]) == Verdict("tokens", 7, -12.5)
    assert parse_admit_reply([2, 3, b""]) == Verdict("requests", 3)
    with pytest.raises(ValueError, match="unexpected reply"):
        parse_admit_reply([9, 0, b""])


@pytest.mark.parametrize(("address", "expected"), [
    ("redis.cache.svc:6379", ("redis.cache.svc", 6379)),
    ("10.0.0.7:7000", ("10.0.0.7", 7000)),
    ("[fd00::7]:6379", ("fd00::7", 6379)),
])
def test_split_address(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["redis", "redis:", ":6379", "redis:0", "redis:65536",
                                     "redis:port"])
def test_split_address_refuses(address: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        split_address(address)


def test_store_health_changes_state_once_and_waits_before_asking_again() -> None:
    now = [100.0]
    health = StoreHealth(retry_seconds=1.0, clock=lambda: now[0])
    assert health.should_try() and health.available
    assert health.succeeded() is False  # no change
    assert health.failed() is True  # up -> down: log it
    assert health.should_try() is False
    now[0] += 0.5
    assert health.should_try() is False
    now[0] += 0.6
    assert health.should_try() is True  # one second later: ask again
    assert health.failed() is False  # still down: nothing new to log
    assert health.should_try() is False
    now[0] += 1.0
    assert health.succeeded() is True  # down -> up: log it
    assert health.should_try()


def test_error_reasons() -> None:
    assert error_reason(TimeoutError()) == "timeout"
    assert error_reason(RedisConnectionError("refused")) == "connection"
    assert error_reason(ConnectionRefusedError()) == "connection"
    assert error_reason(ResponseError("NOAUTH")) == "error"


@dataclass
class ScriptedStore:
    """Answers like RedisBuckets: a verdict, or raises what `fail_with` holds."""

    verdict: Verdict = ADMITTED
    fail_with: BaseException | None = None
    admits: list[str] = field(default_factory=list)
    charges: list[tuple[str, int]] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)

    async def admit(self, key_id: str) -> Verdict:
        if self.fail_with is not None:
            raise self.fail_with
        self.admits.append(key_id)
        return self.verdict

    async def charge(self, key_id: str, tokens: int) -> float:
        if self.fail_with is not None:
            raise self.fail_with
        self.charges.append((key_id, tokens))
        return 0.0

    async def release_request(self, key_id: str) -> float:
        if self.fail_with is not None:
            raise self.fail_with
        self.releases.append(key_id)
        return 1.0

    async def load_scripts(self, _timeout: float) -> None:
        if self.fail_with is not None:
            raise self.fail_with

    async def close(self) -> None:
        pass


def limits_with(store: ScriptedStore, on_unavailable: gateway_config.OnUnavailable,
                limits: Limits, clock: list[float]) -> tuple[KeyLimits, GatewayMetrics]:
    metrics = GatewayMetrics.create("chat", "v1", "main")
    config = RateLimitStoreConfig(address="redis:6379", namespace="ns",
                                  on_unavailable=on_unavailable)
    key_limits = KeyLimits(limits, store, config, metrics,  # type: ignore[arg-type]
                           StoreHealth(retry_seconds=1.0, clock=lambda: clock[0]))
    return key_limits, metrics


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(
        name, {"service": "chat", "model_version": "v1", "pool": "main", **labels})


async def test_the_store_decides_while_it_answers() -> None:
    store = ScriptedStore(verdict=Verdict("requests", 4))
    key_limits, metrics = limits_with(store, "allow", Limits(1.0, 2.0, 600), [0.0])
    with pytest.raises(GatewayError) as refused:
        await key_limits.admit("k1")
    assert (refused.value.status, refused.value.retry_after, refused.value.type) == (
        429, 4, "requests")
    store.verdict = Verdict("tokens", 9, -80.0)
    with pytest.raises(GatewayError) as no_tokens:
        await key_limits.admit("k1")
    assert no_tokens.value.type == "tokens" and "80 tokens over" in no_tokens.value.message
    await key_limits.charge("k1", 25)
    await key_limits.charge("k1", 0)  # nothing used, nothing sent
    assert store.admits == ["k1", "k1"] and store.charges == [("k1", 25)]
    # The local buckets (the fallback) were not touched.
    assert key_limits.limiter is not None and key_limits.admit_locally("k1") == ADMITTED
    assert sample(metrics, RATE_LIMIT_STORE_UP) == 1


async def test_allow_counts_in_the_pods_buckets_while_the_store_is_down(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    store = ScriptedStore(fail_with=RedisConnectionError("Connection refused"))
    key_limits, metrics = limits_with(store, "allow", Limits(0.01, 2.0, 0), clock)
    with caplog.at_level(logging.WARNING, logger="glm_operator.gateway.policy.limits"):
        await key_limits.admit("k1")
        await key_limits.admit("k1")
        with pytest.raises(GatewayError) as refused:  # the pod's own burst of 2 is spent
            await key_limits.admit("k1")
    assert refused.value.status == 429
    assert sample(metrics, RATE_LIMIT_STORE_ERRORS_TOTAL, reason="connection") == 1
    assert sample(metrics, RATE_LIMIT_STORE_UP) == 0
    assert len(caplog.records) == 1  # one warning for the outage, not one per request
    assert "onUnavailable: Allow" in caplog.records[0].getMessage()

    clock[0] += 1.5  # the store is asked again, and answers
    store.fail_with = None
    with caplog.at_level(logging.WARNING, logger="glm_operator.gateway.policy.limits"):
        await key_limits.admit("k1")
    assert store.admits == ["k1"] and sample(metrics, RATE_LIMIT_STORE_UP) == 1
    assert "answers again" in caplog.records[-1].getMessage()


async def test_only_a_shared_admission_is_handed_over() -> None:
    """admit() says whether the store counted the request: only then does an overflow give
    the request token back (the long-context pool's gateway counts it in the same store)."""
    clock = [0.0]
    store = ScriptedStore()
    key_limits, _ = limits_with(store, "allow", Limits(1.0, 2.0, 0), clock)
    assert await key_limits.admit("k1") is True
    await key_limits.hand_over("k1")
    assert store.releases == ["k1"]
    store.fail_with = TimeoutError()
    assert await key_limits.admit("k1") is False  # counted in the pod's own bucket
    await KeyLimits(Limits(1.0, 2.0, 0)).hand_over("k1")  # no store: nothing to give back


async def test_a_store_down_at_start_is_logged_once_and_retried_later(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    store = ScriptedStore(fail_with=RedisConnectionError("Name or service not known"))
    key_limits, metrics = limits_with(store, "allow", Limits(1.0, 2.0, 0), clock)
    with caplog.at_level(logging.WARNING, logger="glm_operator.gateway.policy.limits"):
        await key_limits.start()
        await key_limits.admit("k1")  # within the second: straight to the pod's buckets
    assert len(caplog.records) == 1 and "Name or service not known" in caplog.text
    assert sample(metrics, RATE_LIMIT_STORE_ERRORS_TOTAL, reason="connection") == 1
    assert not key_limits.health.available


async def test_allow_keeps_the_debt_in_the_pods_budget() -> None:
    store = ScriptedStore(fail_with=TimeoutError())
    key_limits, metrics = limits_with(store, "allow", Limits(0.0, 0.0, 60), [0.0])
    await key_limits.charge("k1", 100)  # the store did not answer: this pod holds the debt
    assert key_limits.budget is not None and key_limits.budget.balance("k1") < 0
    with pytest.raises(GatewayError) as refused:
        await key_limits.admit("k1")
    assert refused.value.type == "tokens"
    assert sample(metrics, RATE_LIMIT_STORE_ERRORS_TOTAL, reason="timeout") == 1


async def test_deny_answers_503_without_asking_again_within_a_second() -> None:
    clock = [0.0]
    store = ScriptedStore(fail_with=TimeoutError())
    key_limits, metrics = limits_with(store, "deny", Limits(1.0, 2.0, 60), clock)
    assert key_limits.limiter is None and key_limits.budget is None  # no fallback buckets
    for _ in range(3):
        with pytest.raises(GatewayError) as refused:
            await key_limits.admit("k1")
        assert (refused.value.status, refused.value.code, refused.value.retry_after) == (
            503, "rate_limit_store_unavailable", 1)
        assert "redis:6379" in refused.value.message
    assert sample(metrics, RATE_LIMIT_STORE_ERRORS_TOTAL, reason="timeout") == 1  # asked once
    clock[0] += 1.0
    store.fail_with = None
    await key_limits.admit("k1")
    assert store.admits == ["k1"]


async def test_a_hanging_store_is_cut_off_by_the_timeout() -> None:
    """RedisBuckets wraps each call in asyncio.timeout: a store that never answers is a
    TimeoutError after `timeout_seconds`, which KeyLimits treats as unavailable."""
    from glm_operator.gateway.policy.ratelimit_store import RedisBuckets

    class Hanging:
        def register_script(self, _script: str) -> object:
            async def call(**_kw: object) -> None:
                await asyncio.sleep(3600)
            return call

    buckets = RedisBuckets(Hanging(), Limits(1.0, 1.0, 0), "ns", "chat",  # type: ignore[arg-type]
                           timeout_seconds=0.01)
    with pytest.raises(TimeoutError):
        await buckets.admit("k1")


def test_the_password_comes_from_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gateway_config.REDIS_PASSWORD_ENV, "s3cret")
    parser = argparse.ArgumentParser()
    gateway_config.add_arguments(parser)
    assert not any("password" in a for action in parser._actions for a in action.option_strings)
    args = parser.parse_args(["--service-name", "chat", "--namespace", "ns",
                              "--rate-limit-redis", "redis:6379", "--rate-limit-rps", "1"])
    config = gateway_config.from_args(args)
    assert config.rate_limit_store is not None
    assert config.rate_limit_store.password == "s3cret"
    assert config.rate_limit_store.on_unavailable == "allow"
    assert "s3cret" not in repr(config)
    with pytest.raises(ValueError, match="host:port"):
        gateway_config.from_args(parser.parse_args(
            ["--service-name", "chat", "--rate-limit-redis", "redis"]))
