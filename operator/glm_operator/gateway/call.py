"""One request's state as the pipeline (proxy.py) carries it: its audit record, which is what
gets written, and what only the pipeline needs (the charge's estimate, the shared store's
admission, the stream's books).
"""

from __future__ import annotations

from dataclasses import dataclass

from glm_operator.gateway.openai.sse import StreamCapture
from glm_operator.gateway.openai.usage import completion_text, token_counts
from glm_operator.gateway.policy.audit import CLIENT_CLOSED, AuditRecord
from glm_operator.gateway.policy.outcomes import STREAM_BROKEN


@dataclass(slots=True)
class Call:
    record: AuditRecord
    started: float  # perf_counter() when the request arrived
    # What the token budget charges when the engine's counts never arrived.
    request_bytes: int = 0
    max_tokens: int | None = None
    streamed_events: int = 0
    # Admitted by the shared rate-limit store, and handed over to the long-context pool's
    # gateway, which counts and charges it in the same store.
    shared_admission: bool = False
    handed_over: bool = False
    reserved_tokens: int = 0  # taken from the key's budget at admission (accounting.py)
    holds_key_slot: bool = False  # counted in the key's requests in flight (proxy.py)
    capture: StreamCapture | None = None  # a stream's books while it runs (upstream.py)

    def had_first_byte(self) -> bool:
        """The client has had some of the answer (a stream's first chunk)."""
        return self.capture is not None and self.capture.first_at is not None

    def whole_answer(self, status: int, body: bytes, include_text: bool) -> None:
        """A whole answer's usage (and text, for the audit log)."""
        if status == 200:
            record = self.record
            record.prompt_tokens, record.completion_tokens = token_counts(body)
            if include_text:
                record.completion = completion_text(body)

    def stream_ended(self, capture: StreamCapture, complete: bool) -> None:
        """A stream's books, however it ended (both stream paths: upstream.py)."""
        record = self.record
        if capture.first_at is not None:
            record.ttft_ms = (capture.first_at - self.started) * 1000
        self.streamed_events = capture.events
        if capture.delivered:
            # The client has the whole answer: if it hangs up before the chunked body's last
            # bytes, that is not a request it gave up on.
            record.status = 200
        if complete and not capture.delivered and record.error_code is None:
            # The engine ended the body without the stream's last event: it broke off.
            record.error_code = STREAM_BROKEN
        if capture.delivered or complete:
            record.prompt_tokens, record.completion_tokens = token_counts(capture.last_events())
        if complete and capture.keep_all:
            record.completion = capture.text()

    def client_left(self, capture: StreamCapture) -> None:
        """The client went away mid-stream (after stream_ended): a 499 unless it had it all."""
        self.stream_ended(capture, complete=False)
        if not capture.delivered:
            self.record.error_code = "client_closed"
            self.record.status = CLIENT_CLOSED
