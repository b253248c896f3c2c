"""The real API server enforces the CRD schemas: examples accepted, invalid manifests refused.

The table of invalid manifests lives in tests/api/invalid_manifests.yaml, where a unit test
checks that the pydantic types refuse the same ones; here each is sent to the API server
(server-side dry run for creates, a real create then an update for transition rules) and
the refusal must name the field.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubectl import Kubectl, KubectlError
from tests.api.invalid_manifests import InvalidCase, load_cases

REPO = Path(__file__).resolve().parents[1]
CRD_FILES = sorted((REPO / "crds").glob("*.yaml"))
# One service per folder (examples/argocd holds Argo CD Applications, tested elsewhere).
EXAMPLE_DIRS = sorted(p.parent for p in (REPO / "examples").glob("*/glmservice.yaml"))
CASES = load_cases()

Wait = Callable[..., Any]


@pytest.fixture(scope="module")
def glm_crds(kubectl: Kubectl, wait_for: Wait) -> list[str]:
    """Install (server-side apply) the generated CRDs and wait until they serve."""
    assert CRD_FILES, "crds/ is empty: run `make crds`"
    kubectl.apply_files(CRD_FILES)
    names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in CRD_FILES]
    for name in names:
        wait_for(
            lambda name=name: _condition(kubectl.get_json("crd", name), "Established") == "True",
            timeout=60,
            what=f"CRD {name} Established",
        )
    return names


def _condition(obj: dict[str, Any], type_: str) -> str | None:
    for condition in obj.get("status", {}).get("conditions", []):
        if condition["type"] == type_:
            return str(condition["status"])
    return None


def test_crds_are_accepted_and_established(kubectl: Kubectl, glm_crds: list[str]) -> None:
    for name in glm_crds:
        crd = kubectl.get_json("crd", name)
        # NamesAccepted and no NonStructuralSchema: the API server took the schema as is,
        # CEL cost estimates included (an over-budget rule fails the apply above).
        assert _condition(crd, "NamesAccepted") == "True", name
        assert _condition(crd, "NonStructuralSchema") in (None, "False"), name
    resources = kubectl("api-resources", "--api-group=serving.glm-operator.dev").stdout
    assert "glms" in resources and "mv" in resources


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_example_is_accepted(
    example: Path, kubectl: Kubectl, glm_crds: list[str], namespace: str
) -> None:
    kubectl("apply", "--server-side", "-n", namespace, "-f", str(example))
    for path in sorted(example.glob("*.yaml")):
        sent = yaml.safe_load(path.read_text())
        stored = kubectl.get_json(sent["kind"].lower(), sent["metadata"]["name"], "-n", namespace)
        assert (
            stored["spec"]["modelVersion" if sent["kind"] == "GLMService" else "format"]
            == (sent["spec"]["modelVersion" if sent["kind"] == "GLMService" else "format"])
        )
        # Nothing the example says was pruned as unknown.
        assert _subset(sent["spec"], stored["spec"]), (path, stored["spec"])


def _subset(expected: Any, actual: Any) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            key in actual and _subset(value, actual[key]) for key, value in expected.items()
        )
    return bool(expected == actual)


def test_defaults_printer_columns_and_scale(
    kubectl: Kubectl, glm_crds: list[str], namespace: str
) -> None:
    minimal = {
        "apiVersion": "serving.glm-operator.dev/v1alpha2",
        "kind": "GLMService",
        "metadata": {"name": "minimal"},
        "spec": {"modelVersion": "some-model", "accelerator": {"profile": "nvidia-l4"},
                 "gateway": {"access": "Open"}},
    }
    kubectl.apply(minimal, namespace)
    spec = kubectl.get_json("glms", "minimal", "-n", namespace)["spec"]
    assert (spec["contextLength"], spec["concurrency"], spec["accelerator"]["count"]) == (
        8192,
        4,
        1,
    )
    assert "replicas" not in spec  # never defaulted: it would collide with autoscaling
    header = kubectl("get", "glms", "-n", namespace).stdout.splitlines()[0].split()
    for column in ("READY", "ENGINE", "ACCELERATOR", "MODEL", "CANARY", "AGE"):
        assert column in header, header
    # The scale subresource writes spec.replicas ...
    kubectl("scale", "glms", "minimal", "-n", namespace, "--replicas=3")
    assert kubectl.get_json("glms", "minimal", "-n", namespace)["spec"]["replicas"] == 3
    scale = json.loads(
        kubectl(
            "get", "--raw",
            f"/apis/serving.glm-operator.dev/v1alpha2/namespaces/{namespace}/glmservices/minimal/scale",
        ).stdout
    )  # fmt: skip
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    # ... and is refused while autoscaling is set (the CEL rule covers it too).
    kubectl(
        "patch", "glms", "minimal", "-n", namespace, "--type=merge", "-p",
        json.dumps({"spec": {"replicas": None, "autoscaling": {
            "maxReplicas": 2, "targets": {"queueLength": 1}}}}),
    )  # fmt: skip
    refused = kubectl("scale", "glms", "minimal", "-n", namespace, "--replicas=2", check=False)
    assert refused.returncode != 0 and "mutually exclusive" in refused.stderr


def test_status_is_a_subresource(kubectl: Kubectl, glm_crds: list[str], namespace: str) -> None:
    version = {
        "apiVersion": "serving.glm-operator.dev/v1alpha2",
        "kind": "ModelVersion",
        "metadata": {"name": "status-check"},
        "spec": {"source": {"uri": "pvc://models/a.gguf"}, "format": "gguf"},
        "status": {"phase": "Ready"},
    }
    kubectl.apply(version, namespace)
    stored = kubectl.get_json("mv", "status-check", "-n", namespace)
    assert "phase" not in stored.get("status", {})  # status ignored on the main resource
    kubectl(
        "patch", "mv", "status-check", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": {"phase": "Ready", "sizeBytes": 6170000000}}),
    )  # fmt: skip
    row = kubectl("get", "mv", "status-check", "-n", namespace, "--no-headers").stdout.split()
    assert row[:3] == ["status-check", "Ready", "gguf"] and "6170000000" in row


def _refusal(kubectl: Kubectl, manifest: dict[str, Any], namespace: str, dry_run: bool) -> str:
    args = ["apply", "--server-side", "--field-manager=glm-e2e", "-n", namespace, "-f", "-"]
    if dry_run:
        args.append("--dry-run=server")
    result: subprocess.CompletedProcess[str] = kubectl(
        *args, input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, f"accepted: {yaml.safe_dump(manifest)}"
    return result.stderr


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_invalid_manifest_is_refused_naming_the_field(
    case: InvalidCase, kubectl: Kubectl, glm_crds: list[str], namespace: str
) -> None:
    name = f"bad-{case.name}"[:63]
    if case.update is None:
        message = _refusal(kubectl, case.manifest(name), namespace, dry_run=True)
    else:
        try:
            kubectl.apply(case.manifest(name), namespace)
        except KubectlError as error:  # the starting point itself must be valid
            pytest.fail(f"initial object refused: {error}")
        message = _refusal(kubectl, case.manifest(name, case.update), namespace, dry_run=False)
    for expected in case.expect:
        assert expected in message, f"{case.name}: {expected!r} not in {message!r}"
