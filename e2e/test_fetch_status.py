"""The fetch Job reports into its ModelVersion's status with its own narrow ServiceAccount.

On the local control plane: the real ModelVersion CRD from crds/, a ServiceAccount whose Role
allows `get` on one ModelVersion and `patch` on its status subresource only, a token minted for
it by the API server (TokenRequest), and `glm-operator fetch` run as the Job runs it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from glm_operator.kube.client import KubeError
from glm_operator.kube.modelversion_status import ServiceAccountAccess

from e2e.fetch_helpers import FetchRun, run_fetch, sha256_of, write_served_gguf
from e2e.fetch_servers import ModelFileServer, serve
from e2e.kubectl import Kubectl

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "crds" / "serving.glm-operator.dev_modelversions.yaml"
GROUP = "serving.glm-operator.dev"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_served_gguf(tmp_path_factory.mktemp("served") / "glm4.gguf", payload_mib=1)


@pytest.fixture
def file_server(model: Path) -> Iterator[ModelFileServer]:
    with serve(model.parent) as server:
        yield server


@pytest.fixture
def modelversion_crd(kubectl: Kubectl, wait_for: Callable[..., Any]) -> None:
    assert CRD.exists(), f"{CRD} is missing: regenerate with `glm-operator crds`"
    kubectl.apply_files([CRD])
    wait_for(lambda: kubectl("wait", "--for=condition=Established", "--timeout=30s",
                             f"crd/modelversions.{GROUP}"), timeout=60,
             what="the ModelVersion CRD to be established")


def _fetch_job_identity(kubectl: Kubectl, namespace: str, modelversion: str,
                        tmp_path: Path) -> list[str]:
    """The Job's ServiceAccount + Role + binding; returns the fetch CLI's API arguments."""
    account = f"fetch-{modelversion}"
    kubectl.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": account, "namespace": namespace},
         "rules": [
             {"apiGroups": [GROUP], "resources": ["modelversions"],
              "resourceNames": [modelversion], "verbs": ["get"]},
             {"apiGroups": [GROUP], "resources": ["modelversions/status"],
              "resourceNames": [modelversion], "verbs": ["patch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": account, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
    ])
    token = kubectl("create", "token", account, "-n", namespace, "--duration=600s").stdout
    token_file = tmp_path / f"{account}.token"
    token_file.write_text(token.strip())
    config = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    cluster = config["clusters"][0]["cluster"]
    ca_file = tmp_path / "ca.crt"
    if "certificate-authority-data" in cluster:
        ca_file.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    else:
        ca_file.write_bytes(Path(cluster["certificate-authority"]).read_bytes())
    return ["--api-server", cluster["server"], "--token-file", str(token_file),
            "--api-ca-file", str(ca_file), "--namespace", namespace]


def _modelversion(name: str, uri: str, sha256: str, architecture: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1alpha2", "kind": "ModelVersion",
            "metadata": {"name": name},
            "spec": {"source": {"uri": uri}, "format": "gguf", "quantization": "Q4_K_M",
                     "architecture": architecture, "sha256": sha256}}


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def _fetch(server: ModelFileServer, model: Path, api: list[str], name: str, dest: Path,
           architecture: str) -> FetchRun:
    return run_fetch("--allow-http", "--source", f"{server.url}/{model.name}",
                     "--dest", str(dest), "--sha256", sha256_of(model),
                     "--architecture", architecture, "--modelversion", name,
                     "--cache-claim", f"{name}-cache", *api)


@pytest.mark.usefixtures("modelversion_crd")
def test_fetch_reports_verified_facts_into_status(
    kubectl: Kubectl, namespace: str, file_server: ModelFileServer, model: Path, tmp_path: Path
) -> None:
    kubectl.apply(_modelversion("glm4-q4", f"{file_server.url}/{model.name}",
                                sha256_of(model), "glm4"), namespace=namespace)
    api = _fetch_job_identity(kubectl, namespace, "glm4-q4", tmp_path)
    run = _fetch(file_server, model, api, "glm4-q4", tmp_path / "cache", "glm4")
    assert run.code == 0, run.log

    obj = kubectl.get_json(f"modelversions.{GROUP}", "glm4-q4", "-n", namespace)
    status = obj["status"]
    assert status["phase"] == "Ready"
    assert status["sizeBytes"] == model.stat().st_size
    assert status["sha256"] == sha256_of(model)
    assert status["cache"] == {"claimName": "glm4-q4-cache", "path": model.name}
    assert status["facts"] == {
        "architecture": "glm4", "blockCount": 40, "contextLength": 131072,
        "embeddingLength": 4096, "headCount": 32, "headCountKv": 2, "keyLength": 128,
        "valueLength": 128, "fileType": "Q4_K_M", "sizeBytes": model.stat().st_size}
    verified, cached = _condition(obj, "Verified"), _condition(obj, "Cached")
    assert (verified["status"], cached["status"]) == ("True", "True")
    assert cached["reason"] == "Downloaded"
    assert verified["observedGeneration"] == obj["metadata"]["generation"]


@pytest.mark.usefixtures("modelversion_crd")
def test_wrong_architecture_is_reported_as_a_false_condition(
    kubectl: Kubectl, namespace: str, file_server: ModelFileServer, model: Path, tmp_path: Path
) -> None:
    kubectl.apply(_modelversion("moe", f"{file_server.url}/{model.name}", sha256_of(model),
                                "glm4moe"), namespace=namespace)
    api = _fetch_job_identity(kubectl, namespace, "moe", tmp_path)
    run = _fetch(file_server, model, api, "moe", tmp_path / "cache", "glm4moe")
    assert run.code == 8, run.log
    obj = kubectl.get_json(f"modelversions.{GROUP}", "moe", "-n", namespace)
    assert obj["status"]["phase"] == "Failed"
    verified = _condition(obj, "Verified")
    assert (verified["status"], verified["reason"]) == ("False", "WrongArchitecture")
    assert "'glm4'" in verified["message"] and "'glm4moe'" in verified["message"]
    assert _condition(obj, "Cached")["status"] == "False"
    assert not (tmp_path / "cache" / model.name).exists()


@pytest.mark.usefixtures("modelversion_crd")
def test_the_job_token_can_touch_nothing_else(
    kubectl: Kubectl, namespace: str, file_server: ModelFileServer, model: Path, tmp_path: Path
) -> None:
    for name in ("mine", "other"):
        kubectl.apply(_modelversion(name, f"{file_server.url}/{model.name}", sha256_of(model),
                                    "glm4"), namespace=namespace)
    api = _fetch_job_identity(kubectl, namespace, "mine", tmp_path)
    # Reporting into another ModelVersion is refused by RBAC, and the Job says so.
    run = _fetch(file_server, model, api, "other", tmp_path / "cache", "glm4")
    assert run.code == 11, run.log
    assert "403" in run.log
    # Nothing the fetcher reports landed (an operator watching this namespace may have
    # written its own Pending/Fetching phase meanwhile; that is not the Job's doing).
    status = kubectl.get_json(f"modelversions.{GROUP}", "other", "-n", namespace).get(
        "status") or {}
    assert not {"sha256", "sizeBytes", "facts", "cache"} & status.keys(), status
    assert not {c["type"] for c in status.get("conditions", [])} & {"Verified", "Cached"}
    # Its own ModelVersion's spec is out of reach too: only the status subresource.
    options = dict(zip(api[::2], api[1::2], strict=True))
    client = ServiceAccountAccess(options["--api-server"], Path(options["--token-file"]),
                                  Path(options["--api-ca-file"])).client()
    with pytest.raises(KubeError) as denied:
        client.patch_merge(f"{GROUP}/v1alpha2", "ModelVersion", namespace, "mine",
                           {"metadata": {"labels": {"tampered": "yes"}}})
    assert denied.value.status == 403
