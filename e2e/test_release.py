"""A release, end to end on this machine: `make release` pushes the images, their SBOMs' subjects
and the chart to a local OCI registry (go-containerregistry's `crane registry serve`, plain
HTTP), the chart installs the operator into the local cluster from `oci://` at the released
version, and podman pulls every released image from that registry into an empty storage,
getting the very images that were built (same image IDs).

What is not proven here: the multi-arch builds and the CUDA and CANN images, which only the
release workflow (docker buildx) makes; `make release` says so and the summary lists them.

Warm (images built, tools cached) the module takes about a minute and a half: the pushes of
the three images (about 500 MB) and the pulls back dominate.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from glm_operator import __version__
from glm_operator.config import OperatorConfig

from e2e import images, procstat, toolchain
from e2e.kubectl import Kubectl
from e2e.operator_fixtures import REPO
from e2e.ports import free_port
from e2e.test_chart import Helm, helm, release_namespace, uninstall
from e2e.test_images import require_image_tools

__all__ = ["helm", "release_namespace"]  # fixtures used by name

# The images are built by e2e/images.py (the llama.cpp one carries the toolchain's llama-server)
# and may be built cold here: more than the suite's default timeout.
pytestmark = [pytest.mark.llama, pytest.mark.timeout(1800)]

RELEASED_HERE = {"llamacpp-cpu", "epp", "glm-operator"}
NOT_BUILT_HERE = ["llamacpp-cann", "llamacpp-cuda"]
# The name each is built under in e2e/images.py's storage (the default registry).
BUILT_AS = {"llamacpp-cpu": images.llama_cpu_spec, "epp": images.epp_spec,
            "glm-operator": images.python_spec}


@pytest.fixture(scope="module")
def release_tools() -> dict[str, Path]:
    """crane (the registry) and syft (the SBOMs), built by the toolchain."""
    return {name: toolchain.ensure(name) / name for name in ("crane", "syft")}


@pytest.fixture(scope="module")
def registry(release_tools: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`crane registry serve` on a free port, blobs on disk; the registry a release names has a
    path under the host, as a real one (ghcr.io/<org>) has."""
    port = free_port()
    blobs = tmp_path_factory.mktemp("registry-blobs")
    log_path = tmp_path_factory.mktemp("registry-log") / "registry.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [str(release_tools["crane"]), "registry", "serve", "--address", f"127.0.0.1:{port}",
         "--disk", str(blobs)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as reply:
                    assert reply.status == 200
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("crane registry serve did not answer on /v2/: "
                                         f"{log_path.read_text()}") from None
                time.sleep(0.2)
        yield f"127.0.0.1:{port}/glm"
    finally:
        procstat.stop(process)
        log.close()


