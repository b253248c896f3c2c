"""Build the Gateway API Inference Extension's endpoint picker (EPP) from its Go module.

The toolchain component `epp` (e2e/toolchain.py; version: the `[epp]` pin of e2e/versions.toml)
builds `epp`, the module's `cmd/epp` main package: the ext-proc gRPC server that scrapes each
selected pod's /metrics and answers which pod a request goes to. The routing e2e tests run it
on this machine against the local cluster (e2e/epp.py); `epp_arm64` is the same build for
linux/arm64, for the arm64 build of its image.

It is built inside a copy of the module, not through a wrapper module like kwok or helm: the
module's own go.mod and go.sum then fix every dependency exactly as its release image
(the module's Dockerfile) builds it. What is copied is what that Dockerfile copies
(`copy_dirs` reads its COPY lines), less the tests; nothing is trimmed: `go list -deps
./cmd/epp` counts about 1,210 packages at v1.5.0, mostly client-go and controller-runtime,
which the picker does use (it watches pods through them). On this machine's two cores it
builds in about 80 s with a warm module cache.

The patches under runtime-images/epp/patches/<version>/ (none, unless the release cannot run
as rendered: v1.5.0 has one, for its standalone mode) are applied to that copy with `git
apply`, in name order, as the image's Dockerfile applies them.

The version stamps are the Dockerfile's (`version.CommitSHA`, `version.BuildRef`); the module
proxy's zip has no commit, so CommitSHA says where the binary came from instead.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

MODULE = "sigs.k8s.io/gateway-api-inference-extension"
PATCHES_DIR = Path(__file__).resolve().parent.parent / "runtime-images" / "epp" / "patches"


def copy_dirs(dockerfile: str) -> list[str]:
    """The source folders the module's Dockerfile copies before `go build` (`COPY cmd/epp
    ./cmd/epp`, ...): read from the pinned version's own Dockerfile, so a release that needs
    another folder (v1.5.0 added `sidecars`) builds without an edit here."""
    dirs = []
    for line in dockerfile.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "COPY" and not words[1].startswith("--") \
                and words[2] == f"./{words[1]}" and words[1] not in ("go.mod", "go.sum"):
            dirs.append(words[1])
    if "cmd/epp" not in dirs:
        raise ValueError("the module's Dockerfile no longer copies cmd/epp: "
                         f"found only {dirs}")
    return dirs


def copy_source(module_dir: Path, dest: Path) -> None:
    """The module cache is read-only: copy what the build needs and make it writable."""
    dest.mkdir(parents=True)
    for name in ("go.mod", "go.sum"):
        shutil.copyfile(module_dir / name, dest / name)
    for relative in copy_dirs((module_dir / "Dockerfile").read_text()):
        shutil.copytree(module_dir / relative, dest / relative,
                        ignore=shutil.ignore_patterns("*_test.go", "testdata"))
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def patches(version: str) -> list[Path]:
    """The patches the picker of `version` is built with, in the order they are applied."""
    return sorted((PATCHES_DIR / version).glob("*.patch"))


def apply_patches(version: str, src: Path) -> None:
    for patch in patches(version):
        result = subprocess.run(["git", "apply", "--verbose", str(patch)], cwd=src,
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{patch.name} does not apply to {MODULE}@{version}:\n"
                               f"{result.stderr[-2000:]}")


def build_epp(version: str, out: Path, work: Path, goarch: str | None = None) -> None:
    """`epp` from the module's cmd/epp, CGO off, -trimpath (toolchain._go_build_with_progress);
    for linux/<goarch> when given (the image's other architecture)."""
    from e2e.toolchain import _go_build_with_progress, _module_info

    name = "epp" if goarch is None else f"epp ({goarch})"
    info = _module_info(name, f"{MODULE}@{version}", work)
    src = work / "gaie"
    copy_source(Path(info["Dir"]), src)
    apply_patches(version, src)
    _go_build_with_progress(name, src, ["./cmd/epp"], out, ldflags(version), goarch=goarch)


def ldflags(version: str) -> str:
    """Stripped, with the version stamps (runtime-images/epp builds with the same)."""
    return (f"-s -w -X {MODULE}/version.CommitSHA=module-proxy-{version} "
            f"-X {MODULE}/version.BuildRef={version}")
