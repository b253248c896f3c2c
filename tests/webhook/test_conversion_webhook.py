"""The conversion webhook: the ConversionReview it answers, and its HTTPS server against
hostile clients (raw sockets, bad JSON, oversized and trickled requests, too many
connections), with a stand-in conversion so that the protocol is tested on its own."""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from glm_operator.controllers import cli
from glm_operator.webhook.server import (
    Converter,
    Limits,
    WebhookServer,
    answer_review,
)

GROUP = "serving.glm-operator.dev"
V1, V2 = f"{GROUP}/v1alpha1", f"{GROUP}/v1alpha2"


class StubConversionError(ValueError):
    pass


def stub_convert(obj: dict[str, Any], desired: str) -> dict[str, Any]:
    """Moves spec.contextLength to spec.pool.contextLength and back; refuses 'bad'."""
    out = json.loads(json.dumps(obj))
    spec = out.setdefault("spec", {})
    if spec.get("bad"):
        raise StubConversionError("spec.bad cannot be expressed")
    if spec.get("explode"):
        raise KeyError("a bug")
    if spec.get("rename"):
        out["metadata"]["name"] = "renamed"
    if spec.get("stay"):
        return out
    if desired == V2 and "contextLength" in spec:
        spec["pool"] = {"contextLength": spec.pop("contextLength")}
    elif desired == V1 and "pool" in spec:
        spec["contextLength"] = spec.pop("pool")["contextLength"]
    out["apiVersion"] = desired
    return out


CONVERTER = Converter(stub_convert, ("v1alpha1", "v1alpha2"))


def review(objects: list[dict[str, Any]], desired: str = V2, uid: str = "u-1") -> bytes:
    return json.dumps({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                       "request": {"uid": uid, "desiredAPIVersion": desired,
                                   "objects": objects}}).encode()


def glms(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": V1, "kind": "GLMService",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": spec}


# --- the review ------------------------------------------------------------------------------


def test_converts_every_object_in_order_and_echoes_the_uid() -> None:
    status, answer = answer_review(
        review([glms("a", contextLength=8192), glms("b", contextLength=4096)], uid="abc"),
        CONVERTER)
    assert status == 200
    response = answer["response"]
    assert answer["kind"] == "ConversionReview"
    assert answer["apiVersion"] == "apiextensions.k8s.io/v1"
    assert response["uid"] == "abc" and response["result"] == {"status": "Success"}
    assert [o["metadata"]["name"] for o in response["convertedObjects"]] == ["a", "b"]
    assert response["convertedObjects"][1] == {
        "apiVersion": V2, "kind": "GLMService",
        "metadata": {"name": "b", "namespace": "ns", "uid": "uid-b"},
        "spec": {"pool": {"contextLength": 4096}}}


def test_an_empty_review_succeeds() -> None:
    status, answer = answer_review(review([]), CONVERTER)
    assert status == 200 and answer["response"]["result"]["status"] == "Success"
    assert answer["response"]["convertedObjects"] == []


@pytest.mark.parametrize(("objects", "desired", "says"), [
    ([glms("a", bad=True)], V2, "ns/a cannot be converted to " + V2 + ": spec.bad cannot"),
    ([glms("a", explode=True)], V2, "ns/a: internal error converting to " + V2 + ": KeyError"),
    ([glms("a", rename=True)], V2, "ns/a: the conversion changed metadata.name"),
    ([glms("a", stay=True)], V2, "ns/a: the conversion changed apiVersion to "
                                 "'serving.glm-operator.dev/v1alpha1', not " + V2),
    ([glms("a")], f"{GROUP}/v9", "'serving.glm-operator.dev/v9' is not served here"),
    ([glms("a")], "apps/v1", "'apps/v1' is not served here"),
    ([{**glms("a"), "apiVersion": "apps/v1"}], V2, "ns/a: apiVersion 'apps/v1' is not served"),
    (["a string"], V2, "request.objects must be a list of objects"),
])
def test_a_review_it_cannot_convert_is_a_failure_with_the_reason(
        objects: list[Any], desired: str, says: str) -> None:
    status, answer = answer_review(review(objects, desired, uid="x-1"), CONVERTER)
    assert status == 200
    response = answer["response"]
    assert response["uid"] == "x-1" and response["convertedObjects"] == []
    assert response["result"]["status"] == "Failure"
    assert says in response["result"]["message"]


