"""Accelerator profiles from operator config: the Helm values' spelling, checked field by field.

`load_profiles(extra)` merges user entries over the shipped catalog (planning/accelerators.py):
an entry whose name exists overrides only the fields it sets, a new name is complete or says
`basedOn`. Every error names the profile and the field. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from glm_operator import __version__
from glm_operator.planning.accelerators import (
    DEFAULT_IMAGE_REGISTRY,
    AcceleratorProfile,
    MiB,
    Toleration,
    builtin_profiles,
)
from glm_operator.planning.architectures import check_architectures

# Operator-config spelling (camelCase, as in the Helm values) -> dataclass field.
_CONFIG_KEYS: dict[str, str] = {
    "vendor": "vendor",
    "memoryBytes": "memory_bytes",
    "memoryMiB": "memory_bytes",
    "resourceName": "resource_name",
    "nodeLabels": "node_labels",
    "tolerations": "tolerations",
    "engines": "engines",
    "images": "images",
    "maxDevicesPerNode": "max_devices_per_node",
    "flashAttention": "flash_attention",
    "bf16": "bf16",
    "fp8": "fp8",
    "runtimeOverheadBytes": "runtime_overhead_bytes",
    "cpuCores": "cpu_cores",
    "architectures": "architectures",
    "description": "description",
}


# The type of each operator-config field, checked before the value reaches the dataclass (a
# string where a number belongs would otherwise pass, or fail deep inside the planner). The
# chart's values.schema.json states the same rules (tests/chart pins the two together).
# key -> its minimum (memory and maxDevicesPerNode: checked by the profile itself)
_INTEGER_KEYS: dict[str, int | None] = {"memoryBytes": None, "memoryMiB": None,
                                        "maxDevicesPerNode": None, "runtimeOverheadBytes": 0,
                                        "cpuCores": 1}
_BOOLEAN_KEYS = frozenset({"flashAttention", "bf16", "fp8"})
_STRING_KEYS = frozenset({"basedOn", "vendor", "resourceName", "description"})
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION_OPERATORS = ("Exists", "Equal")


def _check_type(name: str, key: str, value: Any) -> None:
    if key in _INTEGER_KEYS:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"profile {name}: {key} must be an integer, not {value!r}")
        minimum = _INTEGER_KEYS[key]
        if minimum is not None and value < minimum:
            raise ValueError(f"profile {name}: {key} must be >= {minimum}, not {value}")
    elif key in _BOOLEAN_KEYS and not isinstance(value, bool):
        raise ValueError(f"profile {name}: {key} must be true or false, not {value!r}")
    elif key in _STRING_KEYS and not isinstance(value, str):
        raise ValueError(f"profile {name}: {key} must be a string, not {value!r}")
    elif key in ("engines", "tolerations") and not isinstance(value, list | tuple):
        raise ValueError(f"profile {name}: {key} must be a list, not {value!r}")
    elif key in ("images", "nodeLabels") and not isinstance(value, Mapping):
        raise ValueError(f"profile {name}: {key} must be a mapping, not {value!r}")


def _toleration(name: str, entry: Any) -> Toleration:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("key"), str):
        raise ValueError(f"profile {name}: each toleration needs a key (a string)")
    unknown = sorted(set(entry) - {"key", "effect", "operator", "value"})
    if unknown:
        raise ValueError(f"profile {name}: unknown toleration field(s) {', '.join(unknown)}")
    toleration = Toleration(key=entry["key"], effect=str(entry.get("effect", "NoSchedule")),
                            operator=str(entry.get("operator", "Exists")),
                            value=entry.get("value"))
    if toleration.effect not in TOLERATION_EFFECTS:
        raise ValueError(f"profile {name}: toleration effect must be one of "
                         f"{', '.join(TOLERATION_EFFECTS)}, not {toleration.effect!r}")
    if toleration.operator not in TOLERATION_OPERATORS:
        raise ValueError(f"profile {name}: toleration operator must be one of "
                         f"{', '.join(TOLERATION_OPERATORS)}, not {toleration.operator!r}")
    return toleration


def _profile_fields(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(spec) - set(_CONFIG_KEYS) - {"basedOn"})
    if unknown:
        raise ValueError(f"profile {name}: unknown field(s) {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for key, value in spec.items():
        _check_type(name, key, value)
        if key == "basedOn":
            continue
        target = _CONFIG_KEYS[key]
        if key == "memoryMiB":
            value = int(value) * MiB
        elif key == "nodeLabels":
            value = {
                str(k): (str(v),) if isinstance(v, str) else tuple(str(x) for x in v)
                for k, v in dict(value).items()
            }
        elif key == "tolerations":
            value = tuple(_toleration(name, t) for t in value)
        elif key == "engines":
            value = tuple(value)
        elif key == "images":
            value = dict(value)
        elif key == "architectures":
            value = check_architectures(value, where=f"profile {name}: architectures")
        out[target] = value
    return out


def load_profiles(
    extra: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    registry: str = DEFAULT_IMAGE_REGISTRY,
    tag: str = __version__,
) -> Mapping[str, AcceleratorProfile]:
    """The built-in catalog merged with user profiles from operator config.

    A user entry whose name exists overrides only the fields it sets (e.g. `cpu:
    {memoryMiB: 262144, cpuCores: 32}`); a new name must be complete, or say `basedOn:
    <profile>` to start from one. Every result is validated; errors name the profile and field.
    """
    profiles = builtin_profiles(registry, tag)
    for name, spec in (extra or {}).items():
        if not isinstance(spec, Mapping):
            raise ValueError(f"profile {name}: must be a mapping")
        changes = _profile_fields(name, spec)
        base_name = spec.get("basedOn", name if name in profiles else None)
        try:
            if base_name is not None:
                if base_name not in profiles:
                    raise ValueError(f"profile {name}: basedOn {base_name!r} is not a profile")
                base = profiles[base_name]
                if "images" in changes:  # an override of one engine's image keeps the others
                    changes["images"] = {**base.images, **changes["images"]}
                profiles[name] = replace(base, name=name, **changes)
            else:
                missing = {"vendor", "memory_bytes", "engines", "images"} - set(changes)
                if missing:
                    raise ValueError(
                        f"profile {name}: a new profile needs {', '.join(sorted(missing))} "
                        "(or basedOn)"
                    )
                changes.setdefault("resource_name", None)
                changes.setdefault("node_labels", {})
                changes.setdefault("tolerations", ())
                changes.setdefault("max_devices_per_node", 1)
                changes.setdefault("flash_attention", False)
                changes.setdefault("bf16", False)
                changes.setdefault("fp8", False)
                profiles[name] = AcceleratorProfile(name=name, **changes)
        except TypeError as exc:  # a wrongly typed value reaching the dataclass
            raise ValueError(f"profile {name}: {exc}") from exc
    return MappingProxyType(profiles)
