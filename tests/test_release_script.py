"""scripts/release.py: one version or none, the images the operator renders, and the build
commands docs/images.md shows ("Build and push") being the ones the script (and so the release
workflow) runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from glm_operator import __version__
from glm_operator.config import OperatorConfig
from glm_operator.images import configured_images

from scripts import release

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "images.md"


def test_the_repository_declares_one_version() -> None:
    assert set(release.declared_versions().values()) == {__version__}
    release.check_version(__version__)


def test_a_version_that_disagrees_is_refused_naming_each_place() -> None:
    declared = {**release.declared_versions(), "charts/glm-operator/Chart.yaml version": "0.0.9"}
    with pytest.raises(release.ReleaseError) as error:
        release.check_version(__version__, declared)
    listed = [line for line in str(error.value).splitlines() if line.startswith("  ")]
    assert listed == ["  charts/glm-operator/Chart.yaml version = 0.0.9"]
    with pytest.raises(release.ReleaseError, match=r"pyproject.toml \[project\] version = "):
        release.check_version("9.9.9")


def test_a_tag_name_is_refused_as_a_version() -> None:
    with pytest.raises(release.ReleaseError, match="without the tag's `v`"):
        release.check_version(f"v{__version__}")


def test_the_released_images_are_ours_that_the_operator_renders() -> None:
    registry = "registry.example.com/glm"
    config = OperatorConfig(imageRegistry=registry, imageTag=__version__)
    ours = {image for image in configured_images(config) if image.startswith(registry + "/")}
    released = {image.reference(registry, __version__) for image in release.release_images()}
    assert released == ours


def test_only_cuda_and_cann_are_single_platform() -> None:
    platforms = {image.name: image.platforms for image in release.release_images()}
    assert platforms.pop("llamacpp-cuda") == ("linux/amd64",)
    assert platforms.pop("llamacpp-cann") == ("linux/arm64",)
    assert set(platforms.values()) == {("linux/amd64", "linux/arm64")}


def documented_release_commands(text: str) -> list[list[str]]:
    """The `docker buildx build` commands of docs/images.md's "Build and push" block that tag
    `$REGISTRY/<name>:$VERSION` (the vLLM images there keep their upstream tags and are not
    released), the block's other variables expanded."""
    section = text.split("## Build and push", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    variables = dict(re.findall(r"^([A-Z_]+)=(\S+)", block, flags=re.MULTILINE))
    keep = {"REGISTRY", "VERSION"}
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        if not line.startswith("docker buildx build"):
            continue
        expanded = re.sub(r"\$([A-Z_]+)", lambda m: m.group(0) if m.group(1) in keep
                          else variables[m.group(1)], line)
        argv = shlex.split(expanded, comments=True)
        if argv[argv.index("-t") + 1].endswith(":$VERSION"):
            commands.append(argv)
    return commands


def scripted_commands() -> list[list[str]]:
    return [image.buildx("$REGISTRY", "$VERSION", push=True)
            for image in release.release_images()]


def test_the_documented_build_commands_are_the_release_script_s() -> None:
    assert documented_release_commands(DOCS.read_text()) == scripted_commands()


def test_the_docs_check_catches_a_drifted_command() -> None:
    """The control: docs building the CUDA image for arm64 too no longer match."""
    text = DOCS.read_text()
    drifted = text.replace("docker buildx build --platform linux/amd64 \\\n"
                           "  -f runtime-images/llamacpp/Dockerfile.cuda",
                           "docker buildx build --platform linux/amd64,linux/arm64 \\\n"
                           "  -f runtime-images/llamacpp/Dockerfile.cuda", 1)
    assert drifted != text
    assert documented_release_commands(drifted) != scripted_commands()


def test_the_dry_run_prints_the_commands_for_the_shell(capsys: pytest.CaptureFixture[str]) \
        -> None:
    assert release.main(["buildx", "--registry", "$REGISTRY", "--version", "$VERSION",
                         "--push", "--dry-run"]) == 0
    printed = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == scripted_commands()


def test_an_unknown_image_is_refused() -> None:
    with pytest.raises(release.ReleaseError, match="choose from llamacpp-cpu"):
        release.select(["llama-cpu"])


def test_llama_cpp_is_added_to_the_sboms_of_the_images_that_carry_it() -> None:
    """syft sees no package database for a C++ binary: the release names it itself."""
    carried = {image.name: [p.name for p in image.built_from_source]
               for image in release.release_images()}
    assert carried == {"llamacpp-cpu": ["llama.cpp"], "llamacpp-cuda": ["llama.cpp"],
                       "llamacpp-cann": ["llama.cpp"], "epp": [], "glm-operator": []}
    root = "SPDXRef-DocumentRoot-Image-llama-server-cpu"
    document: dict[str, object] = {
        "packages": [{"name": "libc6", "SPDXID": "SPDXRef-Package-deb-libc6"}],
        "relationships": [{"spdxElementId": "SPDXRef-DOCUMENT", "relatedSpdxElement": root,
                           "relationshipType": "DESCRIBES"}]}
    (image,) = [i for i in release.release_images() if i.name == "llamacpp-cpu"]
    release.add_built_from_source(document, image.name, image.built_from_source)
    packages = document["packages"]
    assert isinstance(packages, list)
    added = packages[-1]
    version = release.pinned("llama_cpp_python")
    assert added["name"] == "llama.cpp"
    assert re.fullmatch(r"SPDXRef-[A-Za-z0-9.-]+", added["SPDXID"])
    assert added["externalRefs"][0]["referenceLocator"] == f"pkg:pypi/llama-cpp-python@{version}"
    assert document["relationships"][-1] == {  # type: ignore[index]
        "spdxElementId": root, "relatedSpdxElement": added["SPDXID"],
        "relationshipType": "CONTAINS"}
    # A document describing nothing is refused rather than given a package nothing contains.
    with pytest.raises(release.ReleaseError, match="describes no element"):
        release.add_built_from_source({"packages": []}, image.name, image.built_from_source)
