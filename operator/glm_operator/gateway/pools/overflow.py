"""A prompt too long for this pool's engine, sent to the long-context pool.

The pipeline (proxy.py) decides that a request overflows, once, from the engine's refusal;
this routes it: no pool is a 400 naming the numbers, a pool asleep is woken first (wake.py),
a request the shared rate-limit store admitted is handed over (that pool's gateway counts it
in the same store), and every outcome is counted.
"""

from __future__ import annotations

import aiohttp

from glm_operator.gateway.call import Call
from glm_operator.gateway.openai import errors
from glm_operator.gateway.openai.errors import GatewayError
from glm_operator.gateway.openai.validation import ParsedRequest
from glm_operator.gateway.policy.limits import KeyLimits
from glm_operator.gateway.policy.metrics import GatewayMetrics
from glm_operator.gateway.pools.wake import LongContextWaker, WakeError
from glm_operator.gateway.upstream import Reply, Upstream
from glm_operator.gateway.wire.messages import Request


class Overflow:
    def __init__(self, pool: Upstream | None, metrics: GatewayMetrics,
                 limits: KeyLimits | None, retry_after_seconds: int) -> None:
        self.pool = pool  # None: no long-context pool
        self.waker: LongContextWaker | None = None  # set once the gateway's session is open
        self._metrics = metrics
        self._limits = limits
        self._retry_after = retry_after_seconds
        self.held = 0  # requests waiting for the pool's wake

    def _outcome(self, outcome: str) -> None:
        self._metrics.overflow.labels(**self._metrics.labels, outcome=outcome).inc()

    async def route(self, request: Request, parsed: ParsedRequest, path: str, call: Call,
                    n_prompt: int | None, n_ctx: int | None) -> Reply:
        if self.pool is None:
            self._outcome("no_pool")
            raise errors.prompt_too_long(n_prompt, n_ctx, "the engine refused it")
        if self.waker is not None:
            self.held += 1
            try:
                await self.waker.ensure_awake()
            except (WakeError, aiohttp.ClientError, OSError) as exc:
                self._outcome("wake_timeout")
                raise GatewayError(
                    503,
                    f"The prompt has {n_prompt} tokens, more than this pool's context of "
                    f"{n_ctx}; the long-context pool is not ready: {exc}",
                    "server_error", None, "long_context_unavailable", self._retry_after,
                ) from None
            finally:
                self.held -= 1
        if call.shared_admission and self._limits is not None:
            # That pool's gateway counts this request in the same store: count it once.
            await self._limits.hand_over(call.record.key_id)
            call.handed_over = True
        routed = True  # the pool answered, or the client left while it did
        try:
            return await self.pool.send(request, parsed, path, call)
        except GatewayError:
            routed = False
            self._outcome("failed")
            raise
        finally:
            if routed:
                self._outcome("routed")
