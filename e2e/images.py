"""Build the runtime images locally, from Debian's packages, with no registry and no Docker.

    python -m e2e.images build      # (make images) base, llama.cpp CPU, EPP, glm-operator images
    python -m e2e.images build-cuda # the CUDA llama.cpp image's test build (see below)
    python -m e2e.images podman -- images    # podman on the same private storage

- The base: `mmdebstrap` writes a minimal Debian rootfs (the release in DEBIAN_SUITE, from
  deb.debian.org), `podman import` turns it into `localhost/glm-operator-base:<suite>-<hash>`.
  Every Dockerfile takes it as `--build-arg BASE=...`; their default is the upstream
  `debian:12.11-slim`, so users' builds are unchanged.
- The images: `buildah bud --pull=never --isolation chroot`, target `runtime-prebuilt`: the
  llama.cpp image copies the llama-server the toolchain compiled (e2e/llama_build.py, the same
  sdist and flags as the image's own `build` stage), the endpoint picker's the toolchain's
  `epp` (e2e/epp_build.py, likewise), the glm-operator image installs wheels
  `pip wheel` made here (the build containers cannot verify PyPI's certificate; this host can).
  They are tagged exactly as the operator renders them by default
  (`ghcr.io/glm-operator/llama-server-cpu:<version>`, `.../endpoint-picker:<version>`,
  `.../glm-operator:<version>`), so a rendered pod spec runs as it is.
- Storage: a podman/buildah storage of its own under
  ~/.cache/glm-operator/images-<hash>/ (the hash of the base's inputs), never the machine's.
  Each image is also tagged `inputs-<hash>`, the hash of its Dockerfile, its context files and
  the base's image ID: an image whose inputs did not change is not rebuilt.
- The CUDA llama.cpp image (`build-cuda`): its test build from source, e2e/images_cuda.py.
- Another architecture (`build --arch arm64`): e2e/images_foreign.py.
- Runtime: `runc` (Debian's `crun` refuses hybrid cgroup hierarchies) through a
  containers.conf written into the storage folder and named by CONTAINERS_CONF; the machine's
  own configuration is not touched.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from glm_operator.config import OperatorConfig
from glm_operator.planning.accelerators import runtime_images

from e2e import toolchain
from e2e.llama_build import BUILD_TARGETS

REPO = Path(__file__).resolve().parent.parent
IMAGES_DIR = REPO / "runtime-images"
SYSTEM_TOOLS = ("mmdebstrap", "buildah", "podman", "runc")

# The base: Debian's release of this machine (bookworm), the packages apt's minbase variant
# installs, and dpkg excludes in the spirit of the debian:*-slim images (kept in the rootfs, so
# they also apply to what the Dockerfiles install).
DEBIAN_SUITE = "bookworm"
DEBIAN_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
MMDEBSTRAP_OPTIONS = (
    "--variant=minbase",
    # Merged /usr set up by symlinks, with usr-is-merged: otherwise bookworm's
    # init-system-helpers pulls in usrmerge, and usrmerge perl (40 MB).
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-include=/usr/share/locale/locale.alias",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    # The debian:* images' /etc/apt/apt.conf.d/docker-clean, which the Dockerfiles expect of
    # their base: no package caches left in the layers (80 MB after one `apt-get update`).
    # Written into the rootfs only (an --aptopt would also apply to mmdebstrap's own apt).
    "--customize-hook=printf '%s\\n' "
    "'DPkg::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb "
    "/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\"; };' "
    "'APT::Update::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb "
    "/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\"; };' "
    "'Dir::Cache::pkgcache \"\"; Dir::Cache::srcpkgcache \"\";' "
    "> \"$1/etc/apt/apt.conf.d/docker-clean\"",
    # The merged-usr hook's own apt run left its caches before the file above existed.
    '--customize-hook=rm -f "$1"/var/cache/apt/*.bin',
)
# An imported rootfs has no image config: give it the PATH a Debian image has.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONTAINERS_CONF = """\
# Written by e2e/images.py for its own podman storage; the machine's config is untouched.
[containers]
# The default ulimits ask for more open files than this machine allows a container.
default_ulimits = []
# `podman logs` without journald.
log_driver = "k8s-file"

