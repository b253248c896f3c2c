"""The request pipeline, composed once: authenticate -> admit -> parse -> upstream ->
overflow -> account.

The hot path is deliberately thin because the gateway shares CPU cores with the engine, and
after the engine's wait every line of it runs cold: the body is parsed once for validation
and sent on as the client's own bytes (re-encoded only when the model's stop sequences must
be added), a whole answer is written to the client from the engine connection's callback
(upstream.py), a stream is relayed at the transport level, token counts come from a scan of
the last bytes (openai/usage.py), and metrics, audit and the key's charge wait until the
answer is written.
"""

from __future__ import annotations

import asyncio
import functools
import random
import re
import time
from collections.abc import Mapping

from glm_operator.gateway.call import Call
from glm_operator.gateway.openai import errors
from glm_operator.gateway.openai.errors import GatewayError
from glm_operator.gateway.openai.usage import context_overflow
from glm_operator.gateway.openai.validation import Endpoint, ParsedRequest, parse_request
from glm_operator.gateway.policy.accounting import tokens_to_charge, tokens_to_reserve
from glm_operator.gateway.policy.audit import CLIENT_CLOSED, AuditLog, AuditRecord
from glm_operator.gateway.policy.keys import ApiKeyStore
from glm_operator.gateway.policy.limits import KeyLimits
from glm_operator.gateway.policy.metrics import GatewayMetrics
from glm_operator.gateway.policy.outcomes import request_outcome
from glm_operator.gateway.pools.activity import ActivityMarker
from glm_operator.gateway.pools.overflow import Overflow
from glm_operator.gateway.upstream import JSON, Upstream, UpstreamAnswer
from glm_operator.gateway.wire.messages import Request, Response, Streamed

ANONYMOUS = "anonymous"
Answer = Response | Streamed


# A client's X-Request-Id is kept when it is a plain token of at most 128 characters: it is
# echoed in a header and written to the audit log, so anything else (60 KB of it, control
# characters, a second id joined by ", ") gets a fresh id instead.
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")


def request_id() -> str:
    # A name for the logs, not a secret: no system call for randomness on the hot path.
    return f"{random.getrandbits(64):016x}"


def client_request_id(headers: Mapping[str, str]) -> str:
    """The client's X-Request-Id when it is a plain token, else a new id."""
    given = headers.get("x-request-id")
    if given is not None and _CLIENT_REQUEST_ID.fullmatch(given):
        return given
    return request_id()


def authenticate(keys: ApiKeyStore | None, headers: Mapping[str, str]) -> str:
    """The id of the request's key (ANONYMOUS where no keys are configured), else the 401
    raised: no key in the Bearer form, or one not among `keys`. The pods' gateways and the
    router check keys with this, alike."""
    if keys is None:
        return ANONYMOUS
    scheme, _, key = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise errors.unauthorized(
            "Missing API key: send it as 'Authorization: Bearer <key>'."
        )
    key_id = keys.check(key.strip())
    if key_id is None:
        raise errors.unauthorized("Incorrect API key provided.", bad_key=True)
    return key_id


def error_response(err: GatewayError, rid: str) -> Response:
    headers = {"Content-Type": JSON, **err.headers()}
    if rid:
        headers["X-Request-Id"] = rid
    return Response(err.status, err.body(), headers, reason=err.code)


