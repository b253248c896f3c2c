"""A download users can watch: the real fetch CLI against a slow local HTTP server, reporting
into a real ModelVersion on the local API server with the Job's own narrow ServiceAccount.

While bytes arrive, `status.progress` holds bytes done and total, the rate and the ETA, and
`kubectl get mv` prints them in the Progress column. A fetch killed half-way (a pod lost) and
run again continues from its `.partial` with a Range request, and its first report already
counts the bytes on disk as done. With the operator running, a GLMService waiting on the
version repeats the summary in its ModelReady message.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.fetch_helpers import (
    REPO_ROOT,
    sha256_of,
    write_safetensors_model,
    write_served_gguf,
)
from e2e.fetch_servers import ModelFileServer, serve
from e2e.kubectl import Kubectl
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator
from e2e.test_fetch_status import (  # noqa: F401  (the CRD fixture)
    GROUP,
    _fetch_job_identity,
    _modelversion,
    modelversion_crd,
)

__all__ = ["glm_crds", "operator"]  # fixtures used by name

PAYLOAD_MIB = 4
RATE = 384 * 1024  # bytes/s: the 4 MiB take about 11 s


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_served_gguf(tmp_path_factory.mktemp("served") / "glm4.gguf",
                             payload_mib=PAYLOAD_MIB)


@pytest.fixture
def slow_server(model: Path) -> Iterator[ModelFileServer]:
    with serve(model.parent) as server:
        server.bytes_per_second = RATE
        yield server


def _start_fetch(server: ModelFileServer, model: Path, api: list[str], name: str,
                 dest: Path) -> subprocess.Popen[str]:
    """`glm-operator fetch` as the Job runs it, in the background, writing the status every
    second (the Job's default is every 15 s; the throttle itself is unit-tested)."""
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("AWS_", "HF_", "GLM_FETCH_"))}
    return subprocess.Popen(
        [sys.executable, "-m", "glm_operator.cli", "fetch", "--allow-http",
         "--source", f"{server.url}/{model.name}", "--dest", str(dest),
         "--sha256", sha256_of(model), "--architecture", "glm4", "--modelversion", name,
         "--cache-claim", f"{name}-cache", "--status-interval", "1", "--retry-delay", "0.05",
         *api],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment,
        cwd=REPO_ROOT)


