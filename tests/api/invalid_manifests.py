"""Loader for invalid_manifests.yaml, shared by the unit test and e2e/test_api_validation.py."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TABLE = Path(__file__).with_name("invalid_manifests.yaml")
API_VERSION = "serving.glm-operator.dev/v1alpha2"


def merge(base: Any, patch: Any) -> Any:
    """JSON-merge-patch semantics: dicts merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


@dataclass(frozen=True)
class InvalidCase:
    name: str
    kind: str
    spec: dict[str, Any]  # the spec to create (complete, base merged in)
    expect: tuple[str, ...]
    update: dict[str, Any] | None = None  # the complete spec of the refused update
    extra: dict[str, Any] = field(default_factory=dict)

    def manifest(self, name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "metadata": {"name": name},
            "spec": spec if spec is not None else self.spec,
        }


def load_cases() -> list[InvalidCase]:
    table = yaml.safe_load(TABLE.read_text())
    cases = []
    for raw in table["cases"]:
        spec = merge(table["bases"][raw["kind"]], raw.get("spec") or {})
        update = merge(spec, raw["update"]) if "update" in raw else None
        cases.append(
            InvalidCase(
                name=raw["name"],
                kind=raw["kind"],
                spec=spec,
                expect=tuple(raw["expect"]),
                update=update,
            )
        )
    return cases
