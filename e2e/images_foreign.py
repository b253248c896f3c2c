"""The images built for an architecture other than this machine's: linux/arm64 on amd64.

    python -m e2e.images build --arch arm64     # (make images-multiarch) both architectures
    python -m e2e.images build --arch arm64 --with-llama    # and the CPU llama.cpp image

What runs where:
- Emulation: the arm64 base's package scripts (mmdebstrap) and the Dockerfiles' RUN steps
  (apt-get, pip install) run arm64 code, through qemu-user-static's binfmt_misc handler.
  Debian's qemu-user-static ships the handler's definition (/usr/lib/binfmt.d/qemu-aarch64.conf,
  flags `F`: the interpreter is opened once, so it also serves inside a chroot); where no
  system service has registered it, `ensure_emulation` mounts binfmt_misc when a fresh machine
  has not (root, or `sudo -n`) and writes the definition to /proc/sys/fs/binfmt_misc/register.
  Checked by running the base's own `uname -m`.
- The glm-operator image: the same Dockerfile stage, with the aarch64 wheels of its
  dependencies (pip download --platform manylinux_*_aarch64, resolved here as for amd64).
- The endpoint picker: the toolchain's `epp_arm64`, cross-compiled by Go (GOARCH=arm64, CGO
  off): no emulated compiler.
- The llama.cpp CPU image (`build --arch arm64 --with-llama`, and `make release`): its
  Dockerfile's own `runtime` target, whose build stage runs on this machine's platform
  (BUILD_BASE, BUILDPLATFORM) with Debian's cross compiler and the target's libssl-dev from
  Debian's multiarch archive, so the compile is native speed (about 10 minutes of two cores
  cold); the sdist comes in the build context (INPUTS=inputs-context). The release
  workflow's buildx runs the same stages.

Each build is tagged `<the rendered reference>-<arch>` in the images' storage (the rendered
name itself stays this machine's build, which the podman pod tests run). `manifest_list`
joins the builds of one image into the multi-platform index the release pushes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from e2e import images, toolchain

# Debian architecture (= GOARCH for these two) -> the kernel's and qemu's name for it.
QEMU_NAMES = {"arm64": "aarch64", "amd64": "x86_64"}
# ELF e_machine of each architecture's binaries.
ELF_MACHINES = {"amd64": 62, "arm64": 183}
BINFMT = Path("/proc/sys/fs/binfmt_misc")
BINFMT_DEFINITIONS = Path("/usr/lib/binfmt.d")
# The CPU llama.cpp image's cross compile (`--with-llama`): 10 minutes here, more under load.
LLAMA_BUILD_TIMEOUT = 2 * 3600


class EmulationUnavailable(images.ImageBuildError):
    """No way to run the other architecture's code here; the message says what is missing."""


def emulation_problem(arch: str) -> str | None:
    """Why `arch` code cannot run here (None when it can, natively or emulated)."""
    if arch == images.native_arch():
        return None
    qemu = QEMU_NAMES.get(arch)
    if qemu is None:
        return f"no emulator is known for {arch} (known: {', '.join(QEMU_NAMES)})"
    handler = BINFMT / f"qemu-{qemu}"
    if handler.exists():
        return None if handler.read_text().startswith("enabled") else (
            f"the binfmt_misc handler {handler} is disabled: "
            f"`echo 1 > {handler}` (root) enables it")
    definition = BINFMT_DEFINITIONS / f"qemu-{qemu}.conf"
    if not definition.exists():
        return (f"qemu-user-static is not installed ({definition} is missing): run `make deps` "
                "(Debian packages qemu-user-static and arch-test)")
    return None


def mount_command() -> list[str]:
    """The command that mounts binfmt_misc, through `sudo -n` for a user other than root."""
    command = ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)]
    return command if os.geteuid() == 0 else ["sudo", "-n", *command]


