"""The generated CRDs are structural, carry the promised rules, and match what is committed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator import generate
from glm_operator.api.crdgen import (
    GLMSERVICE_KIND,
    MODELVERSION_KIND,
    crd,
    crd_errors,
    structural_errors,
)

REPO = Path(__file__).resolve().parents[2]


def spec_schema(definition: dict[str, Any]) -> dict[str, Any]:
    """The storage version's schema."""
    storage = next(v for v in definition["spec"]["versions"] if v["storage"])
    schema: dict[str, Any] = storage["schema"]["openAPIV3Schema"]
    return schema


def rules_of(node: dict[str, Any]) -> list[str]:
    return [rule["rule"] for rule in node.get("x-kubernetes-validations", [])]


def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [node]
    for prop in node.get("properties", {}).values():
        nodes += walk(prop)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            nodes += walk(node[key])
    return nodes


def test_committed_files_match_the_types(tmp_path: Path) -> None:
    generate.write_generated(tmp_path)
    stale = [
        relative
        for relative in generate.generated_files()
        if not (REPO / relative).exists()
        or (REPO / relative).read_text() != (tmp_path / relative).read_text()
    ]
    assert not stale, f"generated files are stale: {stale}; run `make crds` and commit"


def test_check_mode_reports_stale_files(tmp_path: Path) -> None:
    args = argparse.Namespace(root=tmp_path, check=True)
    assert generate.run(args) == 1
    assert generate.run(argparse.Namespace(root=tmp_path, check=False)) == 0
    assert generate.run(args) == 0
    (tmp_path / "crds" / generate.crd_filename("glmservices")).write_text("edited")
    assert generate.run(args) == 1


@pytest.mark.parametrize("kind", [GLMSERVICE_KIND, MODELVERSION_KIND], ids=lambda k: k.kind)
def test_crds_are_structural_and_bounded(kind: Any) -> None:
    definition = crd(kind)
    assert crd_errors(definition) == []
    schema = spec_schema(definition)
    for node in walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node


def test_structural_check_catches_the_usual_mistakes() -> None:
    errors = structural_errors(
        {
            "type": "object",
            "properties": {
                "untyped": {"description": "x"},
                "unbounded": {"type": "string"},
                "list": {"type": "array", "items": {"type": "integer"}},
                "both": {"type": "object", "properties": {}, "additionalProperties": {}},
                "ref": {"$ref": "#/x", "type": "object"},
            },
        }
    )
    joined = "\n".join(errors)
    for expected in (
        ".untyped: no type",
        ".unbounded: string without maxLength",
        ".list: array without maxItems",
        ".both: properties and additionalProperties together",
        ".ref: keys not allowed",
    ):
        assert expected in joined


def test_glmservice_crd_shape() -> None:
    definition = crd(GLMSERVICE_KIND)
    assert definition["metadata"]["name"] == "glmservices.serving.glm-operator.dev"
    names = definition["spec"]["names"]
    assert names["shortNames"] == ["glms"] and "glm" in names["categories"]
    old, version = definition["spec"]["versions"]
    assert (old["name"], old["served"], old["storage"]) == ("v1alpha1", True, False)
    assert version["name"] == "v1alpha2" and version["served"] and version["storage"]
    assert definition["spec"]["conversion"]["strategy"] == "Webhook"
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    for name in (
        "Engine",
        "Accelerator",
        "Model version",
        "Ready replicas",
        "Canary weight",
        "Age",
    ):
        assert name in columns
    spec = spec_schema(definition)["properties"]["spec"]
    props = spec["properties"]
    assert set(props["engine"]["properties"]) == {"llamacpp", "vllm"}  # one key per engine
    assert rules_of(props["engine"]) == ["!(has(self.llamacpp) && has(self.vllm))"]
    assert props["contextLength"]["default"] == 8192
    assert (props["contextLength"]["minimum"], props["contextLength"]["maximum"]) == (512, 1048576)
    assert props["accelerator"]["properties"]["count"]["default"] == 1
    spec_rules = " ".join(rules_of(spec))
    assert "has(self.replicas) && has(self.autoscaling)" in spec_rules
    assert "has(self.engine.vllm)" in spec_rules
    # No rule is left whose only job is "that setting is the other engine's".
    assert "kvUnified" not in spec_rules and "loadMode" not in spec_rules
    assert "self.longContext.contextLength > self.contextLength" in spec_rules
    autoscaling = props["autoscaling"]
    assert rules_of(autoscaling) == ["self.minReplicas <= self.maxReplicas"]
    steps = props["rollout"]["properties"]["steps"]
    assert steps["x-kubernetes-list-type"] == "set"
    assert (steps["items"]["minimum"], steps["items"]["maximum"]) == (1, 100)
    assert rules_of(steps) == ["self.isSorted()"]
    assert "--ctx-size" in rules_of(props["engineArgs"])[0]
    conditions = spec_schema(definition)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_status_schema_has_no_defaults() -> None:
    status = spec_schema(crd(GLMSERVICE_KIND))["properties"]["status"]
    assert [n for n in walk(status) if "default" in n] == []