class Proxy:
    """`whole` answers and `streams` come from this pod's engine, each over the client that
    serves it best (upstream.py); a refusal for the context's size goes to `overflow`."""

    def __init__(self, whole: Upstream, streams: Upstream, overflow: Overflow,
                 keys: ApiKeyStore | None, limits: KeyLimits | None, audit: AuditLog,
                 metrics: GatewayMetrics, max_body_bytes: int, stop_sequences: tuple[str, ...],
                 context_length: int, engine_slots: int, relayed: Upstream | None = None,
                 max_in_flight_per_key: int = 0, first_token_overdue: float = 0.0,
                 request_overdue: float = 0.0, served_model: str = "") -> None:
        self.whole = whole
        self.streams = streams
        self.relayed = relayed  # streams to HTTP/1.1 clients, where the relay applies
        self.overflow = overflow
        self.keys = keys
        self.limits = limits
        self.audit = audit
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.stop_sequences = stop_sequences
        self.served_model = served_model  # what every request names to the engine
        # 0: unknown until the warm-up reads them from the engine (app.py)
        self.context_length = context_length
        self.engine_slots = engine_slots
        self.activity: ActivityMarker | None = None  # long-context pool: renews its Lease
        self.max_in_flight_per_key = max_in_flight_per_key  # 0: unlimited
        self.key_in_flight: dict[str, int] = {}  # only keys with requests running
        self.first_token_overdue = first_token_overdue  # 0: never
        self.request_overdue = request_overdue  # 0: never
        self.running: dict[int, Call] = {}  # id -> call, only while overdue is watched
        self.in_flight = 0
        self.at_engine = 0

    def queued_now(self) -> float:
        """Requests waiting: held for the long-context pool's wake, or beyond the engine's
        slots (the engine queues those itself)."""
        over_slots = max(0, self.at_engine - self.engine_slots) if self.engine_slots else 0
        return over_slots + self.overflow.held

    def overdue_now(self) -> float:
        """Requests running longer than they may (read when scraped): streams with no first
        byte of answer after first_token_overdue, or any running longer than
        request_overdue."""
        now = time.perf_counter()
        first, whole = self.first_token_overdue, self.request_overdue
        count = 0
        for call in self.running.values():
            age = now - call.started
            # The first-token bound is for streams: a whole answer's first byte is its end.
            if (whole and age > whole) or (first and age > first and call.record.stream
                                           and not call.had_first_byte()):
                count += 1
        return count

    def authenticate(self, request: Request) -> str:
        return authenticate(self.keys, request.headers)

    def refuse_unauthenticated(self, request: Request) -> Response | None:
        """The check of a request's head, before its body is read (wire/http.py): a request
        without a valid key is answered 401 before a byte of its body is buffered, and gets
        no `100 Continue`. The key found is kept on the request for the pipeline."""
        try:
            request.key_id = self.authenticate(request)
        except GatewayError as err:
            return error_response(err, client_request_id(request.headers))
        return None

    def refused(self, status: int, reason: str, request: Request | None) -> None:
        """A refusal of the HTTP server's own (wire/server.py `on_refusal`): counted, and,
        where a key is known (a cap or a timeout after the head check passed), audited as
        the key's request."""
        self.metrics.record_refusal(status, reason)
        if request is None or not request.key_id or not self.audit.enabled:
            return
        endpoint: Endpoint = "completions" if request.path == "/v1/completions" else "chat"
        self.audit.write(AuditRecord(request_id=client_request_id(request.headers),
                                     endpoint=endpoint, key_id=request.key_id, status=status,
                                     error_code=reason))

    def _take_key_slot(self, call: Call) -> None:
        """One more request running for its key, or the 429 when it has its most."""
        key_id = call.record.key_id
        running = self.key_in_flight.get(key_id, 0)
        if running >= self.max_in_flight_per_key:
            raise errors.too_many_in_flight(self.max_in_flight_per_key)
        self.key_in_flight[key_id] = running + 1
        call.holds_key_slot = True

    def _free_key_slot(self, call: Call) -> None:
        key_id = call.record.key_id
        running = self.key_in_flight.get(key_id, 1) - 1
        if running > 0:
            self.key_in_flight[key_id] = running
        else:
            self.key_in_flight.pop(key_id, None)  # idle keys take no memory
        call.holds_key_slot = False

    async def chat_completions(self, request: Request) -> Answer:
        return await self.handle(request, "chat", "/v1/chat/completions")

    async def completions(self, request: Request) -> Answer:
        return await self.handle(request, "completions", "/v1/completions")

    async def handle(self, request: Request, endpoint: Endpoint, path: str) -> Answer:
        started = time.perf_counter()
        rid = client_request_id(request.headers)
        call = Call(AuditRecord(request_id=rid, endpoint=endpoint), started)
        record = call.record
        self.in_flight += 1
        if self.first_token_overdue or self.request_overdue:
            self.running[id(call)] = call
        try:
            try:
                record.key_id = request.key_id or self.authenticate(request)
                if self.max_in_flight_per_key:
                    self._take_key_slot(call)
                if self.limits is not None:
                    call.shared_admission = await self.limits.admit(record.key_id)
                if request.too_large:
                    raise errors.too_large(self.max_body_bytes)
                parsed = parse_request(request.body, endpoint, self.stop_sequences,
                                       keep_prompt=self.audit.include_text,
                                       served_model=self.served_model)
                request.body = b""  # the engine gets parsed.body; the client's copy goes
                record.stream = parsed.stream
                record.prompt = parsed.prompt
                call.request_bytes = len(parsed.body)
                call.max_tokens = parsed.max_tokens
                if self.limits is not None and self.limits.limits.tokens_per_minute > 0:
                    await self._reserve(call)
                response = await self._served(request, parsed, path, call)
            except GatewayError as err:
                record.error_code = err.code
                response = error_response(err, rid)
        except asyncio.CancelledError:
            # The client went away: accounted all the same.
            if record.status != 200:  # 200 here: a stream whose last event was delivered
                record.status = CLIENT_CLOSED
            await self._account(call)
            raise
        except Exception:
            record.status, record.error_code = 500, "internal"  # the server answers 500
            await self._account(call)
            raise
        if isinstance(response, Streamed):
            record.status = record.status or 200  # a stream may have set 499
            await self._account(call)
        else:
            # Metrics, audit and the key's charge wait until the answer is written: none of
            # it is the client's time.
            record.status = record.status or response.status
            response.after = functools.partial(self._account, call)
        return response

    async def _served(self, request: Request, parsed: ParsedRequest, path: str, call: Call
                      ) -> Answer:
        """A valid request, answered: in the long-context pool, activity that keeps the pool
        awake while it runs (its Lease is renewed, throttled)."""
        if self.activity is None:
            return await self._forward(request, parsed, path, call)
        self.activity.begin()
        try:
            return await self._forward(request, parsed, path, call)
        finally:
            self.activity.end()

    async def _forward(self, request: Request, parsed: ParsedRequest, path: str, call: Call
                       ) -> Answer:
        """This pod's engine answers; the one place where a refusal for the context's size
        sends the request on to the long-context pool."""
        if not parsed.stream:
            upstream = self.whole
        elif request.http11 and self.relayed is not None:
            upstream = self.relayed
        else:
            upstream = self.streams
        self.at_engine += 1
        try:
            reply = await upstream.send(request, parsed, path, call)
        finally:
            self.at_engine -= 1
        if isinstance(reply, Streamed):
            return reply
        if reply.sent is not None:
            call.whole_answer(reply.status, reply.body, self.audit.include_text)
            return reply.sent
        overflow = context_overflow(reply.status, reply.body)
        if overflow is None:
            return self._passed_on(reply, call)
        call.record.overflow = True
        n_prompt, n_ctx = overflow
        reply = await self.overflow.route(request, parsed, path, call, n_prompt,
                                          n_ctx or self.context_length or None)
        return reply if isinstance(reply, Streamed) else self._passed_on(reply, call)

    def _passed_on(self, answer: UpstreamAnswer, call: Call) -> Response:
        """A whole answer, its usage counted, to the client as the engine gave it."""
        call.whole_answer(answer.status, answer.body, self.audit.include_text)
        if answer.status >= 400:
            call.record.error_code = f"engine_{answer.status}"
        return Response(answer.status, answer.body, {"Content-Type": answer.content_type,
                                                     "X-Request-Id": call.record.request_id})

    async def _reserve(self, call: Call) -> None:
        """Take the most the request may cost from its key's budget now (accounting.py)."""
        assert self.limits is not None
        tokens = tokens_to_reserve(call, self.limits.limits.tokens_per_minute,
                                   self.context_length)
        charge = self.limits.charge(call.record.key_id, tokens)
        # Shielded as the settlement is, and counted as reserved only once taken: a client
        # that leaves meanwhile is never refunded what was not reserved.
        await (asyncio.shield(charge) if self.limits.store is not None else charge)
        call.reserved_tokens = tokens

    async def _account(self, call: Call) -> None:
        """A finished request in the metrics, the audit log and its key's token budget."""
        self.in_flight -= 1
        self.running.pop(id(call), None)
        if call.holds_key_slot:
            self._free_key_slot(call)
        record = call.record
        elapsed = time.perf_counter() - call.started
        record.duration_ms = elapsed * 1000
        self.metrics.record(record.endpoint, record.status, elapsed, record.stream,
                            None if record.ttft_ms is None else record.ttft_ms / 1000,
                            record.prompt_tokens, record.completion_tokens,
                            request_outcome(record.status, record.error_code,
                                            record.ttft_ms is not None))
        self.audit.write(record)
        if self.limits is not None:
            # Settled against the reservation: what was not used goes back. A request handed
            # over to the long-context pool is charged there, so all of it goes back.
            used = 0 if call.handed_over else tokens_to_charge(call)
            charge = self.limits.charge(record.key_id, used - call.reserved_tokens)
            # Shielded when it waits for the store: a client that went away cancels the
            # request, not its charge.
            await (asyncio.shield(charge) if self.limits.store is not None else charge)
