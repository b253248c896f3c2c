"""The Argo CD health checks of charts/argocd, run the way Argo CD runs them.

`luahealth` (e2e/luahealth) is Argo CD's Lua VM setup reproduced on the interpreter Argo CD
embeds, gopher-lua. Every case of every health_test.yaml runs twice: as Argo CD's own
TestLuaHealthScript runs it (standard libraries open) and as an argocd-cm entry runs in the
controller (standard libraries closed). Both must give exactly the expected status and message.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from e2e.luahealth import (
    ARGOCD_CM,
    CUSTOMIZATIONS,
    CaseResult,
    build_for_tests,
    run_tests,
)

GROUP = "serving.glm-operator.dev"
KINDS = ("GLMService", "ModelVersion")
MODES = ("argocd-test", "argocd-cm")


def _declared_cases() -> list[str]:
    cases = []
    for kind in KINDS:
        tests = yaml.safe_load((CUSTOMIZATIONS / GROUP / kind / "health_test.yaml").read_text())
        cases += [f"{GROUP}/{kind}/{t['inputPath']}" for t in tests["tests"]]
    return cases


@pytest.fixture(scope="module")
def luahealth() -> Path:
    return build_for_tests()


@pytest.fixture(scope="module")
def results(luahealth: Path) -> dict[tuple[str, str], CaseResult]:
    return {(r.case, r.mode): r for r in run_tests(luahealth)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", _declared_cases())
def test_health_case(results: dict[tuple[str, str], CaseResult], case: str, mode: str) -> None:
    result = results.get((case, mode))
    assert result is not None, f"luahealth did not run {case} [{mode}]"
    assert result.ok, result.explain()


def test_luahealth_ran_exactly_the_declared_cases(
        results: dict[tuple[str, str], CaseResult]) -> None:
    assert sorted(results) == sorted((c, m) for c in _declared_cases() for m in MODES)


@pytest.mark.parametrize("kind", KINDS)
def test_every_testdata_file_is_a_case_of_its_kind(kind: str) -> None:
    folder = CUSTOMIZATIONS / GROUP / kind
    declared = {c.removeprefix(f"{GROUP}/{kind}/") for c in _declared_cases()
                if c.startswith(f"{GROUP}/{kind}/")}
    present = {f"testdata/{p.name}" for p in (folder / "testdata").glob("*.yaml")}
    assert present == declared
    for name in present:
        obj = yaml.safe_load((folder / name).read_text())
        # Argo CD reads objects at the version their manifest names: both are served.
        assert obj["kind"] == kind, name
        assert obj["apiVersion"] in (f"{GROUP}/v1alpha1", f"{GROUP}/v1alpha2"), name


@pytest.mark.parametrize("kind", KINDS)
def test_argocd_cm_holds_the_same_scripts(kind: str) -> None:
    data = yaml.safe_load(ARGOCD_CM.read_text())["data"]
    key = f"resource.customizations.health.{GROUP}_{kind}"
    assert data[key] == (CUSTOMIZATIONS / GROUP / kind / "health.lua").read_text()


def test_argocd_cm_has_only_health_entries() -> None:
    cm = yaml.safe_load(ARGOCD_CM.read_text())
    assert (cm["apiVersion"], cm["kind"], cm["metadata"]["name"]) == ("v1", "ConfigMap",
                                                                     "argocd-cm")
    assert sorted(cm["data"]) == sorted(f"resource.customizations.health.{GROUP}_{k}"
                                        for k in KINDS)


def _tree(tmp_path: Path, script: str, expected: dict[str, str]) -> Path:
    """A one-script resource_customizations tree."""
    folder = tmp_path / "rc" / GROUP / "ModelVersion"
    (folder / "testdata").mkdir(parents=True)
    (folder / "health.lua").write_text(script)
    (folder / "health_test.yaml").write_text(yaml.safe_dump(
        {"tests": [{"healthStatus": expected, "inputPath": "testdata/mv.yaml"}]}))
    (folder / "testdata" / "mv.yaml").write_text(yaml.safe_dump(
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelVersion",
         "metadata": {"name": "m", "generation": 2}, "status": {"phase": "Ready"}}))
    return tmp_path / "rc"


def test_the_standard_libraries_are_closed_in_argocd_cm_mode(
        luahealth: Path, tmp_path: Path) -> None:
    # The reason every script here uses base and table functions only.
    tree = _tree(tmp_path, 'return {status = "Healthy", message = string.lower("OK")}',
                 {"status": "Healthy", "message": "ok"})
    by_mode = {r.mode: r for r in run_tests(luahealth, tree)}
    assert by_mode["argocd-test"].ok
    assert not by_mode["argocd-cm"].ok
    assert "lower" in (by_mode["argocd-cm"].error or "")


def test_argocd_result_rules(luahealth: Path, tmp_path: Path) -> None:
    # An unknown status becomes Unknown; numbers from the object print as integers.
    tree = _tree(tmp_path, 'return {status = "Fine", message = "x"}',
                 {"status": "Unknown", "message": "Lua returned an invalid health status"})
    assert all(r.ok for r in run_tests(luahealth, tree))
    tree = _tree(tmp_path / "b", 'return {status = "Progressing", message = '
                 '"generation " .. obj.metadata.generation}',
                 {"status": "Progressing", "message": "generation 2"})
    assert all(r.ok for r in run_tests(luahealth, tree))


def _unknown_fields(value: object, schema: dict[str, object], path: str) -> list[str]:
    """Paths in `value` that the structural schema does not declare (the API server would
    prune them, so a script reading them would read nothing)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        found = []
        for key, item in value.items():
            if isinstance(properties, dict) and key in properties:
                found += _unknown_fields(item, properties[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += _unknown_fields(item, extra, f"{path}.{key}")
            else:
                found.append(f"{path}.{key}")
        return found
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [p for i, item in enumerate(value)
                for p in _unknown_fields(item, schema["items"], f"{path}[{i}]")]  # type: ignore[arg-type]
    return []


@pytest.mark.parametrize("kind", KINDS)
def test_testdata_has_only_fields_of_the_crd(kind: str) -> None:
    crd_file = CUSTOMIZATIONS.parents[2] / "crds" / f"{GROUP}_{kind.lower()}s.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    schemas = {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]}
    for path in sorted((CUSTOMIZATIONS / GROUP / kind / "testdata").glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        schema = schemas[obj["apiVersion"].rpartition("/")[2]]
        body = {k: v for k, v in obj.items() if k in ("spec", "status")}
        assert _unknown_fields(body, schema, "") == [], path.name