@pytest.mark.parametrize(("body", "says"), [
    (b"", "not JSON"),
    (b"{", "not JSON"),
    (b"\xff\xfe\x00", "not JSON"),
    (b"[" * 200_000 + b"]" * 200_000, "not JSON"),  # nesting past the recursion limit
    (b'{"a": NaN}', "not JSON"),
    (b"[]", "ConversionReview"),
    (b'{"kind": "ConversionReview", "apiVersion": "apiextensions.k8s.io/v1beta1", '
     b'"request": {}}', "ConversionReview"),
    (b'{"kind": "ConversionReview", "apiVersion": "apiextensions.k8s.io/v1"}',
     "ConversionReview"),
    (b'{"kind": "ConversionReview", "apiVersion": "apiextensions.k8s.io/v1", '
     b'"request": {"uid": 7}}', "request.uid"),
], ids=["empty", "truncated", "not-utf8", "deep-nesting", "nan", "a-list", "v1beta1",
        "no-request", "uid-not-a-string"])
def test_a_request_that_is_not_a_review_is_refused(body: bytes, says: str) -> None:
    status, answer = answer_review(body, CONVERTER)
    assert status == 400
    assert answer["response"]["result"]["status"] == "Failure"
    assert says in answer["response"]["result"]["message"]


# --- over HTTPS ------------------------------------------------------------------------------


def make_certificate(directory: Path, name: str = "localhost") -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=30)
    return cert, key


LIMITS = Limits(max_body_bytes=64 * 1024, connection_seconds=1.0, max_connections=4,
                reload_seconds=0.0)


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    return make_certificate(tmp_path)


@pytest.fixture
def server(certificate: tuple[Path, Path]) -> Iterator[WebhookServer]:
    with WebhookServer("127.0.0.1", 0, *certificate, converter=CONVERTER,
                       limits=LIMITS) as running:
        yield running


def client_context(cert: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cert))
    return context


