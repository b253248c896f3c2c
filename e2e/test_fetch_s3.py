"""`glm-operator fetch` from s3:// against a real S3-compatible server: MinIO, built from its Go
module by e2e/toolchain.py (component `minio`), started on a free port for this module.

Objects are uploaded with boto3 (a real S3 client); the fetcher signs its own requests
(SigV4), so these tests are what proves that signing against a server.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e import toolchain
from e2e.fetch_helpers import (
    SafetensorsModel,
    folder_digest,
    run_fetch,
    sha256_of,
    write_safetensors_model,
    write_served_gguf,
)
from e2e.ports import free_port

ROOT_USER, ROOT_PASSWORD = "glm-e2e-admin", "glm-e2e-secret-key"
BUCKET = "models"


@dataclass
class MinIO:
    endpoint: str

    def env(self, access: str = ROOT_USER, secret: str = ROOT_PASSWORD) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": access,
                "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1"}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ROOT_USER,
                            aws_secret_access_key=ROOT_PASSWORD, region_name="us-east-1")


@pytest.fixture(scope="module")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinIO]:
    try:
        binary = toolchain.ensure("minio") / "minio"
    except toolchain.BuildError as exc:
        message = f"MinIO could not be built: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    data = tmp_path_factory.mktemp("minio-data")
    port, console = free_port(), free_port()
    log_path = data.parent / "minio.log"
    env = {**os.environ, "MINIO_ROOT_USER": ROOT_USER, "MINIO_ROOT_PASSWORD": ROOT_PASSWORD,
           "MINIO_BROWSER": "off", "MINIO_UPDATE": "off"}
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(binary), "server", str(data), "--address", f"127.0.0.1:{port}",
             "--console-address", f"127.0.0.1:{console}", "--quiet"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/minio/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"MinIO did not become ready:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.3)
        server = MinIO(endpoint)
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.fixture(scope="module")
def uploaded(minio: MinIO, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = write_served_gguf(tmp_path_factory.mktemp("s3-src") / "glm-4 9b.Q4_K_M.gguf",
                              payload_mib=3)
    minio.client().upload_file(str(model), BUCKET, f"glm/{model.name}")
    return model


def test_s3_download_verified(minio: MinIO, uploaded: Path, tmp_path: Path) -> None:
    run = run_fetch("--allow-http", "--source", f"s3://{BUCKET}/glm/{uploaded.name}",
                    "--dest", str(tmp_path), "--sha256", sha256_of(uploaded),
                    "--architecture", "glm4", env=minio.env())
    assert run.code == 0, run.log
    assert sha256_of(tmp_path / uploaded.name) == sha256_of(uploaded)


def test_s3_resume_sends_a_signed_range(minio: MinIO, uploaded: Path, tmp_path: Path) -> None:
    (tmp_path / (uploaded.name + ".partial")).write_bytes(uploaded.read_bytes()[:2_000_000])
    run = run_fetch("--allow-http", "--source", f"s3://{BUCKET}/glm/{uploaded.name}",
                    "--dest", str(tmp_path), "--sha256", sha256_of(uploaded), env=minio.env())
    assert run.code == 0, run.log
    assert "resuming from" in run.log
    assert sha256_of(tmp_path / uploaded.name) == sha256_of(uploaded)


def test_s3_missing_key_is_not_found(minio: MinIO, tmp_path: Path) -> None:
    run = run_fetch("--allow-http", "--source", f"s3://{BUCKET}/glm/none.gguf",
                    "--dest", str(tmp_path), env=minio.env())
    assert run.code == 3, run.log
    assert "HTTP 404" in run.log


@pytest.mark.parametrize("credentials", ["wrong-secret", "anonymous"])
def test_s3_auth_failures(minio: MinIO, uploaded: Path, tmp_path: Path, credentials: str) -> None:
    env = minio.env(secret="not-the-secret") if credentials == "wrong-secret" else {
        "AWS_ENDPOINT_URL": minio.endpoint}
    run = run_fetch("--allow-http", "--source", f"s3://{BUCKET}/glm/{uploaded.name}",
                    "--dest", str(tmp_path), env=env)
    assert run.code == 4, run.log
    assert "HTTP 403" in run.log and "not-the-secret" not in run.log
    assert list(tmp_path.iterdir()) == []


def test_s3_plain_http_endpoint_needs_allow_http(minio: MinIO, tmp_path: Path) -> None:
    run = run_fetch("--source", f"s3://{BUCKET}/glm/x.gguf", "--dest", str(tmp_path),
                    env=minio.env())
    assert run.code == 2 and "allow http" in run.log


# ---------------------------------------------------------------- folders (safetensors)


@pytest.fixture(scope="module")
def uploaded_folder(minio: MinIO, tmp_path_factory: pytest.TempPathFactory) -> SafetensorsModel:
    model = write_safetensors_model(tmp_path_factory.mktemp("s3-st") / "GLM-4-tiny")
    client = minio.client()
    for path in sorted(p for p in model.folder.rglob("*") if p.is_file()):
        key = f"zai-org/GLM-4-tiny/{path.relative_to(model.folder).as_posix()}"
        client.upload_file(str(path), BUCKET, key)
    # A sibling whose name shares the prefix's text must not leak into the listing.
    client.put_object(Bucket=BUCKET, Key="zai-org/GLM-4-tiny-old/config.json", Body=b"{}")
    client.put_object(Bucket=BUCKET, Key="zai-org/GLM-4-tiny/", Body=b"")  # a folder marker
    return model


def test_s3_folder_paginates_downloads_and_verifies(
        minio: MinIO, uploaded_folder: SafetensorsModel, tmp_path: Path) -> None:
    expected = folder_digest(uploaded_folder.folder, uploaded_folder.included)
    result_json = tmp_path / "result.json"
    run = run_fetch("--allow-http", "--format", "safetensors", "--source",
                    f"s3://{BUCKET}/zai-org/GLM-4-tiny/", "--dest", str(tmp_path / "cache"),
                    "--sha256", expected, "--architecture", "glm4moe", "--s3-max-keys", "2",
                    "--result-json", str(result_json), env=minio.env())
    assert run.code == 0, run.log
    folder = tmp_path / "cache" / "GLM-4-tiny"  # the renderer's model path: /models/GLM-4-tiny
    assert folder_digest(folder) == expected
    for name in uploaded_folder.included:
        assert (folder / name).read_bytes() == (uploaded_folder.folder / name).read_bytes()
    for name in uploaded_folder.excluded:
        assert not (folder / name).exists()
    result = json.loads(result_json.read_text())
    assert result["sha256"] == expected and result["files"] == len(uploaded_folder.included)
    assert result["facts"]["blockCount"] == 47 and result["facts"]["architecture"] == "glm4moe"
    assert result["facts"]["parameterCount"] == uploaded_folder.parameters
    manifest = json.loads((folder / ".glm-operator-manifest.json").read_text())
    assert [f["path"] for f in manifest["files"]] == uploaded_folder.included
    assert all(f["sha256"] == sha256_of(uploaded_folder.folder / f["path"])
               for f in manifest["files"])


def test_s3_folder_listing_pages_are_followed(
        minio: MinIO, uploaded_folder: SafetensorsModel, tmp_path: Path) -> None:
    # 13 objects under the prefix (12 files and the marker) at 2 keys a page: 7 signed pages.
    # Anything short of following every continuation token misses files and fails here.
    run = run_fetch("--allow-http", "--format", "safetensors", "--source",
                    f"s3://{BUCKET}/zai-org/GLM-4-tiny/", "--dest", str(tmp_path),
                    "--s3-max-keys", "2", "--include", "*", env=minio.env())
    assert run.code == 0, run.log
    fetched = sorted(p.relative_to(tmp_path / "GLM-4-tiny").as_posix()
                     for p in (tmp_path / "GLM-4-tiny").rglob("*") if p.is_file())
    assert fetched == sorted([*uploaded_folder.included, *uploaded_folder.excluded,
                              ".glm-operator-manifest.json", ".glm-operator.sha256sums"])
    assert (tmp_path / "GLM-4-tiny" / "config.json").read_bytes() == (
        uploaded_folder.folder / "config.json").read_bytes()  # not GLM-4-tiny-old's


def test_s3_folder_resumes_one_object(minio: MinIO, uploaded_folder: SafetensorsModel,
                                      tmp_path: Path) -> None:
    shard = "model-00002-of-00002.safetensors"
    partial = tmp_path / "GLM-4-tiny.partial"
    partial.mkdir()
    (partial / (shard + ".partial")).write_bytes(
        (uploaded_folder.folder / shard).read_bytes()[:500_000])
    result_json = tmp_path / "result.json"
    run = run_fetch("--allow-http", "--source", f"s3://{BUCKET}/zai-org/GLM-4-tiny/",
                    "--dest", str(tmp_path), "--result-json", str(result_json), env=minio.env())
    assert run.code == 0, run.log
    assert f"s3://{BUCKET}/zai-org/GLM-4-tiny/{shard}: resuming from" in run.log
    assert json.loads(result_json.read_text())["resumedFiles"] == 1
    assert sha256_of(tmp_path / "GLM-4-tiny" / shard) == sha256_of(uploaded_folder.folder / shard)


def test_s3_folder_empty_prefix_and_auth(minio: MinIO, uploaded_folder: SafetensorsModel,
                                         tmp_path: Path) -> None:
    empty = run_fetch("--allow-http", "--source", f"s3://{BUCKET}/zai-org/none/",
                      "--dest", str(tmp_path), env=minio.env())
    assert empty.code == 3 and "no objects under this prefix" in empty.log, empty.log
    denied = run_fetch("--allow-http", "--source", f"s3://{BUCKET}/zai-org/GLM-4-tiny/",
                       "--dest", str(tmp_path), env=minio.env(secret="not-the-secret"))
    assert denied.code == 4 and "HTTP 403" in denied.log, denied.log
    assert list(tmp_path.iterdir()) == []

