"""How a request ended, in the words the canary analysis judges a version by (pure).

A status code alone cannot say it: a stream the engine broke went out as 200 (its head was
written before it broke), and a client that gave up is a 499 whether it waited in vain for
the first token or left a stream it had been reading.
"""

from __future__ import annotations

from glm_operator.gateway.policy.audit import CLIENT_CLOSED

# error_code values the stream paths set (upstream.py, call.py)
STREAM_BROKEN = "engine_stream_broken"
STREAM_TIMED_OUT = "engine_stream_timeout"


def request_outcome(status: int, error_code: str | None, first_token: bool) -> str:
    """One of gateway/metrics.py REQUEST_OUTCOMES. `first_token`: the client got at least
    the first bytes of the answer."""
    if error_code == STREAM_TIMED_OUT:
        return "timed_out"
    if error_code == STREAM_BROKEN:
        return "engine_broken"
    if status == CLIENT_CLOSED:
        return "abandoned_after_first_token" if first_token else "abandoned_before_first_token"
    if status == 504:
        return "timed_out"
    if status >= 500:
        return "server_error"
    if status == 429:
        return "rate_limited"
    if status >= 400:
        return "client_error"
    return "completed"