def post(server: WebhookServer, cert: Path, body: bytes, path: str = "/convert",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPSConnection("localhost", server.port, timeout=10,
                                             context=client_context(cert))
    try:
        connection.request("POST", path, body=body,
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def assert_serves(server: WebhookServer, cert: Path) -> None:
    status, answer = post(server, cert, review([glms("a", contextLength=512)]))
    assert status == 200, answer
    assert answer["response"]["convertedObjects"][0]["spec"] == {"pool": {"contextLength": 512}}


def test_serves_a_review_over_tls(server: WebhookServer,
                                  certificate: tuple[Path, Path]) -> None:
    assert_serves(server, certificate[0])
    status, answer = post(server, certificate[0], review([glms("a")], desired="v1"))
    assert status == 200 and answer["response"]["result"]["status"] == "Failure"


def test_other_paths_and_health(server: WebhookServer, certificate: tuple[Path, Path]) -> None:
    assert post(server, certificate[0], review([]), path="/mutate")[0] == 404
    connection = http.client.HTTPSConnection("localhost", server.port, timeout=10,
                                             context=client_context(certificate[0]))
    connection.request("GET", "/healthz")
    assert connection.getresponse().read() == b"ok\n"
    connection.close()


def test_an_oversized_body_is_refused_before_it_is_read(
        server: WebhookServer, certificate: tuple[Path, Path]) -> None:
    context = client_context(certificate[0])
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        # Announce 1 GiB, send none of it: the answer comes at once.
        tls.sendall(b"POST /convert HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1073741824\r\n\r\n")
        answer = _read_all(tls)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    message = json.loads(body)["response"]["result"]["message"]
    assert "1073741824 bytes is over this webhook's bound of 65536 bytes" in message


def test_a_body_without_length_is_refused(server: WebhookServer,
                                          certificate: tuple[Path, Path]) -> None:
    status, answer = post(server, certificate[0], b"", headers={"Transfer-Encoding": "chunked"})
    assert status == 411 and "Content-Length" in answer["response"]["result"]["message"]


def test_bad_json_over_the_wire(server: WebhookServer, certificate: tuple[Path, Path]) -> None:
    status, answer = post(server, certificate[0], b'{"kind": "ConversionReview",')
    assert status == 400 and "not JSON" in answer["response"]["result"]["message"]
    assert_serves(server, certificate[0])


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # plain HTTP on the TLS port
    b"\x16\x03\x01\x00\x05hello",  # a broken TLS record
    b"\x00" * 4096,
    bytes(range(256)) * 64,
], ids=["plain-http", "broken-tls-record", "zeros", "all-bytes"])
def test_raw_garbage_does_not_hurt_the_server(server: WebhookServer,
                                              certificate: tuple[Path, Path],
                                              garbage: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(garbage)
        _read_all(raw)  # the server closes it (or answers and closes)
    assert_serves(server, certificate[0])


def test_garbage_after_the_handshake(server: WebhookServer,
                                     certificate: tuple[Path, Path]) -> None:
    context = client_context(certificate[0])
    for garbage in (b"\r\n\r\n", b"POST /convert HTTP/9.9\r\n\r\n", b"X" * 70000 + b"\r\n",
                    b"POST /convert HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                    b"POST /convert HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(garbage)
            answer = _read_all(tls)
        assert not answer.startswith(b"HTTP/1.1 200"), garbage[:40]
    assert_serves(server, certificate[0])


def test_a_trickled_request_is_cut_at_the_connection_deadline(
        server: WebhookServer, certificate: tuple[Path, Path]) -> None:
    context = client_context(certificate[0])
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(b"POST /convert HTTP/1.1\r\n")
        # One header byte every 0.2 s: each read is quick, the request never completes.
        tls.settimeout(0.2)
        for _ in range(40):
            try:
                tls.recv(1)
                break  # the server cut it (EOF or an answer)
            except TimeoutError:
                pass  # still open (a TLS 1.3 session ticket is read here too)
            except OSError:
                break
            try:
                tls.sendall(b"X")
            except OSError:
                break
        elapsed = time.monotonic() - started
    assert LIMITS.connection_seconds - 0.1 < elapsed < LIMITS.connection_seconds + 3
    assert_serves(server, certificate[0])


def test_connections_over_the_cap_are_closed_and_the_cap_frees_up(
        server: WebhookServer, certificate: tuple[Path, Path]) -> None:
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
              for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.2)  # let the server take them
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as extra:
            assert _read_all(extra) == b""  # closed unanswered
    finally:
        for sock in silent:
            sock.close()
    deadline = time.monotonic() + LIMITS.connection_seconds + 5
    while True:
        try:
            assert_serves(server, certificate[0])
            break
        except (OSError, ssl.SSLError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_rotated_certificate_is_served_without_a_restart(
        server: WebhookServer, certificate: tuple[Path, Path], tmp_path: Path) -> None:
    assert_serves(server, certificate[0])
    rotated = tmp_path / "rotated"
    rotated.mkdir()
    new_cert, new_key = make_certificate(rotated)
    # The kubelet swaps a Secret's files by a symlink rename; a copy over them is the same
    # for the server: new inode and mtime.
    shutil.copy(new_key, certificate[1])
    shutil.copy(new_cert, certificate[0])
    status, _ = post(server, new_cert, review([]))
    assert status == 200


def test_the_run_command_takes_the_webhook_flags() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--webhook-port=9443", "--webhook-cert-file=/w/tls.crt",
                              "--webhook-key-file=/w/tls.key"])
    assert (args.webhook_port, args.webhook_cert_file, args.webhook_key_file) == (
        9443, Path("/w/tls.crt"), Path("/w/tls.key"))
    assert parser.parse_args([]).webhook_port == 0