def test_modelversion_crd_shape() -> None:
    definition = crd(MODELVERSION_KIND)
    version = definition["spec"]["versions"][0]
    assert definition["spec"]["names"]["shortNames"] == ["mv"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    for name in ("Phase", "Format", "Quantization", "Architecture", "Size", "Age"):
        assert name in columns
    spec = spec_schema(definition)["properties"]["spec"]
    source = spec["properties"]["source"]
    assert rules_of(source) == ["self == oldSelf"]
    uri_rule = rules_of(source["properties"]["uri"])[0]
    for scheme in ("https?://", "s3://", "hf://", "pvc://"):
        assert scheme in uri_rule
    assert spec["properties"]["sha256"]["pattern"] == "^[a-f0-9]{64}$"
    assert any("oldSelf.sha256" in rule for rule in rules_of(spec))


def test_chart_carries_the_same_crds() -> None:
    for plural in ("glmservices", "modelversions"):
        name = generate.crd_filename(plural)
        top = (REPO / "crds" / name).read_text()
        assert top == (REPO / "charts" / "glm-operator" / "files" / "crds" / name).read_text()
        assert yaml.safe_load(top)["kind"] == "CustomResourceDefinition"


def test_api_reference_documents_the_version_fields() -> None:
    text = generate.generated_files()[generate.API_DOC]
    assert "`spec.modelVersion` and `status.stableModelVersion`" in text
    assert "EngineFormatMismatch" in text
    assert "### `spec.autoscaling.targets`" in text
    assert "self.isSorted()" in text


# --- versions and conversion ----------------------------------------------------------------


def _two_versions(**changes: Any) -> Any:
    """A GLMService kind served at two versions of different schemas, as v1alpha2 makes it."""
    from glm_operator.api.crdgen import (
        GLMSERVICE_V1ALPHA1_COLUMNS,
        ConversionWebhook,
        Kind,
        Version,
    )
    from glm_operator.api.glmservice import GLMService, GLMServiceSpec
    from glm_operator.api.glmservice_status import GLMServiceStatus
    from glm_operator.api.modelversion import ModelVersionSpec

    fields: dict[str, Any] = {
        "kind": "GLMService", "plural": "glmservices", "short_names": ("glms",),
        "model": GLMService, "scale": True, "conversion": ConversionWebhook(),
        "versions": (
            Version("v1alpha1", GLMServiceSpec, GLMServiceStatus, GLMSERVICE_V1ALPHA1_COLUMNS),
            # Any other schema stands in for v1alpha2 here.
            Version("v1alpha2", ModelVersionSpec, GLMServiceStatus,
                    GLMSERVICE_V1ALPHA1_COLUMNS[:2], storage=True),
        ),
    }
    fields.update(changes)
    return Kind(**fields)


def test_each_version_has_its_schema_and_columns_and_one_is_stored() -> None:
    definition = crd(_two_versions())
    versions = {v["name"]: v for v in definition["spec"]["versions"]}
    assert [v["name"] for v in definition["spec"]["versions"]] == ["v1alpha1", "v1alpha2"]
    assert (versions["v1alpha1"]["served"], versions["v1alpha1"]["storage"]) == (True, False)
    assert (versions["v1alpha2"]["served"], versions["v1alpha2"]["storage"]) == (True, True)
    v1 = versions["v1alpha1"]["schema"]["openAPIV3Schema"]
    v2 = versions["v1alpha2"]["schema"]["openAPIV3Schema"]
    assert "contextLength" in v1["properties"]["spec"]["properties"]
    assert "source" in v2["properties"]["spec"]["properties"]
    assert v1["properties"]["apiVersion"]["description"] == "serving.glm-operator.dev/v1alpha1"
    assert v2["properties"]["apiVersion"]["description"] == "serving.glm-operator.dev/v1alpha2"
    assert len(versions["v1alpha1"]["additionalPrinterColumns"]) == 11
    assert len(versions["v1alpha2"]["additionalPrinterColumns"]) == 2
    for version in versions.values():
        assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert crd_errors(definition) == []


def test_the_conversion_webhook_block() -> None:
    conversion = crd(_two_versions())["spec"]["conversion"]
    assert conversion == {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "glm-operator-webhook",
                                         "namespace": "glm-operator",
                                         "path": "/convert", "port": 443}},
        },
    }


def test_versions_of_one_schema_need_no_webhook() -> None:
    from glm_operator.api.crdgen import Version

    same = MODELVERSION_KIND.versions[0]
    kind = _two_versions(conversion=None, versions=(
        Version("v1alpha1", same.spec, same.status, same.columns),
        Version("v1alpha2", same.spec, same.status, same.columns, storage=True)))
    definition = crd(kind)
    assert "conversion" not in definition["spec"]
    assert crd_errors(definition) == []


def test_bad_version_sets_are_refused() -> None:
    from glm_operator.api.crdgen import Version

    v1, v2 = _two_versions().versions
    with pytest.raises(ValueError, match="exactly one storage version"):
        _two_versions(versions=(v1, Version("v1alpha2", v2.spec, v2.status, v2.columns)))
    with pytest.raises(ValueError, match="need a conversion webhook"):
        _two_versions(conversion=None)
    with pytest.raises(ValueError, match="must be served"):
        _two_versions(versions=(v1, Version("v1alpha2", v2.spec, v2.status, v2.columns,
                                            storage=True, served=False)))


def test_crd_errors_checks_every_version() -> None:
    definition = crd(_two_versions())
    first = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    first["properties"]["spec"]["properties"]["loose"] = {"type": "string"}
    del definition["spec"]["conversion"]
    definition["spec"]["versions"][0]["storage"] = True
    errors = crd_errors(definition)
    assert "v1alpha1: .spec.loose: string without maxLength" in errors
    assert "exactly one storage version, got ['v1alpha1', 'v1alpha2']" in errors
    assert "versions of different schemas without a conversion webhook" in errors
