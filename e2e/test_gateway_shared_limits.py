"""Rate limits shared by a service's gateways through a real Redis (Debian's redis-server).

Two real gateway processes, one per pool of the same GLMService (main and long-context),
in front of the real llama-server, share one Redis: a key's limit holds for the two
together. Redis killed: `allow` counts in each pod's own buckets, `deny` answers 503; Redis
hanging (SIGSTOP): the same after the store timeout; Redis back: shared again.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
import trustme
from glm_operator.gateway.call import Call
from glm_operator.gateway.config import REDIS_PASSWORD_ENV, RateLimitStoreConfig
from glm_operator.gateway.metrics import RATE_LIMIT_STORE_ERRORS_TOTAL, RATE_LIMIT_STORE_UP
from glm_operator.gateway.policy.accounting import tokens_to_reserve
from glm_operator.gateway.policy.audit import AuditRecord
from glm_operator.gateway.policy.keys import key_id
from glm_operator.gateway.policy.limits import KeyLimits
from glm_operator.gateway.policy.ratelimit_store import (
    ADMITTED,
    Limits,
    RedisBuckets,
    bucket_keys,
    redis_client,
)

from e2e.gateway_process import GatewayProcess
from e2e.kubectl import wait_for
from e2e.llama import LlamaServer, llama_server_binary
from e2e.models import TinyLlamaSpec, prompt_of_tokens, write_tiny_llama
from e2e.redis import RedisServer, TlsFiles, redis_server, start_or_skip
from e2e.test_gateway import metric_value

pytestmark = pytest.mark.llama
__all__ = ["redis_server"]  # the fixture

SERVICE = "glm-shared"
NAMESPACE = "team-a"
KEY = "sk-shared-key"
OTHER = "sk-other-key"
# A refill this slow adds nothing during a test: every admitted request came from the burst.
SLOW_RPS = "0.01"
UNAVAILABLE = "unavailable ("  # in the one warning a gateway logs per outage
BACK = "answers again"  # in the one it logs when the outage ends
# Longer than the 50 ms default: on a busy two-core test machine a reconnect after a restart
# (connect, AUTH, NOSCRIPT, SCRIPT LOAD, EVALSHA) can take that long, and these tests are
# about sharing and failing over, not about the deadline. The hanging test sets its own.
STORE_TIMEOUT = "0.5"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("shared-limits") / "tiny.gguf",
                            TinyLlamaSpec(n_ctx_train=4096))


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[LlamaServer]:
    """Two slots of 1024 tokens: a 2000-token prompt overflows."""
    with LlamaServer.start([str(llama_server_binary()), "-m", str(tiny_model), "-c", "2048",
                            "-np", "2", "--metrics", "-t", "1"], tiny_model.parent) as server:
        yield server


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keys = tmp_path_factory.mktemp("keys")
    (keys / "a").write_text(KEY)
    (keys / "b").write_text(OTHER)
    return keys


def start_pools(stack: ExitStack, engine: LlamaServer, keys: Path, store: RedisServer,
                log_dir: Path, limits: Sequence[str], on_unavailable: str = "allow"
                ) -> tuple[GatewayProcess, GatewayProcess]:
    """The main and the long-context pool's gateways of one service, on one Redis."""
    common = ["--api-keys", str(keys), "--namespace", NAMESPACE, "--model-version", "v1",
              "--rate-limit-redis", store.address, "--rate-limit-store-unavailable",
              on_unavailable, "--rate-limit-store-timeout", STORE_TIMEOUT, *limits]
    env = {REDIS_PASSWORD_ENV: store.password}
    return (stack.enter_context(GatewayProcess.start(
                engine.url, log_dir, [*common, "--pool", "main"], SERVICE, env=env)),
            stack.enter_context(GatewayProcess.start(
                engine.url, log_dir, [*common, "--pool", "long-context"], SERVICE, env=env)))