def _mount_binfmt(arch: str) -> None:
    """Mount binfmt_misc where a fresh machine has not (nothing else in the suite needs it, so
    the build that needs it does it); raise EmulationUnavailable saying what to run."""
    if (BINFMT / "register").exists():
        return
    command = mount_command()
    images.log(f"binfmt_misc is not mounted: {' '.join(command)}")
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        failure = result.stderr.strip() if result.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = str(exc)
    if failure or not (BINFMT / "register").exists():
        raise EmulationUnavailable(
            f"binfmt_misc is not mounted at {BINFMT} and `{' '.join(command)}` failed "
            f"({failure or 'no register file after it'}): run `sudo mount -t binfmt_misc "
            f"binfmt_misc {BINFMT}` once, or build {arch} images on a {arch} machine")


def ensure_emulation(arch: str) -> None:
    """Register qemu's handler for `arch` from Debian's definition when no one has, mounting
    binfmt_misc first where it is not; raise EmulationUnavailable saying why when that cannot
    be done."""
    problem = emulation_problem(arch)
    if problem is not None:
        raise EmulationUnavailable(problem)
    qemu = QEMU_NAMES.get(arch)
    if arch == images.native_arch() or (BINFMT / f"qemu-{qemu}").exists():
        return
    _mount_binfmt(arch)
    lines = [line for line in (BINFMT_DEFINITIONS / f"qemu-{qemu}.conf").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    images.log(f"registering qemu-{qemu} with binfmt_misc (flags F)")
    try:
        (BINFMT / "register").write_text(lines[0] + "\n")
    except OSError as exc:
        raise EmulationUnavailable(
            f"cannot register qemu-{qemu} with {BINFMT / 'register'}: {exc} (it needs root "
            "and a writable binfmt_misc)") from exc


def foreign_spec(spec: images.ImageSpec, arch: str) -> images.ImageSpec:
    """`spec` built for `arch`: tagged `<reference>-<arch>`."""
    return replace(spec, arch=arch, reference=f"{spec.reference}-{arch}")


def _epp_context(work: Path, arch: str) -> Path:
    built = toolchain.ensure(f"epp_{arch}")
    context = work / f"epp-{arch}"
    (context / "prebuilt").mkdir(parents=True)
    shutil.copy2(images.epp_spec().dockerfile, context / "Dockerfile")
    shutil.copytree(images.epp_spec().dockerfile.parent / "patches", context / "patches")
    shutil.copy2(built / "epp", context / "prebuilt" / "epp")
    return context


def llama_cpu_spec(arch: str) -> images.ImageSpec:
    """The CPU llama.cpp image for `arch`, compiled by its Dockerfile's own `runtime` target: on
    this machine's platform with Debian's cross compiler (BUILD_BASE: this machine's base), from
    the sdist in the build context."""
    return replace(foreign_spec(images.llama_cpu_spec(), arch), target="runtime",
                   build_args=(("INPUTS", "inputs-context"),
                               ("BUILD_BASE", images.base_reference())))


def _sdist_downloads() -> Path:
    """The pinned llama-cpp-python sdist, downloaded here once: downloads/sdist/*.tar.gz."""
    version = toolchain.versions()["llama_cpp_python"]
    folder = toolchain.cache_root() / f"llamacpp-sdist-{version}"
    if (folder / toolchain.COMPLETE_MARKER).exists():
        return folder / "downloads"
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    images.store_free_run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                           "--no-binary", ":all:", "--dest", str(staging / "downloads" / "sdist"),
                           f"llama-cpp-python=={version}"], "pip download (llama-cpp-python sdist)")
    (staging / toolchain.COMPLETE_MARKER).write_text(f"{version}\n")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder / "downloads"


def _llama_context(work: Path, arch: str) -> Path:
    context = work / f"llamacpp-{arch}"
    shutil.copytree(_sdist_downloads(), context / "downloads")
    shutil.copy2(images.llama_cpu_spec().dockerfile, context / "Dockerfile")
    return context


