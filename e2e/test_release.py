"""A release, end to end on this machine: `make release` pushes the images, their SBOMs' subjects
and the chart to a local OCI registry (go-containerregistry's `crane registry serve`, plain
HTTP), the chart installs the operator into the local cluster from `oci://` at the released
version, and podman pulls every released image from that registry into an empty storage,
getting the very images that were built (same image IDs), for each platform.

Multi-arch: the glm-operator, endpoint-picker and CPU llama.cpp images are each pushed as
one OCI index of linux/amd64 and linux/arm64 (the arm64 builds of e2e/images_foreign.py);
podman pulls each platform's image, the arm64 binaries are AArch64 ELF files, and the arm64
glm-operator image runs (emulated). What is not proven here: the CUDA and CANN images, which
only the release workflow (docker buildx) makes; `make release` says so and the summary
lists them by platform.

Warm (images built, tools cached) the module takes about two minutes: the pushes of the six
images (about 1 GB) and the pulls back dominate. Cold, `make release` also cross compiles
llama.cpp for arm64 (about 10 minutes of two cores).
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

from e2e import images, images_foreign, procstat, toolchain
from e2e.kubectl import Kubectl
from e2e.operator_fixtures import REPO
from e2e.ports import free_port
from e2e.test_chart import Helm, helm, release_namespace, uninstall
from e2e.test_images import require_image_tools

__all__ = ["helm", "release_namespace"]  # fixtures used by name

# The images are built by e2e/images.py (the llama.cpp one carries the toolchain's llama-server)
# and may be built cold here: more than the suite's default timeout.
pytestmark = [pytest.mark.llama, pytest.mark.timeout(1800)]

BOTH = ["linux/amd64", "linux/arm64"]
RELEASED_HERE = {"llamacpp-cpu": BOTH, "epp": BOTH, "glm-operator": BOTH}
NOT_BUILT_HERE = {"llamacpp-cann": ["linux/arm64"], "llamacpp-cuda": ["linux/amd64"]}
# The name each is built under in e2e/images.py's storage (the default registry).
BUILT_AS = {"llamacpp-cpu": images.llama_cpu_spec, "epp": images.epp_spec,
            "glm-operator": images.python_spec}
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
# The main binary of each image.
BINARY = {"llamacpp-cpu": "/usr/local/bin/llama-server", "epp": "/usr/local/bin/epp",
          "glm-operator": "/usr/bin/python3.11"}


def built_reference(name: str, platform: str) -> str:
    """Where e2e/images.py (this machine's) or e2e/images_foreign.py (another's) stored it."""
    spec = BUILT_AS[name]()
    arch = platform.split("/")[1]
    if arch == images.native_arch():
        return spec.reference
    return images_foreign.foreign_spec(spec, arch).reference


@pytest.fixture(scope="module")
def release_tools() -> dict[str, Path]:
    """crane (the registry) and syft (the SBOMs), built by the toolchain; and the picker for
    arm64, which `make release` puts in that platform's image."""
    toolchain.ensure("epp_arm64")
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
    assert {name: pushed["platforms"] for name, pushed in summary["images"].items()} == \
        RELEASED_HERE
    assert summary["notBuiltHere"] == NOT_BUILT_HERE
    assert "not built here (the release workflow builds them with docker buildx): " \
        "llamacpp-cann linux/arm64; llamacpp-cuda linux/amd64" \
        in released["log"]
    config = OperatorConfig(imageRegistry=registry, imageTag=__version__)
    assert summary["images"]["glm-operator"]["image"] == config.operator_image
    assert summary["images"]["epp"]["image"] == config.epp_image
    for name, pushed in summary["images"].items():
        repository, tag = pushed["image"].rsplit(":", 1)
        assert tag == __version__
        assert crane(release_tools, "ls", repository).split() == [__version__], name
        digest = crane(release_tools, "digest", pushed["image"]).strip()
        assert digest == pushed["digest"], name
        manifest = json.loads(crane(release_tools, "manifest", pushed["image"]))
        assert manifest["mediaType"] == OCI_INDEX, name
        assert sorted(f"{m['platform']['os']}/{m['platform']['architecture']}"
                      for m in manifest["manifests"]) == BOTH, name


