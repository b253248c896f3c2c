"""`glm-operator render`: files in, multi-document YAML out; clear errors for bad input."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.cli import main

from render.cases import MODEL_VERSIONS, service_manifest


def mv_manifest(key: str) -> dict[str, Any]:
    data = MODEL_VERSIONS[key]
    return {"apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
            "metadata": {"name": data["name"]}, "spec": data["spec"]}


def write(tmp_path: Path, name: str, *docs: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def offline_service(**spec: Any) -> dict[str, Any]:
    manifest = service_manifest("llamacpp", "a10", **spec)
    manifest["metadata"] = {"name": "chat"}  # as written in git: no namespace, no uid
    return manifest


def test_renders_service_and_model_version_children(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    svc = write(tmp_path, "svc.yaml", offline_service(
        longContext={"enabled": True, "contextLength": 65536}))
    mv = write(tmp_path, "mv.yaml", mv_manifest("gguf"))
    assert main(["render", "-f", svc, "-f", mv, "-n", "prod", "--service-monitor"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding", "Job",
                     "Deployment", "Deployment", "Service", "Service",
                     "PodDisruptionBudget", "ServiceMonitor",
                     "ServiceAccount", "Role", "RoleBinding",
                     "Lease", "ServiceAccount", "Role", "RoleBinding"]
    assert all(d["metadata"]["namespace"] == "prod" for d in docs)
    assert all("ownerReferences" not in d["metadata"] for d in docs)


@pytest.mark.parametrize(("flags", "workloads"), [
    ([], ["StatefulSet", "StatefulSet", "Service", "NetworkPolicy"]),
    (["--leader-worker-set"], ["LeaderWorkerSet", "NetworkPolicy"]),
])
def test_a_multi_node_service_renders_its_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], workloads: list[str]
) -> None:
    manifest = offline_service(contextLength=8192, concurrency=1)
    manifest["spec"]["modelVersion"] = "glm46-q4"
    manifest["spec"]["accelerator"] = {"profile": "nvidia-a10", "count": 4, "nodes": 3}
    svc = write(tmp_path, "svc.yaml", manifest)
    mv = write(tmp_path, "mv.yaml", mv_manifest("glm46-q4"))
    assert main(["render", "-f", svc, "-f", mv, "--no-model-version-children", *flags]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == [*workloads, "Service", "PodDisruptionBudget"]


def test_operator_config_file_is_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "operator.yaml"
    config.write_text("imageRegistry: registry.local/glm\nimageTag: 9.9.9\ngatewayPort: 9090\n")
    svc = write(tmp_path, "all.yaml", offline_service(), mv_manifest("gguf"))
    assert main(["render", "-f", svc, "--config", str(config),
                 "--no-model-version-children"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    pod = docs[0]["spec"]["template"]["spec"]
    assert pod["containers"][1]["image"] == "registry.local/glm/glm-operator:9.9.9"
    assert docs[1]["spec"]["ports"][0]["port"] == 9090


@pytest.mark.parametrize(("docs", "message"), [
    ([offline_service()], "spec.modelVersion 'glm4-9b-q4' is not among the inputs"),
    ([offline_service(contextLength=131072, concurrency=16), mv_manifest("gguf")],
     r"Planned=False \(Infeasible\): main pool does not fit: needs .* GiB.*Nearest "),
    ([offline_service(contextLenght=4096), mv_manifest("gguf")],
     "invalid GLMService:\n  spec.contextLenght: Extra inputs are not permitted"),
    ([{**mv_manifest("gguf"), "spec": {**mv_manifest("gguf")["spec"], "facts": None}},
      offline_service()],
     r"glm4-9b-q4: model facts unknown \(blockCount, embeddingLength"),
    ([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}],
     "kind 'ConfigMap' is neither GLMService nor ModelVersion"),
])
def test_bad_input_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], docs: list[dict[str, Any]],
    message: str,
) -> None:
    path = write(tmp_path, "in.yaml", *docs)
    assert main(["render", "-f", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert re.search(message, captured.err), captured.err


def test_missing_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(tmp_path / "nope.yaml")]) == 1
    assert "nope.yaml: No such file" in capsys.readouterr().err
