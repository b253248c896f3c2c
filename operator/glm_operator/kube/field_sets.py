"""Server-side apply's field sets (`managedFields[].fieldsV1`) as plain trees.

A field set is a nested map whose keys name fields (`f:spec`), list items by key
(`k:{"name":"engine"}`) or value (`v:"x"`), and `.` for "this node itself"; an empty map is a
leaf. Pure functions, so ownership changes can be reasoned about and unit-tested.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FieldSet = dict[str, Any]


def merged_field_sets(a: Mapping[str, Any], b: Mapping[str, Any]) -> FieldSet:
    """The union of two field sets: every field either owns."""
    merged: FieldSet = {key: _copy(value) for key, value in a.items()}
    for key, value in b.items():
        if key in merged and isinstance(merged[key], Mapping) and isinstance(value, Mapping):
            merged[key] = merged_field_sets(merged[key], value)
        else:
            merged[key] = _copy(value)
    return merged


def without_replicas(fields: Mapping[str, Any]) -> FieldSet:
    """The field set less `spec.replicas` (which belongs to the autoscaler's manager)."""
    copied = {key: _copy(value) for key, value in fields.items()}
    spec = copied.get("f:spec")
    if isinstance(spec, dict):
        spec.pop("f:replicas", None)
        if not spec:
            copied.pop("f:spec")
    return copied


def _copy(value: Any) -> Any:
    return merged_field_sets(value, {}) if isinstance(value, Mapping) else value
