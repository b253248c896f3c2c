"""OpenAI-shaped error bodies: {"error": {"message", "type", "param", "code"}}.

Clients (the official SDKs included) map the HTTP status to an exception class and show
`message`, so the message carries the numbers and the field name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(eq=False)  # not frozen: contextlib and asyncio set __traceback__ on exceptions
class GatewayError(Exception):
    """An error answered to the client; raised anywhere in request handling."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None
    # A 401's challenge (RFC 9110 11.6.1: a 401 MUST carry WWW-Authenticate).
    challenge: str | None = None

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)

    def headers(self) -> dict[str, str]:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
        if self.challenge is not None:
            headers["WWW-Authenticate"] = self.challenge
        return headers


def error_body(message: str, type_: str, param: str | None = None,
               code: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    ).encode()


def invalid(param: str, message: str, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", param, code)


def unauthorized(message: str, bad_key: bool = False) -> GatewayError:
    # RFC 6750 3: no error code when no key came, invalid_token for a wrong one.
    challenge = 'Bearer realm="glm-operator"' + (', error="invalid_token"' if bad_key else "")
    return GatewayError(401, message, "invalid_request_error", None, "invalid_api_key",
                        challenge=challenge)


def too_many_in_flight(limit: int) -> GatewayError:
    return GatewayError(
        429,
        f"This API key already has {limit} requests running on this replica, the most it "
        "may (gateway --max-in-flight-per-key); retry when one finishes.",
        "requests", None, "too_many_concurrent_requests", 1,
    )


def rate_limited(retry_after: int, limit_rps: float) -> GatewayError:
    return GatewayError(
        429,
        f"Rate limit reached for this API key ({limit_rps:g} requests/s); "
        f"retry after {retry_after} s.",
        "requests", None, "rate_limit_exceeded", retry_after,
    )


def tokens_rate_limited(retry_after: int, tokens_per_minute: int, balance: float
                        ) -> GatewayError:
    return GatewayError(
        429,
        f"Token rate limit reached for this API key ({tokens_per_minute} prompt + completion "
        f"tokens per minute; {max(0, -round(balance))} tokens over); "
        f"retry after {retry_after} s.",
        "tokens", None, "rate_limit_exceeded", retry_after,
    )


def limit_store_unavailable(address: str, retry_after: int) -> GatewayError:
    return GatewayError(
        503,
        f"The rate-limit store ({address}) is unavailable and this service refuses requests "
        f"it cannot count (gateway.rateLimit.store.onUnavailable: Deny); "
        f"retry after {retry_after} s.",
        "server_error", None, "rate_limit_store_unavailable", retry_after,
    )


def too_large(limit: int) -> GatewayError:
    return GatewayError(
        413, f"Request body is larger than the limit of {limit} bytes.",
        "invalid_request_error", None, "request_too_large",
    )


def engine_unavailable(detail: str, retry_after: int = 1) -> GatewayError:
    return GatewayError(
        503, f"The model engine is unavailable: {detail}", "server_error", None,
        "engine_unavailable", retry_after,
    )


def engine_timeout(seconds: float) -> GatewayError:
    return GatewayError(
        504, f"The model engine sent nothing for {seconds:g} s.", "server_error", None,
        "engine_timeout",
    )


def prompt_too_long(n_prompt_tokens: int | None, n_ctx: int | None, detail: str) -> GatewayError:
    if n_prompt_tokens and n_ctx:
        message = (
            f"The prompt is too long: it has {n_prompt_tokens} tokens and this model serves a "
            f"context of {n_ctx} tokens per request. Shorten the prompt; nothing was truncated."
        )
    else:
        message = (f"The prompt is too long for this model's context ({detail}); "
                   "nothing was truncated.")
    return GatewayError(400, message, "invalid_request_error", "messages",
                        "context_length_exceeded")
