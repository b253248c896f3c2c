"""Pydantic models -> structural apiextensions.k8s.io/v1 CRDs.

pydantic emits JSON Schema (draft 2020-12: `$ref`, `anyOf` with null for optionals,
`additionalProperties: false` for forbidden extras). The API server wants a *structural*
OpenAPI v3 schema: every node typed, no references, no unions except int-or-string.
`structural_schema` bridges the two; `structural_errors` checks the result so that a
type change that cannot be expressed fails here, not when the CRD is applied.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from glm_operator.api.base import GROUP
from glm_operator.api.glmservice import GLMService, GLMServiceSpec
from glm_operator.api.glmservice_status import GLMServiceStatus
from glm_operator.api.glmservice_v1alpha1 import GLMServiceSpec as GLMServiceSpecV1alpha1
from glm_operator.api.modelversion import ModelVersion, ModelVersionSpec, ModelVersionStatus

Schema = dict[str, Any]

# Keys the pydantic output may carry that have no place in a CRD schema.
_DROPPED_KEYS = {"title", "examples", "$defs"}
# Keys JSONSchemaProps accepts (apiextensions.k8s.io/v1); anything else is a generator bug.
_ALLOWED_KEYS = {
    "type", "format", "description", "default", "enum", "nullable",
    "maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum", "multipleOf",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
    "maxProperties", "minProperties", "required", "items", "properties",
    "additionalProperties", "example",
    "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type", "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
}  # fmt: skip
_NULL = {"type": "null"}


def _merge(base: Schema, overlay: Schema) -> Schema:
    """Overlay a field's keywords on the schema of its type.

    The field's own description and bounds win; `items` merge key by key (a field may
    bound the items of a list type); CEL rules of type and field both apply.
    """
    merged = dict(base)
    for key, value in overlay.items():
        if key == "items" and isinstance(merged.get("items"), dict):
            merged["items"] = _merge(merged["items"], value)
        elif key == "x-kubernetes-validations" and key in merged:
            merged[key] = [*merged[key], *value]
        else:
            merged[key] = value
    return merged


def _convert(node: Schema, defs: dict[str, Schema], *, drop_defaults: bool) -> Schema:
    node = {k: v for k, v in node.items() if k not in _DROPPED_KEYS}
    if node.get("default", 0) is None:
        del node["default"]
    if drop_defaults:
        node.pop("default", None)

    # Unwrap references and Optional[...] into the single type they stand for.
    for union_key in ("anyOf", "oneOf", "allOf"):
        if union_key in node:
            choices = [c for c in node.pop(union_key) if c != _NULL]
            if len(choices) != 1:
                raise ValueError(f"cannot express a union in a structural schema: {choices}")
            target = _convert(choices[0], defs, drop_defaults=drop_defaults)
            node = _merge(target, _convert(node, defs, drop_defaults=drop_defaults))
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        target = _convert(defs[name], defs, drop_defaults=drop_defaults)
        node = _merge(target, _convert(node, defs, drop_defaults=drop_defaults))

    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("additionalProperties") is False:
        # Unknown fields are pruned (and refused by `kubectl apply --validate=strict`).
        del node["additionalProperties"]
    if node.get("additionalProperties") is True:
        del node["additionalProperties"]
        node["x-kubernetes-preserve-unknown-fields"] = True
    if "properties" in node:
        node["properties"] = {
            name: _convert(prop, defs, drop_defaults=drop_defaults)
            for name, prop in node["properties"].items()
        }
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _convert(node[key], defs, drop_defaults=drop_defaults)
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    return node


# Order of keywords in the YAML: what a reader looks for first.
_KEY_ORDER = (
    "type", "description", "format", "enum", "default", "required", "properties",
    "additionalProperties", "items",
)  # fmt: skip


def _ordered(node: Schema) -> Schema:
    def rank(key: str) -> tuple[int, str]:
        return (_KEY_ORDER.index(key) if key in _KEY_ORDER else len(_KEY_ORDER), key)

    result: Schema = {}
    for key in sorted(node, key=rank):
        value = node[key]
        if key == "properties":
            value = {name: _ordered(prop) for name, prop in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            value = _ordered(value)
        result[key] = value
    return result


def structural_schema(model: type[BaseModel], *, drop_defaults: bool = False) -> Schema:
    """The structural OpenAPI v3 schema of a pydantic model, by its wire (alias) names.

    `drop_defaults` is for status: defaults there would be filled in on every read,
    hiding whether the operator has written the field yet.
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _ordered(_convert(raw, raw.get("$defs", {}), drop_defaults=drop_defaults))


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    priority: int = 0
    description: str = ""

    def as_dict(self) -> Schema:
        column: Schema = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            column["description"] = self.description
        if self.priority:
            column["priority"] = self.priority
        return column