def chat_body(max_tokens: int, content: str) -> bytes:
    return json.dumps({"model": SERVICE, "messages": [{"role": "user", "content": content}],
                       "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}).encode()


def ask(gateway: GatewayProcess, key: str = KEY, max_tokens: int = 1, content: str = "Hi"
        ) -> tuple[int, dict[str, str], Any]:
    """One chat request: (status, headers, JSON body)."""
    request = urllib.request.Request(
        gateway.url + "/v1/chat/completions", data=chat_body(max_tokens, content),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def statuses(gateways: Sequence[GatewayProcess], count: int, key: str = KEY) -> list[int]:
    """`count` requests, taking turns across `gateways`."""
    return [ask(gateways[i % len(gateways)], key)[0] for i in range(count)]


def direct_client(store: RedisServer) -> redis.Redis:
    host, _, port = store.address.rpartition(":")
    return redis.Redis(host=host, port=int(port), password=store.password)


def warnings_about_store(gateway: GatewayProcess) -> list[str]:
    return [line for line in gateway.log_text().splitlines()
            if UNAVAILABLE in line or BACK in line]


def test_two_pools_share_one_request_limit(engine: LlamaServer, keys_dir: Path,
                                           redis_server: RedisServer, tmp_path: Path) -> None:
    with ExitStack() as stack:
        main, long_context = start_pools(stack, engine, keys_dir, redis_server, tmp_path,
                                         ["--rate-limit-rps", SLOW_RPS, "--rate-limit-burst", "4"])
        got = statuses([main, long_context], 10)
        assert got.count(200) == 4 and got.count(429) == 6, got  # the limit, not twice it
        status, headers, body = ask(long_context)
        assert status == 429 and body["error"]["type"] == "requests"
        assert 1 <= int(headers["Retry-After"]) <= 100  # (1 - balance) / 0.01 per second
        assert ask(main, OTHER)[0] == 200  # another key has buckets of its own

        # The keys name the namespace, the service and the key id, never the key; each
        # expires once its bucket would be full again.
        client = stack.enter_context(direct_client(redis_server))
        stored = {name.decode() for name in client.keys("*")}
        expected = {bucket_keys(NAMESPACE, SERVICE, key_id(k))[1] for k in (KEY, OTHER)}
        assert stored == expected
        assert all(KEY not in name and OTHER not in name for name in stored)
        assert all(0 < client.pttl(name) <= 401_000 for name in stored)  # 4 tokens at 0.01/s


def test_two_pools_share_one_token_budget(engine: LlamaServer, keys_dir: Path,
                                          redis_server: RedisServer, tmp_path: Path) -> None:
    """Charged by one pool after its answer, refused by the other.

    Two things move with the machine's speed, and the checks are exact about both rather
    than bounded by a guess at it. The budget refills while the requests run (a little over
    one token a second here): by no more than the rate times the time since the first
    request, on Redis's clock, which the scripts refill by. And a request is taken from the
    budget as its reservation when admitted and settled to its cost after its answer is
    written (accounting.py): at the refusal, each of the two earlier requests counts as one
    or the other. Retry-After lies between what those bounds give; the settled balance holds
    both costs."""
    status, _, direct = ask_engine(engine)
    cost = direct["usage"]["prompt_tokens"] + direct["usage"]["completion_tokens"]
    # Room for one request and two tokens: the second is admitted on what is left (a balance of
    # one is enough), the third refused until the refill pays the deficit back (a minute).
    per_minute = cost + 2
    rate = per_minute / 60
    reserved = tokens_to_reserve(Call(AuditRecord("", "chat"), 0.0,
                                      request_bytes=len(chat_body(16, "Hi")), max_tokens=16),
                                 per_minute, 0)
    low, high = sorted((reserved, cost))
    with ExitStack() as stack:
        client = stack.enter_context(direct_client(redis_server))
        main, long_context = start_pools(stack, engine, keys_dir, redis_server, tmp_path,
                                         ["--rate-limit-tokens-per-minute", str(per_minute)])
        started = redis_seconds(client)
        assert ask(main, max_tokens=16)[0] == 200
        assert ask(long_context, max_tokens=16)[0] == 200  # admitted on what is left
        status, headers, body = ask(main, max_tokens=16)
        refused_by = redis_seconds(client)
        assert status == 429 and body["error"]["type"] == "tokens", body
        refill = rate * (refused_by - started)
        assert retry_after(per_minute - 2 * low + refill, rate) <= int(headers["Retry-After"]) \
            <= retry_after(per_minute - 2 * high, rate), (reserved, cost, refill)

        def settled() -> tuple[float, float] | None:
            stored = client.hmget(bucket_keys(NAMESPACE, SERVICE, key_id(KEY))[0], "v", "t")
            balance, stored_at = float(stored[0]), float(stored[1])
            # Both pools' costs in the one bucket, refilled by no more than the time allows.
            return (balance, stored_at) if per_minute - 2 * cost <= balance <= \
                per_minute - 2 * cost + rate * (stored_at - started) else None

        wait_for(settled, timeout=10, interval=0.05,
                 what=f"a settled balance of two costs of {cost} tokens")
        assert ask(long_context, OTHER, max_tokens=16)[0] == 200


def redis_seconds(client: redis.Redis) -> float:
    """Redis's clock, the one the bucket scripts refill by."""
    seconds, microseconds = client.time()
    return seconds + microseconds / 1e6


def retry_after(balance: float, rate: float) -> int:
    """The admission script's answer for a balance: whole seconds until it is back to one."""
    return max(1, math.ceil((1 - balance) / rate))


def ask_engine(engine: LlamaServer) -> tuple[int, dict[str, str], Any]:
    body = {"model": SERVICE, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(engine.url + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, dict(response.headers), json.loads(response.read())


def wait_for_retry_window() -> None:
    """A gateway asks a failed store again one second after the failure."""
    time.sleep(1.2)


def test_store_killed_allow_counts_per_pod_then_shares_again(
        engine: LlamaServer, keys_dir: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    with ExitStack() as stack:
        pools = start_pools(stack, engine, keys_dir, redis_server, tmp_path,
                            ["--rate-limit-rps", SLOW_RPS, "--rate-limit-burst", "2"])
        assert statuses(pools, 4) == [200, 200, 429, 429]

        redis_server.kill()
        for gateway in pools:  # each pod's own bucket: the limit per pod
            assert [ask(gateway)[0] for _ in range(3)] == [200, 200, 429]
            metrics = gateway.metrics_text()
            assert metric_value(metrics, RATE_LIMIT_STORE_ERRORS_TOTAL,
                                reason="connection") >= 1
            assert metric_value(metrics, RATE_LIMIT_STORE_UP) == 0
            assert len(warnings_about_store(gateway)) == 1  # once per outage, not per request

        redis_server.start()  # same port, empty
        wait_for_retry_window()
        assert statuses(pools, 4) == [200, 200, 429, 429]  # shared again
        for gateway in pools:
            assert metric_value(gateway.metrics_text(), RATE_LIMIT_STORE_UP) == 1
            assert len(warnings_about_store(gateway)) == 2  # unavailable, answers again


def test_store_hanging_deny_answers_503_then_recovers(
        engine: LlamaServer, keys_dir: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    with ExitStack() as stack:
        main, long_context = start_pools(
            stack, engine, keys_dir, redis_server, tmp_path,
            ["--rate-limit-rps", SLOW_RPS, "--rate-limit-burst", "5",
             "--rate-limit-store-timeout", "0.25"], on_unavailable="deny")
        assert ask(main)[0] == 200

        redis_server.pause()  # accepts connections, answers nothing
        try:
            status, headers, body = ask(main)
            assert status == 503, body
            assert body["error"]["code"] == "rate_limit_store_unavailable"
            assert "onUnavailable: Deny" in body["error"]["message"]
            assert headers["Retry-After"] == "1"
            assert metric_value(main.metrics_text(), RATE_LIMIT_STORE_ERRORS_TOTAL,
                                reason="timeout") >= 1
            # Within the retry window the store is not asked again: no wait, the same answer.
            assert ask(main)[0] == 503
            assert ask(long_context)[0] == 503
        finally:
            redis_server.resume()
        wait_for_retry_window()
        assert ask(main)[0] == 200
        assert ask(long_context)[0] == 200
        assert len(warnings_about_store(main)) == 2


def test_an_overflowed_request_counts_once(engine: LlamaServer, tiny_model: Path,
                                           keys_dir: Path, redis_server: RedisServer,
                                           tmp_path: Path) -> None:
    """A prompt too long for the main pool goes to the long-context pool's gateway, which
    admits and charges it in the same store: the main gateway gives its request token back
    and charges nothing, so the service counts the request once."""
    per_minute, burst = 6000, 3
    limits = ["--rate-limit-rps", SLOW_RPS, "--rate-limit-burst", str(burst),
              "--rate-limit-tokens-per-minute", str(per_minute)]
    common = ["--api-keys", str(keys_dir), "--namespace", NAMESPACE, "--rate-limit-redis",
              redis_server.address, "--rate-limit-store-timeout", STORE_TIMEOUT, *limits]
    env = {REDIS_PASSWORD_ENV: redis_server.password}
    with ExitStack() as stack:
        large = stack.enter_context(LlamaServer.start(
            [str(llama_server_binary()), "-m", str(tiny_model), "-c", "4096", "-np", "1",
             "-t", "1"], tmp_path))
        long_gw = stack.enter_context(GatewayProcess.start(
            large.url, tmp_path, [*common, "--pool", "long-context"], SERVICE, env=env))
        main_gw = stack.enter_context(GatewayProcess.start(
            engine.url, tmp_path, [*common, "--pool", "main", "--long-context-url",
                                   long_gw.url], SERVICE, env=env))
        asked = time.monotonic()
        status, _, body = ask(main_gw, max_tokens=4, content=prompt_of_tokens(2000))
        assert status == 200, body
        cost = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        assert cost > 2000  # answered by the long-context pool, whole
        assert metric_value(main_gw.metrics_text(), "glm_gateway_overflow_total",
                            outcome="routed") == 1

        client = stack.enter_context(direct_client(redis_server))
        tokens_key, requests_key = bucket_keys(NAMESPACE, SERVICE, key_id(KEY))
        # One request token taken (plus what 0.01/s refilled meanwhile), not two.
        assert float(client.hget(requests_key, "v") or 0) == pytest.approx(burst - 1, abs=0.2)
        # Charged once: the reservations taken at admission (the main gateway's, the long
        # pool's) are settled, so the budget is per_minute - cost as last written, plus what
        # refilled (per_minute / 60 a second) while the request ran. Charged twice it would
        # be another `cost` below.
        # The settlement is written after the answer reaches the client, so refill is
        # bounded by the time until this read, not until the answer.
        balance = float(client.hget(tokens_key, "v") or 0)
        until_read = time.monotonic() - asked
        assert per_minute - cost - 1 <= balance <= (per_minute - cost
                                                    + per_minute / 60 * until_read)
        assert balance < per_minute
        assert statuses([main_gw], 3) == [200, 200, 429]


def test_tls_store_verified_against_the_trusted_cas(engine: LlamaServer, keys_dir: Path,
                                                   tmp_path: Path) -> None:
    """--rate-limit-redis-tls: shared limits over TLS to a server whose certificate the
    gateway's CAs trust (SSL_CERT_FILE here, the image's system CAs in a pod); a gateway that
    does not trust it never talks to it in clear: the store is unavailable to it."""
    ca = trustme.CA()
    issued = ca.issue_cert("localhost")
    files = TlsFiles(tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem")
    issued.cert_chain_pems[0].write_to_path(str(files.cert))
    issued.private_key_pem.write_to_path(str(files.key))
    ca.cert_pem.write_to_path(str(files.ca))
    store = start_or_skip(RedisServer(password="tls-secret", tls=files))
    try:
        args = ["--api-keys", str(keys_dir), "--rate-limit-rps", SLOW_RPS,
                "--rate-limit-burst", "2", "--rate-limit-redis", f"localhost:{store.port}",
                "--rate-limit-redis-tls", "--rate-limit-store-timeout", STORE_TIMEOUT]
        env = {REDIS_PASSWORD_ENV: store.password}
        with GatewayProcess.start(engine.url, tmp_path, args, SERVICE,
                                  env={**env, "SSL_CERT_FILE": str(files.ca)}) as trusting, \
                GatewayProcess.start(engine.url, tmp_path, [*args, "--pool", "long-context"],
                                     SERVICE, env={**env, "SSL_CERT_FILE": str(files.ca)}
                                     ) as trusting_too:
            assert statuses([trusting, trusting_too], 3) == [200, 200, 429]
            assert metric_value(trusting.metrics_text(), RATE_LIMIT_STORE_UP) == 1
            with GatewayProcess.start(engine.url, tmp_path, args, SERVICE, env=env) as other:
                assert ask(other)[0] == 200  # Allow: its own buckets
                assert metric_value(other.metrics_text(), RATE_LIMIT_STORE_UP) == 0
                assert "CERTIFICATE_VERIFY_FAILED" in "".join(warnings_about_store(other))
    finally:
        store.stop()


def buckets_on(store: RedisServer, limits: Limits, timeout: float = 2.0) -> RedisBuckets:
    config = RateLimitStoreConfig(address=store.address, namespace=NAMESPACE,
                                  password=store.password, timeout_seconds=timeout)
    return RedisBuckets(redis_client(config), limits, NAMESPACE, SERVICE, timeout)


async def test_scripts_match_the_local_buckets(redis_server: RedisServer) -> None:
    """The Lua scripts against the real Redis give what RateLimiter and TokenBudget give,
    and survive a SCRIPT FLUSH (NOSCRIPT: loaded again)."""
    limits = Limits(requests_per_second=0.01, burst=3.0, tokens_per_minute=60)
    shared = buckets_on(redis_server, limits)
    local = KeyLimits(limits)
    try:
        for _ in range(3):
            assert await shared.admit("k1") == local.admit_locally("k1") == ADMITTED
        refused, expected = await shared.admit("k1"), local.admit_locally("k1")
        assert (refused.refused, refused.wait) == (expected.refused, expected.wait) \
            == ("requests", 100)
        # A token given back (an overflow handed to the other pool) admits one more.
        assert await shared.release_request("k1") == pytest.approx(1.0, abs=0.01)
        assert await shared.admit("k1") == ADMITTED

        await shared.client.script_flush()
        balance = await shared.charge("k2", 100)  # 60 per minute: 40 over
        assert local.budget is not None
        local.budget.charge("k2", 100)
        assert balance == pytest.approx(local.budget.balance("k2"), abs=0.5)
        refused, expected = await shared.admit("k2"), local.admit_locally("k2")
        assert refused.refused == expected.refused == "tokens"
        assert abs(refused.wait - expected.wait) <= 1 and refused.wait == pytest.approx(41, abs=1)
        assert refused.balance == pytest.approx(-40, abs=0.5)
        # Kept until the balance is full again: (60 + 40) / 1 per second, plus a second.
        tokens_key = bucket_keys(NAMESPACE, SERVICE, "k2")[0]
        assert 99_000 <= await shared.client.pttl(tokens_key) <= 101_000
    finally:
        await shared.close()


async def test_concurrent_admissions_never_share_the_last_token(
        redis_server: RedisServer) -> None:
    """Two clients (two gateways), 60 requests at once, a burst of 25: exactly 25 pass."""
    limits = Limits(requests_per_second=0.01, burst=25.0)
    first, second = buckets_on(redis_server, limits), buckets_on(redis_server, limits)
    try:
        verdicts = await asyncio.gather(*(
            (first if i % 2 else second).admit("k1") for i in range(60)))
        assert sum(v == ADMITTED for v in verdicts) == 25
    finally:
        await first.close()
        await second.close()
