"""The CUDA llama.cpp image: a toolkit from pinned PyPI wheels, the catalog's architectures, and a
final stage that carries only the binaries and three CUDA libraries.

e2e/test_cuda_image.py builds it (its test build) and runs it without a GPU.
"""

from __future__ import annotations

import re
from pathlib import Path

from dockerfile_rules import cmake_configure_flags, parse
from glm_operator.planning.accelerators import builtin_profiles

from e2e import images_cuda

ROOT = Path(__file__).resolve().parents[2]
LLAMACPP = ROOT / "runtime-images" / "llamacpp"
DOCKERFILE = LLAMACPP / "Dockerfile.cuda"
WHEELS = LLAMACPP / "cuda-wheels.txt"
# CUDA 13, the first release whose nvcc is on PyPI, compiles for sm_75 and newer only.
CUDA_13_OLDEST_SM = 75
RUNTIME_LIBRARIES = {"libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"}


def _requirements() -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, sha256 hashes) of cuda-wheels.txt."""
    text = re.sub(r"\\\n", " ", WHEELS.read_text())
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        name, _, version = requirement.partition("==")
        found[name] = (version, [o.removeprefix("--hash=sha256:") for o in options])
    return found


def test_every_wheel_is_pinned_by_version_and_hash() -> None:
    requirements = _requirements()
    assert set(requirements) == {"nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm",
                                 "nvidia-cuda-cccl", "nvidia-cuda-runtime", "nvidia-cublas"}
    for name, (version, hashes) in requirements.items():
        assert re.fullmatch(r"13(\.\d+)+", version), f"{name}: {version!r} is not a CUDA 13 pin"
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name


def test_the_toolkit_release_is_the_one_the_image_says() -> None:
    nvcc = _requirements()["nvidia-cuda-nvcc"][0]
    text = DOCKERFILE.read_text()
    major_minor = ".".join(nvcc.split(".")[:2])
    assert f'dev.glm-operator.cuda.version="{major_minor}"' in text
    assert f'NVIDIA_REQUIRE_CUDA="cuda>={major_minor}"' in text


def test_the_pypi_download_checks_the_hashes() -> None:
    text = DOCKERFILE.read_text()
    assert "--require-hashes" in text and "-r /tmp/cuda-wheels.txt" in text


def test_release_architectures_are_the_catalogs_nvidia_profiles() -> None:
    """Every NVIDIA profile of the catalog that CUDA 13 can target; the others are named in the
    Dockerfile as not built, so a user reads why their GPU has no kernels."""
    catalog = {}
    for profile in builtin_profiles().values():
        if profile.vendor != "nvidia":
            continue
        match = re.search(r"sm_(\d+)", profile.description)
        assert match, f"{profile.name}: no sm_NN in its description"
        catalog[profile.name] = int(match.group(1))
    built = [int(a) for a in parse(DOCKERFILE.read_text()).args()["CUDA_ARCHITECTURES"]
             .split(";")]
    assert built == sorted({sm for sm in catalog.values() if sm >= CUDA_13_OLDEST_SM})
    text = DOCKERFILE.read_text()
    for name, sm in catalog.items():
        if sm < CUDA_13_OLDEST_SM:
            assert f"sm_{sm}" in text, f"{name} (sm_{sm}) is not built and not said so"
            # ... and the built-in profile does not render the image that has no kernels for it
            assert "llamacpp" not in builtin_profiles()[name].engines, name


def test_the_test_build_sets_only_arguments_the_dockerfile_declares() -> None:
    dockerfile = parse(DOCKERFILE.read_text())
    declared = set(dockerfile.args()) | {
        i.value.split("=")[0] for s in dockerfile.stages for i in s.instructions
        if i.keyword == "ARG"}
    test_args = dict(images_cuda.CUDA_TEST_BUILD_ARGS)
    assert set(test_args) <= declared
    stage_names = {s.name for s in dockerfile.stages}
    assert dockerfile.global_args["INPUTS"] in stage_names
    assert test_args["INPUTS"] in stage_names
    assert len(test_args["CUDA_ARCHITECTURES"].split(";")) == 1, "the test build: one SM"
    assert int(test_args["BUILD_JOBS"]) <= 2


def test_the_two_inputs_stages_end_in_the_same_layout() -> None:
    stages = {s.name: s for s in parse(DOCKERFILE.read_text()).stages}
    pypi = " ".join(i.value for i in stages["inputs-pypi"].instructions)
    assert "--dest /inputs/sdist" in pypi and "--dest /inputs/wheels" in pypi
    (copy,) = [i.value for i in stages["inputs-context"].instructions]
    assert copy == "downloads/ /inputs/"
    # The parser resolves ${INPUTS} to its default.
    assert stages["inputs"].image == "inputs-pypi" and not stages["inputs"].instructions


def test_the_cmake_flags_name_the_wheel_toolkit() -> None:
    (flags,) = cmake_configure_flags(DOCKERFILE.read_text())
    assert "-DCUDAToolkit_ROOT=/usr/local/cuda" in flags
    assert "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc" in flags
    # No libcuda.so.1 at link or load time: the binary starts where no driver is mounted.
    assert "-DGGML_CUDA_NO_VMM=ON" in flags
    assert "-DGGML_CUDA_FA=${GGML_CUDA_FA}" in flags
    assert parse(DOCKERFILE.read_text()).args()["GGML_CUDA_FA"] == "ON"


def test_only_the_final_stage_carries_the_runtime_libraries() -> None:
    dockerfile = parse(DOCKERFILE.read_text())
    final = dockerfile.stages[-1]
    assert final.name == "runtime" and final.image == dockerfile.global_args["BASE"]
    copied = set()
    for instruction in final.instructions:
        if instruction.keyword == "COPY":
            words = instruction.value.split()
            assert words[0] == "--from=build", instruction.value
            copied |= {Path(w).name for w in words[1:-1]}
    assert copied == RUNTIME_LIBRARIES | {"llama-server", "ggml-rpc-server"}
