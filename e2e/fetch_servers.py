"""Real HTTP(S) servers for the fetcher's e2e tests: a file server, a Hub-shaped server, TLS.

`ModelFileServer` serves files from a directory over a real socket with real Range support
and scripted faults, so the fetcher's client code runs exactly as against a CDN:

    server.drop_after[path] = n      the next GET of `path` sends n body bytes, then the
                                     connection is closed (a mid-file disconnect)
    server.fail_next[path] = [503]   answer the next GETs with these statuses
    server.required_token = "t"      401 without `Authorization: Bearer t`, 403 with another
    server.no_length = {path}        send the body without Content-Length (close-delimited)
    server.hub_layout = True         serve /{org}/{repo}/resolve/{revision}/{file} from
                                     root/{org}/{repo}/{revision}/{file}, answering with a 302
                                     to a /cdn/ URL, as the Hub does for large files
    server.requests                  (method, path, Range header) of every request seen

`self_signed_certificate(dir)` makes a CA-less self-signed cert for 127.0.0.1 with openssl.
"""

from __future__ import annotations

import http.server
import re
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
_HUB = re.compile(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")


class ModelFileServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.tls = tls
        self.drop_after: dict[str, int] = {}
        self.fail_next: dict[str, list[int]] = {}
        self.required_token: str | None = None
        self.no_length: set[str] = set()
        self.hub_layout = False
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ModelFileServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        return

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def _status(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> (
            None):
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, send_body: bool) -> None:
        server = self.server
        path = unquote(urlsplit(self.path).path)
        with server.lock:
            server.requests.append((self.command, path, self.headers.get("Range")))
            faults = server.fail_next.get(path)
            fault = faults.pop(0) if faults else None
        if server.required_token is not None:
            auth = self.headers.get("Authorization")
            if auth is None:
                return self._status(401, b'{"error":"Unauthorized"}')
            if auth != f"Bearer {server.required_token}":
                return self._status(403, b'{"error":"Forbidden"}')
        if fault is not None:
            return self._status(fault, b"scripted failure")
        if server.hub_layout and not path.startswith("/cdn/"):
            match = _HUB.match(path)
            if not match:
                return self._status(404, b"Repository Not Found")
            org, repo, revision, file = match.groups()
            if not (server.root / org / repo / revision / file).is_file():
                return self._status(404, b"Entry not found")
            return self._status(302, headers={"Location": f"/cdn/{org}/{repo}/{revision}/{file}"})
        relative = path.removeprefix("/cdn/") if server.hub_layout else path.lstrip("/")
        target = (server.root / relative).resolve()
        if server.root.resolve() not in target.parents or not target.is_file():
            return self._status(404, b"Not Found")
        data = target.read_bytes()
        total = len(data)
        start, status = 0, 200
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        requested = self.headers.get("Range")
        if requested:
            match = _RANGE.match(requested.strip())
            if not match:
                return self._status(416, headers={"Content-Range": f"bytes */{len(data)}"})
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) else len(data) - 1
            if start >= len(data):
                return self._status(416, headers={"Content-Range": f"bytes */{len(data)}"})
            data = data[start:end + 1]
            status = 206
            headers["Content-Range"] = f"bytes {start}-{start + len(data) - 1}/{total}"
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        close_delimited = path in server.no_length or relative in server.no_length
        if close_delimited:
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not send_body:
            return
        with server.lock:
            drop = server.drop_after.pop(path, None)
        if drop is not None:
            self.wfile.write(data[:drop])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        view = memoryview(data)
        for offset in range(0, len(data), 64 * 1024):
            self.wfile.write(view[offset:offset + 64 * 1024])


@contextmanager
def serve(root: Path, tls: ssl.SSLContext | None = None) -> Iterator[ModelFileServer]:
    server = ModelFileServer(root, tls)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1 and localhost, valid for a day."""
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


def tls_server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    return context
