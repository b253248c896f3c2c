"""One reconcile per object at a time, and bursts of events collapsed into one more.

A Deployment becoming ready sends several watch events in a row, and every child of a
GLMService (Deployment, Service, HPA, Role, ...) has its own; each event used to mean one
full reconcile of the service. Like client-go's workqueue, a key here has at most one
reconcile running and, behind it, waiting ones; an event that finds a reconcile of its key
already waiting is dropped, because that reconcile reads the kopf indexes only when it
starts, so it sees the event's change anyway.

Only child and ModelVersion events may be collapsed (`coalesce=True`). The object's own
create/update/resume handlers always run: if such a run fails, kopf retries it, which is
what covers the events that rode on it. Entries exist only while a key is in use, so the
table does not grow with every object the operator ever saw.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field


@dataclass
class _Entry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0  # running + waiting
    waiting: int = 0


class KeyQueue:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}

    def run(self, key: Hashable, work: Callable[[], None], *, coalesce: bool = False) -> bool:
        """Run `work` holding the key's turn; False when collapsed into a waiting run."""
        with self._guard:
            entry = self._entries.get(key)
            if coalesce and entry is not None and entry.waiting:
                return False
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.users += 1
            entry.waiting += 1
        try:
            with entry.lock:
                with self._guard:
                    entry.waiting -= 1
                work()
            return True
        finally:
            with self._guard:
                entry.users -= 1
                if not entry.users:
                    del self._entries[key]

    def __len__(self) -> int:
        with self._guard:
            return len(self._entries)
