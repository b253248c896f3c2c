"""POST /convert: apiextensions.k8s.io/v1 ConversionReview over HTTPS, in every replica.

The API server calls the webhook whenever it reads or writes a GLMService at a version other
than the one it is stored at (a v1alpha1 object stored before the upgrade, read at
v1alpha2 by the operator; a v1alpha1 manifest applied by Argo CD). It may call any endpoint
of the Service, so followers serve it as well as the leader: the server starts before
leader election, next to the metrics server, and stops only with the process.

Why the standard library and not aiohttp: each connection is bounded as a whole (TLS
handshake, head and body together within `Limits.connection_seconds`, enforced by a timer
that shuts the socket down, so a client trickling one byte at a time is cut too), the
number of connections is capped, each serves one request (`Connection: close`), and a
request body is refused above `Limits.max_body_bytes` before a byte of it is read. A
thread per connection, at most `max_connections` of them, is plenty for a caller that is the
API server.

The answer's shape (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/
custom-resource-definition-versioning/#response):

- a review it could read: HTTP 200, `response.uid` echoed, `result.status` Success with
  `convertedObjects` in the order given, or Failure with a message (the API server returns
  that message to whoever read the object);
- a request it could not read (not JSON, not a ConversionReview, too large, no
  Content-Length): HTTP 400/411/413 with a ConversionReview whose result is a Failure that
  says why (the API server logs it).

The certificate and key are files (a mounted Secret): they are read again when they change,
checked at most every `Limits.reload_seconds`, so a rotation (cert-manager, or the chart's
own after `helm upgrade`) needs no restart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from glm_operator.wellknown import GROUP

log = logging.getLogger("glm_operator.webhook")

REVIEW_API_VERSION = "apiextensions.k8s.io/v1"
PATH = "/convert"
HEALTH_PATH = "/healthz"
MiB = 1024 * 1024

REVIEWS = Counter(
    "glm_operator_conversion_reviews_total",
    "ConversionReviews answered by this replica's webhook, by result: Success, Failure (a "
    "review read but not converted), refused (a request that was not a readable review)",
    ["result"],
)
CONVERTED = Counter(
    "glm_operator_conversion_objects_total",
    "Objects converted by the webhook, by the version asked for",
    ["desired_version"],
)


Convert = Callable[[dict[str, Any], str], dict[str, Any]]


@dataclass(frozen=True)
class Converter:
    """What the server converts with: the pure function and the versions it serves."""

    convert: Convert
    served_versions: tuple[str, ...]

    @classmethod
    def default(cls) -> Converter:
        # Imported here so that the server and its tests stand without it.
        from glm_operator.api import conversion  # type: ignore[attr-defined,unused-ignore]

        return cls(conversion.convert, tuple(conversion.SERVED_VERSIONS))


@dataclass(frozen=True)
class Limits:
    # The API server sends one object per review when it decodes from etcd (at most etcd's
    # 1.5 MiB) and a list's objects together in a few paths; 8 MiB leaves room for both.
    max_body_bytes: int = 8 * MiB
    # Handshake, head and body of one request together. The API server gives a conversion
    # webhook 30 s in all, and sends the whole review at once.
    connection_seconds: float = 10.0
    # Connections served at once; more are closed unanswered (the API server retries).
    max_connections: int = 32
    # How often the certificate and key files are checked for a rotation.
    reload_seconds: float = 10.0


class _Certificate:
    """An SSLContext that follows the certificate and key files."""

    def __init__(self, cert_file: Path, key_file: Path, reload_seconds: float) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.reload_seconds = reload_seconds
        self._lock = threading.Lock()
        self._stamp = self._files_stamp()
        self._context = self._load()
        self._checked = time.monotonic()

    def _files_stamp(self) -> tuple[float, float, int, int]:
        cert, key = os.stat(self.cert_file), os.stat(self.key_file)
        return (cert.st_mtime, key.st_mtime, cert.st_ino, key.st_ino)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def context(self) -> ssl.SSLContext:
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= self.reload_seconds:
                self._checked = now
                try:
                    stamp = self._files_stamp()
                    if stamp != self._stamp:
                        self._context, self._stamp = self._load(), stamp
                        log.info("conversion webhook: certificate reloaded from %s",
                                 self.cert_file)
                except (OSError, ssl.SSLError) as exc:
                    # Half-written during a rotation: keep serving the previous pair.
                    log.warning("conversion webhook: certificate not reloaded: %s", exc)
            return self._context


# --- the review, without sockets ------------------------------------------------------------


def _failure(uid: str, message: str) -> dict[str, Any]:
    return {"apiVersion": REVIEW_API_VERSION, "kind": "ConversionReview",
            "response": {"uid": uid, "convertedObjects": [],
                         "result": {"status": "Failure", "message": message}}}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _object_name(obj: Any) -> str:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        return "<no metadata>"
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"[:300]


def _identity_changed(before: dict[str, Any], after: Any, desired: str) -> str:
    """What a conversion may not change (the API server checks it too), or ''."""
    if not isinstance(after, dict):
        return "the object into a non-object"
    if after.get("apiVersion") != desired:
        return f"apiVersion to {str(after.get('apiVersion'))[:100]!r}, not {desired}"
    if after.get("kind") != before.get("kind"):
        return "kind"
    old, new = before.get("metadata") or {}, after.get("metadata") or {}
    for key in ("name", "namespace", "uid", "resourceVersion", "generation"):
        if old.get(key) != new.get(key):
            return f"metadata.{key}"
    return ""


def answer_review(body: bytes, converter: Converter) -> tuple[HTTPStatus, dict[str, Any]]:
    """The HTTP status and ConversionReview answering `body`. Never raises."""
    try:
        review = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        REVIEWS.labels("refused").inc()
        return HTTPStatus.BAD_REQUEST, _failure("", f"the request is not JSON: {exc}"[:500])
    request = review.get("request") if isinstance(review, dict) else None
    if (not isinstance(review, dict) or review.get("kind") != "ConversionReview"
            or review.get("apiVersion") != REVIEW_API_VERSION or not isinstance(request, dict)):
        REVIEWS.labels("refused").inc()
        return HTTPStatus.BAD_REQUEST, _failure(
            "", f"expected a {REVIEW_API_VERSION} ConversionReview with a request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > 256:
        REVIEWS.labels("refused").inc()
        return HTTPStatus.BAD_REQUEST, _failure("", "request.uid must be a non-empty string")

    desired = request.get("desiredAPIVersion")
    objects = request.get("objects")
    served = [f"{GROUP}/{version}" for version in converter.served_versions]
    if desired not in served:
        REVIEWS.labels("Failure").inc()
        return HTTPStatus.OK, _failure(
            uid, f"desiredAPIVersion {str(desired)[:100]!r} is not served here: "
                 f"{', '.join(served)}")
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        REVIEWS.labels("Failure").inc()
        return HTTPStatus.OK, _failure(uid, "request.objects must be a list of objects")

    converted = []
    for obj in objects:
        if obj.get("apiVersion") not in served:
            REVIEWS.labels("Failure").inc()
            return HTTPStatus.OK, _failure(
                uid, f"{_object_name(obj)}: apiVersion {str(obj.get('apiVersion'))[:100]!r} "
                     f"is not served here: {', '.join(served)}")
        try:
            result = converter.convert(obj, desired)
            changed = _identity_changed(obj, result, desired)
            if changed:
                # The API server would refuse the whole review; say which object and why.
                REVIEWS.labels("Failure").inc()
                return HTTPStatus.OK, _failure(
                    uid, f"{_object_name(obj)}: the conversion changed {changed}")
            converted.append(result)
        except ValueError as exc:  # ConversionError and its kin: the input cannot convert
            REVIEWS.labels("Failure").inc()
            return HTTPStatus.OK, _failure(
                uid, f"{_object_name(obj)} cannot be converted to {desired}: {exc}"[:2000])
        except Exception as exc:  # a bug in the conversion must not take the server down
            log.exception("conversion webhook: converting %s to %s failed",
                          _object_name(obj), desired)
            REVIEWS.labels("Failure").inc()
            return HTTPStatus.OK, _failure(
                uid, f"{_object_name(obj)}: internal error converting to {desired}: "
                     f"{type(exc).__name__}")
    REVIEWS.labels("Success").inc()
    CONVERTED.labels(desired.rsplit("/", 1)[1]).inc(len(converted))
    return HTTPStatus.OK, {"apiVersion": REVIEW_API_VERSION, "kind": "ConversionReview",
                           "response": {"uid": uid, "convertedObjects": converted,
                                        "result": {"status": "Success"}}}


# --- HTTPS ----------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "glm-operator-webhook"
    sys_version = ""

    def do_POST(self) -> None:
        limits = self.server.limits
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            REVIEWS.labels("refused").inc()
            self._send(HTTPStatus.LENGTH_REQUIRED,
                       _failure("", "a Content-Length is required"), close=True)
            return
        length_header = self.headers.get("Content-Length", "")
        if not length_header.isdigit():
            REVIEWS.labels("refused").inc()
            self._send(HTTPStatus.LENGTH_REQUIRED,
                       _failure("", "a Content-Length is required"), close=True)
            return
        length = int(length_header)
        if length > limits.max_body_bytes:
            REVIEWS.labels("refused").inc()
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _failure(
                "", f"the request body of {length} bytes is over this webhook's bound of "
                    f"{limits.max_body_bytes} bytes"), close=True)
            return
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True  # the client went away mid-body
            return
        if self.path.split("?", 1)[0] != PATH:
            # After the body: closing with unread bytes would reset the connection under
            # the answer.
            self._send(HTTPStatus.NOT_FOUND, _failure("", f"POST {PATH} only"), close=True)
            return
        status, review = answer_review(body, self.server.converter)
        self._send(status, review, close=True)

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == HEALTH_PATH:
            body = b"ok\n"
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(body)
            return
        self._send(HTTPStatus.NOT_FOUND, _failure("", f"POST {PATH} only"), close=True)

    def _send(self, status: HTTPStatus, review: dict[str, Any], *, close: bool) -> None:
        body = json.dumps(review, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            # One request per connection: the connection's deadline is then the request's,
            # and a client never sends on a connection the server is about to close.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("conversion webhook: %s " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Accept connections as fast as they come; the cap below closes what is over it.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], certificate: _Certificate,
                 converter: Converter, limits: Limits) -> None:
        self.certificate, self.converter, self.limits = certificate, converter, limits
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            REVIEWS.labels("refused").inc()
            with contextlib.suppress(OSError):
                request.close()
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # One deadline for the whole connection: the timer shuts the connection down, which
        # wakes any read or handshake still waiting on it. It holds a duplicate of the
        # socket: wrapping it in TLS detaches the original object from the connection.
        handle: socket.socket | None = None
        deadline: threading.Timer | None = None
        try:
            handle = request.dup()
            deadline = threading.Timer(self.limits.connection_seconds, _shutdown, (handle,))
            deadline.daemon = True
            deadline.start()
            request.settimeout(self.limits.connection_seconds)
            tls = self.certificate.context().wrap_socket(request, server_side=True)
            try:
                self.finish_request(tls, client_address)
            finally:
                with contextlib.suppress(OSError):
                    tls.close()
        except (OSError, ssl.SSLError, ValueError):
            pass  # a failed handshake, a reset or a cut connection: nothing to answer
        except Exception:
            log.exception("conversion webhook: connection from %s failed", client_address)
        finally:
            if deadline is not None:
                deadline.cancel()
            with contextlib.suppress(OSError):
                request.close()
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()
            self._slots.release()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class WebhookServer:
    """The HTTPS server in a thread of its own: `start()`, then `stop()` (or a with block)."""

    def __init__(self, host: str, port: int, cert_file: Path, key_file: Path,
                 converter: Converter | None = None, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        certificate = _Certificate(cert_file, key_file, self.limits.reload_seconds)
        self._server = _Server((host, port), certificate, converter or Converter.default(),
                               self.limits)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> WebhookServer:
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="glm-conversion-webhook", daemon=True)
        self._thread.start()
        log.info("conversion webhook: serving https on port %d%s", self.port, PATH)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> WebhookServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
