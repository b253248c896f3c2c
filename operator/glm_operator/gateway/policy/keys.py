"""API keys from a mounted Secret, reloaded without a restart.

The path is either a directory (a Secret volume: each regular file is one key, so a Secret
with keys `current` and `next` gives two valid keys during a rotation) or a file with one key
per line. The gateway checks the path's signature (names, sizes, mtimes) at most once per
second and reloads when it changes; kubelet swaps the `..data` symlink on a Secret update,
which changes the signature.

Keys are held only as sha256 digests; the first 12 hex digits are the key id that metrics
and the audit log show, never the key.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

KEY_ID_LENGTH = 12
RELOAD_INTERVAL_SECONDS = 1.0  # a rotated key works (or stops working) within a second
# The gateway's refresher has stalled when the keys are older than this: check() looks itself.
REFRESHER_STALL_SECONDS = 5.0
Signature = tuple[tuple[str, int, int], ...]


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(key: str) -> str:
    """A short, stable, non-reversible name for a key (sha256 prefix)."""
    return digest(key)[:KEY_ID_LENGTH]


def _key_files(path: Path) -> list[Path]:
    if path.is_dir():
        # Secret volumes hold ..data and ..2024_... entries next to the key symlinks.
        return sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())
    return [path] if path.is_file() else []


def _signature(path: Path) -> Signature:
    entries = []
    try:
        for file in _key_files(path):
            stat = file.stat()
            entries.append((file.name, stat.st_mtime_ns, stat.st_size))
    except OSError:
        return ()
    return tuple(entries)


def read_keys(path: Path) -> set[str]:
    """Every key under `path`: one per file in a directory, one per line in a file."""
    keys: set[str] = set()
    if path.is_dir():
        for file in _key_files(path):
            value = file.read_text().strip()
            if value:
                keys.add(value)
    elif path.is_file():
        for line in path.read_text().splitlines():
            value = line.strip()
            if value and not value.startswith("#"):
                keys.add(value)
    return keys


class ApiKeyStore:
    """Answers "is this key valid, and what is its id" and keeps itself current."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic,
                 check_reloads_after: float = RELOAD_INTERVAL_SECONDS) -> None:
        """`check_reloads_after`: how stale the keys may be before `check()` looks at the
        files itself; the gateway keeps them fresh from a background task (`refresh`) so a
        request never waits on the file system, and sets this higher as a fallback."""
        self._path = path
        self._clock = clock
        self._check_reloads_after = check_reloads_after
        self._digests: frozenset[str] = frozenset()
        self._signature: Signature | None = None
        self._checked_at = float("-inf")
        self._refresh(force=True)

    @property
    def count(self) -> int:
        return len(self._digests)

    def refresh(self) -> None:
        """Reload the keys if their files changed (a stat per file when they did not)."""
        self._refresh(force=True)

    def _refresh(self, force: bool = False, interval: float = RELOAD_INTERVAL_SECONDS) -> None:
        now = self._clock()
        if not force and now - self._checked_at < interval:
            return
        self._checked_at = now
        signature = _signature(self._path)
        if signature == self._signature:
            return
        try:
            keys = read_keys(self._path)
        except OSError as exc:  # mid-swap: keep the old keys and look again next second
            log.warning("cannot read API keys from %s: %s", self._path, exc)
            return
        self._signature = signature
        self._digests = frozenset(digest(k) for k in keys)
        if not keys:
            log.warning("no API keys under %s: every request is refused", self._path)
        else:
            log.info("loaded %d API key(s) from %s", len(keys), self._path)

    def check(self, key: str) -> str | None:
        """The key id when `key` is valid now, else None."""
        self._refresh(interval=self._check_reloads_after)
        hashed = digest(key)
        return hashed[:KEY_ID_LENGTH] if hashed in self._digests else None


async def keep_fresh(keys: ApiKeyStore) -> None:
    """Key files are looked at here, every second, never while a request waits (the pods'
    gateways and the router each run one)."""
    while True:
        await asyncio.sleep(RELOAD_INTERVAL_SECONDS)
        try:
            keys.refresh()
        except Exception:  # never let the refresher die: requests would look themselves
            log.exception("reloading the API keys failed")