def test_an_sbom_per_image_lists_what_is_in_it(released: dict[str, Any]) -> None:
    out, summary = released["out"], released["summary"]
    assert len(summary["sboms"]) == sum(map(len, RELEASED_HERE.values()))
    packages: dict[str, set[str]] = {}
    for name, platforms in RELEASED_HERE.items():
        for platform in platforms:
            arch = platform.split("/")[1]
            (path,) = [p for p in summary["sboms"]
                       if Path(p).name == f"{name}-{__version__}-linux-{arch}.spdx.json"]
            document = json.loads((out / path).read_text())
            assert document["spdxVersion"] == "SPDX-2.3"
            assert document["name"] == summary["images"][name]["image"].rsplit(":", 1)[0]
            # Each platform's SBOM is of that platform's image: its Debian packages' purls
            # carry the architecture (the control: no purl of the other one).
            purls = {ref["referenceLocator"] for package in document["packages"]
                     for ref in package.get("externalRefs", ())
                     if ref.get("referenceType") == "purl" and "pkg:deb/debian/libc6@"
                     in ref["referenceLocator"]}
            assert purls and all(f"arch={arch}" in purl for purl in purls), (name, purls)
            packages[name] = {package["name"] for package in document["packages"]}
    # The Python image's venv, Debian's packages in every image; the control: the picker's
    # image (a Go binary on the base) has no Python packages.
    assert {"kopf", "pydantic", "glm-operator"} <= packages["glm-operator"]
    assert {"libc6", "libgomp1"} <= packages["llamacpp-cpu"]
    # llama-server, which syft cannot see, is named by the release (the control: only there).
    assert "llama.cpp" in packages["llamacpp-cpu"]
    assert "llama.cpp" not in packages["glm-operator"] | packages["epp"]
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
    """Into an empty storage of their own, each platform of each image: the image pulled is
    the one built (same ID, the config's digest), for that architecture, its main binary an
    ELF file of that architecture; the operator's image runs on both (arm64 emulated)."""
    built = images.Store.default()
    pulled = images.Store(tmp_path_factory.mktemp("pulled-store"))
    pulled.prepare()
    try:
        for name, pushed in sorted(released["summary"]["images"].items()):
            for platform in pushed["platforms"]:
                arch = platform.split("/")[1]
                image_id = pulled.run(pulled.podman(
                    "pull", "--quiet", "--tls-verify=false", "--platform", platform,
                    pushed["image"]), f"podman pull {name} {platform}", timeout=600).stdout
                image_id = image_id.strip().splitlines()[-1]
                assert image_id == built.image_id(built_reference(name, platform)), \
                    (name, platform)
                assert images_foreign.image_arch(pulled, image_id) == arch, (name, platform)
                machine = images_foreign.binary_machine(pulled, image_id, BINARY[name])
                assert machine == images_foreign.ELF_MACHINES[arch], (name, platform)
                if name != "glm-operator":
                    continue
                ran = pulled.run(pulled.podman(
                    "run", "--rm", "--network", "none", "--arch", arch, "--entrypoint",
                    "python3", image_id, "-c",
                    "import platform, glm_operator; "
                    "print(platform.machine(), glm_operator.__version__)"),
                    f"podman run glm-operator ({platform})")
                kernel_name = images_foreign.QEMU_NAMES[arch]
                assert ran.stdout.split() == [kernel_name, __version__], ran.stdout
        version = pulled.run(pulled.podman(
            "run", "--rm", "--network", "none",
            released["summary"]["images"]["glm-operator"]["image"], "--version"),
            "podman run glm-operator --version")
        assert version.stdout.strip() == f"glm-operator {__version__}"
    finally:
        pulled.run(pulled.podman("system", "reset", "--force"), "podman system reset",
                   check=False)