[engine]
# crun refuses this kernel's hybrid cgroup v1/v2 hierarchy; runc with cgroupfs works.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
# The Python the glm-operator image runs: Debian bookworm's python3 (3.11.2-6+deb12uN), and
# its C library (glibc 2.36). The wheels are resolved by an interpreter of exactly this version
# (this Debian's own /usr/bin/python3, with python3-pip): pip evaluates environment markers
# against the interpreter it runs on, and they differ even between micro versions (redis needs
# async-timeout below 3.11.3). e2e/test_images.py checks the image's version against this.
IMAGE_PYTHON = "3.11.2"
IMAGE_GLIBC = (2, 36)


class ImageBuildError(RuntimeError):
    """An image step failed; the message names the step and shows the log tail."""


def log(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def _digest(*parts: bytes | str) -> str:
    sha = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        sha.update(len(data).to_bytes(8, "big"))
        sha.update(data)
    return sha.hexdigest()[:16]


def base_inputs_hash() -> str:
    return _digest(DEBIAN_SUITE, *DEBIAN_SOURCES, *MMDEBSTRAP_OPTIONS, BASE_PATH)


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def missing_tools() -> list[str]:
    return [tool for tool in SYSTEM_TOOLS if shutil.which(tool) is None]


@dataclass(frozen=True)
class Store:
    """A podman/buildah storage of the tests' own, and the flags that select it."""

    root: Path

    @classmethod
    def default(cls) -> Store:
        return cls(toolchain.cache_root() / f"images-{base_inputs_hash()}")

    @property
    def run_dir(self) -> Path:
        # Lock files and runtime state: on /tmp, so a reboot cannot leave stale ones behind.
        return Path(tempfile.gettempdir()) / f"glm-operator-{self.root.name}"

    @property
    def containers_conf(self) -> Path:
        return self.root / "containers.conf"

    def prepare(self) -> None:
        if os.geteuid() != 0:
            raise ImageBuildError(
                "the image builds and pods run rootful podman/buildah: run them as root")
        missing = missing_tools()
        if missing:
            raise ImageBuildError(
                f"missing {', '.join(missing)}: run `make deps` (Debian packages "
                f"{' '.join(SYSTEM_TOOLS)})")
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self.containers_conf.exists() or \
                self.containers_conf.read_text() != CONTAINERS_CONF:
            self.containers_conf.write_text(CONTAINERS_CONF)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CONTAINERS_CONF"] = str(self.containers_conf)
        env.pop("CONTAINERS_STORAGE_CONF", None)
        return env

    def storage_flags(self) -> list[str]:
        return ["--root", str(self.root / "storage"), "--runroot", str(self.run_dir / "run"),
                "--storage-driver", "overlay"]

    def podman(self, *args: str) -> list[str]:
        return ["podman", *self.storage_flags(), "--tmpdir", str(self.run_dir / "libpod"),
                "--network-config-dir", str(self.root / "networks"), *args]

    def buildah(self, *args: str) -> list[str]:
        return ["buildah", *self.storage_flags(), *args]

    def run(self, cmd: Sequence[str], step: str, timeout: float = 3600,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(list(cmd), env=self.env(), capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            tail = (result.stdout + result.stderr)[-4000:]
            raise ImageBuildError(f"{step}: `{' '.join(cmd)}` failed "
                                  f"(exit {result.returncode}):\n{tail}")
        return result

    def image_exists(self, reference: str) -> bool:
        return self.run(self.podman("image", "exists", reference), "image exists",
                        check=False).returncode == 0

    def image_id(self, reference: str) -> str:
        return self.run(self.podman("image", "inspect", "--format", "{{.Id}}", reference),
                        "image inspect").stdout.strip()

    def image_size(self, reference: str) -> int:
        return int(self.run(self.podman("image", "inspect", "--format", "{{.Size}}", reference),
                            "image inspect").stdout.strip())

    @contextlib.contextmanager
    def locked(self, name: str = "build.lock") -> Iterator[None]:
        """One builder at a time per storage and lock name (parallel test sessions share the
        cache)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / name).open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Built:
    name: str
    reference: str
    size_bytes: int
    seconds: float  # 0 when it came from the cache
    cached: bool


def native_arch() -> str:
    """This machine's architecture as images name it (GOARCH: amd64, arm64)."""
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def arch_suffix(arch: str | None) -> str:
    """What tells another architecture's build apart in the storage: nothing for this
    machine's (the names and caches of the single-architecture builds stay as they were)."""
    return "" if arch in (None, native_arch()) else f"-{arch}"


def base_reference(arch: str | None = None) -> str:
    return f"localhost/glm-operator-base:{DEBIAN_SUITE}-{base_inputs_hash()}{arch_suffix(arch)}"


def ensure_base(store: Store, arch: str | None = None) -> Built:
    """The Debian base for `arch` (default this machine's). Another architecture's runs its
    packages' maintainer scripts under emulation (e2e/images_foreign.py checks for it)."""
    reference = base_reference(arch)
    if store.image_exists(reference):
        return Built("base", reference, store.image_size(reference), 0.0, True)
    started = time.monotonic()
    log(f"mmdebstrap {DEBIAN_SUITE} -> {reference}")
    arch_flags = ["--arch", arch] if arch_suffix(arch) else []
    with tempfile.TemporaryDirectory(prefix="glm-base-", dir=store.root) as work:
        rootfs = Path(work) / "rootfs.tar"
        store.run(["mmdebstrap", "--mode=root", "--format=tar", *arch_flags,
                   *MMDEBSTRAP_OPTIONS, DEBIAN_SUITE, str(rootfs), *DEBIAN_SOURCES],
                  "mmdebstrap", timeout=2400)
        store.run(store.podman("import", *arch_flags, "--change", f"ENV=PATH={BASE_PATH}",
                               "--change", 'CMD=["bash"]', str(rootfs), reference),
                  "podman import")
    return Built("base", reference, store.image_size(reference),
                 time.monotonic() - started, False)


@dataclass(frozen=True)
class ImageSpec:
    """One image: its Dockerfile, the files of its build context, the name it gets."""

    name: str
    dockerfile: Path
    reference: str
    target: str = "runtime-prebuilt"
    build_args: tuple[tuple[str, str], ...] = ()
    arch: str | None = None  # None: this machine's (e2e/images_foreign.py builds others)

    @property
    def platform(self) -> str:
        return f"linux/{self.arch or native_arch()}"

    def inputs_hash(self, base_id: str, files: Sequence[tuple[str, bytes]]) -> str:
        """The Dockerfile, the target, the base's image ID, the build arguments (when there are
        any) and (name, content) of the inputs."""
        parts: list[bytes | str] = [self.dockerfile.read_bytes(), self.target, base_id]
        for name, value in self.build_args:
            parts += [f"--build-arg={name}", value]
        for name, content in sorted(files):
            parts += [name, content]
        return _digest(*parts)

    def cache_tag(self, inputs: str) -> str:
        return f"{self.reference.rsplit(':', 1)[0]}:inputs-{inputs}{arch_suffix(self.arch)}"


def context_files(context: Path) -> list[tuple[str, bytes]]:
    return [(str(p.relative_to(context)), p.read_bytes())
            for p in sorted(context.rglob("*")) if p.is_file()]


def reuse(store: Store, spec: ImageSpec, inputs: str) -> Built | None:
    """The stored image built from the same inputs, tagged as `spec` names it; or None."""
    cache_tag = spec.cache_tag(inputs)
    if not store.image_exists(cache_tag):
        return None
    store.run(store.podman("tag", cache_tag, spec.reference), "podman tag")
    return Built(spec.name, spec.reference, store.image_size(spec.reference), 0.0, True)


def build_image(store: Store, spec: ImageSpec, context: Path, base: str, inputs: str,
                timeout: float = 3600) -> Built:
    """Build `spec` from `context` (its Dockerfile at context/Dockerfile), tagged twice. At the
    lowest CPU priority: the machine is shared, and the compiles inside take every core."""
    cache_tag = spec.cache_tag(inputs)
    log(f"building {spec.reference} ({spec.dockerfile.relative_to(REPO)}, "
        f"target {spec.target})")
    started = time.monotonic()
    # What buildx sets by itself and buildah 1.28 (Debian bookworm's) does not: the
    # Dockerfiles' cross-compiling stages run on BUILDPLATFORM for TARGETARCH.
    native, target = native_arch(), spec.arch or native_arch()
    platform_args = (("BUILDPLATFORM", f"linux/{native}"), ("BUILDARCH", native),
                     ("TARGETPLATFORM", f"linux/{target}"), ("TARGETARCH", target))
    build_args = [arg for name, value in (*platform_args, *spec.build_args)
                  for arg in ("--build-arg", f"{name}={value}")]
    store.run(["nice", "-n", "19", *store.buildah(
        "bud", "--pull=never", "--isolation", "chroot", "--layers=false",
        "--platform", spec.platform,
        "--build-arg", f"BASE={base}", *build_args, "--target", spec.target,
        "-f", str(context / "Dockerfile"), "-t", cache_tag, "-t", spec.reference,
        str(context))], f"buildah bud {spec.name}", timeout=timeout)
    seconds = time.monotonic() - started
    log(f"{spec.reference} built in {seconds:.0f}s")
    forget_older_builds(store, spec, cache_tag)
    return Built(spec.name, spec.reference, store.image_size(spec.reference), seconds, False)


def forget_older_builds(store: Store, spec: ImageSpec, keep: str) -> None:
    """Drop the image's builds from other inputs: the cache keeps one build per image, not one
    per change of the sources."""
    repository = spec.reference.rsplit(":", 1)[0]
    listed = store.run(store.podman("images", "--format", "{{.Repository}}:{{.Tag}}",
                                    repository), "podman images").stdout.split()
    # Only this architecture's: another's build of the same image is not an older one.
    suffix = arch_suffix(spec.arch)
    stale = [tag for tag in listed if ":inputs-" in tag and tag != keep
             and arch_suffix(_tag_arch(tag)) == suffix]
    if stale:  # removes the tag only where another tag still holds the image
        store.run(store.podman("rmi", *stale), "podman rmi", check=False)


def _tag_arch(tag: str) -> str | None:
    """The architecture a cache tag (`...:inputs-<hash>[-<arch>]`) was built for."""
    rest = tag.rsplit(":inputs-", 1)[1]
    return rest.split("-", 1)[1] if "-" in rest else None


def llama_cpu_spec() -> ImageSpec:
    return ImageSpec("llamacpp-cpu", IMAGES_DIR / "llamacpp" / "Dockerfile.cpu",
                     runtime_images()["llamacpp-cpu"])


def python_spec() -> ImageSpec:
    return ImageSpec("glm-operator", IMAGES_DIR / "python" / "Dockerfile",
                     OperatorConfig().operator_image)


def epp_spec() -> ImageSpec:
    """Tagged as the operator renders it by default (config eppImage)."""
    return ImageSpec("epp", IMAGES_DIR / "epp" / "Dockerfile", OperatorConfig().epp_image)


def _epp_context(work: Path) -> Path:
    """The Dockerfile and the picker the toolchain built (prebuilt/epp)."""
    built = toolchain.ensure("epp")
    context = work / "epp"
    (context / "prebuilt").mkdir(parents=True)
    shutil.copy2(epp_spec().dockerfile, context / "Dockerfile")
    shutil.copytree(epp_spec().dockerfile.parent / "patches", context / "patches")
    shutil.copy2(built / "epp", context / "prebuilt" / "epp")
    return context


def _llama_context(work: Path) -> Path:
    """The Dockerfile and the binaries the toolchain built (prebuilt/llama-server,
    prebuilt/ggml-rpc-server)."""
    built = toolchain.ensure("llama_cpp_python")
    context = work / "llamacpp"
    (context / "prebuilt").mkdir(parents=True)
    shutil.copy2(llama_cpu_spec().dockerfile, context / "Dockerfile")
    for binary in BUILD_TARGETS:
        shutil.copy2(built / binary, context / "prebuilt" / binary)
    return context


def _project_sources() -> list[Path]:
    files = [REPO / "pyproject.toml", REPO / "README.md"]
    files += sorted(p for p in (REPO / "operator").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts
                    and ".egg-info" not in str(p))
    return files


def python_inputs() -> list[tuple[str, bytes]]:
    """The image's inputs besides the Dockerfile: the project's sources. The wheels follow from
    them (dependency versions float within pyproject's ranges until the sources change)."""
    return [(str(path.relative_to(REPO)), path.read_bytes()) for path in _project_sources()]


def _wheel_platforms(arch: str | None = None) -> list[str]:
    """Every manylinux tag a wheel may carry to run on the image's glibc and architecture."""
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch or native_arch(), arch)
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(IMAGE_GLIBC[1], 4, -1)]
    return [*tags, f"manylinux2014_{machine}", f"manylinux2010_{machine}",
            f"manylinux1_{machine}", f"linux_{machine}"]


def _resolving_python() -> str:
    """An interpreter of exactly IMAGE_PYTHON with pip, to resolve the image's dependencies."""
    major, minor, _ = IMAGE_PYTHON.split(".")
    for candidate in (f"/usr/bin/python{major}.{minor}", f"python{major}.{minor}", sys.executable):
        found = shutil.which(candidate)
        if found is None:
            continue
        probe = subprocess.run(
            [found, "-c", "import platform, pip; print(platform.python_version())"],
            capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == IMAGE_PYTHON:
            return found
    raise ImageBuildError(
        f"no Python {IMAGE_PYTHON} with pip here to resolve the glm-operator image's "
        f"dependencies for its Python (Debian {DEBIAN_SUITE}'s python3): install python3-pip "
        "(make deps)")


def python_context(work: Path, arch: str | None = None) -> Path:
    """The Dockerfile and wheels/: the project's wheel and its dependencies' wheels for the
    image's Python and architecture, downloaded here (the host trusts PyPI's certificate; the
    build does not)."""
    context = work / f"python{arch_suffix(arch)}"
    wheels = context / "wheels"
    wheels.mkdir(parents=True)
    shutil.copy2(python_spec().dockerfile, context / "Dockerfile")
    with tempfile.TemporaryDirectory(prefix="glm-wheel-src-") as src:
        # A clean copy: no .venv, no egg-info, nothing the image should not carry.
        for path in _project_sources():
            target = Path(src) / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        store_free_run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--wheel-dir", str(wheels), src], "pip wheel (glm-operator)")
    (project,) = wheels.glob("glm_operator-*.whl")
    major, minor, _ = IMAGE_PYTHON.split(".")
    store_free_run([_resolving_python(), "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                    "--python-version", IMAGE_PYTHON, "--implementation", "cp",
                    "--abi", f"cp{major}{minor}", "--abi", "abi3", "--abi", "none",
                    *(arg for tag in _wheel_platforms(arch) for arg in ("--platform", tag)),
                    "--dest", str(wheels), str(project)], "pip download (dependencies)")
    return context


def store_free_run(cmd: Sequence[str], step: str, timeout: float = 900) -> None:
    result = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                            check=False)
    if result.returncode != 0:
        raise ImageBuildError(f"{step}: `{' '.join(cmd)}` failed (exit {result.returncode}):\n"
                              f"{(result.stdout + result.stderr)[-4000:]}")


def build_all() -> list[Built]:
    """The base and the three images, each built only when its inputs changed."""
    store = Store.default()
    store.prepare()
    with store.locked(), tempfile.TemporaryDirectory(prefix="glm-images-") as tmp:
        work = Path(tmp)
        base = ensure_base(store)
        base_id = store.image_id(base.reference)
        built = [base]
        llama = llama_cpu_spec()
        context = _llama_context(work)
        inputs = llama.inputs_hash(base_id, context_files(context))
        built.append(reuse(store, llama, inputs)
                     or build_image(store, llama, context, base.reference, inputs))
        epp = epp_spec()
        context = _epp_context(work)
        inputs = epp.inputs_hash(base_id, context_files(context))
        built.append(reuse(store, epp, inputs)
                     or build_image(store, epp, context, base.reference, inputs))
        python = python_spec()
        inputs = python.inputs_hash(base_id, python_inputs())
        built.append(reuse(store, python, inputs)
                     or build_image(store, python, python_context(work), base.reference,
                                    inputs))
        return built


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.images", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build what is missing and print the images")
    build.add_argument("--arch", action="append", default=[], choices=("amd64", "arm64"),
                       help="also build the images e2e/images_foreign.py makes for this "
                            "architecture (repeatable; this machine's is always built)")
    build.add_argument("--with-llama", action="store_true",
                       help="with --arch: the CPU llama.cpp image too (cross compiled, about "
                            "10 minutes cold)")
    foreign = sub.add_parser("build-foreign", help="only the images for another architecture "
                             "(e2e/images_foreign.py), the CPU llama.cpp one included")
    foreign.add_argument("--arch", default="arm64", choices=("amd64", "arm64"))
    foreign.add_argument("--background", type=Path, metavar="LOG",
                         help="start the build detached at nice 19 and return (make test: "
                              "it overlaps the tests that do not need it)")
    sub.add_parser("build-cuda", help="the CUDA llama.cpp image's test build (35 min cold: "
                                      "docs/images.md)")
    podman = sub.add_parser("podman", help="run podman on the images' storage")
    podman.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "podman":
        store = Store.default()
        store.prepare()
        return subprocess.run(store.podman(*[a for a in args.args if a != "--"]),
                              env=store.env(), check=False).returncode
    if args.command == "build-foreign" and args.background is not None:
        return _build_foreign_in_background(args.arch, args.background)
    started = time.monotonic()
    try:
        if args.command == "build-foreign":
            from e2e.images_foreign import build_foreign

            built = build_foreign(args.arch, llama=True) if args.arch != native_arch() else []
        elif args.command == "build-cuda":
            from e2e.images_cuda import build_cuda

            built = [build_cuda()]
        else:
            from e2e.images_foreign import build_foreign

            built = build_all()
            for arch in dict.fromkeys(args.arch):
                if arch != native_arch():
                    built += build_foreign(arch, llama=args.with_llama)
    except (ImageBuildError, toolchain.BuildError) as exc:
        log(f"FAILED: {exc}")
        return 1
    for image in built:
        how = "cached" if image.cached else f"built in {image.seconds:.0f}s"
        print(f"{image.reference:55} {image.size_bytes / 1e6:7.1f} MB  {how}")
    print(json.dumps({"seconds": round(time.monotonic() - started, 1)}))
    return 0


def _build_foreign_in_background(arch: str, log_path: Path) -> int:
    """`build-foreign` detached from this process (its own session, so it outlives make's
    step), at the lowest CPU priority. The tests that need its images find them built, or wait
    for it on the storage's build lock; a failed build is left for them to report."""
    if arch == native_arch():
        return 0
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        subprocess.Popen(["nice", "-n", "19", sys.executable, "-m", "e2e.images",
                          "build-foreign", "--arch", arch], stdout=out, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True)
    log(f"{arch} images: background build started; log: {log_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
