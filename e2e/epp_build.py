"""Build the Gateway API Inference Extension's endpoint picker (EPP) from its Go module.

The toolchain component `epp` (e2e/toolchain.py; version: the `[epp]` pin of e2e/versions.toml,
v1.2.0) builds `epp`, the module's `cmd/epp` main package: the ext-proc gRPC server that scrapes
each selected pod's /metrics and answers which pod a request goes to. The routing e2e tests run
it on this machine against the local cluster (e2e/epp.py).

It is built inside a copy of the module, not through a wrapper module like kwok or helm: the
module's own go.mod and go.sum then fix every dependency exactly as its release image
(the module's Dockerfile) builds it. What is copied is what that Dockerfile copies
(`COPY_DIRS`), less the tests; nothing is trimmed: `go list -deps ./cmd/epp` counts about 1,190
packages, mostly client-go and controller-runtime, which the picker does use (it watches pods
through them).

The version stamps are the Dockerfile's (`version.CommitSHA`, `version.BuildRef`); the module
proxy's zip has no commit, so CommitSHA says where the binary came from instead.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

MODULE = "sigs.k8s.io/gateway-api-inference-extension"
# The module's Dockerfile copies these (and go.mod, go.sum) before `go build ./cmd/epp`.
COPY_DIRS = ("cmd/epp", "pkg/common", "pkg/epp", "internal", "apix", "api", "version")


def copy_source(module_dir: Path, dest: Path) -> None:
    """The module cache is read-only: copy what the build needs and make it writable."""
    dest.mkdir(parents=True)
    for name in ("go.mod", "go.sum"):
        shutil.copyfile(module_dir / name, dest / name)
    for relative in COPY_DIRS:
        shutil.copytree(module_dir / relative, dest / relative,
                        ignore=shutil.ignore_patterns("*_test.go", "testdata"))
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def build_epp(version: str, out: Path, work: Path, goarch: str | None = None) -> None:
    """`epp` from the module's cmd/epp, CGO off, -trimpath (toolchain._go_build_with_progress);
    for linux/<goarch> when given (the image's other architecture)."""
    from e2e.toolchain import _go_build_with_progress, _module_info

    name = "epp" if goarch is None else f"epp ({goarch})"
    info = _module_info(name, f"{MODULE}@{version}", work)
    src = work / "gaie"
    copy_source(Path(info["Dir"]), src)
    _go_build_with_progress(name, src, ["./cmd/epp"], out, ldflags(version), goarch=goarch)


def ldflags(version: str) -> str:
    """Stripped, with the version stamps (runtime-images/epp builds with the same)."""
    return (f"-s -w -X {MODULE}/version.CommitSHA=module-proxy-{version} "
            f"-X {MODULE}/version.BuildRef={version}")
