"""Download one artifact into the cache directory, resumably, and verify it before it is named.

The file grows as `<name>.partial`; only after the size, the sha256 and (for GGUF) the header
check pass is it renamed to `<name>`, so a reader of the cache never sees a half-written or
unverified model under its final name. A `.partial` left by a killed Job is resumed with an
HTTP Range request (its bytes are re-hashed first so the checksum still covers the whole file).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import http.client
import io
import logging
import os
import re
import shutil
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from glm_operator.fetch.errors import (
    ChecksumMismatch,
    FetchError,
    InsufficientSpace,
    InvalidModelFile,
    SizeMismatch,
    SourceAuthFailed,
    SourceNotFound,
    SourceUnavailable,
    WrongArchitecture,
)
from glm_operator.fetch.gguf_header import GGUFFacts, GGUFFormatError, read_gguf_file
from glm_operator.fetch.progress import ProgressMeter
from glm_operator.fetch.sources import HttpSource, LocalSource, Source

log = logging.getLogger("glm_operator.fetch")

PARTIAL_SUFFIX = ".partial"
LOCK_SUFFIX = ".lock"
CHUNK_BYTES = 1024 * 1024
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIABLE_RANGE = re.compile(r"bytes\s+\*/(\d+)")


class _Retryable(Exception):
    """A failure worth another attempt (connection reset, timeout, 5xx, short body)."""


@dataclass(frozen=True)
class FetchOptions:
    expected_sha256: str | None = None
    expected_architecture: str | None = None
    parse_gguf: bool = True
    reserve_bytes: int = 0
    max_attempts: int = 6
    retry_initial_delay_s: float = 1.0
    retry_max_delay_s: float = 30.0
    timeout_s: float = 60.0
    progress_interval_s: float = 10.0
    # Where the bytes are counted for the status (fetch/progress.py); None: only logged.
    meter: ProgressMeter | None = None
    ssl_context: ssl.SSLContext | None = None
    # The file system's idea of free bytes; replaceable so a test can pin it.
    free_bytes: Callable[[Path], int] = lambda path: shutil.disk_usage(path).free
    sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True)
class FetchResult:
    path: Path
    size_bytes: int
    sha256: str
    gguf: GGUFFacts | None
    from_cache: bool
    resumed_from_bytes: int
    attempts: int
    seconds: float


@dataclass
class _Response:
    start: int  # offset of the first byte in `body`
    total: int | None
    body: BinaryIO
    headers: Mapping[str, str] = field(default_factory=dict)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def _open_http(source: HttpSource, offset: int, options: FetchOptions) -> _Response:
    extra = {"Range": f"bytes={offset}-"} if offset else {}
    extra["User-Agent"] = "glm-operator-fetch"
    headers = source.request_headers("GET", extra)
    request = urllib.request.Request(source.url, headers=headers, method="GET")
    handlers: list[urllib.request.BaseHandler] = []
    if options.ssl_context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=options.ssl_context))
    opener = urllib.request.build_opener(*handlers)
    try:
        response = opener.open(request, timeout=options.timeout_s)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416:
            match = _UNSATISFIABLE_RANGE.search(exc.headers.get("Content-Range", "") or "")
            total = int(match.group(1)) if match else None
            # The partial file already holds every byte: nothing left to read.
            if total is not None and total == offset:
                return _Response(start=offset, total=total, body=io.BytesIO())
            raise _Retryable(f"server refused Range bytes={offset}- (416), restarting") from exc
        raise _http_error(source, exc.code, exc.reason) from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(cause, ssl.SSLCertVerificationError):
            # Retrying cannot fix trust; say what to change instead.
            raise SourceUnavailable(
                f"{source.display}: TLS certificate not trusted ({cause.verify_message}); "
                "give the CA with --ca-bundle") from exc
        raise _Retryable(str(cause)) from exc
    status = response.status
    if status == 206:
        match = _CONTENT_RANGE.search(response.headers.get("Content-Range", ""))
        if not match:
            response.close()
            raise _Retryable("206 without a usable Content-Range")
        start = int(match.group(1))
        total = None if match.group(3) == "*" else int(match.group(3))
        return _Response(start=start, total=total, body=response, headers=response.headers)
    length = response.headers.get("Content-Length")
    return _Response(start=0, total=int(length) if length is not None else None, body=response,
                     headers=response.headers)


def _http_error(source: HttpSource, code: int, reason: str) -> Exception:
    where = f"{source.display} ({source.url.split('?')[0]})"
    if code == 404:
        return SourceNotFound(f"{where}: HTTP 404, no such file at the source")
    if code in (401, 403):
        return SourceAuthFailed(
            f"{where}: HTTP {code} {reason}: the credentials in the ModelVersion's "
            "credentialsSecret are missing or not allowed to read this file"
        )
    if code == 429 or code >= 500:
        return _Retryable(f"{where}: HTTP {code} {reason}")
    return SourceUnavailable(f"{where}: HTTP {code} {reason}")


def _open_local(source: LocalSource, offset: int) -> _Response:
    try:
        handle = source.path.open("rb")
    except FileNotFoundError as exc:
        raise SourceNotFound(f"{source.display}: no such file ({source.path})") from exc
    except PermissionError as exc:
        raise SourceAuthFailed(f"{source.display}: permission denied ({source.path})") from exc
    total = os.fstat(handle.fileno()).st_size
    handle.seek(offset)
    return _Response(start=offset, total=total, body=handle)


def _open(source: Source, offset: int, options: FetchOptions) -> _Response:
    if isinstance(source, LocalSource):
        return _open_local(source, offset)
    return _open_http(source, offset, options)


def _hash_file(path: Path) -> tuple[hashlib._Hash, int]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES * 4):
            digest.update(chunk)
            size += len(chunk)
    return digest, size


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Progress:
    def __init__(self, display: str, interval_s: float) -> None:
        self.display, self.interval_s = display, interval_s
        self.started = self.last = time.monotonic()
        self.bytes_this_run = 0

    def update(self, done: int, total: int | None, added: int, force: bool = False) -> None:
        self.bytes_this_run += added
        now = time.monotonic()
        if not force and now - self.last < self.interval_s:
            return
        self.last = now
        rate = self.bytes_this_run / max(now - self.started, 1e-6)
        if total:
            eta = (total - done) / rate if rate > 0 else float("inf")
            log.info("%s: %s / %s (%.1f%%), %s/s, ETA %.0fs", self.display, _human(done),
                     _human(total), 100.0 * done / total, _human(rate), eta)
        else:
            log.info("%s: %s, %s/s", self.display, _human(done), _human(rate))


def _check_space(directory: Path, needed: int, options: FetchOptions, display: str) -> None:
    free = options.free_bytes(directory)
    if free < needed + options.reserve_bytes:
        raise InsufficientSpace(
            f"{display}: needs {_human(needed)} more plus a reserve of "
            f"{_human(options.reserve_bytes)}, but {directory} has {_human(free)} free; "
            "grow the cache volume (spec.cache) or free space on it"
        )


def _download(source: Source, partial: Path, options: FetchOptions) -> tuple[str, int, int, int]:
    """Fill `partial` from `source`; return (sha256, size, resumed_from, attempts)."""
    if partial.exists():
        digest, offset = _hash_file(partial)
        resumed_from = offset
        if offset:
            log.info("%s: resuming from %s already in %s", source.display, _human(offset),
                     partial.name)
    else:
        digest, offset, resumed_from = hashlib.sha256(), 0, 0
    progress = _Progress(source.display, options.progress_interval_s)
    attempts, failures, space_checked = 0, 0, False
    while True:
        attempts += 1
        at_start = offset
        try:
            response = _open(source, offset, options)
            try:
                if response.start != offset:
                    log.warning("%s: server ignored the Range request; starting over",
                                source.display)
                    digest, offset, resumed_from = hashlib.sha256(), 0, 0
                    partial.write_bytes(b"")
                total = response.total
                if options.meter is not None:
                    options.meter.started(str(partial), total, offset)
                if not space_checked:
                    _check_space(partial.parent, (total - offset) if total else 0, options,
                                 source.display)
                    space_checked = True
                with partial.open("r+b" if partial.exists() else "wb") as out:
                    out.seek(offset)
                    out.truncate()
                    while True:
                        try:
                            chunk = response.body.read(CHUNK_BYTES)
                        except (OSError, http.client.HTTPException) as exc:
                            raise _Retryable(f"connection lost at {_human(offset)}: {exc}") \
                                from exc
                        if not chunk:
                            break
                        try:
                            out.write(chunk)
                        except OSError as exc:
                            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                                raise InsufficientSpace(
                                    f"{source.display}: the cache volume filled up after "
                                    f"{_human(offset)} of {_human(total or 0)}; grow spec.cache"
                                ) from exc
                            raise
                        digest.update(chunk)
                        offset += len(chunk)
                        progress.update(offset, total, len(chunk))
                        if options.meter is not None:
                            options.meter.advance(len(chunk))
                    try:
                        out.flush()
                        os.fsync(out.fileno())
                    except OSError as exc:
                        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                            raise InsufficientSpace(
                                f"{source.display}: the cache volume filled up while flushing "
                                f"{_human(offset)}; grow spec.cache") from exc
                        raise
            finally:
                response.body.close()
            if total is not None and offset < total:
                raise _Retryable(f"connection closed at {_human(offset)} of {_human(total)}")
            if total is not None and offset > total:
                raise SizeMismatch(
                    f"{source.display}: received {offset} bytes, the server declared {total}")
            progress.update(offset, total, 0, force=True)
            return digest.hexdigest(), offset, resumed_from, attempts
        except _Retryable as exc:
            failures = 1 if offset > at_start else failures + 1
            if failures >= options.max_attempts:
                raise SourceUnavailable(
                    f"{source.display}: giving up after {failures} attempts without progress: "
                    f"{exc}") from exc
            delay = min(options.retry_max_delay_s,
                        options.retry_initial_delay_s * 2 ** (failures - 1))
            log.warning("%s: %s; retrying in %.1fs (attempt %d of %d)", source.display, exc,
                        delay, failures + 1, options.max_attempts)
            options.sleep(delay)


def _verify(path: Path, sha256: str, size: int, source: Source, options: FetchOptions) -> (
        GGUFFacts | None):
    expected = options.expected_sha256
    if expected and sha256 != expected.lower():
        raise ChecksumMismatch(
            f"{source.display}: sha256 is {sha256}, spec.sha256 says {expected.lower()} "
            f"({size} bytes received); the download was discarded")
    if not options.parse_gguf:
        return None
    try:
        facts = read_gguf_file(path)
    except GGUFFormatError as exc:
        raise InvalidModelFile(f"{source.display}: not a readable GGUF file: {exc}") from exc
    wanted = options.expected_architecture
    if wanted and (facts.architecture or "").lower() != wanted.lower():
        raise WrongArchitecture(
            f"{source.display}: the GGUF header says general.architecture="
            f"{facts.architecture!r}, spec.architecture expects {wanted!r}")
    return facts


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, display: str) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (created, and removed when done).

    A Job's replacement pod may start while the old one is still terminating, and two
    writers would corrupt one `.partial`.
    """
    while True:
        with lock_path.open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("%s: another fetch holds %s; waiting for it", display, lock_path)
                fcntl.flock(lock, fcntl.LOCK_EX)
            # The holder removes the lock file when done: if ours is no longer the file at
            # that path, lock again, or a third fetch could take the new file concurrently.
            try:
                if os.stat(lock_path).st_ino != os.fstat(lock.fileno()).st_ino:
                    continue
            except FileNotFoundError:
                continue
            try:
                yield
                return
            finally:
                lock_path.unlink(missing_ok=True)


