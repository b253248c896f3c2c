"""The operator's read cache: kopf indexes, one watch per kind, and the lookups on them.

Everything a reconcile reads about its objects comes from here. An entry keeps the object as
compact JSON (`Cached`); a reconcile parses only its own few, each a fresh copy it may
change. The kopf handlers that fill the indexes are registered in triggers.py; the tables
of what is indexed are here, read by triggers.py, the relist sweep and the chart's RBAC test.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

import kopf

from glm_operator.controllers.ownership import replicas_owners
from glm_operator.controllers.relists import WatchedKind
from glm_operator.kube.resources import kind_by_plural
from glm_operator.render.names import MANAGED_BY
from glm_operator.wellknown import API_VERSION, MANAGED_BY_LABEL

MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}
SERVICE_CRD_CHILDREN = (
    ("apps", "v1", "deployments"),
    ("apps", "v1", "statefulsets"),  # multi-node groups
    ("networking.k8s.io", "v1", "networkpolicies"),  # multi-node groups
    ("", "v1", "services"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    # spec.routing EndpointPicker: the route table and the endpoint picker's config. Watched
    # (by the managed-by label, as every child) so switching back to mode Service prunes them.
    ("", "v1", "configmaps"),
)
# Every kind render_model_version makes: one not indexed here would look missing at every
# reconcile, and be applied again each time.
MODEL_VERSION_CHILDREN = (
    ("batch", "v1", "jobs"),
    ("", "v1", "persistentvolumeclaims"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
)
SERVICE_CHILD_INDEXES = [f"service_{plural}" for _, _, plural in SERVICE_CRD_CHILDREN]
MODEL_CHILD_INDEXES = [f"model_{plural}" for _, _, plural in MODEL_VERSION_CHILDREN]
OWNER_INDEXES = ("glmservices", "modelversions")

Obj = dict[str, Any]
Key = tuple[str, str]


def plain(body: Mapping[str, Any]) -> Obj:
    """The object as a plain dict, every top-level field kept: not all kinds keep their
    content under spec (a Role's rules, a RoleBinding's roleRef, a ServiceAccount's
    automountServiceAccountToken), and a field missing here would look like drift.

    `metadata.managedFields` is cut to what a reconcile reads (who owns spec.replicas, see
    ownership.py): it is 40 % of a Deployment's bytes, and the cache holds one copy of
    every child."""
    out = {key: body[key] for key in body}
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and meta.get("managedFields"):
        out["metadata"] = {**meta, "managedFields": replicas_owners(meta["managedFields"])}
    return out


class Cached(NamedTuple):
    """An index entry: who the object is, readable without parsing (the sweep for deleted
    objects reads every entry's), and the object itself as compact JSON (see cached)."""

    namespace: str
    name: str
    uid: str
    json: bytes


def cached(body: Mapping[str, Any]) -> Cached:
    """What the cache keeps of an object: `plain(body)` as compact JSON. A dict of a
    Deployment is about 28 KB of Python objects, its JSON 5 KB; the cache holds one copy of
    every GLMService, ModelVersion and child, and a reconcile parses only its own few
    (`lookup`), each a fresh copy it may change."""
    meta = body.get("metadata") or {}
    return Cached(meta.get("namespace") or "", meta.get("name") or "", meta.get("uid") or "",
                  json.dumps(plain(body), separators=(",", ":")).encode())


def thaw(entry: Cached) -> Obj:
    thawed: Obj = json.loads(entry.json)
    return thawed


def identity(entry: Cached) -> tuple[str, str, str]:
    return entry.namespace, entry.name, entry.uid


def child_entry(labels: Mapping[str, str], namespace: str, body: kopf.Body,
                label: str) -> dict[Key, Cached] | None:
    """A child's index entry, keyed by its owner (named by `label`)."""
    owner = labels.get(label)
    return {(namespace, owner): cached(body)} if owner else None


COPY_ATTEMPTS = 100
_T = TypeVar("_T")


def copied(source: Iterable[_T]) -> list[_T]:
    """A copy of a kopf index's keys or of one key's entries, taken in a worker thread while
    kopf's event loop may be changing them: iterating a dict that another thread resizes
    fails ("dictionary changed size during iteration"), so the copy is taken again until one
    goes through (the loop's changes are brief)."""
    for _ in range(COPY_ATTEMPTS - 1):
        try:
            return list(iter(source))
        except RuntimeError:
            continue
    return list(iter(source))


def lookup(index: kopf.Index[Key, Cached] | None, key: Key) -> list[Obj]:
    if index is None:
        return []
    store = index.get(key)
    return [thaw(entry) for entry in copied(store)] if store is not None else []


def children(indexes: Mapping[str, Any], names: Iterable[str], key: Key) -> list[Obj]:
    return [obj for name in names for obj in lookup(indexes.get(name), key)]


def model_versions_of(body: Obj, index: kopf.Index[Key, Cached],
                      namespace: str) -> dict[str, Obj]:
    """The ModelVersions one service wants or serves, by key lookup: a reconcile stays O(1)
    however many ModelVersions the cluster holds."""
    names = {body.get("spec", {}).get("modelVersion"),
             (body.get("status") or {}).get("stableModelVersion")}
    found = {}
    for name in names - {None}:
        bodies = lookup(index, (namespace, name))
        if bodies:
            found[name] = bodies[0]
    return found


def namespace_model_versions(index: kopf.Index[Key, Cached], namespace: str) -> dict[str, Obj]:
    """Every ModelVersion of the namespace. Read only when a plan does not fit, for advice
    that points spec.modelVersion at another version of the model (a smaller quantization):
    it walks the whole index, which an ordinary reconcile never does."""
    found = {}
    for ns, name in copied(index):
        entries = copied(index.get((ns, name)) or ()) if ns == namespace else []
        if entries:
            found[name] = thaw(entries[0])
    return found


def namespace_objects(index: kopf.Index[Key, Cached], namespace: str,
                      mentioning: str) -> dict[str, Obj]:
    """The namespace's objects whose JSON holds the string `mentioning` (a name their spec
    or status refers to): only those are parsed, however many the namespace holds."""
    needle = json.dumps(mentioning).encode()
    found = {}
    for ns, name in copied(index):
        entries = copied(index.get((ns, name)) or ()) if ns == namespace else []
        if entries and needle in entries[0].json:
            found[name] = thaw(entries[0])
    return found


def watched_kinds() -> tuple[WatchedKind, ...]:
    """Every indexed kind, with the indexes that hold it, for the sweep of deleted objects."""
    selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
    kinds = [WatchedKind(API_VERSION, "GLMService", "", ("glmservices",)),
             WatchedKind(API_VERSION, "ModelVersion", "", ("modelversions",))]
    by_kind: dict[tuple[str, str], list[str]] = {}
    for (group, version, plural), name in [
            *zip(SERVICE_CRD_CHILDREN, SERVICE_CHILD_INDEXES, strict=True),
            *zip(MODEL_VERSION_CHILDREN, MODEL_CHILD_INDEXES, strict=True)]:
        by_kind.setdefault((f"{group}/{version}" if group else version, plural), []).append(name)
    for (api_version, plural), names in by_kind.items():
        kind = kind_by_plural(api_version, plural).kind
        kinds.append(WatchedKind(api_version, kind, selector, tuple(names)))
    return tuple(kinds)


WATCHED_KINDS = watched_kinds()