@dataclass(frozen=True)
class Version:
    """One served version of a kind: its schema's types and its printer columns."""

    name: str
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[PrinterColumn, ...]
    storage: bool = False
    served: bool = True


@dataclass(frozen=True)
class ConversionWebhook:
    """`spec.conversion` of a kind whose versions differ in shape: the API server calls the
    operator's webhook (glm_operator/webhook/) to convert between them.

    The service written here is the chart's for its documented release, `glm-operator` in
    the namespace `glm-operator` (`<fullname>-webhook`), without a caBundle: the chart's CRD
    template puts its own release's service and CA in their place
    (charts/glm-operator/templates/crds.yaml); whoever applies crds/ by hand sets them
    (docs/install.md#the-conversion-webhook)."""

    service_name: str = "glm-operator-webhook"
    service_namespace: str = "glm-operator"
    path: str = "/convert"
    port: int = 443

    def as_dict(self) -> Schema:
        return {
            "strategy": "Webhook",
            "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {
                    "service": {
                        "name": self.service_name,
                        "namespace": self.service_namespace,
                        "path": self.path,
                        "port": self.port,
                    },
                },
            },
        }


@dataclass(frozen=True)
class Kind:
    """Everything that makes one CRD: names, versions, subresources, conversion."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    model: type[BaseModel]
    versions: tuple[Version, ...]
    scale: bool = False
    categories: tuple[str, ...] = ("glm",)
    # None: the versions share one schema, and the API server converts by rewriting
    # apiVersion (strategy None).
    conversion: ConversionWebhook | None = None

    def __post_init__(self) -> None:
        storage = [v.name for v in self.versions if v.storage]
        if len(storage) != 1:
            raise ValueError(f"{self.kind}: exactly one storage version, got {storage}")
        if not all(v.served for v in self.versions if v.storage):
            raise ValueError(f"{self.kind}: the storage version must be served")
        schemas = {(v.spec, v.status) for v in self.versions}
        if len(schemas) > 1 and self.conversion is None:
            raise ValueError(f"{self.kind}: versions of different schemas need a conversion "
                             "webhook")

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def storage_version(self) -> Version:
        return next(v for v in self.versions if v.storage)

    # The storage version's types and columns: what docs/api.md documents.
    @property
    def spec(self) -> type[BaseModel]:
        return self.storage_version.spec

    @property
    def status(self) -> type[BaseModel]:
        return self.storage_version.status

    @property
    def columns(self) -> tuple[PrinterColumn, ...]:
        return self.storage_version.columns


READY_COLUMN = PrinterColumn(
    "Ready", '.status.conditions[?(@.type=="Ready")].status', description="Ready condition"
)
AGE_COLUMN = PrinterColumn("Age", ".metadata.creationTimestamp", type="date")

GLMSERVICE_V1ALPHA1_COLUMNS = (
    READY_COLUMN,
    PrinterColumn("Engine", ".status.plan.engine", description="Planned engine"),
    PrinterColumn("Accelerator", ".spec.accelerator.profile"),
    PrinterColumn("Model version", ".spec.modelVersion", description="Wanted version"),
    PrinterColumn("Stable", ".status.stableModelVersion", priority=1),
    PrinterColumn("Ready replicas", ".status.readyReplicas", type="integer"),
    PrinterColumn("Canary weight", ".status.canaryWeight", type="integer"),
    PrinterColumn("Canary ready", ".status.canaryReadyReplicas", type="integer", priority=1),
    PrinterColumn("Context", ".spec.contextLength", type="integer", priority=1),
    PrinterColumn("Endpoint", ".status.endpoint", priority=1),
    AGE_COLUMN,
)
# v1alpha2: v1alpha1's columns (the engine is the plan's, in both), and the vLLM layout the
# plan chose (tp, dcp, dep) with -o wide.
GLMSERVICE_V1ALPHA2_COLUMNS = (
    *GLMSERVICE_V1ALPHA1_COLUMNS[:-1],
    PrinterColumn("Layout", ".status.plan.vllm.layout", priority=1,
                  description="vLLM layout of a replica's devices"),
    AGE_COLUMN,
)
GLMSERVICE_KIND = Kind(
    kind="GLMService",
    plural="glmservices",
    short_names=("glms",),
    model=GLMService,
    versions=(
        Version("v1alpha1", GLMServiceSpecV1alpha1, GLMServiceStatus,
                GLMSERVICE_V1ALPHA1_COLUMNS),
        Version("v1alpha2", GLMServiceSpec, GLMServiceStatus, GLMSERVICE_V1ALPHA2_COLUMNS,
                storage=True),
    ),
    scale=True,
    conversion=ConversionWebhook(),
)
MODELVERSION_COLUMNS = (
    PrinterColumn("Phase", ".status.phase"),
    PrinterColumn("Progress", ".status.progress.summary",
                  description="The fetch Job's download: done/total, rate, ETA"),
    PrinterColumn("Format", ".spec.format"),
    PrinterColumn("Quantization", ".spec.quantization"),
    PrinterColumn("Architecture", ".spec.architecture"),
    PrinterColumn("Size", ".status.sizeBytes", type="integer", description="Bytes"),
    PrinterColumn("Source", ".spec.source.uri", priority=1),
    AGE_COLUMN,
)
MODELVERSION_KIND = Kind(
    kind="ModelVersion",
    plural="modelversions",
    short_names=("mv",),
    model=ModelVersion,
    versions=(
        Version("v1alpha1", ModelVersionSpec, ModelVersionStatus, MODELVERSION_COLUMNS),
        Version("v1alpha2", ModelVersionSpec, ModelVersionStatus, MODELVERSION_COLUMNS,
                storage=True),
    ),
)
KINDS: tuple[Kind, ...] = (GLMSERVICE_KIND, MODELVERSION_KIND)


def object_schema(kind: Kind, version: Version | None = None) -> Schema:
    """The openAPIV3Schema of one version of a kind (default: the storage version):
    apiVersion, kind, metadata, spec, status."""
    version = version or kind.storage_version
    spec = structural_schema(version.spec)
    spec["description"] = (version.spec.__doc__ or "").strip().splitlines()[0]
    status = structural_schema(version.status, drop_defaults=True)
    status["description"] = (version.status.__doc__ or "").strip().splitlines()[0]
    return {
        "type": "object",
        "description": _kind_description(kind),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"{GROUP}/{version.name}"},
            "kind": {"type": "string", "description": kind.kind},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def _kind_description(kind: Kind) -> str:
    """The first paragraph of the kind's module docstring, on one line."""
    module_doc = sys.modules[kind.model.__module__].__doc__ or ""
    return " ".join(module_doc.strip().split("\n\n")[0].split())


