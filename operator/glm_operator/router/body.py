"""What the router reads of a request body: the few things it routes on, decoded once, kept
bounded, and the decoded JSON dropped before the request waits for a pod or is relayed.

As the gateway keeps a ParsedRequest (openai/validation.py) and not the parsed JSON: a decoded
body costs up to about 15 times its bytes (every string, list and object a Python object), a
request may be held for minutes while its version wakes, and the body is not the router's to
trust (keys are checked by the pods' gateways). The pod gets the client's bytes unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glm_operator.gateway.openai import strict_json
from glm_operator.router.prefix import BLOCK_CHARS, MAX_BLOCKS, prompt_text

PREFIX_CHARS = MAX_BLOCKS * BLOCK_CHARS  # of the prompt's text: all the prefix index reads


@dataclass(frozen=True, slots=True)
class RoutedFields:
    """What outlives the decode: `stream`, the prompt's size for the long-prompt decision,
    and at most PREFIX_CHARS of its text for the prefix index."""

    stream: bool
    prompt_chars: int  # text characters of the prompt (the long-context estimate)
    prefix: str  # the prompt's text as the prefix index reads it, cut to PREFIX_CHARS
    text_chars: int  # the length of that text uncut (the router's prompt-character counts)


def prompt_chars(body: dict[str, Any]) -> int:
    """Characters of prompt text in a chat or completions body (text parts only)."""
    total = 0
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        total += len(prompt)
    elif isinstance(prompt, list):
        total += sum(len(p) for p in prompt if isinstance(p, str))
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(part["text"]) for part in content
                             if isinstance(part, dict) and isinstance(part.get("text"), str))
    return total


def routed_fields(body: bytes) -> RoutedFields | None:
    """The body's routed fields; None where it is not a JSON object. The decoded JSON never
    leaves this call."""
    try:
        payload = strict_json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(payload, dict):
        return None
    text = prompt_text(payload)
    # A longer text is cut (a copy): the uncut one goes with the payload.
    return RoutedFields(payload.get("stream") is True, prompt_chars(payload),
                        text[:PREFIX_CHARS], len(text))
