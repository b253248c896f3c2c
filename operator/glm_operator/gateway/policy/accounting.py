"""What a request costs its key's token budget: reserved when it is admitted, settled when it
ends.

A budget charged only after the answer lets a key overshoot it by everything it has running:
ten requests admitted on the same positive balance, each with max_tokens 10^5, all finish
before the first charge. So the most a request may cost is taken when it is admitted, and
when it ends the difference to what it used is given back (or, past the estimate, taken).
"""

from __future__ import annotations

from glm_operator.gateway.call import Call
from glm_operator.gateway.policy.audit import CLIENT_CLOSED

# A prompt's tokens when the engine never said: about four bytes of JSON per token.
BYTES_PER_TOKEN_ESTIMATE = 4


def tokens_to_reserve(call: Call, tokens_per_minute: int, context_length: int) -> int:
    """The most a request may cost, taken when it is admitted: its prompt (estimated from its
    size) plus its max_tokens, or, without one, the engine's context (what it may generate
    until the context is full). At most one minute's budget: a request asking for more than
    the key may use in a minute is admitted on a full balance, not refused for ever."""
    prompt = call.request_bytes // BYTES_PER_TOKEN_ESTIMATE
    completion = call.max_tokens or context_length or tokens_per_minute
    return max(0, min(tokens_per_minute, prompt + completion))


def tokens_to_charge(call: Call) -> int:
    """What one request cost the token budget: the engine's usage (prompt + completion) when
    the answer carried it. A client that went away gets no usage back, yet the engine worked:
    it is charged an estimate, the request's size for the prompt plus the chunks streamed so
    far, or, not streaming, its max_tokens (a busy llama-server finishes such a request).
    Refused requests (4xx/5xx, never reached the engine or answered with an error) cost
    nothing."""
    record = call.record
    if record.prompt_tokens is not None or record.completion_tokens is not None:
        return (record.prompt_tokens or 0) + (record.completion_tokens or 0)
    if record.status not in (200, CLIENT_CLOSED) or not call.request_bytes:
        return 0
    prompt = call.request_bytes // BYTES_PER_TOKEN_ESTIMATE
    if record.stream:
        return prompt + call.streamed_events
    return prompt + (call.max_tokens or 0)