def check_runs(store: images.Store, base: str, arch: str) -> None:
    """The base's own binaries run here (emulated): else every RUN step would fail obscurely."""
    result = store.run(store.podman("run", "--rm", "--network", "none", "--arch", arch, base,
                                    "uname", "-m"), f"podman run ({arch} base)", check=False)
    if result.returncode != 0 or result.stdout.strip() != QEMU_NAMES[arch]:
        raise EmulationUnavailable(
            f"the {arch} base does not run here (uname -m said {result.stdout.strip()!r}, "
            f"exit {result.returncode}): {result.stderr[-500:]}")


def build_foreign(arch: str, llama: bool = False) -> list[images.Built]:
    """The base, the picker and glm-operator for `arch`, each only when its inputs changed;
    with `llama`, the CPU llama.cpp image too (cross compiled: about 10 minutes of two cores
    cold)."""
    ensure_emulation(arch)
    store = images.Store.default()
    store.prepare()
    with store.locked(), tempfile.TemporaryDirectory(prefix=f"glm-images-{arch}-") as tmp:
        work = Path(tmp)
        base = images.ensure_base(store, arch)
        check_runs(store, base.reference, arch)
        base_id = store.image_id(base.reference)
        built = [base]
        epp = foreign_spec(images.epp_spec(), arch)
        context = _epp_context(work, arch)
        inputs = epp.inputs_hash(base_id, images.context_files(context))
        built.append(images.reuse(store, epp, inputs)
                     or images.build_image(store, epp, context, base.reference, inputs))
        python = foreign_spec(images.python_spec(), arch)
        inputs = python.inputs_hash(base_id, images.python_inputs())
        built.append(images.reuse(store, python, inputs)
                     or images.build_image(store, python, images.python_context(work, arch),
                                           base.reference, inputs))
        if llama:
            spec = llama_cpu_spec(arch)
            context = _llama_context(work, arch)
            inputs = _llama_inputs(store, spec, base_id, context)
            built.append(images.reuse(store, spec, inputs)
                         or images.build_image(store, spec, context, base.reference, inputs,
                                               timeout=LLAMA_BUILD_TIMEOUT))
        return built


def _llama_inputs(store: images.Store, spec: images.ImageSpec, base_id: str,
                  context: Path) -> str:
    """The target's base, the building machine's (BUILD_BASE), the Dockerfile and the sdist."""
    native_id = store.image_id(images.ensure_base(store).reference)
    return spec.inputs_hash(f"{base_id} {native_id}", images.context_files(context))


def image_arch(store: images.Store, reference: str) -> str:
    return store.run(store.podman("image", "inspect", "--format", "{{.Architecture}}",
                                  reference), "image inspect").stdout.strip()


def manifest_list(store: images.Store, name: str, references: list[str]) -> None:
    """A local manifest list `name` holding each of `references` (one per architecture),
    replacing one of that name; `podman manifest push --all` pushes it as an OCI index."""
    store.run(store.podman("manifest", "rm", name), "podman manifest rm", check=False)
    store.run(store.podman("manifest", "create", name), "podman manifest create")
    for reference in references:
        store.run(store.podman("manifest", "add", name, f"containers-storage:{reference}"),
                  f"podman manifest add {reference}")


def elf_machine(path: Path) -> int:
    """e_machine of an ELF file (ELF_MACHINES)."""
    header = path.read_bytes()[:20]
    if header[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    return int.from_bytes(header[18:20], "little")


def binary_machine(store: images.Store, image: str, path: str) -> int:
    """The ELF machine of `path` in `image`, read from the image's mounted file system (no
    code of the image runs)."""
    mounted = store.run(store.podman("image", "mount", image), "podman image mount")
    try:
        root = Path(mounted.stdout.strip())
        target = root / path.lstrip("/")
        while target.is_symlink():  # an absolute link points inside the image
            link = Path(target.readlink())
            target = root / str(link).lstrip("/") if link.is_absolute() else \
                target.parent / link
        return elf_machine(target)
    finally:
        store.run(store.podman("image", "unmount", image), "podman image unmount",
                  check=False)
