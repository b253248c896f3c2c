"""Where built components are cached: one home, imported by the toolchain and by every
builder it calls (vLLM's venv, the Lua health checks), so none of them imports the toolchain
back."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def cache_root() -> Path:
    configured = os.environ.get("GLM_OPERATOR_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "glm-operator"


@contextlib.contextmanager
def build_lock(name: str, log: Callable[[str], None]) -> Iterator[None]:
    """Hold the cache's lock for `name` while it is built: a second process that needs it
    (a test, while `make test`'s background build makes it) waits here instead of building
    it again, then finds it cached. An flock is released by the kernel when its holder dies,
    so a killed build never leaves a stale lock."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{name}.lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for {name}: another process is building it")
            started = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            log(f"{name}: the other build finished after {time.monotonic() - started:.0f}s")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
