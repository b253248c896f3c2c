"""Does a live object already hold the operator's intent? (pure)

The operator applies a child only when the live object differs from what it renders, so a
periodic check of an unchanged cluster makes no write at all. "Holds the intent" means every
field the operator sets has the same value live; fields the API server defaults or other
actors own (status, an HPA's replicas, a user's extra annotation) are not compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Server-set metadata never appears in the operator's intent.
_IGNORED_METADATA = frozenset(
    {"resourceVersion", "uid", "generation", "creationTimestamp", "managedFields"}
)


def holds_intent(desired: Any, live: Any) -> bool:
    """True when `live` contains `desired` (maps by key, lists element by element)."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(k in live and holds_intent(v, live[k]) for k, v in desired.items())
    if isinstance(desired, Sequence) and not isinstance(desired, str):
        if not isinstance(live, Sequence) or isinstance(live, str) or len(desired) != len(live):
            return False
        return all(holds_intent(d, v) for d, v in zip(desired, live, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live
    if isinstance(desired, int | float) and isinstance(live, int | float):
        return float(desired) == float(live)
    return bool(desired == live)


def object_holds_intent(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """Compare whole objects: metadata labels/annotations/ownerReferences, then the rest."""
    if live is None:
        return False
    for key, value in desired.items():
        if key == "metadata":
            meta = {k: v for k, v in value.items() if k not in _IGNORED_METADATA}
            if not holds_intent(meta, live.get("metadata", {})):
                return False
        elif key == "status":
            continue
        elif not holds_intent(value, live.get(key)):
            return False
    return True


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
