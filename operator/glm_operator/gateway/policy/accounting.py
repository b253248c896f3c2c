"""What a finished request costs its key's token budget."""

from __future__ import annotations

from glm_operator.gateway.call import Call
from glm_operator.gateway.policy.audit import CLIENT_CLOSED

# A prompt's tokens when the engine never said: about four bytes of JSON per token.
BYTES_PER_TOKEN_ESTIMATE = 4


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
