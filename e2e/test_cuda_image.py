"""The CUDA llama.cpp image, built here from Debian and NVIDIA's PyPI wheels, run without a GPU.

e2e/images_cuda.py builds runtime-images/llamacpp/Dockerfile.cuda with buildah (its test build: one
SM version, no flash-attention kernels; cached by its inputs), and podman runs it on this
machine, which has no NVIDIA device and no driver. What a node without a working GPU sees:

- the binary loads: every library `ldd` lists is in the image (libcudart, libcublas and
  libcublasLt from the wheels), and none is the driver's libcuda.so.1;
- `llama-server --list-devices` exits 0 after the CUDA backend says it found no device
  (`ggml_cuda_init: failed to initialize CUDA: ...`) and lists no accelerator;
- `llama-server` with a model still starts on the CPU, reports the CUDA backend compiled in
  for the SM version built (`system_info: ... | CUDA : ARCHS = 900 | ...`), says again that it
  found no device, and answers a completion.

The CPU llama-server also lists `(none)` for --list-devices: what proves the CUDA backend is
there is its own `ggml_cuda_init` message and its line in system_info.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e import images, images_cuda
from e2e.llama_http import complete, wait_healthy
from e2e.models import write_tiny_llama
from e2e.ports import free_port
from e2e.test_images import require_image_tools

# A cold run compiles llama.cpp with nvcc inside the build (docs/images.md: build times).
pytestmark = [pytest.mark.timeout(images_cuda.CUDA_BUILD_TIMEOUT + 600)]

BUILD_SWITCH = "GLM_E2E_BUILD_CUDA_IMAGE"
# What the CUDA runtime answers when no driver is present (cudaErrorInsufficientDriver: no
# libcuda.so.1) or the driver sees no device (cudaErrorNoDevice).
NO_DEVICE = ("failed to initialize CUDA: CUDA driver version is insufficient",
             "failed to initialize CUDA: no CUDA-capable device is detected")


@pytest.fixture(scope="module")
def cuda_image() -> images.Built:
    require_image_tools("CUDA image test")
    cached = images_cuda.cached_cuda()
    if cached is not None:
        return cached
    # A cold build is over half an hour of two cores (docs/images.md): more than a CI run can
    # take beside the toolchain, so it is built only when asked for.
    if os.environ.get(BUILD_SWITCH) != "1":
        pytest.skip(f"the CUDA image's test build is not cached: `python -m e2e.images "
                    f"build-cuda` (about 35 minutes cold on two cores) or {BUILD_SWITCH}=1 "
                    "builds it")
    return images_cuda.build_cuda()


def podman_run(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    store = images.Store.default()
    result = store.run(store.podman("run", "--rm", *args), "podman run", timeout=timeout,
                       check=False)
    return result.returncode, result.stdout, result.stderr


def test_the_binary_loads_without_the_driver(cuda_image: images.Built) -> None:
    code, out, err = podman_run("--entrypoint", "ldd", cuda_image.reference,
                                "/usr/local/bin/llama-server")
    assert code == 0, out + err
    assert "not found" not in out, out
    for library in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"):
        assert f"{library} => /usr/local/cuda/lib64/{library}" in out, out
    assert "libcuda.so" not in out, f"linked against the driver library:\n{out}"


def test_list_devices_says_no_cuda_device(cuda_image: images.Built) -> None:
    code, out, err = podman_run(cuda_image.reference, "--list-devices")
    assert code == 0, out + err
    # ggml logs to stderr before llama's logger is set up; the list is printf'd to stdout.
    assert any(f"ggml_cuda_init: {message}" in out + err for message in NO_DEVICE), out + err
    assert out.splitlines()[-2:] == ["Available devices:", "  (none)"], out


def test_serves_on_the_cpu_with_the_cuda_backend_compiled_in(
    cuda_image: images.Built, tmp_path: Path
) -> None:
    model = write_tiny_llama(tmp_path / "tiny-llama.gguf")
    model.chmod(0o644)
    tmp_path.chmod(0o755)
    port = free_port()
    name = f"llama-cuda-{port}"
    store = images.Store.default()
    store.run(store.podman(
        "run", "--detach", "--name", name, "--network", "host", "--read-only",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--volume", f"{tmp_path}:/models:ro", cuda_image.reference,
        "--host", "127.0.0.1", "--port", str(port), "-m", "/models/tiny-llama.gguf",
        # -lv 4: the start-up trace, whose system_info line lists each backend compiled in.
        "-c", "256", "-t", "1", "-lv", "4"), "podman run")
    try:
        status = wait_healthy(port, 120)
        logs = store.run(store.podman("logs", name), "podman logs", check=False)
        log = logs.stdout + logs.stderr
        assert status == 200, f"llama-server never served /health:\n{log[-4000:]}"
        answer = complete(port, "Hello", 4, timeout=60)
        assert answer["tokens_predicted"] == 4, answer
        assert any(message in log for message in NO_DEVICE), log[-4000:]
        assert "CUDA : ARCHS = 900" in log, log[-4000:]
        user = store.run(store.podman("inspect", "--format", "{{.Config.User}}",
                                      cuda_image.reference), "podman inspect").stdout.strip()
        assert user == "65532:65532"
    finally:
        store.run(store.podman("rm", "--force", "--time", "5", name), "podman rm", check=False)
