"""The example Argo CD Applications of examples/argocd hang together: they point at paths
that exist, sync in the documented order, and the chart gives its CRDs the sync options the
operator's Application asks for (rendered by the real helm)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import toolchain

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "argocd"
WAVE = "argocd.argoproj.io/sync-wave"
OPTIONS = "argocd.argoproj.io/sync-options"


def _load(path: Path) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(path.read_text())
    return obj


def _applications() -> dict[str, dict[str, Any]]:
    apps = [_load(EXAMPLES / "root.yaml"), *(_load(p) for p in (EXAMPLES / "apps").glob("*.yaml"))]
    assert all(a["kind"] == "Application" for a in apps)
    return {a["metadata"]["name"]: a for a in apps}


def _wave(obj: dict[str, Any]) -> int:
    return int((obj["metadata"].get("annotations") or {}).get(WAVE, "0"))


def test_every_application_points_at_a_path_of_this_repository() -> None:
    apps = _applications()
    assert set(apps) == {"glm-platform", "glm-operator", "glm-services"}
    urls = {a["spec"]["source"]["repoURL"] for a in apps.values()}
    assert len(urls) == 1, f"one placeholder repoURL to replace, not {urls}"
    for app in apps.values():
        assert (REPO / app["spec"]["source"]["path"]).is_dir(), app["metadata"]["name"]
    assert apps["glm-platform"]["spec"]["source"]["path"] == "examples/argocd/apps"
    assert apps["glm-operator"]["spec"]["source"]["path"] == "charts/glm-operator"
    assert (REPO / "charts/glm-operator/Chart.yaml").exists()


def test_the_operator_syncs_before_the_services() -> None:
    apps = _applications()
    assert _wave(apps["glm-operator"]) < _wave(apps["glm-services"])
    services = [_load(p) for p in (EXAMPLES / "services").glob("*.yaml")]
    assert {s["kind"] for s in services} == {"ModelVersion", "GLMService"}
    model_waves = {_wave(s) for s in services if s["kind"] == "ModelVersion"}
    service_waves = {_wave(s) for s in services if s["kind"] == "GLMService"}
    assert max(model_waves) < min(service_waves)
    # The services' ModelVersions exist in the same directory.
    names = {s["metadata"]["name"] for s in services if s["kind"] == "ModelVersion"}
    assert {s["spec"]["modelVersion"] for s in services if s["kind"] == "GLMService"} <= names


def test_the_services_application_needs_no_ignore_differences() -> None:
    assert "ignoreDifferences" not in _applications()["glm-services"]["spec"]


def test_server_side_apply_goes_with_server_side_diff() -> None:
    # e2e/test_argocd_health.py proves "no diff" with a server-side diff; the Applications
    # must compare the same way.
    for name in ("glm-operator", "glm-services"):
        app = _applications()[name]
        assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"]
        options = app["metadata"]["annotations"]["argocd.argoproj.io/compare-options"]
        assert "ServerSideDiff=true" in options.split(","), name


def _helm() -> Path:
    if not toolchain.is_cached("helm"):
        message = "helm is not built: `.venv/bin/python -m e2e.toolchain build helm`"
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return toolchain.bin_dir("helm") / "helm"


def test_the_chart_gives_its_crds_the_applications_sync_options(tmp_path: Path) -> None:
    helm_source = _applications()["glm-operator"]["spec"]["source"]["helm"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(helm_source["valuesObject"]))
    result = subprocess.run(
        [str(_helm()), "template", helm_source["releaseName"], str(REPO / "charts/glm-operator"),
         "--namespace", "glm-operator", "-f", str(values),
         # helm template assumes an old Kubernetes; the chart requires a recent one.
         "--kube-version", toolchain.versions()["kubernetes"]],
        capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    assert {c["metadata"]["name"] for c in crds} == {
        "glmservices.serving.glm-operator.dev", "modelversions.serving.glm-operator.dev"}
    for crd in crds:
        annotations = crd["metadata"]["annotations"]
        assert annotations[WAVE] == "-1"
        assert set(annotations[OPTIONS].split(",")) == {
            "ServerSideApply=true", "Prune=false", "Delete=false"}
    for obj in objects:
        if obj["kind"] != "CustomResourceDefinition":
            assert _wave(obj) >= 0, f"{obj['kind']} {obj['metadata']['name']} before the CRDs"
