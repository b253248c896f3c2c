"""What a request's head alone says is wrong with it, as its answer (pure): the protocol's
rules a front door enforces before it routes anything (RFC 9112)."""

from __future__ import annotations

from glm_operator.gateway.wire.messages import Response, error_response


def head_fault(fault: str | None, http11: bool, method: str, headers: dict[str, str]
               ) -> Response | None:
    """`fault`: what the header callbacks found already (a doubled Host, ...)."""
    if fault is not None:
        return error_response(400, fault, "bad_request")
    if http11 and "host" not in headers:
        return error_response(400, "An HTTP/1.1 request must carry a Host header "
                                   "(RFC 9112 3.2).", "bad_request")
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
