"""The CPU llama.cpp image for linux/arm64, cross compiled here by its own Dockerfile, run
emulated (qemu-user-static) on this amd64 machine.

e2e/images_foreign.py builds runtime-images/llamacpp/Dockerfile.cpu's `runtime` target for
linux/arm64: the compile on this machine's platform with Debian's aarch64 cross compiler, the
runtime stages on the arm64 base. What a Graviton, Kunpeng or Ampere node would run:

- the image is linux/arm64 and both binaries are AArch64 ELF files;
- every library `ldd` lists is in the image, OpenSSL among them (the cross build found the
  target's libssl, as the native build finds this machine's);
- llama-server loads a model and answers a completion, its CPU backend built with the ARM
  features (`NEON = 1` in system_info), as uid 65532 on a read-only root.

The image is the one `make release` pushes (cached by its inputs; a cold build cross compiles
llama.cpp, about 10 minutes of two cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import images, images_foreign
from e2e.llama_http import complete, wait_healthy
from e2e.models import write_tiny_llama
from e2e.ports import free_port
from e2e.test_images import require_image_tools

pytestmark = [pytest.mark.timeout(images_foreign.LLAMA_BUILD_TIMEOUT + 600)]

ARCH = "arm64"
AARCH64 = images_foreign.ELF_MACHINES[ARCH]


@pytest.fixture(scope="module")
def arm64_llama() -> images.Built:
    require_image_tools("arm64 llama.cpp image test")
    try:
        images_foreign.ensure_emulation(ARCH)
    except images_foreign.EmulationUnavailable as exc:
        pytest.fail(f"arm64 code cannot run here: {exc}")
    (built,) = [b for b in images_foreign.build_foreign(ARCH, llama=True)
                if b.name == "llamacpp-cpu"]
    return built


def podman(*args: str, timeout: float = 300, check: bool = True) -> tuple[int, str, str]:
    store = images.Store.default()
    result = store.run(store.podman(*args), "podman", timeout=timeout, check=check)
    return result.returncode, result.stdout, result.stderr


def test_the_image_and_its_binaries_are_arm64(arm64_llama: images.Built) -> None:
    store = images.Store.default()
    assert images_foreign.image_arch(store, arm64_llama.reference) == ARCH
    for binary in ("/usr/local/bin/llama-server", "/usr/local/bin/ggml-rpc-server"):
        machine = images_foreign.binary_machine(store, arm64_llama.reference, binary)
        assert machine == AARCH64, binary
    # The control: the same check on this machine's base (its build stage's) says x86-64.
    assert images_foreign.binary_machine(store, images.base_reference(), "/usr/bin/bash") == \
        images_foreign.ELF_MACHINES[images.native_arch()]


def test_every_library_it_links_is_in_the_image(arm64_llama: images.Built) -> None:
    code, out, err = podman("run", "--rm", "--network", "none", "--arch", ARCH,
                            "--entrypoint", "ldd", arm64_llama.reference,
                            "/usr/local/bin/llama-server")
    assert code == 0, out + err
    assert "not found" not in out, out
    assert "/lib/aarch64-linux-gnu/libssl.so.3" in out, out
    assert "libgomp.so.1 => /lib/aarch64-linux-gnu/libgomp.so.1" in out, out


def test_serves_a_completion_emulated(arm64_llama: images.Built, tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny-llama.gguf")
    model.chmod(0o644)
    tmp_path.chmod(0o755)
    port = free_port()
    name = f"llama-arm64-{port}"
    podman("run", "--detach", "--name", name, "--arch", ARCH, "--network", "host",
           "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
           "--volume", f"{tmp_path}:/models:ro", arm64_llama.reference,
           "--host", "127.0.0.1", "--port", str(port), "-m", "/models/tiny-llama.gguf",
           "-c", "256", "-t", "1", "-lv", "4")
    try:
        status = wait_healthy(port, 240)  # emulated: several times slower to start
        _, out, err = podman("logs", name, check=False)
        log = out + err
        assert status == 200, f"llama-server never served /health:\n{log[-4000:]}"
        answer = complete(port, "Hello", 4, timeout=120)
        assert answer["tokens_predicted"] == 4, answer
        assert "NEON = 1" in log, log[-4000:]
        _, user, _ = podman("inspect", "--format", "{{.Config.User}}", arm64_llama.reference)
        assert user.strip() == "65532:65532"
    finally:
        podman("rm", "--force", "--time", "5", name, check=False)