def read_document(source: HttpSource, options: FetchOptions, max_bytes: int = 64 * 2**20) -> (
        tuple[bytes, Mapping[str, str]]):
    """GET a small document (a listing, a config) whole, with the downloads' retry policy.

    Returns (body, response headers); 404/401/403 raise at once like a download's would.
    """
    failures = 0
    while True:
        try:
            response = _open_http(source, 0, options)
            try:
                body = response.body.read(max_bytes + 1)
            except (OSError, http.client.HTTPException) as exc:
                raise _Retryable(f"connection lost while reading: {exc}") from exc
            finally:
                response.body.close()
            if len(body) > max_bytes:
                raise SourceUnavailable(
                    f"{source.display}: answer larger than {_human(max_bytes)}; refusing it")
            if response.total is not None and len(body) < response.total:
                raise _Retryable(f"connection closed at {len(body)} of {response.total} bytes")
            return body, response.headers
        except _Retryable as exc:
            failures += 1
            if failures >= options.max_attempts:
                raise SourceUnavailable(
                    f"{source.display}: giving up after {failures} attempts: {exc}") from exc
            delay = min(options.retry_max_delay_s,
                        options.retry_initial_delay_s * 2 ** (failures - 1))
            log.warning("%s: %s; retrying in %.1fs (attempt %d of %d)", source.display, exc,
                        delay, failures + 1, options.max_attempts)
            options.sleep(delay)


