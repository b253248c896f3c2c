"""The CRDs' CEL rules, applied in Python: each cross-field rule is written once.

A rule lives in one place, the `x-kubernetes-validations` of its type (the CRD schema the
API server enforces at admission). The operator's offline tools (`glm-operator render`,
`plan`, `convert`) and the types themselves apply the same rules here, evaluated by
cel-python over the same generated schema, so a manifest the API server would refuse is
refused offline with the API server's message and field path, and no rule is mirrored by
hand. Objects read back from the API server were admitted already: they are not checked
again (the ADMITTED validation context).

What differs from the API server: transition rules (those that read `oldSelf`) need the
stored object and are left to it; cel-python's RE2 is the same engine as Kubernetes'.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError
from pydantic import BaseModel

Schema = Mapping[str, Any]


def _join(items: celtypes.ListType, separator: celtypes.StringType | None = None
          ) -> celtypes.StringType:
    """Kubernetes' strings library: list.join(separator)."""
    return celtypes.StringType(("" if separator is None else str(separator)).join(
        str(i) for i in items))


def _is_sorted(items: Sequence[Any]) -> celtypes.BoolType:
    """Kubernetes' lists library: list.isSorted()."""
    return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(items)))


# Kubernetes' quantity library: isQuantity(string), quantity(string) and the compare methods
# the rules use (the value as a double: the rules only compare with 0).
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_SCALE = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50,
          "Ei": 2.0**60, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9,
          "T": 1e12, "P": 1e15, "E": 1e18}


def _is_quantity(text: celtypes.StringType) -> celtypes.BoolType:
    return celtypes.BoolType(bool(_QUANTITY.match(str(text))))


def _quantity(text: celtypes.StringType) -> celtypes.DoubleType:
    found = _QUANTITY.match(str(text))
    if found is None:
        raise ValueError(f"{text!r} is not a quantity")
    number, suffix = float(found.group(1)), found.group(2) or ""
    scale = float(10 ** int(suffix[1:])) if suffix[:1] in ("e", "E") else _SCALE.get(suffix, 1.0)
    return celtypes.DoubleType(number * scale)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "join": _join, "isSorted": _is_sorted, "isQuantity": _is_quantity, "quantity": _quantity,
    "isGreaterThan": lambda a, b: celtypes.BoolType(a > b),
    "isLessThan": lambda a, b: celtypes.BoolType(a < b),
}
_ENVIRONMENT = celpy.Environment()


@functools.cache
def _program(expression: str) -> celpy.Runner:
    return _ENVIRONMENT.program(_ENVIRONMENT.compile(expression), functions=_FUNCTIONS)


def _holds(expression: str, value: Any) -> bool:
    try:
        return bool(_program(expression).evaluate({"self": value}))
    except (CELEvalError, TypeError, ValueError, KeyError):
        return False  # as the API server: a rule that cannot be evaluated does not hold


def _message(rule: Mapping[str, str], value: Any) -> str:
    expression = rule.get("messageExpression")
    if expression:
        try:
            return str(_program(expression).evaluate({"self": value}))
        except (CELEvalError, TypeError, ValueError, KeyError, IndexError):
            pass
    return rule.get("message") or f"failed rule: {rule['rule']}"


def violations(schema: Schema, value: Any, path: str = "spec") -> Iterator[str]:
    """`path.field: message` for each rule `value` breaks, depth first, as the API server
    reports them."""
    if value is None:
        return
    checked = [r for r in schema.get("x-kubernetes-validations", ()) if "oldSelf" not in r["rule"]]
    if checked:
        as_cel = json_to_cel(value)  # once for the node's rules
        for rule in checked:
            if not _holds(rule["rule"], as_cel):
                yield f"{path}{rule.get('fieldPath', '')}: {_message(rule, as_cel)}"
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from violations(sub, value[name], f"{path}.{name}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                yield from violations(extra, item, f"{path}[{key}]")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from violations(schema["items"], item, f"{path}[{index}]")


@functools.cache
def _schema_of(model: type[BaseModel]) -> Schema:
    from glm_operator.api.crdgen import structural_schema  # crdgen imports the types

    return structural_schema(model)


def broken(model: BaseModel, path: str = "spec") -> list[str]:
    """Every rule of `model`'s schema its value breaks, its defaults filled (as the API
    server fills them before its rules run)."""
    value = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    return list(violations(_schema_of(type(model)), value, path))


def check(model: BaseModel, path: str = "spec") -> None:
    """Raise ValueError naming every rule `model` breaks."""
    found = broken(model, path)
    if found:
        raise ValueError("; ".join(found))