def _progress(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    obj = kubectl.get_json(f"modelversions.{GROUP}", name, "-n", namespace)
    return dict((obj.get("status") or {}).get("progress") or {})


def _finish(process: subprocess.Popen[str]) -> str:
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    return out


@pytest.mark.usefixtures("modelversion_crd")
def test_a_slow_download_shows_its_progress_in_the_status_and_the_column(
    kubectl: Kubectl, namespace: str, slow_server: ModelFileServer, model: Path,
    tmp_path: Path, wait_for: Callable[..., Any],
) -> None:
    size = model.stat().st_size
    kubectl.apply(_modelversion("slow", f"{slow_server.url}/{model.name}", sha256_of(model),
                                "glm4"), namespace=namespace)
    api = _fetch_job_identity(kubectl, namespace, "slow", tmp_path)
    process = _start_fetch(slow_server, model, api, "slow", tmp_path / "cache")
    try:
        # half-way: a percentage, bytes of the whole, a rate and an ETA, all in the real object
        midway = wait_for(
            lambda: (p := _progress(kubectl, namespace, "slow")).get("bytesPerSecond")
            and 10 <= p.get("percent", 0) <= 80 and p, timeout=60,
            what="an intermediate progress with a rate in the ModelVersion's status")
        assert midway["totalBytes"] == size
        assert 0 < midway["doneBytes"] < size
        assert midway["percent"] == midway["doneBytes"] * 100 // size
        assert RATE / 3 < midway["bytesPerSecond"] < RATE * 3, midway
        assert midway["etaSeconds"] >= 1
        assert midway["resumedBytes"] == 0
        assert re.fullmatch(r"Downloading \d+% [\d.]+/4\.0Mi \d+KiB/s ETA \d+s",
                            midway["summary"]), midway
        # and the printer column shows the same line in `kubectl get mv`
        table = wait_for(
            lambda: (out := kubectl("get", f"modelversions.{GROUP}", "slow", "-n",
                                    namespace).stdout)
            and re.search(r"Downloading \d+% [\d.]+/4\.0Mi", out) and out, timeout=30,
            what="the Progress column of kubectl get mv")
        header, row = table.splitlines()[:2]
        assert header.split()[:3] == ["NAME", "PHASE", "PROGRESS"], header
        assert re.match(r"slow\s+Fetching\s+Downloading \d+% [\d.]+/4\.0Mi \d+KiB/s ETA \d+s\s",
                        row), row
    finally:
        slow_server.bytes_per_second = None
        out = _finish(process)
    status = kubectl.get_json(f"modelversions.{GROUP}", "slow", "-n", namespace)["status"]
    assert status["phase"] == "Ready", out
    final = status["progress"]
    assert (final["doneBytes"], final["totalBytes"], final["percent"]) == (size, size, 100)
    assert "etaSeconds" not in final  # removed by the final merge patch (null)
    assert re.fullmatch(r"Downloaded 4\.0Mi in \d+s", final["summary"]), final
    row = kubectl("get", f"modelversions.{GROUP}", "slow", "-n", namespace).stdout
    assert re.search(r"slow\s+Ready\s+Downloaded 4\.0Mi in \d+s", row), row


@pytest.mark.usefixtures("modelversion_crd")
def test_a_killed_download_resumes_and_counts_what_was_on_disk(
    kubectl: Kubectl, namespace: str, slow_server: ModelFileServer, model: Path,
    tmp_path: Path, wait_for: Callable[..., Any],
) -> None:
    size = model.stat().st_size
    dest = tmp_path / "cache"
    partial = dest / f"{model.name}.partial"
    kubectl.apply(_modelversion("resumed", f"{slow_server.url}/{model.name}",
                                sha256_of(model), "glm4"), namespace=namespace)
    api = _fetch_job_identity(kubectl, namespace, "resumed", tmp_path)

    first = _start_fetch(slow_server, model, api, "resumed", dest)
    try:
        wait_for(lambda: _progress(kubectl, namespace, "resumed").get("percent", 0) >= 30,
                 timeout=60, what="the first attempt to pass 30%")
    finally:
        first.send_signal(signal.SIGKILL)  # the pod is lost: no failure report, no cleanup
        first.communicate(timeout=30)
    left = partial.stat().st_size
    assert 0.25 * size < left < size
    assert not (dest / model.name).exists()
    slow_server.requests.clear()

    second = _start_fetch(slow_server, model, api, "resumed", dest)
    try:
        # the second attempt's first figures already count the partial file as done
        resumed = wait_for(
            lambda: (p := _progress(kubectl, namespace, "resumed")).get("resumedBytes")
            and p.get("summary", "").startswith("Downloading") and p, timeout=60,
            what="the resumed attempt's first progress report")
        assert resumed["resumedBytes"] == left
        assert left <= resumed["doneBytes"] < size
        assert resumed["percent"] >= left * 100 // size
    finally:
        slow_server.bytes_per_second = None
        out = _finish(second)
    gets = [r for r in slow_server.requests if r[0] == "GET"]
    assert gets and gets[0][2] == f"bytes={left}-", gets
    assert (dest / model.name).read_bytes() == model.read_bytes()
    status = kubectl.get_json(f"modelversions.{GROUP}", "resumed", "-n", namespace)["status"]
    assert status["phase"] == "Ready", out
    assert status["sha256"] == sha256_of(model)
    final = status["progress"]
    assert (final["doneBytes"], final["resumedBytes"]) == (size, left)
    assert re.fullmatch(r"Downloaded 4\.0Mi in \d+s \(resumed at [\d.]+Mi\)",
                        final["summary"]), final


@pytest.mark.usefixtures("modelversion_crd")
def test_a_snapshot_reports_the_whole_folder_with_the_files_on_disk_done(
    kubectl: Kubectl, namespace: str, tmp_path: Path, wait_for: Callable[..., Any],
) -> None:
    """A safetensors folder (the GLM-5 case): the listing gives the total before the first
    byte, and what an earlier attempt left (a whole file, half a shard) counts as done."""
    st_model = write_safetensors_model(tmp_path / "st" / "GLM-tiny", rows=512)
    sizes = {f: (st_model.folder / f).stat().st_size for f in st_model.included}
    total = sum(sizes.values())
    shard = "model-00001-of-00002.safetensors"
    dest = tmp_path / "cache"
    partial = dest / "GLM-tiny.partial"
    partial.mkdir(parents=True)
    (partial / "config.json").write_bytes((st_model.folder / "config.json").read_bytes())
    (partial / f"{shard}.partial").write_bytes((st_model.folder / shard).read_bytes()[:600_000])
    present = sizes["config.json"] + 600_000
    kubectl.apply({"apiVersion": f"{GROUP}/v1alpha2", "kind": "ModelVersion",
                   "metadata": {"name": "folder"},
                   "spec": {"source": {"uri": "hf://zai-org/GLM-tiny?revision=main"},
                            "format": "safetensors", "architecture": "glm4moe"}},
                  namespace=namespace)
    api = _fetch_job_identity(kubectl, namespace, "folder", tmp_path)
    root = tmp_path / "hub"
    shutil.copytree(st_model.folder, root / "zai-org" / "GLM-tiny" / "main")
    with serve(root) as hub:
        hub.hub_layout = True
        hub.bytes_per_second = RATE
        environment = {k: v for k, v in os.environ.items()
                       if not k.startswith(("AWS_", "HF_", "GLM_FETCH_"))}
        environment["HF_ENDPOINT"] = hub.url
        process = subprocess.Popen(
            [sys.executable, "-m", "glm_operator.cli", "fetch", "--allow-http",
             "--format", "safetensors", "--source", "hf://zai-org/GLM-tiny?revision=main",
             "--dest", str(dest), "--architecture", "glm4moe", "--modelversion", "folder",
             "--cache-claim", "folder-cache", "--status-interval", "1", *api],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment,
            cwd=REPO_ROOT)
        try:
            first = wait_for(
                lambda: (p := _progress(kubectl, namespace, "folder")).get("summary", "")
                .startswith("Downloading") and p, timeout=60,
                what="the snapshot's first progress report")
            assert first["totalBytes"] == total
            assert first["resumedBytes"] == present
            assert present <= first["doneBytes"] < total
            assert first["percent"] >= present * 100 // total
        finally:
            hub.bytes_per_second = None
            out = _finish(process)
    status = kubectl.get_json(f"modelversions.{GROUP}", "folder", "-n", namespace)["status"]
    assert status["phase"] == "Ready", out
    final = status["progress"]
    assert (final["doneBytes"], final["totalBytes"], final["resumedBytes"]) == (
        total, total, present)


def test_a_service_waiting_on_the_download_repeats_its_progress_in_model_ready(
    operator: OperatorProcess, kubectl: Kubectl, namespace: str,
    slow_server: ModelFileServer, model: Path, tmp_path: Path, wait_for: Callable[..., Any],
) -> None:
    """With the operator running: the real fetch reports into the ModelVersion, and the
    GLMService that waits on it says how far the download is in its ModelReady message."""
    kubectl.apply(_modelversion("watched", f"{slow_server.url}/{model.name}",
                                sha256_of(model), "glm4"), namespace=namespace)
    kubectl.apply({"apiVersion": f"{GROUP}/v1alpha2", "kind": "GLMService",
                   "metadata": {"name": "waiting"},
                   "spec": {"modelVersion": "watched", "engine": {"llamacpp": {}},
                            "accelerator": {"profile": "cpu", "count": 1},
                            "contextLength": 4096, "concurrency": 1, "replicas": 1,
                            "gateway": {"access": "Open"}}}, namespace=namespace)
    api = _fetch_job_identity(kubectl, namespace, "watched", tmp_path)
    process = _start_fetch(slow_server, model, api, "watched", tmp_path / "cache")
    try:
        def model_ready() -> dict[str, Any] | None:
            obj = kubectl.get_json(f"glmservices.{GROUP}", "waiting", "-n", namespace)
            cond = next((c for c in obj.get("status", {}).get("conditions", [])
                         if c["type"] == "ModelReady"), None)
            return cond if cond and re.search(r"Downloading \d+% ", cond["message"]) else None
        cond = wait_for(model_ready, timeout=60,
                        what="the GLMService's ModelReady message with the download's progress")
        assert (cond["status"], cond["reason"]) == ("False", "ModelVersionNotReady")
        assert re.fullmatch(r"ModelVersion 'watched' is Fetching \(Downloading \d+% "
                            r"[\d.]+/4\.0Mi( \d+KiB/s ETA \d+s)?\): waiting for the fetch Job "
                            r"to download and verify it", cond["message"]), cond
    finally:
        slow_server.bytes_per_second = None
        out = _finish(process)
    wait_for(lambda: next((c for c in kubectl.get_json(
        f"glmservices.{GROUP}", "waiting", "-n", namespace)["status"]["conditions"]
        if c["type"] == "ModelReady" and c["status"] == "True"), None),
        timeout=60, what="ModelReady=True once the fetch reported Ready: " + out[-300:])
