"""OpenAI's server-sent events, as the gateway follows them: where a stream ends, what its
last events carry, and its text for the audit log.

Both stream paths (the transport-level relay, wire/relay.py, and aiohttp's client for the
rest) keep their books here, one `StreamCapture` per streamed answer: what the client was
sent, for the time to first token, the token counts, the 499 and the audit text.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Sequence

STREAM_END = b"data: [DONE]"  # the OpenAI stream's last event (llama-server and vLLM)
EVENT = b"data: "
TAIL_EVENTS = 4  # the last chunks kept: usage / timings always fit in these


class StreamCapture:
    """What is kept of a streamed answer as it reaches the client, for usage, limits and the
    audit log. `note` runs once per packet relayed, after its write."""

    __slots__ = ("count_events", "delivered", "events", "everything", "first_at", "keep_all",
                 "tail")

    def __init__(self, count_events: bool = False, keep_all: bool = False) -> None:
        self.count_events = count_events  # count `data: ` lines (a client that leaves is
        self.keep_all = keep_all  # charged by them); keep every chunk (the audit's text)
        self.tail: deque[bytes] = deque(maxlen=TAIL_EVENTS)
        self.everything: list[bytes] = []
        self.events = 0  # `data: ` lines relayed, when count_events
        self.delivered = False  # the stream's last event reached the client's socket
        self.first_at: float | None = None  # perf_counter() of the first body bytes relayed

    def note(self, pieces: Sequence[bytes]) -> None:
        if self.first_at is None:
            self.first_at = time.perf_counter()
        for piece in pieces:
            self.tail.append(piece)
            if self.count_events:
                self.events += piece.count(EVENT)
            if self.keep_all:
                self.everything.append(piece)
            if STREAM_END in piece:
                self.delivered = True

    def last_events(self) -> bytes:
        return b"".join(self.tail)

    def text(self) -> str:
        return stream_text(b"".join(self.everything))


def error_event(message: str, code: str) -> bytes:
    """The event that ends a stream the engine broke off, as OpenAI's API ends a stream that
    failed: without it the client sees a stream that simply ends, and cannot tell a cut-off
    answer from a whole one (there is no `data: [DONE]` after it)."""
    return EVENT + json.dumps({"error": {"message": message, "type": "server_error",
                                         "param": None, "code": code}}).encode() + b"\n\n"


def stream_text(data: bytes) -> str:
    """Join the deltas of an SSE stream (only for the audit log with text enabled)."""
    parts: list[str] = []
    for line in data.split(b"\n"):
        if not line.startswith(EVENT) or line == STREAM_END:
            continue
        try:
            choices = json.loads(line[len(EVENT):]).get("choices") or []
        except ValueError:
            continue
        for choice in choices:
            delta = choice.get("delta", {}).get("content") if "delta" in choice else choice.get(
                "text")
            if isinstance(delta, str):
                parts.append(delta)
    return "".join(parts)
