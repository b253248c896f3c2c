"""Building blocks shared by every API type: model bases, Kubernetes scalar types, metadata.

The pydantic models in this package are the single source of truth for the CRDs
(`glm_operator.api.crdgen` turns them into structural OpenAPI schemas). That is why
cross-field rules are written twice, once as a pydantic validator and once as CEL in
`x-kubernetes-validations` next to it: the API server enforces the CEL, offline tools
(`glm-operator render`, the unit tests over examples/) enforce the validator.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from glm_operator.wellknown import API_VERSION as API_VERSION
from glm_operator.wellknown import GROUP as GROUP
from glm_operator.wellknown import RESERVED_LABEL_PREFIXES as RESERVED_LABEL_PREFIXES
from glm_operator.wellknown import VERSION as VERSION

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Go time.Duration subset we accept for intervals: "30s", "2m", "1h30m".
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h))+$"

_CAMEL = ConfigDict(
    alias_generator=to_camel,
    populate_by_name=True,
    protected_namespaces=(),
    # Enum fields serialise as their plain string values.
    use_enum_values=True,
    validate_default=True,
)


class SpecModel(BaseModel):
    """Base of every spec type: camelCase wire names, unknown fields refused.

    Refusing unknown fields mirrors `kubectl apply --validate=strict`: a typo such as
    `contextLenght` is an error, not a silently dropped setting.
    """

    model_config = ConfigDict(**_CAMEL, extra="forbid")


class StatusModel(BaseModel):
    """Base of every status type: camelCase wire names, unknown fields ignored.

    Status is written by the operator; a newer operator may add fields an older reader
    does not know, which must not break it.
    """

    model_config = ConfigDict(**_CAMEL, extra="ignore")


# A Kubernetes quantity ("24Gi", "500m", 4). The CRD schema says int-or-string.
# A Kubernetes quantity ("20Gi", "1500m", 2), never negative. The API server checks it with
# CEL's quantity library, the pydantic type with the same grammar, so `glm-operator render`
# refuses what `kubectl apply` would.
_QUANTITY = re.compile(r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_ZERO = re.compile(r"^\+?[0.]*([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


def _quantity(positive: bool) -> Any:
    least = "positive" if positive else "non-negative"
    message = f"must be a {least} Kubernetes quantity such as 20Gi, 1500m or 2"
    # The quantity library of the pinned API server has compare methods, not sign().
    least_ok = "quantity(self).isGreaterThan(quantity('0'))" if positive \
        else "!quantity(self).isLessThan(quantity('0'))"

    def check(value: str | int) -> str | int:
        if isinstance(value, int):
            bad = value <= 0 if positive else value < 0
        else:
            bad = not _QUANTITY.match(value) or (positive and bool(_ZERO.match(value)))
        if bad:
            raise ValueError(f"{value!r} {message}")
        return value

    return Annotated[
        str | int,
        WithJsonSchema({
            "x-kubernetes-int-or-string": True,
            "maxLength": 64,  # bounds the CEL cost (and no real quantity is longer)
            "x-kubernetes-validations": [{
                "rule": f"type(self) == int ? self {'>' if positive else '>='} 0 : "
                        f"isQuantity(self) && {least_ok}",
                "message": message,
            }],
        }),
        Field(union_mode="left_to_right"),
        AfterValidator(check),
    ]


if TYPE_CHECKING:
    Quantity = str | int
    PositiveQuantity = str | int
else:
    Quantity = _quantity(positive=False)
    PositiveQuantity = _quantity(positive=True)

# An object whose fields Kubernetes defines (affinity, ...): passed through unvalidated.
FreeFormObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]

ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
SecretName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
StringMap = Annotated[
    dict[str, Annotated[str, Field(max_length=4096)]],
    Field(json_schema_extra={"maxProperties": 64}),
]
# Integers that may exceed 2^31 (bytes, parameter counts): int64 in the schema.
Int64 = Annotated[int, Field(json_schema_extra={"format": "int64"})]
NonNegativeInt64 = Annotated[int, Field(ge=0, json_schema_extra={"format": "int64"})]
Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)]
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """Seconds in a Duration ("1m30s" -> 90.0)."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration such as 30s, 2m or 1h30m")
    return sum(float(n) * _DURATION_UNITS[unit]
               for n, unit in re.findall(r"([0-9]+)(ms|s|m|h)", text))


class ObjectMeta(BaseModel):
    """The parts of metav1.ObjectMeta the operator reads; everything else is kept as is."""

    model_config = ConfigDict(**_CAMEL, extra="allow")

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
