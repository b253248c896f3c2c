"""Real HTTP(S) servers for the fetcher's e2e tests: a file server, a Hub-shaped server, TLS.

`ModelFileServer` serves files from a directory over a real socket with real Range support
and scripted faults, so the fetcher's client code runs exactly as against a CDN:

    server.drop_after[path] = n      the next GET of `path` sends n body bytes, then the
                                     connection is closed (a mid-file disconnect)
    server.fail_next[path] = [503]   answer the next GETs with these statuses
    server.required_token = "t"      401 without `Authorization: Bearer t`, 403 with another
    server.no_length = {path}        send the body without Content-Length (close-delimited)
    server.bytes_per_second = n      send bodies at about n bytes/s (a slow CDN; None: as fast
                                     as the socket takes them); read per chunk, so a test
                                     can speed up a download under way
    server.hub_layout = True         serve /{org}/{repo}/resolve/{revision}/{file} from
                                     root/{org}/{repo}/{revision}/{file}, answering with a 302
                                     to a /cdn/ URL, as the Hub does for large files; and the
                                     Hub API a snapshot download lists with:
                                       /api/models/{org}/{repo}/revision/{revision} -> {"sha"}
                                       /api/models/{org}/{repo}/tree/{sha}?recursive=true
                                     (type/path/size/oid, lfs {oid sha256, size} for
                                     *.safetensors; pages of `tree_page_size` entries linked
                                     by a Link rel="next" header). A revision's commit sha is
                                     `hub_commit(org, repo, revision)`; resolve takes either.
    server.tree_page_size = n        entries per tree page (default 50)
    server.hub_missing = {path}      listed in the tree, but resolve answers 404 (a file lost
                                     between listing and download)
    server.hub_lfs_override = {path: sha256}   the tree lists this lfs.oid instead of the
                                     file's own (a listing and a CDN that disagree)
    server.requests                  (method, path, Range header) of every request seen

`self_signed_certificate(dir)` makes a CA-less self-signed cert for 127.0.0.1 with openssl.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
_HUB = re.compile(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")
_HUB_API = re.compile(r"^/api/models/([^/]+)/([^/]+)/(revision|tree)/([^/]+)$")
_LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def hub_commit(org: str, repo: str, revision: str) -> str:
    """The commit sha the test Hub gives a revision (a directory under root/org/repo/)."""
    return hashlib.sha1(f"{org}/{repo}@{revision}".encode()).hexdigest()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


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
        self.bytes_per_second: float | None = None
        self.hub_layout = False
        self.tree_page_size = 50
        self.hub_missing: set[str] = set()
        self.hub_lfs_override: dict[str, str] = {}
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
        if server.hub_layout and path.startswith("/api/"):
            return self._hub_api(path)
        if server.hub_layout and not path.startswith("/cdn/"):
            match = _HUB.match(path)
            if not match:
                return self._status(404, b"Repository Not Found")
            org, repo, revision, file = match.groups()
            revision = self._hub_revision(org, repo, revision) or revision
            if file in server.hub_missing or not (
                    server.root / org / repo / revision / file).is_file():
                return self._status(404, b"Entry not found")
            return self._status(302, headers={"Location": f"/cdn/{org}/{repo}/{revision}/{file}"})
        relative = path.removeprefix("/cdn/") if server.hub_layout else path.lstrip("/")
        if server.hub_layout:  # /cdn/org/repo/<commit>/file names the revision's directory
            parts = relative.split("/", 3)
            if len(parts) == 4:
                parts[2] = self._hub_revision(parts[0], parts[1], parts[2]) or parts[2]
                relative = "/".join(parts)
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
        chunk = 64 * 1024
        try:
            for offset in range(0, len(data), chunk):
                self.wfile.write(view[offset:offset + chunk])
                rate = server.bytes_per_second
                if rate:
                    self.wfile.flush()
                    time.sleep(min(chunk, len(data) - offset) / rate)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (a killed fetch)

    def _hub_revision(self, org: str, repo: str, name: str) -> str | None:
        """The revision directory for a branch/tag name or a commit sha; None if unknown."""
        folder = self.server.root / org / repo
        if (folder / name).is_dir():
            return name
        if folder.is_dir():
            for candidate in folder.iterdir():
                if candidate.is_dir() and hub_commit(org, repo, candidate.name) == name:
                    return candidate.name
        return None

    def _hub_api(self, path: str) -> None:
        match = _HUB_API.match(path)
        if not match:
            return self._status(404, b'{"error":"Not Found"}')
        org, repo, kind, name = match.groups()
        revision = self._hub_revision(org, repo, name)
        if revision is None:
            return self._status(404, b'{"error":"Repository or revision not found"}')
        folder = self.server.root / org / repo / revision
        files = sorted(p for p in folder.rglob("*"))
        if kind == "revision":
            body = {"id": f"{org}/{repo}", "sha": hub_commit(org, repo, revision),
                    "siblings": [{"rfilename": p.relative_to(folder).as_posix()}
                                 for p in files if p.is_file()]}
            return self._status(200, json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
        entries: list[dict[str, object]] = []
        for item in files:
            relative = item.relative_to(folder).as_posix()
            if item.is_dir():
                entries.append({"type": "directory", "oid": "0" * 40, "size": 0,
                                "path": relative})
                continue
            data = item.read_bytes()
            entry: dict[str, object] = {"type": "file", "oid": git_blob_sha1(data),
                                        "size": len(data), "path": relative}
            if relative.endswith(_LFS_SUFFIXES):
                entry["oid"] = hashlib.sha1(relative.encode()).hexdigest()  # pointer blob
                sha256 = self.server.hub_lfs_override.get(relative)
                entry["lfs"] = {"oid": sha256 or hashlib.sha256(data).hexdigest(),
                                "size": len(data), "pointerSize": 134}
            entries.append(entry)
        query = dict(p.partition("=")[::2] for p in urlsplit(self.path).query.split("&") if p)
        start = int(query.get("cursor", "0"))
        page = entries[start:start + self.server.tree_page_size]
        headers = {"Content-Type": "application/json"}
        if start + len(page) < len(entries):
            headers["Link"] = (f'<{self.server.url}{urlsplit(self.path).path}?recursive=true'
                               f'&cursor={start + len(page)}>; rel="next"')
        return self._status(200, json.dumps(page).encode(), headers)


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
