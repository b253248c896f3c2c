"""Objects deleted while a watch was cut off ("ghosts"), found and dropped from the indexes.

kopf lists a kind again when its watch cannot resume (410 Gone: the API server restarted,
or etcd compacted past the version the operator had seen). The listing brings every object
again as a listing event (type None); an object deleted in the gap is simply absent from it
and never arrives as DELETED, so kopf's index keeps it for the life of the process. A ghost
child hides a missing one, which is then never created again (the resync reads the same
index), and a ghost GLMService is reconciled as if it still existed.

So a listing event for an object the operator has seen before (in any event) means its
kind is being listed again. Every indexed kind is then compared with a consistent LIST of
its uids (metadata only): what an index holds that the API server no longer has is
dropped, and the owners of dropped children are reconciled, which creates again what is
missing. The resync runs the same sweep as a backstop, and so does a write answered 404
(the index said the object was there).

The sweep reads and changes kopf's indexes on kopf's event loop (where kopf changes them),
from each entry's identity alone (no JSON parsed); it reads the API server in a worker
thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("glm_operator")

# A burst of 404s or listings (an API server restart relists every kind) asks for one sweep.
SWEEP_MIN_INTERVAL_SECONDS = 10.0
Key = tuple[str, str]
WATCH_ID_SUFFIX = "-relists"  # the kopf id of each kind's relist watch: "<plural>-relists"


class QuietRelistWatch(logging.Filter):
    """Drops kopf's "Handler '<plural>-relists' succeeded." lines: the relist watch runs on
    every event of every watched kind, and would double the operator's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().endswith(f"{WATCH_ID_SUFFIX}' succeeded.")


@dataclass(frozen=True)
class WatchedKind:
    """A kind the operator watches, and the kopf indexes its objects feed."""

    api_version: str
    kind: str
    label_selector: str  # the watch's own selector ("" for every object of the kind)
    indexes: tuple[str, ...]


@dataclass(frozen=True)
class Ghost:
    index: str
    key: Key  # the index key: (namespace, the object's name or its owner's)
    namespace: str
    name: str
    uid: str


class RelistDetector:
    """Tells a listing after a cut-off watch from the first: every uid a kind's events showed
    is remembered until its DELETED, and a listing event for one of them means the kind is
    being listed again (the first listing shows each object for the first time)."""

    def __init__(self) -> None:
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def relisting(self, kind: str, event_type: str | None, uid: str) -> bool:
        """Note an event of `kind`; True for a listing event of an object seen before."""
        with self._lock:
            seen = self._seen.setdefault(kind, set())
            if event_type == "DELETED":
                seen.discard(uid)
                return False
            if event_type is None and uid in seen:
                return True
            seen.add(uid)
            return False

    def forget(self, uids: set[str]) -> None:
        """Objects found gone without a DELETED event (ghosts)."""
        with self._lock:
            for seen in self._seen.values():
                seen -= uids


def find_ghosts(candidates: list[tuple[str, Key, str, str, str]],
                live: Mapping[str, set[str]]) -> list[Ghost]:
    """Index entries (index, key, namespace, name, uid) whose uid is not among the live
    uids of that index's kind; an index whose kind could not be listed is left alone."""
    return [Ghost(index, key, namespace, name, uid)
            for index, key, namespace, name, uid in candidates
            if index in live and uid not in live[index]]


class Sweeper:
    def __init__(self, kinds: tuple[WatchedKind, ...],
                 list_uids: Callable[[WatchedKind], set[str]],
                 identity: Callable[[Any], tuple[str, str, str]],
                 on_dropped: Callable[[list[Ghost]], None]) -> None:
        self.kinds = kinds
        self._list_uids = list_uids  # blocking: the kind's live uids in the operator's scope
        self._identity = identity  # an index entry's (namespace, name, uid), without parsing
        self._on_dropped = on_dropped
        self._loop: asyncio.AbstractEventLoop | None = None
        self._indexes: Mapping[str, Any] = {}
        self._lock = threading.Lock()
        self._scheduled = False
        self._last = 0.0
        self._running = asyncio.Lock()

    def attach(self, loop: asyncio.AbstractEventLoop, indexes: Mapping[str, Any]) -> None:
        """kopf's loop and index views, from the first handler that runs on the loop."""
        if self._loop is None:
            self._indexes = indexes
            self._loop = loop

    def request(self) -> bool:
        """Sweep soon (thread-safe); requests within SWEEP_MIN_INTERVAL_SECONDS fold into
        one. True when this request scheduled the sweep."""
        loop = self._loop
        if loop is None:
            return False  # nothing indexed yet: nothing can be stale
        with self._lock:
            if self._scheduled:
                return False
            self._scheduled = True
            delay = max(0.0, self._last + SWEEP_MIN_INTERVAL_SECONDS - time.monotonic())
        loop.call_soon_threadsafe(lambda: loop.call_later(delay, self._start))
        return True

    def _start(self) -> None:
        with self._lock:
            self._scheduled = False
            self._last = time.monotonic()
        task = asyncio.ensure_future(self.sweep())
        task.add_done_callback(_log_failure)

    def sweep_from_thread(self, timeout: float) -> list[Ghost]:
        """Sweep now and wait for it (the resync thread)."""
        if self._loop is None:
            return []
        done: Future[list[Ghost]] = asyncio.run_coroutine_threadsafe(self.sweep(), self._loop)
        return done.result(timeout)

    async def sweep(self) -> list[Ghost]:
        """Drop every index entry whose object the API server no longer has."""
        async with self._running:
            # Taken before the LISTs: an entry they do not show was deleted before them.
            candidates = [(name, key, *self._identity(entry)) for kind in self.kinds
                          for name in kind.indexes if name in self._indexes
                          for key, store in self._indexes[name].items() for entry in store]
            ghosts = find_ghosts(candidates, await asyncio.to_thread(self._live_uids))
            for ghost in ghosts:
                # kopf's own key for an indexed object (namespace, name, uid); kopf has no
                # public way to forget an object it never saw deleted.
                self._indexes[ghost.index]._discard((ghost.namespace, ghost.name, ghost.uid))
        if ghosts:
            log.info("dropped %d objects deleted while a watch was cut off: %s", len(ghosts),
                     ", ".join(f"{g.index} {g.namespace}/{g.name}" for g in ghosts[:10]))
            await asyncio.to_thread(self._on_dropped, ghosts)
        return ghosts

    def _live_uids(self) -> dict[str, set[str]]:
        live: dict[str, set[str]] = {}
        for kind in self.kinds:
            try:
                uids = self._list_uids(kind)
            except Exception as exc:  # that kind's entries stay; the next sweep looks again
                log.warning("cannot list %s to find deleted objects: %s", kind.kind, exc)
                continue
            live.update(dict.fromkeys(kind.indexes, uids))
        return live


def _log_failure(task: asyncio.Future[list[Ghost]]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        if task.exception() is not None:
            log.warning("the sweep for deleted objects failed: %s", task.exception())
