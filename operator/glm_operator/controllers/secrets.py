"""Which Secrets exist, by name: a metadata-only list and watch of Secrets, so a GLMService
that names a missing one says so (decide/references.py) instead of leaving its pods in
ContainerCreating.

Not a kopf index: kopf watches whole objects, and a Secret's data (Helm keeps every release
in one, up to 1 MiB each) has no business in the operator's memory or on its wire. The API
server answers this watch with PartialObjectMetadata, names and labels only, and the cache is
a set of names per namespace: a reconcile asks it (no GET per service, however many
services), and only an appearing or vanishing name wakes the services that mention it.

One watch per namespace the operator is told by exact name, or one cluster-wide (filtered by
the namespace scope) otherwise, as kopf's own watches. Until a watch has listed, or while the
API server refuses it (the chart's rbac.watchSecrets off), its namespaces are unknown, and the
condition says so rather than guess.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from glm_operator.decide.references import SecretsObserved
from glm_operator.kube.client import KubeClient, KubeError

log = logging.getLogger("glm_operator")

RETRY_SECONDS = 5.0  # after a watch failed for another reason than its version being too old
REFUSED_RETRY_SECONDS = 60.0  # after 401/403: RBAC may be granted later

# (namespace, the names that appeared or went; None: the whole namespace became known), with
# namespace None for every namespace at once.
Changed = Callable[[str | None, frozenset[str] | None], None]


@dataclass
class SecretNames:
    """Secret names per namespace, as the watches last saw them (thread-safe)."""

    contains: Callable[[str | None], bool] = lambda _namespace: True
    _names: dict[str, set[str]] = field(default_factory=dict)
    _listed: set[str | None] = field(default_factory=set)  # watch scopes with a listing
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observed(self, namespace: str, names: Iterable[str]) -> SecretsObserved:
        """What decide_service gets: which of `names` exist in `namespace`."""
        with self._lock:
            if None not in self._listed and namespace not in self._listed:
                return SecretsObserved(known=False)
            have = self._names.get(namespace, set())
            return SecretsObserved(known=True, present=frozenset(n for n in names if n in have))

    def listed(self, scope: str | None, items: Iterable[tuple[str, str]]
               ) -> dict[str, set[str]] | None:
        """A (re)listing of a watch scope: (namespace, name) pairs. Returns the names that
        appeared or went since the last listing, by namespace; None for a first listing
        (every namespace of the scope became known)."""
        fresh: dict[str, set[str]] = {}
        for namespace, name in items:
            if self.contains(namespace):
                fresh.setdefault(namespace, set()).add(name)
        with self._lock:
            first = scope not in self._listed
            old = {ns: names for ns, names in self._names.items()
                   if scope is None or ns == scope}
            for namespace in old:
                del self._names[namespace]
            self._names.update(fresh)
            self._listed.add(scope)
        if first:
            return None
        changed = {ns: (fresh.get(ns, set()) ^ old.get(ns, set()))
                   for ns in set(fresh) | set(old)}
        return {ns: names for ns, names in changed.items() if names}

    def added(self, namespace: str, name: str) -> bool:
        """True when the name is new."""
        if not self.contains(namespace):
            return False
        with self._lock:
            names = self._names.setdefault(namespace, set())
            new = name not in names
            names.add(name)
            return new

    def deleted(self, namespace: str, name: str) -> bool:
        """True when the name was known."""
        with self._lock:
            names = self._names.get(namespace)
            if names is None or name not in names:
                return False
            names.discard(name)
            return True

    def forget(self, scope: str | None) -> None:
        """The watch is refused: its namespaces are unknown again."""
        with self._lock:
            self._listed.discard(scope)
            for namespace in [ns for ns in self._names if scope is None or ns == scope]:
                del self._names[namespace]


def watch_secrets(kube: KubeClient, names: SecretNames, scope: str | None,
                  changed: Changed, stop: threading.Event) -> None:
    """List then watch one scope's Secret names until `stop`: a thread's whole life."""
    version: str | None = None
    refused = False
    while not stop.is_set():
        try:
            if version is None:
                items, version = kube.list_metadata("v1", "Secret", scope)
                diff = names.listed(scope, ((i["metadata"].get("namespace", ""),
                                             i["metadata"]["name"]) for i in items))
                if refused:
                    log.info("Secrets in %s: the watch of their names is allowed again",
                             scope or "every namespace")
                refused = False
                if diff is None:
                    changed(scope, None)
                else:
                    for namespace, gone_or_new in diff.items():
                        changed(namespace, frozenset(gone_or_new))
            for kind, obj in kube.watch_metadata("v1", "Secret", scope, version):
                meta = obj.get("metadata") or {}
                version = meta.get("resourceVersion") or version
                namespace, name = meta.get("namespace", ""), meta.get("name", "")
                news = ((kind == "ADDED" and names.added(namespace, name))
                        or (kind == "DELETED" and names.deleted(namespace, name)))
                if news:
                    changed(namespace, frozenset({name}))
                if stop.is_set():
                    return
        except KubeError as exc:
            if exc.status == 410:  # too old a version: list again, now
                version = None
                continue
            version = None
            if exc.status in (401, 403):
                if not refused:
                    log.warning("Secrets in %s: the API server refuses the watch of their "
                                "names (%s); condition ResolvedRefs stays Unknown",
                                scope or "every namespace", exc)
                refused = True
                names.forget(scope)
                stop.wait(REFUSED_RETRY_SECONDS)
            else:
                log.info("Secrets in %s: the watch of their names failed (%s); listing "
                         "again", scope or "every namespace", exc)
                stop.wait(RETRY_SECONDS)
        except Exception as exc:  # the thread must outlive a surprise; it lists again
            log.warning("Secrets in %s: the watch of their names failed: %s",
                        scope or "every namespace", exc)
            version = None
            stop.wait(RETRY_SECONDS)
