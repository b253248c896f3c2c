"""The per-key buckets of `ratelimit.py`, kept in Redis so that they hold for a whole service.

Every replica of a GLMService, in both pools, runs the same two Lua scripts against one
Redis: `admit` (the token budget, then the request bucket, as `KeyLimits.admit_locally` does
with the local buckets) and `charge` (a finished request's tokens). Each script is one atomic step,
so two gateways can never both take a bucket's last token, and each reads the time from
Redis (`TIME`), never from the caller, so gateways with skewed clocks agree on the refill.
The arithmetic is `RateLimiter`'s and `TokenBudget`'s, line for line.

A bucket is a hash {v: value, t: when, in seconds of the Redis clock}, its key
`glm-ratelimit:{<namespace>/<service>/<key id>}:requests|tokens`: the key id is the API key's
sha256 prefix (keys.py), never the key; the braces are a Redis Cluster hash tag, so the two
buckets of one key live in one slot and `admit` may touch both. Each write sets the expiry
to the moment the bucket is full again: from then on a missing bucket and a full one are the
same thing, so idle keys vanish on their own and a key in deficit is never forgotten early.

The scripts run through redis-py's `Script` (EVALSHA, and SCRIPT LOAD then EVALSHA again on
NOSCRIPT, which is what a restarted or failed-over Redis answers).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from glm_operator.gateway.config import RateLimitStoreConfig, split_address

KEY_PREFIX = "glm-ratelimit"
# After a failure the store is left alone this long: requests meanwhile do not each wait
# for a timeout, and the first one after it tries again.
RETRY_AFTER_FAILURE_SECONDS = 1.0
# Loading the scripts at start-up is off the request path: it may take longer.
LOAD_TIMEOUT_SECONDS = 2.0

_BUCKET_FUNCTIONS = """
local function now_seconds()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- The bucket's value refilled up to now (a missing bucket is a full one).
local function refill(key, capacity, rate, now)
  local state = redis.call('HMGET', key, 'v', 't')
  local value, at = tonumber(state[1]), tonumber(state[2])
  if value == nil or at == nil then return capacity end
  return math.min(capacity, value + math.max(0, now - at) * rate)
end
-- Keep the value until the bucket would be full again; after that, absent == full.
local function store(key, value, capacity, rate, now)
  redis.call('HSET', key, 'v', string.format('%.17g', value), 't', string.format('%.17g', now))
  -- %d: Lua would print a large number as 1e+14, which PEXPIRE refuses.
  local full_in_ms = math.ceil((capacity - value) / rate * 1000) + 1000
  redis.call('PEXPIRE', key, string.format('%d', full_in_ms))
end
"""

# KEYS: token budget, request bucket. ARGV: token refill per second (0: no budget), token
# capacity, requests per second (0: no request limit), burst.
# Returns {0, 0, ''} admitted; {1, wait, balance} no tokens; {2, wait, ''} no request token.
ADMIT_SCRIPT = _BUCKET_FUNCTIONS + """
local now = now_seconds()
local token_rate, token_capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local request_rate, burst = tonumber(ARGV[3]), tonumber(ARGV[4])
if token_rate > 0 then
  local balance = refill(KEYS[1], token_capacity, token_rate, now)
  if balance < 1 then
    return {1, math.max(1, math.ceil((1 - balance) / token_rate)), string.format('%.17g', balance)}
  end
end
if request_rate > 0 then
  local tokens = refill(KEYS[2], burst, request_rate, now)
  if tokens < 1 then
    return {2, math.max(1, math.ceil((1 - tokens) / request_rate)), ''}
  end
  store(KEYS[2], tokens - 1, burst, request_rate, now)
