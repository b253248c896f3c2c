"""What the gateway's HTTP server hands a handler and takes back: the parsed request, the
answer (whole, or written by the handler itself), and the routes (http.py parses and
answers; server.py listens)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from glm_operator.gateway.wire.http import HttpConnection


@dataclass(slots=True)
class Request:
    method: str
    path: str  # without the query string
    version: tuple[int, int]
    headers: dict[str, str]  # lower-case names; repeated headers joined by ", "
    connection: HttpConnection
    body: bytes = b""
    too_large: bool = False  # the body passed the limit: not kept, and the connection closes
    keep_alive: bool = True  # what the client asked (HTTP version and Connection header)
    key_id: str | None = None  # the API key's id, when a head check found it (proxy.py)
    # The server's own: the route's handler, the answer when the server refused the request
    # itself, and the bytes it counts in the server's buffered total.
    handler: Handler | None = None
    refusal: Response | None = None
    held: int = 0

    @property
    def transport(self) -> asyncio.Transport:
        return self.connection.transport

    @property
    def http11(self) -> bool:
        return self.version >= (1, 1)

    async def drain(self) -> None:
        await self.connection.drain()

    def write_now(self, response: Response) -> Streamed:
        """Write a whole answer at once, from a callback that has it (an engine's answer,
        the moment it is parsed) rather than from the handler's return; the handler then
        returns what this returns. The handler's turn to write: answers go out in order."""
        return self.connection.write_now(self, response)


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # Work that may wait until the answer is on its way (metrics, audit, charging a key's
    # budget): run right after the write, before the connection's next request.
    after: Callable[[], Awaitable[None]] | None = None
    # An error answer's code (error_response), which a refusal is counted by.
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Streamed:
    """What a handler returns when it wrote its answer itself (a relayed stream).
    `complete`: the body's framing was finished, so the connection can serve another request."""

    complete: bool


Handler = Callable[[Request], Awaitable[Response | Streamed]]
# Sees a request once its head is parsed, before a byte of its body is read or `100 Continue`
# is sent; a Response it returns is the answer (the body is never read, and the connection
# closes after it), None lets the request go on to its handler.
HeadCheck = Callable[[Request], Response | None]


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> Response:
    return Response(status, json.dumps(data).encode(),
                    {"Content-Type": "application/json", **(headers or {})})


def error_response(status: int, message: str, code: str,
                   type_: str = "invalid_request_error",
                   headers: dict[str, str] | None = None) -> Response:
    """The server's own refusals, in OpenAI's error shape (as openai/errors.py writes it)."""
    response = json_response({"error": {"message": message, "type": type_, "param": None,
                                        "code": code}}, status, headers)
    response.reason = code
    return response


def busy(message: str, code: str) -> Response:
    return error_response(503, message, code, "server_error", {"Retry-After": "1"})


# The reasons a server's own refusal is counted by (HttpServer.on_refusal): the codes the
# wire layer and the head checks answer with, and the 401 of a key check. Anything else is
# counted as "other", so a label's values stay few whatever a handler returns.
REFUSAL_REASONS = ("too_many_connections", "server_busy", "shutting_down", "request_timeout",
                   "request_header_fields_too_large", "bad_request",
                   "http_version_not_supported", "not_implemented", "method_not_allowed",
                   "invalid_api_key", "other")
# What a refusal is reported with: its status, its reason (REFUSAL_REASONS) and the request
# when there was one (None: refused at the connection, before a head).
RefusalHook = Callable[[int, str, "Request | None"], None]


SHUTTING_DOWN = ("The gateway is shutting down: send the request again (another replica "
                 "answers it).", "shutting_down")


class Router:
    """Exact (method, path) routes; anything else goes to the fallback."""

    def __init__(self, fallback: Handler) -> None:
        self._routes: dict[tuple[str, str], tuple[Handler, HeadCheck | None]] = {}
        self._fallback: tuple[Handler, HeadCheck | None] = (fallback, None)

    def add(self, method: str, path: str, handler: Handler,
            head_check: HeadCheck | None = None) -> None:
        self._routes[(method, path)] = (handler, head_check)

    def route(self, method: str, path: str) -> tuple[Handler, HeadCheck | None]:
        return self._routes.get((method, path)) or self._fallback

    def find(self, method: str, path: str) -> Handler:
        return self.route(method, path)[0]
