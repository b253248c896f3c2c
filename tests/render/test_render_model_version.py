"""render_model_version: cache PVC, fetch Job with the fetcher's real flags, narrow RBAC."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from glm_operator.api import ModelVersion
from glm_operator.config import OperatorConfig
from glm_operator.fetch import cli as fetch_cli
from glm_operator.render.modelversion import render_model_version
from glm_operator.render.output import to_yaml

from render.cases import MODEL_VERSIONS, NAMESPACE, model_version
from render.golden import check_golden
from render.invariants import problems

CONFIG = OperatorConfig(imageTag="0.1.0")


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


@pytest.mark.parametrize("key", sorted(MODEL_VERSIONS))
def test_golden(key: str) -> None:
    check_golden(f"modelversion-{key}.yaml",
                 to_yaml(render_model_version(model_version(key), CONFIG)))


@pytest.mark.parametrize("key", sorted(MODEL_VERSIONS))
def test_invariants(key: str) -> None:
    assert problems(render_model_version(model_version(key), CONFIG)) == []


def test_fetch_args_parse_with_the_fetchers_own_parser() -> None:
    job = by_kind(render_model_version(model_version("gguf"), CONFIG), "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["glm-operator"]
    assert container["args"][0] == "fetch"
    parser = argparse.ArgumentParser()
    fetch_cli.add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    spec = MODEL_VERSIONS["gguf"]["spec"]
    assert args.source == spec["source"]["uri"]
    assert str(args.dest) == "/cache"
    assert args.sha256 == spec["sha256"]
    assert args.architecture == "glm4"
    assert args.modelversion == "glm4-9b-q4"
    assert args.namespace == NAMESPACE
    assert args.cache_claim == "glm4-9b-q4-cache"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/cache"] == "cache"


def test_job_lifetime_and_result_visibility() -> None:
    job = by_kind(render_model_version(model_version("gguf"), CONFIG), "Job")
    assert "ttlSecondsAfterFinished" not in job["spec"]  # the operator reads the result
    assert job["spec"]["backoffLimit"] == 3
    # 6.17 GB at the slowest accepted 10 MiB/s, for each of 4 attempts: ~2354 s.
    assert job["spec"]["activeDeadlineSeconds"] == 2354
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_pvc_size_and_storage_class() -> None:
    objects = render_model_version(model_version("gguf"), CONFIG)
    pvc = by_kind(objects, "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "7Gi"  # 6.17 GB + 10 %
    assert "storageClassName" not in pvc["spec"]
    with_default = OperatorConfig(imageTag="0.1.0", defaultStorageClass="standard")
    pvc = by_kind(render_model_version(model_version("gguf"), with_default),
                  "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == "standard"
    pvc = by_kind(render_model_version(model_version("bf16"), with_default),
                  "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == "fast-rwx"  # spec wins
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "40Gi"


def test_measured_status_does_not_change_the_intent() -> None:
    before = render_model_version(model_version("gguf"), CONFIG)
    after = render_model_version(
        model_version("gguf", sizeBytes=9 * 1024**3, phase="Ready"), CONFIG)
    assert before == after


def test_rbac_is_one_modelversion_status_only() -> None:
    objects = render_model_version(model_version("gguf"), CONFIG)
    role = by_kind(objects, "Role")
    assert role["rules"] == [
        {"apiGroups": ["serving.glm-operator.dev"], "resources": ["modelversions"],
         "resourceNames": ["glm4-9b-q4"], "verbs": ["get"]},
        {"apiGroups": ["serving.glm-operator.dev"], "resources": ["modelversions/status"],
         "resourceNames": ["glm4-9b-q4"], "verbs": ["get", "patch"]},
    ]
    pod = by_kind(objects, "Job")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == by_kind(objects, "ServiceAccount")["metadata"]["name"]
    binding = by_kind(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_credentials_come_from_the_secret() -> None:
    job = by_kind(render_model_version(model_version("bf16"), CONFIG), "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "hf-token"}}]


def test_pvc_source_mounts_the_claim_read_only() -> None:
    mv = ModelVersion.model_validate({
        "metadata": {"name": "local", "namespace": "m", "uid": "u-1"},
        "spec": {"source": {"uri": "pvc://shared-models/glm/glm-4-9b.gguf"}, "format": "gguf"},
    })
    objects = render_model_version(mv, CONFIG)
    pod = by_kind(objects, "Job")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][container["args"].index("--pvc-root") + 1] == "/mnt/pvc"
    assert {"name": "source", "mountPath": "/mnt/pvc/shared-models", "readOnly": True} in (
        container["volumeMounts"])
    assert by_kind(objects, "PersistentVolumeClaim")["spec"]["resources"]["requests"][
        "storage"] == "100Gi"  # nothing declared: the configured default
    assert problems(objects) == []
