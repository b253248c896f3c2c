"""Does a live object already hold the operator's intent, and if not, why? (pure)

The operator applies a child only when the live object differs from what it renders, so a
periodic check of an unchanged cluster makes no write at all. "Holds the intent" means every
field the operator sets has the same value live; fields the API server defaults or other
actors own (status, an HPA's replicas, a user's extra annotation) are not compared.

Containment alone cannot see a field the operator stops setting (a label removed from
`podOverrides`): the live object still holds everything desired. So every applied object
carries a hash of its whole intent (`INTENT_HASH_ANNOTATION`); a different hash means the
intent changed, and the server-side apply that follows drops what the operator no longer sets.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from glm_operator.wellknown import GROUP, INTENT_HASH_ANNOTATION

# Server-set metadata never appears in the operator's intent.
_IGNORED_METADATA = frozenset(
    {"resourceVersion", "uid", "generation", "creationTimestamp", "managedFields"}
)
_OWNER_API_VERSION = f"{GROUP}/v1alpha1"
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class DriftReason(StrEnum):
    """Why an object is written; a bounded label for the operator's metrics."""

    MISSING = "Missing"  # not in the cluster
    INTENT_CHANGED = "IntentChanged"  # the operator renders something else now
    LIVE_CHANGED = "LiveChanged"  # someone else edited or removed a field the operator sets


@dataclass(frozen=True)
class Drift:
    reason: DriftReason
    path: str  # the first differing field, e.g. spec.template.spec.containers[0].image

    def __str__(self) -> str:
        return f"{self.reason}: {self.path}"


def _key_path(path: str, key: str) -> str:
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key}]"


def first_difference(desired: Any, live: Any, path: str = "") -> str | None:
    """The path of the first field of `desired` that `live` does not hold (maps by key,
    lists element by element), or None when `live` contains all of `desired`."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return path or "."
        for key, value in desired.items():
            where = _key_path(path, str(key))
            if key not in live:
                return where
            found = first_difference(value, live[key], where)
            if found is not None:
                return found
        return None
    if isinstance(desired, Sequence) and not isinstance(desired, str):
        if not isinstance(live, Sequence) or isinstance(live, str):
            return path
        for index, (d, v) in enumerate(zip(desired, live, strict=False)):
            found = first_difference(d, v, f"{path}[{index}]")
            if found is not None:
                return found
        return None if len(desired) == len(live) else f"{path}[{min(len(desired), len(live))}]"
    if isinstance(desired, bool) or isinstance(live, bool):
        return None if desired is live else path
    if isinstance(desired, int | float) and isinstance(live, int | float):
        return None if float(desired) == float(live) else path
    return None if desired == live else path


def holds_intent(desired: Any, live: Any) -> bool:
    """True when `live` contains `desired`."""
    return first_difference(desired, live) is None


def _owners_unversioned(meta: Mapping[str, Any]) -> dict[str, Any]:
    """`meta` with our owners' apiVersion at one version: an owner is its group, kind and
    uid, the version it is served at is not part of the intent. Written as v1alpha1, so the
    hashes of children applied before v1alpha2 still match and the upgrade rewrites none."""
    owners = meta.get("ownerReferences")
    if not owners:
        return dict(meta)
    return {**meta, "ownerReferences": [
        {**r, "apiVersion": _OWNER_API_VERSION}
        if str(r.get("apiVersion", "")).startswith(f"{GROUP}/") else r for r in owners]}


def _comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "status"}
    meta = {k: v for k, v in _owners_unversioned(obj.get("metadata", {})).items()
            if k not in _IGNORED_METADATA}
    annotations = {k: v for k, v in meta.get("annotations", {}).items()
                   if k != INTENT_HASH_ANNOTATION}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    out["metadata"] = meta
    return out


def intent_hash(obj: Mapping[str, Any]) -> str:
    """A short hash of everything the operator sets on `obj` (its own hash excluded)."""
    canonical = json.dumps(_comparable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_intent_hash(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), INTENT_HASH_ANNOTATION: intent_hash(obj)}
    return {**obj, "metadata": meta}


def drift(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> Drift | None:
    """Why `live` must be written to hold `desired` (stamped by `with_intent_hash`), or None.

    A hash that differs from the live one is an intent change even when every field still
    matches (a field removed from the intent); a field that differs under an unchanged hash
    is someone else's edit."""
    if live is None:
        return Drift(DriftReason.MISSING, ".")
    difference = first_difference(
        _comparable(desired), {**live, "metadata": _owners_unversioned(live.get("metadata", {}))})
    wanted = desired.get("metadata", {}).get("annotations", {}).get(INTENT_HASH_ANNOTATION)
    applied = live.get("metadata", {}).get("annotations", {}).get(INTENT_HASH_ANNOTATION)
    if wanted is not None and wanted != applied:
        return Drift(DriftReason.INTENT_CHANGED,
                     difference or f"metadata.annotations[{INTENT_HASH_ANNOTATION}]"
                     " (a field the operator no longer sets)")
    if difference is not None:
        return Drift(DriftReason.LIVE_CHANGED, difference)
    return None


def object_holds_intent(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    return drift(desired, live) is None


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: removed keys become
    null, so a field the operator stops reporting (a finished rollout) really goes."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif key not in old or before != value:
            patch[key] = value
    return patch
