"""CPU architectures: which nodes each image has a build for (pure data, no I/O).

An image pulled on a node of an architecture it has no build for does not start (`exec
format error`, or the kubelet's `no matching manifest for linux/arm64`), and nothing tells
the user why. Every pod the operator renders is therefore pinned (`kubernetes.io/arch In
[...]`) to the architectures that both its nodes have (the accelerator profile's
`architectures`) and every one of its images was built for; a pod left with none is refused
before it is created (decide/image_architecture.py).

`RELEASED_IMAGE_PLATFORMS` is the one list of what the release builds (scripts/release.py
reads it through `released_platforms`); `UPSTREAM_IMAGE_ARCHITECTURES` says what the
publishers of the upstream images we render publish. Operator config `imageArchitectures`
is merged over both (config.py `OperatorConfig.image_architecture_table`), for mirrored or
rebuilt images.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Architecture = Literal["amd64", "arm64"]
# The architectures we build for and know nodes of (the values of the kubernetes.io/arch
# label, which the kubelet sets from Go's GOARCH). Nodes of any other (ppc64le, s390x) get
# no build of ours, which is why the pin is rendered even when it lists both.
ARCHITECTURES: tuple[Architecture, ...] = ("amd64", "arm64")
ARCH_LABEL = "kubernetes.io/arch"
BOTH: tuple[Architecture, ...] = ("amd64", "arm64")

# Image name under our registry (`<imageRegistry>/<name>:<imageTag>`) -> the architectures
# the release builds it for. The single source of truth for the release's platforms.
RELEASED_IMAGE_PLATFORMS: Mapping[str, tuple[Architecture, ...]] = MappingProxyType({
    # The operator, the gateway sidecar, the router, the fetch Job and the wait-tcp init.
    "glm-operator": BOTH,
    "endpoint-picker": BOTH,
    "llama-server-cpu": BOTH,
    # amd64 only: runtime-images/llamacpp/cuda-wheels.txt pins the x86_64 wheels' hashes.
    "llama-server-cuda": ("amd64",),
    # arm64 only: built for the Kunpeng hosts of Atlas 800 servers (CANN's aarch64 toolkit).
    "llama-server-cann": ("arm64",),
})

# Upstream images (repository, no tag -> architectures) as their publishers say they publish
# them: linux/amd64 and linux/arm64 for both, at these tags. That is the publishers' claim, not
# checked here against the registries: vLLM published amd64 only for a long time (its issue
# #22206, August 2025, asks for an arm64 build; GH200 users built their own), while a manifest
# query of vllm/vllm-openai:v0.21.0 (2026, NVIDIA/Model-Optimizer#2042) found an index with
# linux/arm64; vllm-ascend
# images were once amd64 only too (vllm-ascend issue #2521). Both are kept here, so the pin
# follows the profile's nodes; a registry or mirror that holds one platform says so in
# operator config imageArchitectures, and the operator then refuses what cannot run.
UPSTREAM_IMAGE_ARCHITECTURES: Mapping[str, tuple[Architecture, ...]] = MappingProxyType({
    "vllm/vllm-openai": BOTH,
    "quay.io/ascend/vllm-ascend": BOTH,
})

ImageArchitectures = Mapping[str, tuple[Architecture, ...]]


def released_platforms(name: str) -> tuple[str, ...]:
    """The release's build platforms of our image `name` (`glm-operator`, `llama-server-cann`):
    `("linux/amd64", "linux/arm64")`, as docker buildx --platform spells them."""
    try:
        architectures = RELEASED_IMAGE_PLATFORMS[name]
    except KeyError:
        raise ValueError(f"{name!r} is not an image we release; known: "
                         f"{', '.join(sorted(RELEASED_IMAGE_PLATFORMS))}") from None
    return platforms(architectures)


def platforms(architectures: Iterable[str]) -> tuple[str, ...]:
    return tuple(f"linux/{arch}" for arch in architectures)


def image_repository(reference: str) -> str:
    """The reference without its tag or digest: `registry:5000/team/x:1.0@sha256:..` ->
    `registry:5000/team/x`. Docker Hub's implied names are spelt short (`docker.io/vllm/x`
    and `vllm/x` are one repository; so are `docker.io/library/x` and `x`)."""
    name = reference.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:  # a colon before the last slash is a registry's port
        name = name[:colon]
    for prefix in ("docker.io/", "index.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return name.removeprefix("library/")


def builtin_image_architectures(registry: str) -> dict[str, tuple[Architecture, ...]]:
    """Our released images under `registry`, and the upstream images: repository ->
    architectures."""
    registry = registry.rstrip("/")
    table = {image_repository(f"{registry}/{name}"): archs
             for name, archs in RELEASED_IMAGE_PLATFORMS.items()}
    table.update(UPSTREAM_IMAGE_ARCHITECTURES)
    return table


def image_architectures(reference: str, table: ImageArchitectures) -> tuple[str, ...] | None:
    """The architectures `reference` has builds for, or None when the table does not know
    the image (a user's own image: no constraint from it)."""
    return table.get(image_repository(reference))


@dataclass(frozen=True)
class ArchitectureFit:
    """The architectures a pod may run on, or why it has none."""

    architectures: tuple[str, ...]
    problem: str | None = None


def pod_architectures(node_architectures: Sequence[str], images: Sequence[str],
                      table: ImageArchitectures, *, nodes: str) -> ArchitectureFit:
    """The architectures of `nodes` (`the nodes of accelerator profile ascend-910b`) that
    every one of `images` has a build for, in the nodes' order. None left: the problem names
    the nodes' architectures, the first image that rules the rest out and its builds, and
    the fix."""
    left = tuple(node_architectures)
    for image in dict.fromkeys(images):  # each image once, in order
        builds = image_architectures(image, table)
        if builds is None:
            continue
        narrowed = tuple(arch for arch in left if arch in builds)
        if not narrowed:
            others = ("" if left == tuple(node_architectures) else
                      f" (and the pod's other images leave {_words(left)})")
            missing = " or ".join(left)
            return ArchitectureFit((), (
                f"{nodes} are {_words(node_architectures)}{others}, but image "
                f"{image} is built for {_words(builds)} only: build or mirror it for "
                f"{missing} and list it in operator config imageArchitectures "
                f"({image_repository(image)}: [{', '.join(left)}]), or choose another "
                "accelerator profile"))
        left = narrowed
    return ArchitectureFit(left)


def _words(architectures: Iterable[str]) -> str:
    return "/".join(architectures)


def check_architectures(values: object, *, where: str) -> tuple[Architecture, ...]:
    """A non-empty list of known architectures, each once; the error names `where`."""
    if isinstance(values, str) or not isinstance(values, list | tuple):
        raise ValueError(f"{where} must be a list of architectures ({', '.join(ARCHITECTURES)})"
                         f", not {values!r}")
    if not values:
        raise ValueError(f"{where} must name at least one architecture "
                         f"({', '.join(ARCHITECTURES)})")
    known: list[Architecture] = []
    for value in values:
        match = next((arch for arch in ARCHITECTURES if arch == value), None)
        if match is None:
            raise ValueError(f"{where}: {value!r} is not an architecture we know; use the "
                             f"kubernetes.io/arch values {', '.join(ARCHITECTURES)}")
        if match in known:
            raise ValueError(f"{where}: {value!r} is listed twice")
        known.append(match)
    return tuple(known)