end
return {0, 0, ''}
"""

# KEYS: token budget. ARGV: refill per second, capacity, tokens taken (negative: given back).
# Returns the balance.
CHARGE_SCRIPT = _BUCKET_FUNCTIONS + """
local now = now_seconds()
local rate, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
-- A negative charge gives back a reservation not used, never above a full bucket.
local balance = math.min(capacity, refill(KEYS[1], capacity, rate, now) - tonumber(ARGV[3]))
store(KEYS[1], balance, capacity, rate, now)
return string.format('%.17g', balance)
"""

# KEYS: request bucket. ARGV: requests per second, burst. Gives back the token `admit` took
# for a request another gateway of the service will count (an overflow). Returns the tokens.
RELEASE_SCRIPT = _BUCKET_FUNCTIONS + """
local now = now_seconds()
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens = math.min(burst, refill(KEYS[1], burst, rate, now) + 1)
store(KEYS[1], tokens, burst, rate, now)
return string.format('%.17g', tokens)
"""

Refusal = Literal["tokens", "requests"]


@dataclass(frozen=True)
class Verdict:
    """What admission decided: `refused` None when admitted, else which bucket said no,
    the whole seconds until it would say yes, and (tokens) the balance it holds."""

    refused: Refusal | None = None
    wait: int = 0
    balance: float = 0.0


ADMITTED = Verdict()


@dataclass(frozen=True)
class Limits:
    """The numbers the buckets are built from: `RateLimiter(rps, burst)` and
    `TokenBudget(tokens_per_minute)`; 0 switches one off."""

    requests_per_second: float = 0.0
    burst: float = 0.0
    tokens_per_minute: int = 0

    @property
    def token_rate(self) -> float:
        return self.tokens_per_minute / 60.0


def bucket_keys(namespace: str, service: str, key_id: str) -> tuple[str, str]:
    """(token budget, request bucket) of one API key of one service."""
    tag = "{" + f"{namespace}/{service}/{key_id}" + "}"
    return f"{KEY_PREFIX}:{tag}:tokens", f"{KEY_PREFIX}:{tag}:requests"


def parse_admit_reply(reply: Any) -> Verdict:
    code, wait, balance = int(reply[0]), int(reply[1]), reply[2]
    if code == 0:
        return ADMITTED
    if code == 1:
        return Verdict("tokens", wait, float(balance))
    if code == 2:
        return Verdict("requests", wait)
    raise ValueError(f"unexpected reply from the admit script: {reply!r}")


def redis_client(config: RateLimitStoreConfig) -> redis.Redis:
    host, port = split_address(config.address)
    return redis.Redis(
        host=host, port=port, password=config.password or None, ssl=config.tls,
        # Each call runs under asyncio.timeout (RedisBuckets); a socket timeout as well would
        # only add two timers per command. No retries of its own either: the gateway has a
        # deadline of tens of milliseconds and a decision (onUnavailable) for when it passes.
        socket_connect_timeout=config.timeout_seconds,
        retry=Retry(NoBackoff(), 0), client_name="glm-gateway",
    )


class RedisBuckets:
    """The shared buckets of one service. Calls raise when Redis does not answer in time:
    the caller (limits.py) decides what that means."""

    def __init__(self, client: redis.Redis, limits: Limits, namespace: str, service: str,
                 timeout_seconds: float) -> None:
        self.client = client
        self.limits = limits
        self.namespace = namespace
        self.service = service
        self.timeout_seconds = timeout_seconds
        self._admit = client.register_script(ADMIT_SCRIPT)
        self._charge = client.register_script(CHARGE_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)

    async def load_scripts(self, timeout_seconds: float) -> None:
        """Connect and load both scripts ahead of the first request, which then pays one
        round trip instead of connect, NOSCRIPT, SCRIPT LOAD and EVALSHA again."""
        async with asyncio.timeout(timeout_seconds):
            for script in (ADMIT_SCRIPT, CHARGE_SCRIPT, RELEASE_SCRIPT):
                await self.client.script_load(script)

    async def admit(self, key_id: str) -> Verdict:
        limits = self.limits
        async with asyncio.timeout(self.timeout_seconds):
            reply = await self._admit(
                keys=bucket_keys(self.namespace, self.service, key_id),
                args=(f"{limits.token_rate:.17g}", limits.tokens_per_minute,
                      f"{limits.requests_per_second:.17g}", f"{limits.burst:.17g}"))
        return parse_admit_reply(reply)

    async def charge(self, key_id: str, tokens: int) -> float:
        limits = self.limits
        tokens_key, _ = bucket_keys(self.namespace, self.service, key_id)
        async with asyncio.timeout(self.timeout_seconds):
            reply = await self._charge(keys=(tokens_key,), args=(
                f"{limits.token_rate:.17g}", limits.tokens_per_minute, tokens))
        return float(reply)

    async def release_request(self, key_id: str) -> float:
        limits = self.limits
        _, requests_key = bucket_keys(self.namespace, self.service, key_id)
        async with asyncio.timeout(self.timeout_seconds):
            reply = await self._release(keys=(requests_key,), args=(
                f"{limits.requests_per_second:.17g}", f"{limits.burst:.17g}"))
        return float(reply)

    async def close(self) -> None:
        await self.client.aclose()


@dataclass
class StoreHealth:
    """Whether the store answered last time, and when to ask again after it did not.

    `failed` and `succeeded` return True only when the state changes, so the caller logs a
    transition once rather than once per request."""

    retry_seconds: float = RETRY_AFTER_FAILURE_SECONDS
    clock: Callable[[], float] = time.monotonic
    available: bool = True
    _retry_at: float = field(default=0.0, repr=False)

    def should_try(self) -> bool:
        return self.available or self.clock() >= self._retry_at

    def failed(self) -> bool:
        self._retry_at = self.clock() + self.retry_seconds
        changed, self.available = self.available, False
        return changed

    def succeeded(self) -> bool:
        changed, self.available = not self.available, True
        return changed
