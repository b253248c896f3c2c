"""Token counts from engine responses without parsing whole bodies.

Both engines put the counts in one small object near the end: OpenAI's `usage`
({"prompt_tokens", "completion_tokens"}), and llama.cpp's `timings` ({"prompt_n", "cache_n",
"predicted_n"}, present in the last streamed chunk even when the client did not ask for
usage). We find the last `"usage"` / `"timings"` key and decode only the object after it. Inside a
JSON string a quote is escaped, so those byte sequences cannot come from generated text.
"""

from __future__ import annotations

import json
import re
from typing import Any

_DECODER = json.JSONDecoder()
_COLON = re.compile(rb"\s*:\s*")
_OVERFLOW_VLLM = re.compile(rb"maximum context length is (\d+) tokens.*?(\d+) tokens", re.S)


def _object_after(data: bytes, key: bytes) -> dict[str, Any] | None:
    at = data.rfind(key)
    if at < 0:
        return None
    colon = _COLON.match(data, at + len(key))
    if colon is None:
        return None
    try:
        value, _ = _DECODER.raw_decode(data[colon.end():].decode("utf-8", "replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def token_counts(data: bytes) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from a response body or the tail of a stream."""
    usage = _object_after(data, b'"usage"')
    if usage is not None:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            return prompt, completion
    timings = _object_after(data, b'"timings"')
    if timings is not None:
        predicted = timings.get("predicted_n")
        prompt_n = timings.get("prompt_n", 0) or 0
        cached = timings.get("cache_n", 0) or 0
        if isinstance(predicted, int):
            return int(prompt_n) + int(cached), predicted
    return None, None


def context_overflow(status: int, body: bytes) -> tuple[int | None, int | None] | None:
    """When the engine refused the prompt as longer than its context: (n_prompt, n_ctx).

    llama.cpp: 400 {"error": {"type": "exceed_context_size_error", "n_prompt_tokens", "n_ctx"}}
    vLLM: 400 "... maximum context length is 4096 tokens. However, you requested 5000 tokens ..."
    Returns None for any other answer.
    """
    if status != 400:
        return None
    if b"exceed_context_size_error" in body:
        try:
            error = json.loads(body).get("error", {})
        except (ValueError, AttributeError):
            return None, None
        n_prompt, n_ctx = error.get("n_prompt_tokens"), error.get("n_ctx")
        return (n_prompt if isinstance(n_prompt, int) else None,
                n_ctx if isinstance(n_ctx, int) else None)
    if b"maximum context length" in body:
        match = _OVERFLOW_VLLM.search(body)
        if match:
            return int(match.group(2)), int(match.group(1))
        return None, None
    return None


def completion_text(body: bytes) -> str | None:
    """A whole answer's text (only for the audit log with text enabled)."""
    try:
        choice = json.loads(body)["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    text = choice.get("message", {}).get("content") if "message" in choice else choice.get("text")
    return text if isinstance(text, str) else None