def fetch_artifact(source: Source, dest_dir: Path, filename: str, options: FetchOptions) -> (
        FetchResult):
    """Make `dest_dir/filename` a verified copy of `source`; raise a FetchError otherwise.

    Holds an exclusive lock on `<name>.lock` meanwhile (see `exclusive_lock`).
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(dest_dir / (filename + LOCK_SUFFIX), source.display):
        return _fetch_locked(source, dest_dir, filename, options)


def _fetch_locked(source: Source, dest_dir: Path, filename: str, options: FetchOptions) -> (
        FetchResult):
    started = time.monotonic()
    final = dest_dir / filename
    partial = dest_dir / (filename + PARTIAL_SUFFIX)

    if final.exists():
        digest, size = _hash_file(final)
        sha = digest.hexdigest()
        if options.expected_sha256 and sha != options.expected_sha256.lower():
            log.warning("%s: cached %s has sha256 %s, expected %s; downloading again",
                        source.display, final, sha, options.expected_sha256)
            final.unlink()
        else:
            facts = _verify(final, sha, size, source, options)
            log.info("%s: already cached and verified at %s (%s)", source.display, final,
                     _human(size))
            return FetchResult(final, size, sha, facts, True, 0, 0, time.monotonic() - started)

    sha, size, resumed_from, attempts = _download(source, partial, options)
    try:
        facts = _verify(partial, sha, size, source, options)
    except FetchError:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    os.replace(partial, final)
    _fsync_dir(dest_dir)
    elapsed = time.monotonic() - started
    log.info("%s: verified and stored as %s (%s, sha256 %s, %.1fs)", source.display, final,
             _human(size), sha, elapsed)
    return FetchResult(final, size, sha, facts, False, resumed_from, attempts, elapsed)

