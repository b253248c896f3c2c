"""Request parsing and validation: pure, so it is fuzzed without a server.

Every rejection is a 400 whose `param` names the field (`messages[2].role`, `temperature`).
Fields we do not know pass through untouched: engines accept extensions (llama.cpp `top_k`,
`ignore_eos`, vLLM `guided_json`) and refusing them would break clients for no safety gain.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from glm_operator.gateway.openai import strict_json
from glm_operator.gateway.openai.errors import GatewayError, invalid

Endpoint = Literal["chat", "completions"]
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_STOP_SEQUENCES = 16
MAX_TOKENS_LIMIT = 10_000_000


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the pipeline keeps of a valid request. Not the parsed JSON: a decoded body costs
    about 15 times its bytes (every string and list a Python object), and a request may run
    for minutes, so only these few fields outlive the parse."""

    body: bytes  # what goes to the engine: the client's bytes unless we changed a field
    stream: bool
    max_tokens: int | None = None  # max_tokens, else max_completion_tokens, as asked
    prompt: Any = None  # messages or prompt, only when asked for (audit with text)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number_in(payload: dict[str, Any], name: str, low: float, high: float) -> None:
    value = payload.get(name)
    if value is None:
        return
    if not _is_number(value):
        raise invalid(name, f"'{name}' must be a number between {low:g} and {high:g}.",
                      "invalid_type")
    if not low <= value <= high:
        raise invalid(name, f"'{name}' is {value!r}; it must be between {low:g} and {high:g}.")


def _int_in(payload: dict[str, Any], name: str, low: int, high: int) -> None:
    value = payload.get(name)
    if value is None:
        return
    if not _is_int(value):
        raise invalid(name, f"'{name}' must be an integer.", "invalid_type")
    if not low <= value <= high:
        raise invalid(name, f"'{name}' is {value}; it must be between {low} and {high}.")


def _check_common(payload: dict[str, Any]) -> bool:
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "'model' must be a string.", "invalid_type")
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", "'stream' must be true or false.", "invalid_type")
    _number_in(payload, "temperature", 0.0, 2.0)
    _number_in(payload, "top_p", 0.0, 1.0)
    _number_in(payload, "presence_penalty", -2.0, 2.0)
    _number_in(payload, "frequency_penalty", -2.0, 2.0)
    _int_in(payload, "max_tokens", 1, MAX_TOKENS_LIMIT)
    _int_in(payload, "max_completion_tokens", 1, MAX_TOKENS_LIMIT)
    _int_in(payload, "top_logprobs", 0, 20)
    _int_in(payload, "seed", -(2**63), 2**64 - 1)
    n = payload.get("n")
    if n is not None:
        if not _is_int(n):
            raise invalid("n", "'n' must be an integer.", "invalid_type")
        if n != 1:
            raise invalid("n", f"'n' is {n}; this endpoint returns exactly one choice, "
                               "so n must be 1.")
    options = payload.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("stream_options", "'stream_options' must be an object.", "invalid_type")
        if not stream:
            raise invalid("stream_options",
                          "'stream_options' is only allowed when 'stream' is true.")
    stop = payload.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            pass
        elif isinstance(stop, list):
            if len(stop) > MAX_STOP_SEQUENCES:
                raise invalid("stop", f"'stop' has {len(stop)} entries; at most "
                                      f"{MAX_STOP_SEQUENCES} are allowed.")
            for index, item in enumerate(stop):
                if not isinstance(item, str) or not item:
                    raise invalid(f"stop[{index}]", f"'stop[{index}]' must be a non-empty string.",
                                  "invalid_type")
        else:
            raise invalid("stop", "'stop' must be a string or a list of strings.", "invalid_type")
    return bool(stream)


def _check_content_parts(parts: list[Any], where: str) -> None:
    for index, part in enumerate(parts):
        here = f"{where}[{index}]"
        if not isinstance(part, dict):
            raise invalid(here, f"'{here}' must be an object.", "invalid_type")
        if not isinstance(part.get("type"), str):
            raise invalid(f"{here}.type", f"'{here}.type' must be a string.", "invalid_type")


def _check_messages(payload: dict[str, Any]) -> None:
    messages = payload.get("messages")
    if messages is None:
        raise invalid("messages", "'messages' is required.", "missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid("messages", "'messages' must be a list.", "invalid_type")
    if not messages:
        raise invalid("messages", "'messages' must contain at least one message.")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid(where, f"'{where}' must be an object.", "invalid_type")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise invalid(f"{where}.role", f"'{where}.role' must be one of "
                                           f"{sorted(CHAT_ROLES)}, got {role!r}.")
        content = message.get("content")
        if content is None:
            if role != "assistant":
                raise invalid(f"{where}.content", f"'{where}.content' is required.",
                              "missing_required_parameter")
        elif isinstance(content, list):
            _check_content_parts(content, f"{where}.content")
        elif not isinstance(content, str):
            raise invalid(f"{where}.content",
                          f"'{where}.content' must be a string or a list of content parts.",
                          "invalid_type")


def _check_prompt(payload: dict[str, Any]) -> None:
    prompt = payload.get("prompt")
    if prompt is None:
        raise invalid("prompt", "'prompt' is required.", "missing_required_parameter")
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt) or all(_is_int(p) for p in prompt):
            return
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            return
    raise invalid("prompt", "'prompt' must be a string, a list of strings or a list of token ids.",
                  "invalid_type")


def merge_stop(user: Any, model_stops: tuple[str, ...]) -> list[str]:
    """The client's stop sequences followed by the model's, without duplicates."""
    merged: list[str] = [user] if isinstance(user, str) else list(user or [])
    for stop in model_stops:
        if stop not in merged:
            merged.append(stop)
    return merged


def parse_request(body: bytes, endpoint: Endpoint,
                  model_stops: tuple[str, ...] = (), keep_prompt: bool = False,
                  served_model: str = "") -> ParsedRequest:
    """Validate a request body; return the bytes to send to the engine and the few fields the
    pipeline needs (the prompt itself only with `keep_prompt`).

    `served_model` is the name the engine serves (vLLM's --served-model-name, the service's
    name): whatever `model` the client names (`glm-5`, the Hub id, nothing), the engine gets
    that one. vLLM answers 404 to any other name; llama-server ignores the field."""
    try:
        payload = strict_json.loads(body)
    except strict_json.NotInteroperable as exc:
        raise GatewayError(400, f"The request body is not JSON an engine takes: {exc}",
                           "invalid_request_error", exc.param, "invalid_json") from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise GatewayError(400, f"The request body is not valid JSON: {exc}",
                           "invalid_request_error", None, "invalid_json") from None
    if not isinstance(payload, dict):
        raise GatewayError(400, "The request body must be a JSON object.",
                           "invalid_request_error", None, "invalid_json")
    stream = _check_common(payload)
    if endpoint == "chat":
        _check_messages(payload)
    else:
        _check_prompt(payload)
    changed = False
    if served_model and payload.get("model") != served_model:
        payload["model"] = served_model
        changed = True
    if model_stops:
        merged = merge_stop(payload.get("stop"), model_stops)
        if merged != payload.get("stop"):
            payload["stop"] = merged
            changed = True
    if changed:
        body = json.dumps(payload, separators=(",", ":")).encode()
    max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens"))
    prompt = payload.get("messages" if endpoint == "chat" else "prompt") if keep_prompt \
        else None
    return ParsedRequest(body, stream, max_tokens if _is_int(max_tokens) else None, prompt)
