"""A key's request and token limits for one gateway: per pod, or shared by the service.

Without a store each gateway keeps its own buckets (ratelimit.py), so a service of N ready
pods lets a key through up to N times its limit. With a store (ratelimit_store.py) every
replica of the service, in both pools, draws from the same buckets in Redis. When Redis does
not answer within the timeout, `on_unavailable` decides: "allow" counts in this pod's own
buckets meanwhile (a key keeps a bound: the per-pod one), "deny" answers 503. The store is
asked again a second after a failure, and limits are shared again as soon as it answers.
"""

from __future__ import annotations

import logging

import redis.asyncio as redis
from prometheus_client import Counter, Gauge

from glm_operator.gateway.config import GatewayConfig, RateLimitStoreConfig
from glm_operator.gateway.metrics import STORE_ERROR_REASONS
from glm_operator.gateway.openai import errors
from glm_operator.gateway.policy.metrics import GatewayMetrics
from glm_operator.gateway.policy.ratelimit import RateLimiter, TokenBudget, default_burst
from glm_operator.gateway.policy.ratelimit_store import (
    ADMITTED,
    LOAD_TIMEOUT_SECONDS,
    Limits,
    RedisBuckets,
    StoreHealth,
    Verdict,
    redis_client,
)

log = logging.getLogger(__name__)

STORE_ERRORS = (redis.RedisError, OSError, TimeoutError)


def error_reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | redis.TimeoutError):
        return "timeout"
    if isinstance(exc, redis.ConnectionError | OSError):
        return "connection"
    return "error"


class KeyLimits:
    def __init__(self, limits: Limits, store: RedisBuckets | None = None,
                 store_config: RateLimitStoreConfig | None = None,
                 metrics: GatewayMetrics | None = None,
                 health: StoreHealth | None = None) -> None:
        self.limits = limits
        self.store = store
        self.store_config = store_config
        self.health = health or StoreHealth()
        deny = store_config is not None and store_config.on_unavailable == "deny"
        local = store is None or not deny  # the buckets of this pod: the only ones, or the fallback
        self.limiter = (RateLimiter(limits.requests_per_second, int(limits.burst))
                        if local and limits.requests_per_second > 0 else None)
        self.budget = (TokenBudget(limits.tokens_per_minute)
                       if local and limits.tokens_per_minute > 0 else None)
        self._errors: dict[str, Counter] = {}
        self._up: Gauge | None = None
        if metrics is not None and store is not None:
            self._errors = {reason: metrics.store_errors.labels(**metrics.labels, reason=reason)
                            for reason in STORE_ERROR_REASONS}
            self._up = metrics.store_up.labels(**metrics.labels)
            self._up.set(1)

    @classmethod
    def from_config(cls, config: GatewayConfig, metrics: GatewayMetrics) -> KeyLimits | None:
        rps, tpm = config.rate_limit_rps, config.rate_limit_tokens_per_minute
        if rps <= 0 and tpm <= 0:
            return None
        burst = 0.0
        if rps > 0:  # sized as RateLimiter sizes it, so local and shared buckets agree
            burst = float(config.rate_limit_burst) if config.rate_limit_burst > 0 \
                else default_burst(rps)
        limits = Limits(rps, burst, max(0, tpm))
        store_config = config.rate_limit_store
        store = None
        if store_config is not None:
            store = RedisBuckets(redis_client(store_config), limits, store_config.namespace,
                                 config.service_name, store_config.timeout_seconds)
        return cls(limits, store, store_config, metrics)

    async def start(self) -> None:
        """Load the scripts into the store, so the first request does not wait for it; a
        store that is down now is logged as such, once."""
        if self.store is None:
            return
        try:
            await self.store.load_scripts(LOAD_TIMEOUT_SECONDS)
        except STORE_ERRORS as exc:
            self._store_failed(exc)
        else:
            assert self.store_config is not None
            log.info("rate-limit store %s: limits are shared by the service",
                     self.store_config.address)

    async def admit(self, key_id: str) -> bool:
        """Return when `key_id` may send a request now; raise the 429 (or 503) otherwise.
        True when the shared store admitted it (every gateway of the service saw it)."""
        verdict, shared = await self._verdict(key_id)
        if verdict.refused == "tokens":
            raise errors.tokens_rate_limited(verdict.wait, self.limits.tokens_per_minute,
                                             verdict.balance)
        if verdict.refused == "requests":
            raise errors.rate_limited(verdict.wait, self.limits.requests_per_second)
        return shared

    async def _verdict(self, key_id: str) -> tuple[Verdict, bool]:
        if self.store is not None and self.health.should_try():
            try:
                verdict = await self.store.admit(key_id)
            except STORE_ERRORS as exc:
                self._store_failed(exc)
            else:
                self._store_answered()
                return verdict, True
        if self.store is not None and self.limiter is None and self.budget is None:
            assert self.store_config is not None
            raise errors.limit_store_unavailable(self.store_config.address,
                                                 max(1, round(self.health.retry_seconds)))
        return self.admit_locally(key_id), False

    async def hand_over(self, key_id: str) -> None:
        """A request the shared store admitted goes to the long-context pool, whose gateway
        counts and charges it in the same store: give its request token back, so the
        service counts it once. Best effort: if the store does not answer, it counts twice."""
        if self.store is None or self.limits.requests_per_second <= 0:
            return
        try:
            await self.store.release_request(key_id)
        except STORE_ERRORS as exc:
            self._store_failed(exc)
        else:
            self._store_answered()

    def admit_locally(self, key_id: str) -> Verdict:
        # The token budget first: a request it refuses takes no request token.
        if self.budget is not None:
            wait = self.budget.admit(key_id)
            if wait:
                return Verdict("tokens", wait, self.budget.balance(key_id))
        if self.limiter is not None:
            wait = self.limiter.acquire(key_id)
            if wait:
                return Verdict("requests", wait)
        return ADMITTED

    async def charge(self, key_id: str, tokens: int) -> None:
        """Take `tokens` from the key's token budget (a reservation, or what a request used
        beyond its reservation), or give them back when negative (accounting.py)."""
        if tokens == 0 or self.limits.tokens_per_minute <= 0:
            return
        if self.store is not None and self.health.should_try():
            try:
                await self.store.charge(key_id, tokens)
            except STORE_ERRORS as exc:
                self._store_failed(exc)
            else:
                self._store_answered()
                return
        # Allow: this pod's budget holds the debt. Deny: nowhere to put it; the requests
        # that follow are refused until the store is back.
        if self.budget is not None:
            self.budget.charge(key_id, tokens)

    def _store_failed(self, exc: BaseException) -> None:
        reason = error_reason(exc)
        counter = self._errors.get(reason)
        if counter is not None:
            counter.inc()
        if self.health.failed():
            assert self.store_config is not None
            if self._up is not None:
                self._up.set(0)
            then = ("counting in this pod's own buckets until it answers (onUnavailable: Allow)"
                    if self.store_config.on_unavailable == "allow"
                    else "refusing requests with 503 until it answers (onUnavailable: Deny)")
            log.warning("rate-limit store %s unavailable (%s: %s); %s",
                        self.store_config.address, reason, str(exc) or type(exc).__name__, then)

    def _store_answered(self) -> None:
        if self.health.succeeded():
            assert self.store_config is not None
            if self._up is not None:
                self._up.set(1)
            log.warning("rate-limit store %s answers again; limits are shared by the service",
                        self.store_config.address)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
