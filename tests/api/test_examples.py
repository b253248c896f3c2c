"""Every manifest under examples/ is valid for the API types and the set is complete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.api import GLMService, ModelVersion

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KINDS: dict[str, type[GLMService] | type[ModelVersion]] = {
    "GLMService": GLMService,
    "ModelVersion": ModelVersion,
}
# The format each engine serves; a GLMService without engine gets it from the format.
ENGINE_FOR_FORMAT = {"gguf": "llamacpp", "safetensors": "vllm"}


def example_documents() -> list[tuple[Path, dict[str, Any]]]:
    documents = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            # examples/argocd also holds Argo CD Applications: only our kinds are checked here
            if document and document.get("kind") in KINDS:
                documents.append((path, document))
    return documents


DOCUMENTS = example_documents()


@pytest.mark.parametrize(
    ("path", "document"),
    DOCUMENTS,
    ids=[f"{p.parent.name}/{p.name}:{d.get('kind')}" for p, d in DOCUMENTS],
)
def test_example_is_valid(path: Path, document: dict[str, Any]) -> None:
    model = KINDS[document["kind"]]
    parsed = model.model_validate(document)
    assert parsed.metadata.name, f"{path}: metadata.name is required"
    # Nothing in the example was silently dropped or renamed on the way in.
    dumped = parsed.model_dump(by_alias=True, exclude_none=True, exclude={"status"})
    assert_subset(document["spec"], dumped["spec"], f"{path}: spec")


def assert_subset(expected: Any, actual: Any, where: str) -> None:
    if isinstance(expected, dict):
        for key, value in expected.items():
            assert key in actual, f"{where}.{key} lost"
            assert_subset(value, actual[key], f"{where}.{key}")
    else:
        assert expected == actual, f"{where}: {expected!r} became {actual!r}"


def test_every_accelerator_kind_has_a_consistent_example() -> None:
    by_dir: dict[Path, dict[str, dict[str, Any]]] = {}
    for path, document in DOCUMENTS:
        by_dir.setdefault(path.parent, {})[document["kind"]] = document
    profiles = set()
    for directory, documents in by_dir.items():
        assert set(documents) == {"GLMService", "ModelVersion"}, directory
        service = GLMService.model_validate(documents["GLMService"])
        version = ModelVersion.model_validate(documents["ModelVersion"])
        assert service.spec.model_version == version.metadata.name, directory
        engine = service.spec.engine_name or ENGINE_FOR_FORMAT[version.spec.format]
        assert ENGINE_FOR_FORMAT[version.spec.format] == engine, f"{directory}: engine vs format"
        assert version.spec.facts is not None, f"{directory}: declare facts for the planner"
        profiles.add((service.spec.accelerator.profile, engine, service.spec.accelerator.count))
    assert ("nvidia-a10", "llamacpp", 1) in profiles
    assert ("nvidia-a100-80gb", "vllm", 2) in profiles
    assert any(profile == "ascend-910b" for profile, _, _ in profiles)
    assert ("cpu", "llamacpp", 1) in profiles
