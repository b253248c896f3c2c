"""Which namespaces this operator manages, and how it watches them.

kopf can watch chosen namespaces itself: it lists the cluster's namespaces, and runs one watch
per matching namespace and kind. With globs that is the wrong shape twice over:
- it grows with the namespaces (a thousand teams: a thousand watches per kind);
- kopf holds every handler until each of those watches has listed once, and a namespace
  deleted while its watches are still listing stops them before they report: the hold never
  lifts, and the operator stays alive, answering its liveness probe, handling nothing
  (seen with kopf 1.45 when namespaces come and go while it starts).

So globs watch cluster-wide, one watch per kind whatever the namespace count, and every
handler and index filters by namespace here (`in_scope`). Exact names keep kopf's
per-namespace watches: a Role in each namespace is all the RBAC such an install grants.

Patterns follow kopf's syntax, so `--namespace` means what it always meant: comma-separated
globs, `!` excludes, a leading exclusion implies `*` before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

GLOB_CHARACTERS = frozenset("*?[]!,")


def is_glob(pattern: str) -> bool:
    return any(c in GLOB_CHARACTERS for c in pattern)


def matches(namespace: str, pattern: str) -> bool:
    """kopf's namespace pattern: the first inclusive glob matches, a later `!glob` un-matches,
    a later inclusive glob re-matches only what the first one matched."""
    globs = [glob.strip() for glob in pattern.split(",")]
    if globs[0].startswith("!"):
        globs.insert(0, "*")
    first = found = fnmatchcase(namespace, globs[0])
    for glob in globs[1:]:
        if glob.startswith("!"):
            found = found and not fnmatchcase(namespace, glob[1:])
        else:
            found = found or (first and fnmatchcase(namespace, glob))
    return found


@dataclass(frozen=True)
class NamespaceScope:
    patterns: tuple[str, ...] = ()  # empty: every namespace

    @property
    def cluster_wide_watch(self) -> bool:
        """Watch every namespace (and filter here) rather than each chosen one."""
        return not self.patterns or any(is_glob(p) for p in self.patterns)

    @property
    def kopf_namespaces(self) -> tuple[str, ...]:
        """What kopf is told to watch: nothing (cluster-wide) or the exact names."""
        return () if self.cluster_wide_watch else self.patterns

    def contains(self, namespace: str | None) -> bool:
        if not self.patterns:
            return True
        if namespace is None:
            return False  # cluster-scoped objects are never ours to manage
        return any(matches(namespace, p) for p in self.patterns)


_scope = NamespaceScope()


def configure(scope: NamespaceScope) -> None:
    """Set once by `glm-operator run`, before kopf starts delivering events."""
    global _scope
    _scope = scope


def list_namespaces() -> tuple[str | None, ...]:
    """Where a LIST mirrors the watches: the whole cluster (None), or each exact name."""
    return (None,) if _scope.cluster_wide_watch else _scope.patterns


def in_scope(namespace: str | None = None, **_: Any) -> bool:
    """kopf's `when=` filter on every handler and index."""
    return _scope.contains(namespace)
