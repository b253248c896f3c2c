"""What a request's head alone says is wrong with it, as its answer (pure): the protocol's
rules a front door enforces before it routes anything (RFC 9112)."""

from __future__ import annotations

import re

from glm_operator.gateway.wire.messages import Response, error_response

# RFC 9110 7.2: Host = uri-host [ ":" port ]; uri-host an IP literal in brackets, or a
# reg-name / IPv4 address (RFC 3986 3.2.2: unreserved, pct-encoded, sub-delims), possibly
# empty. Anything else (spaces, control characters, a path, userinfo) is 400.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(?::[0-9]*)?")


def valid_host(host: str | None) -> bool:
    return host is None or _HOST.fullmatch(host) is not None


def head_fault(fault: str | None, http11: bool, method: str, headers: dict[str, str]
               ) -> Response | None:
    """`fault`: what the header callbacks found already (a doubled Host, ...)."""
    if fault is not None:
        return error_response(400, fault, "bad_request")
    if http11 and "host" not in headers:
        return error_response(400, "An HTTP/1.1 request must carry a Host header "
                                   "(RFC 9112 3.2).", "bad_request")
    host = headers.get("host")
    if host is not None and not valid_host(host):
        shown = repr(host[:64]) + ("..." if len(host) > 64 else "")
        return error_response(400, f"The Host header {shown} is not host[:port] "
                                   "(RFC 9110 7.2).", "bad_request")
    coding = headers.get("transfer-encoding")
    if coding is not None:
        if not http11:
            return error_response(400, "An HTTP/1.0 request cannot use Transfer-Encoding "
                                       "(RFC 9112 6.1).", "bad_request")
        if coding.strip().lower() != "chunked":
            return error_response(501, f"Transfer-Encoding {coding!r} is not implemented: "
                                       "send the body with Content-Length, or with "
                                       "Transfer-Encoding: chunked alone.",
                                  "not_implemented")
    if method == "CONNECT":
        return error_response(405, "CONNECT is not served: this is an OpenAI-compatible "
                                   "API, not a proxy.", "method_not_allowed",
                              headers={"Allow": "GET, HEAD, POST"})
    return None