def crd(kind: Kind) -> Schema:
    """The CustomResourceDefinition of one kind."""
    subresources: Schema = {"status": {}}
    if kind.scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    spec: Schema = {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {
            "kind": kind.kind,
            "listKind": f"{kind.kind}List",
            "plural": kind.plural,
            "singular": kind.kind.lower(),
            "shortNames": list(kind.short_names),
            "categories": list(kind.categories),
        },
    }
    if kind.conversion is not None:
        spec["conversion"] = kind.conversion.as_dict()
    spec["versions"] = [
        {
            "name": version.name,
            "served": version.served,
            "storage": version.storage,
            "schema": {"openAPIV3Schema": object_schema(kind, version)},
            "subresources": subresources,
            "additionalPrinterColumns": [c.as_dict() for c in version.columns],
        }
        for version in kind.versions
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": kind.crd_name,
            "labels": {
                "app.kubernetes.io/name": "glm-operator",
                "app.kubernetes.io/part-of": "glm-operator",
            },
        },
        "spec": spec,
    }


def structural_errors(schema: Schema, path: str = "", *, bounded: bool = True) -> list[str]:
    """Why a schema is not structural (or not bounded for CEL cost), empty when it is.

    `bounded` demands maxLength on strings, maxItems on lists and maxProperties on maps,
    which keeps every CEL rule's worst-case cost estimate within the API server budget.
    """
    errors: list[str] = []
    where = path or "<root>"
    unknown = set(schema) - _ALLOWED_KEYS
    if unknown:
        errors.append(f"{where}: keys not allowed in a CRD schema: {sorted(unknown)}")
    free_form = schema.get("x-kubernetes-preserve-unknown-fields") or schema.get(
        "x-kubernetes-int-or-string"
    )
    kind = schema.get("type")
    if kind is None and not free_form:
        errors.append(f"{where}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        errors.append(f"{where}: properties and additionalProperties together")
    if kind == "array" and not isinstance(schema.get("items"), dict):
        errors.append(f"{where}: array without items")
    if bounded and not free_form:
        unbounded_string = kind == "string" and not ({"maxLength", "enum"} & set(schema))
        if unbounded_string and schema.get("format") not in {"date-time", "date"}:
            errors.append(f"{where}: string without maxLength")
        if kind == "array" and "maxItems" not in schema:
            errors.append(f"{where}: array without maxItems")
        if kind == "object" and "additionalProperties" in schema and "maxProperties" not in schema:
            errors.append(f"{where}: map without maxProperties")
    for name, prop in schema.get("properties", {}).items():
        errors += structural_errors(prop, f"{path}.{name}", bounded=bounded)
    for key, suffix in (("items", "[*]"), ("additionalProperties", "{*}")):
        if isinstance(schema.get(key), dict):
            errors += structural_errors(schema[key], f"{path}{suffix}", bounded=bounded)
    for name in schema.get("required", []):
        if name not in schema.get("properties", {}):
            errors.append(f"{where}: required {name!r} is not a property")
    return errors


def crd_errors(definition: Schema) -> list[str]:
    """Structural errors of a CRD, version by version: spec strictly bounded, status only
    structural; and the versions themselves (one storage version, served, names unique)."""
    errors: list[str] = []
    versions = definition["spec"]["versions"]
    names = [v["name"] for v in versions]
    if len(set(names)) != len(names):
        errors.append(f"versions named twice: {names}")
    storage = [v["name"] for v in versions if v.get("storage")]
    if len(storage) != 1:
        errors.append(f"exactly one storage version, got {storage}")
    for version in versions:
        name = version["name"]
        if version.get("storage") and not version.get("served"):
            errors.append(f"{name}: the storage version is not served")
        schema = version["schema"]["openAPIV3Schema"]
        errors += [f"{name}: {e}" for e in
                   structural_errors({**schema, "properties": {}, "required": []}, "")]
        errors += [f"{name}: {e}" for e in
                   structural_errors(schema["properties"]["spec"], ".spec")]
        errors += [f"{name}: {e}" for e in
                   structural_errors(schema["properties"]["status"], ".status", bounded=False)]
    conversion = definition["spec"].get("conversion", {"strategy": "None"})
    schemas = {json.dumps([v["schema"]["openAPIV3Schema"]["properties"][part]
                           for part in ("spec", "status")], sort_keys=True)
               for v in versions}
    if len(schemas) > 1 and conversion.get("strategy") != "Webhook":
        errors.append("versions of different schemas without a conversion webhook")
    if conversion.get("strategy") == "Webhook":
        webhook = conversion.get("webhook", {})
        if "v1" not in webhook.get("conversionReviewVersions", []):
            errors.append("conversion webhook without conversionReviewVersions v1")
        if "service" not in webhook.get("clientConfig", {}):
            errors.append("conversion webhook without clientConfig.service")
    return errors


def all_crds() -> list[Schema]:
    return [crd(kind) for kind in KINDS]