@pytest.fixture(scope="module")
def released(registry: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`make release` to the local registry; its summary and its output."""
    require_image_tools("the release test")
    out = tmp_path_factory.mktemp("release")
    started = time.monotonic()
    result = subprocess.run(
        ["make", "--no-print-directory", "release", f"REGISTRY={registry}",
         f"VERSION={__version__}", "PLAIN_HTTP=1", f"RELEASE_OUT={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=1700, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    print(f"make release: {time.monotonic() - started:.0f} s")
    summary: dict[str, Any] = json.loads((out / f"release-{__version__}.json").read_text())
    return {"summary": summary, "out": out, "log": result.stdout + result.stderr}


def crane(tools: dict[str, Path], *args: str) -> str:
    result = subprocess.run([str(tools["crane"]), *args, "--insecure"], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_release_refuses_another_version(registry: str) -> None:
    result = subprocess.run(["make", "--no-print-directory", "release", f"REGISTRY={registry}",
                             "VERSION=9.9.9", "PLAIN_HTTP=1"], cwd=REPO, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode != 0
    assert f"charts/glm-operator/Chart.yaml appVersion = {__version__}" in result.stderr
    assert "set them all to 9.9.9" in result.stderr


def test_the_images_are_pushed_as_the_operator_renders_them(
        released: dict[str, Any], registry: str, release_tools: dict[str, Path]) -> None:
    summary = released["summary"]
    assert set(summary["images"]) == RELEASED_HERE
    assert summary["notBuiltHere"] == NOT_BUILT_HERE
    assert "not built here: llamacpp-cann, llamacpp-cuda" in released["log"]
    config = OperatorConfig(imageRegistry=registry, imageTag=__version__)
    assert summary["images"]["glm-operator"]["image"] == config.operator_image
    assert summary["images"]["epp"]["image"] == config.epp_image
    for name, pushed in summary["images"].items():
        repository, tag = pushed["image"].rsplit(":", 1)
        assert tag == __version__
        assert crane(release_tools, "ls", repository).split() == [__version__], name
        digest = crane(release_tools, "digest", pushed["image"]).strip()
        assert digest == pushed["digest"], name


def test_an_sbom_per_image_lists_what_is_in_it(released: dict[str, Any]) -> None:
    out, summary = released["out"], released["summary"]
    assert len(summary["sboms"]) == len(RELEASED_HERE)
    packages: dict[str, set[str]] = {}
    for name in RELEASED_HERE:
        (path,) = [p for p in summary["sboms"] if Path(p).name.startswith(f"{name}-")]
        document = json.loads((out / path).read_text())
        assert document["spdxVersion"] == "SPDX-2.3"
        assert document["name"] == summary["images"][name]["image"].rsplit(":", 1)[0]
        packages[name] = {package["name"] for package in document["packages"]}
    # The Python image's venv, Debian's packages in every image; the control: the picker's
    # image (a Go binary on the base) has no Python packages.
    assert {"kopf", "pydantic", "glm-operator"} <= packages["glm-operator"]
    assert {"libc6", "libgomp1"} <= packages["llamacpp-cpu"]
    assert "libc6" in packages["epp"]
    assert "kopf" not in packages["epp"]
    assert "sigs.k8s.io/gateway-api-inference-extension" in packages["epp"]


def test_the_chart_installs_from_the_registry(
        released: dict[str, Any], registry: str, helm: Helm, kubectl: Kubectl,
        release_namespace: str, release_tools: dict[str, Path]) -> None:
    chart = f"oci://{registry}/charts/glm-operator"
    assert released["summary"]["chart"] == f"{chart}:{__version__}"
    manifest = json.loads(crane(release_tools, "manifest",
                                f"{registry}/charts/glm-operator:{__version__}"))
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    # The control: a version that was not released is not found there.
    missing = helm("install", "glmmissing", chart, "--version", "9.9.9", "--plain-http",
                   "-n", release_namespace, check=False)
    assert missing.returncode != 0
    assert "9.9.9" in missing.stderr and "not found" in missing.stderr
    name = "glmreleased"
    try:
        helm("install", name, chart, "--version", __version__, "--plain-http",
             "-n", release_namespace, "--wait", "--timeout", "180s",
             values={"crds": {"enabled": False}, "image": {"registry": registry}})
        listed = json.loads(helm("list", "-n", release_namespace, "-o", "json").stdout)
        assert [(r["name"], r["chart"], r["app_version"]) for r in listed] == \
            [(name, f"glm-operator-{__version__}", __version__)]
        deployment = kubectl.get_json("deployment", f"{name}-glm-operator",
                                      "-n", release_namespace)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == released["summary"]["images"]["glm-operator"]["image"]
        assert deployment["status"]["readyReplicas"] == deployment["spec"]["replicas"]
    finally:
        uninstall(helm, name, release_namespace)


def test_podman_pulls_the_released_images(released: dict[str, Any],
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    """Into an empty storage of their own: each pulled image is the one built (same ID, the
    config's digest), and the operator's image runs."""
    built = images.Store.default()
    pulled = images.Store(tmp_path_factory.mktemp("pulled-store"))
    pulled.prepare()
    try:
        for name, pushed in sorted(released["summary"]["images"].items()):
            pulled.run(pulled.podman("pull", "--tls-verify=false", pushed["image"]),
                       f"podman pull {name}", timeout=600)
            source = BUILT_AS[name]().reference
            assert pulled.image_id(pushed["image"]) == built.image_id(source), name
        version = pulled.run(pulled.podman(
            "run", "--rm", "--network", "none",
            released["summary"]["images"]["glm-operator"]["image"], "--version"),
            "podman run glm-operator --version")
        assert version.stdout.strip() == f"glm-operator {__version__}"
    finally:
        pulled.run(pulled.podman("system", "reset", "--force"), "podman system reset",
                   check=False)
