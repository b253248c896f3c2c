"""One version source: the images the operator renders by default, the chart's defaults, the
Dockerfiles' pins and the documented build commands name the same images and versions."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_rules import parse
from glm_operator import __version__
from glm_operator.config import OperatorConfig
from glm_operator.planning.accelerators import (
    DEFAULT_IMAGE_REGISTRY,
    VLLM_ASCEND_IMAGE,
    VLLM_CUDA_IMAGE,
    runtime_images,
)

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "runtime-images"
CHART = ROOT / "charts" / "glm-operator"
DOCS = ROOT / "docs" / "images.md"
# The operator renders these (planning/accelerators.py); each is built from this Dockerfile.
LLAMA_DOCKERFILES = {
    "llamacpp-cpu": IMAGES / "llamacpp" / "Dockerfile.cpu",
    "llamacpp-cuda": IMAGES / "llamacpp" / "Dockerfile.cuda",
    "llamacpp-cann": IMAGES / "llamacpp" / "Dockerfile.cann",
}


def _project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def _final_base(dockerfile: Path) -> str:
    """The upstream image the final stage ends up on, following stage names."""
    parsed = parse(dockerfile.read_text())
    stages = {s.name: s for s in parsed.stages if s.name}
    image = parsed.stages[-1].image
    while image in stages:
        image = stages[image].image
    return image


def test_operator_version_is_the_package_the_chart_and_the_image_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    python_image = parse((IMAGES / "python" / "Dockerfile").read_text())
    assert __version__ == _project_version()
    assert chart["appVersion"] == __version__
    assert python_image.args()["GLM_OPERATOR_VERSION"] == __version__


def test_chart_defaults_render_the_operator_defaults() -> None:
    """The chart's empty tag means appVersion, its registry the operator's default registry: the
    operator it installs renders the same images as `glm-operator render` without config."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["registry"] == DEFAULT_IMAGE_REGISTRY
    assert values["image"]["tag"] == ""
    config = OperatorConfig()
    assert config.operator_image == f"{DEFAULT_IMAGE_REGISTRY}/glm-operator:{__version__}"
    assert config.epp_image == f"{DEFAULT_IMAGE_REGISTRY}/endpoint-picker:{__version__}"
    assert all(image.endswith(f":{__version__}") for image in runtime_images().values())


@pytest.mark.parametrize(("dockerfile", "rendered"), [
    (IMAGES / "vllm" / "Dockerfile.cuda", VLLM_CUDA_IMAGE),
    (IMAGES / "vllm" / "Dockerfile.ascend", VLLM_ASCEND_IMAGE),
])
def test_vllm_dockerfiles_build_on_the_image_the_operator_renders(
    dockerfile: Path, rendered: str
) -> None:
    assert _final_base(dockerfile) == rendered


def _documented_tags() -> dict[str, str]:
    """`-t $REGISTRY/<name>:<tag>` of each build command in docs/images.md, variables expanded."""
    text = DOCS.read_text()
    variables = dict(re.findall(r"^([A-Z_]+)=(\S+)", text, flags=re.MULTILINE))
    tags = {}
    for name, tag in re.findall(r"-t \$REGISTRY/([a-z0-9-]+):(\S+)", text):
        tags[name] = re.sub(r"\$([A-Z_]+)", lambda m: variables[m.group(1)], tag)
    return tags


def test_documented_builds_tag_the_images_as_the_operator_renders_them() -> None:
    tags = _documented_tags()
    rendered = {**runtime_images(DEFAULT_IMAGE_REGISTRY),
                "glm-operator": OperatorConfig().operator_image,
                "endpoint-picker": OperatorConfig().epp_image}
    for image in rendered.values():
        name, tag = image.removeprefix(f"{DEFAULT_IMAGE_REGISTRY}/").split(":")
        assert tags.get(name) == tag, f"docs/images.md builds {name}:{tags.get(name)}, " \
                                      f"the operator renders {image}"
    for dockerfile, rendered_image in [(IMAGES / "vllm" / "Dockerfile.cuda", VLLM_CUDA_IMAGE),
                                       (IMAGES / "vllm" / "Dockerfile.ascend",
                                        VLLM_ASCEND_IMAGE)]:
        name = "vllm-cuda" if dockerfile.name.endswith("cuda") else "vllm-ascend"
        assert tags.get(name) == rendered_image.rsplit(":", 1)[1], (name, tags.get(name))


@pytest.mark.parametrize("image", sorted(LLAMA_DOCKERFILES))
def test_every_rendered_llama_image_has_its_dockerfile(image: str) -> None:
    assert image in runtime_images()
    assert LLAMA_DOCKERFILES[image].exists()


def test_the_endpoint_picker_follows_the_image_registry_unless_set() -> None:
    mirrored = OperatorConfig(imageRegistry="mirror.example/glm/", imageTag="0.2.0")
    assert mirrored.epp_image == "mirror.example/glm/endpoint-picker:0.2.0"
    assert mirrored.operator_image == "mirror.example/glm/glm-operator:0.2.0"
    upstream = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    assert OperatorConfig(imageRegistry="mirror.example/glm", eppImage=upstream).epp_image \
        == upstream
    with pytest.raises(ValueError, match="eppImage"):
        OperatorConfig(eppImage="mirror.example/epp:latest")


def test_the_version_check_catches_a_stale_pin(tmp_path: Path) -> None:
    stale = (IMAGES / "vllm" / "Dockerfile.ascend").read_text().replace(
        VLLM_ASCEND_IMAGE.rsplit(":", 1)[1], "v0.9.1")
    path = tmp_path / "Dockerfile.ascend"
    path.write_text(stale)
    assert _final_base(path) != VLLM_ASCEND_IMAGE
