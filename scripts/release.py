"""Build and publish a release: the images the operator renders, an SBOM per image, the chart.

Run it with a Python that has the package installed (.venv/bin/python, or `pip install .`): the
image names come from the operator's own config. One version for everything: VERSION must equal
pyproject.toml's version, the operator's (`glm_operator.__version__`, the images' default tag)
and the chart's version and appVersion.

    python3 scripts/release.py check  --version V
    python3 scripts/release.py buildx --registry R --version V [--image NAME ...] [--push]
                                      [--dry-run]
    python3 scripts/release.py sbom   --registry R --version V [--image NAME ...] [--out DIR]
    python3 scripts/release.py chart  --registry R --version V [--out DIR]
    python3 scripts/release.py local  --registry R --version V        (make release)

- `buildx`: the `docker buildx build` of each image, multi-arch where its Dockerfile allows it
  (RELEASE_IMAGES). The release workflow (.github/workflows/release.yml) runs it per image;
  docs/images.md ("Build and push") shows exactly the commands it runs (a unit test holds the
  two to the same text).
- `sbom`: syft's SPDX JSON of each pushed image, one per platform, read from the registry.
- `chart`: `helm package charts/glm-operator` and `helm push` to `oci://<registry>/charts`.
- `local`: what the workflow does, on this machine without Docker: the images e2e/images.py
  builds for this machine's platform, and for linux/arm64 the ones e2e/images_foreign.py
  builds (the glm-operator image emulated, the picker and llama.cpp cross compiled), pushed
  from its podman storage (one platform with `podman push`, several as one OCI index with
  `podman manifest push --all`), then `sbom` and `chart`. Not built here: the CUDA and CANN
  images; the summary's `notBuiltHere` lists them by platform.

`--plain-http` talks HTTP to the registry (a local test registry); never for a real one.
Images are tagged `<registry>/<name>:<version>`, as the operator renders them with
`imageRegistry: <registry>` (`glm-operator images` lists them); install the chart with
`image.registry=<registry>` unless the registry is the chart's default.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "glm-operator"
VERSIONS_TOML = REPO / "e2e" / "versions.toml"
DIST = REPO / "dist"


class ReleaseError(RuntimeError):
    """A release step cannot go on; the message says which and what to do."""


def log(message: str) -> None:
    print(f"[release] {message}", file=sys.stderr, flush=True)


# --- one version -------------------------------------------------------------------------


def declared_versions() -> dict[str, str]:
    """Every place the release version is written, by where it is written."""
    from glm_operator import __version__

    with (REPO / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return {
        "pyproject.toml [project] version": str(project),
        "glm_operator.__version__": __version__,
        "charts/glm-operator/Chart.yaml version": str(chart["version"]),
        "charts/glm-operator/Chart.yaml appVersion": str(chart["appVersion"]),
    }


def check_version(version: str, declared: dict[str, str] | None = None) -> None:
    """Refuse a VERSION any of the declared versions disagrees with, naming each."""
    declared = declared_versions() if declared is None else declared
    if version.startswith("v"):
        raise ReleaseError(f"VERSION={version}: give the version without the tag's `v` "
                           f"({version[1:]}); the release tag is v<VERSION>")
    wrong = {where: value for where, value in declared.items() if value != version}
    if wrong:
        lines = "\n".join(f"  {where} = {value}" for where, value in wrong.items())
        raise ReleaseError(
            f"VERSION={version} does not match:\n{lines}\n"
            f"set them all to {version} (pyproject.toml, operator/glm_operator/__init__.py, "
            "charts/glm-operator/Chart.yaml) or release the version they hold")


# --- the images --------------------------------------------------------------------------


def pinned(component: str) -> str:
    with VERSIONS_TOML.open("rb") as handle:
        return str(tomllib.load(handle)[component]["version"])


@dataclass(frozen=True)
class BuiltFromSource:
    """A program compiled into an image that syft's catalogers cannot see (a C++ binary with no
    package database around it): `sbom` adds it to the image's SBOM as a package of its own."""

    name: str
    version: str
    download: str
    purl: str
    license: str
    comment: str

    def spdx_package(self, image: str) -> dict[str, object]:
        return {
            "name": self.name, "SPDXID": f"SPDXRef-Package-{image}-{self.name}-built-from-source",
            "versionInfo": self.version, "downloadLocation": self.download,
            "filesAnalyzed": False, "licenseConcluded": "NOASSERTION",
            "licenseDeclared": self.license, "copyrightText": "NOASSERTION",
            "primaryPackagePurpose": "APPLICATION", "comment": self.comment,
            "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator": self.purl}],
        }


def llama_cpp(version: str, flags: str) -> BuiltFromSource:
    """llama.cpp as our images carry it: compiled from the tree vendored in the
    llama-cpp-python sdist on PyPI (its own version is the sdist's)."""
    return BuiltFromSource(
        name="llama.cpp", version=f"llama-cpp-python-{version}",
        download=f"https://pypi.org/project/llama-cpp-python/{version}/", license="MIT",
        purl=f"pkg:pypi/llama-cpp-python@{version}",
        comment=f"llama-server and ggml-rpc-server in /usr/local/bin, compiled from the "
                f"llama.cpp tree vendored in the llama-cpp-python {version} sdist ({flags})")


@dataclass(frozen=True)
class ReleaseImage:
    """One released image: how docker buildx builds it and for which platforms."""

    name: str  # e2e/images.py's name for it, and the --image choice
    dockerfile: str  # relative to the repository
    context: str
    platforms: tuple[str, ...]
    build_args: tuple[tuple[str, str], ...]
    reference: Callable[[str, str], str]  # (registry, version) -> as the operator renders it
    built_from_source: tuple[BuiltFromSource, ...] = ()

    @property
    def image_name(self) -> str:
        """The name under the registry (`llama-server-cpu`), as the operator's tables key it."""
        return self.reference("registry.invalid", "0").rsplit("/", 1)[1].rsplit(":", 1)[0]

    def buildx(self, registry: str, version: str, push: bool) -> list[str]:
        cmd = ["docker", "buildx", "build", "--platform", ",".join(self.platforms),
               "-f", self.dockerfile, self.context]
        for key, value in self.build_args:
            cmd += ["--build-arg", f"{key}={value}"]
        cmd += ["-t", self.reference(registry, version)]
        return [*cmd, "--push"] if push else cmd


def _runtime(key: str) -> Callable[[str, str], str]:
    def reference(registry: str, version: str) -> str:
        from glm_operator.planning.accelerators import runtime_images

        return runtime_images(registry, version)[key]

    return reference


def _config_image(attribute: str) -> Callable[[str, str], str]:
    def reference(registry: str, version: str) -> str:
        from glm_operator.config import OperatorConfig

        image: str = getattr(OperatorConfig(imageRegistry=registry, imageTag=version), attribute)
        return image

    return reference


def release_images() -> list[ReleaseImage]:
    """Every image of ours the operator renders (the vLLM ones it renders are upstream's), for
    the platforms the operator's own table says the release builds (planning/architectures.py
    RELEASED_IMAGE_PLATFORMS, which the render pins pods to): CUDA amd64 only, CANN arm64 only,
    the rest both."""
    from glm_operator.planning.architectures import released_platforms

    llama = ("LLAMA_CPP_PYTHON_VERSION", pinned("llama_cpp_python"))
    images = [
        ReleaseImage("llamacpp-cpu", "runtime-images/llamacpp/Dockerfile.cpu",
                     "runtime-images/llamacpp", (), (llama,), _runtime("llamacpp-cpu"),
                     (llama_cpp(llama[1], "CPU: runtime-images/llamacpp/cmake-flags-cpu.txt"),)),
        ReleaseImage("llamacpp-cuda", "runtime-images/llamacpp/Dockerfile.cuda",
                     "runtime-images/llamacpp", (), (llama,), _runtime("llamacpp-cuda"),
                     (llama_cpp(llama[1], "CUDA: runtime-images/llamacpp/Dockerfile.cuda"),)),
        ReleaseImage("llamacpp-cann", "runtime-images/llamacpp/Dockerfile.cann",
                     "runtime-images/llamacpp", (), (llama, ("SOC_TYPE", "ascend910b3")),
                     _runtime("llamacpp-cann"),
                     (llama_cpp(llama[1], "CANN: runtime-images/llamacpp/Dockerfile.cann"),)),
        ReleaseImage("epp", "runtime-images/epp/Dockerfile", "runtime-images/epp", (),
                     (("GAIE_VERSION", pinned("epp")),), _config_image("epp_image")),
        ReleaseImage("glm-operator", "runtime-images/python/Dockerfile", ".", (), (),
                     _config_image("operator_image")),
    ]
    return [replace(image, platforms=released_platforms(image.image_name)) for image in images]


def select(names: Sequence[str]) -> list[ReleaseImage]:
    images = release_images()
    unknown = sorted(set(names) - {image.name for image in images})
    if unknown:
        raise ReleaseError(f"--image {', '.join(unknown)}: not a released image; choose from "
                           f"{', '.join(image.name for image in images)}")
    return [image for image in images if not names or image.name in names]


def _run(cmd: Sequence[str], step: str, env: dict[str, str] | None = None,
         timeout: float = 6 * 3600) -> subprocess.CompletedProcess[str]:
    log(f"{step}: {shlex.join(cmd)}")
    result = subprocess.run(list(cmd), cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=timeout, check=False)
    if result.returncode != 0:
        raise ReleaseError(f"{step}: `{shlex.join(cmd)}` failed (exit {result.returncode}):\n"
                           f"{(result.stdout + result.stderr)[-4000:]}")
    return result


def shell_line(cmd: Sequence[str]) -> str:
    """`cmd` as one shell line, with `$VARIABLE`s left for the shell (docs/images.md shows
    `--registry '$REGISTRY' --version '$VERSION'` printed this way)."""
    safe = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./$-")
    return " ".join(arg if arg and set(arg) <= safe else shlex.quote(arg) for arg in cmd)


def buildx(registry: str, version: str, names: Sequence[str], push: bool,
           dry_run: bool) -> None:
    for image in select(names):
        cmd = image.buildx(registry, version, push)
        if dry_run:
            print(shell_line(cmd))
            continue
        log(f"building {image.name} for {', '.join(image.platforms)}")
        # Streamed, not captured: a multi-arch build logs for hours.
        if subprocess.run(cmd, cwd=REPO, check=False).returncode != 0:
            raise ReleaseError(f"docker buildx build of {image.name} failed (log above)")


# --- SBOMs -------------------------------------------------------------------------------


def tool(name: str, pinned_build: bool = False) -> str:
    """`name` (syft, helm) from PATH, as the workflow installs them at the pinned versions; else,
    or always with `pinned_build` (make release), the toolchain's build of its pin."""
    found = None if pinned_build else shutil.which(name)
    if found:
        return found
    sys.path.insert(0, str(REPO))
    from e2e import toolchain

    return str(toolchain.ensure(name) / name)


def sbom_file(out: Path, name: str, version: str, platform_: str) -> Path:
    return out / f"{name}-{version}-{platform_.replace('/', '-')}.spdx.json"


def sbom(registry: str, version: str, names: Sequence[str], out: Path, plain_http: bool,
         platforms: Sequence[str] = (), pinned_build: bool = False) -> list[Path]:
    """syft's SPDX JSON of each image as pushed, for each of its platforms (or `platforms`,
    where an image has it: the local release pushes one)."""
    syft = tool("syft", pinned_build)
    env = {**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false"}
    if plain_http:
        env["SYFT_REGISTRY_INSECURE_USE_HTTP"] = "true"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for image in select(names):
        for platform_ in image.platforms:
            if platforms and platform_ not in platforms:
                continue
            target = sbom_file(out, image.name, version, platform_)
            _run([syft, "scan", f"registry:{image.reference(registry, version)}",
                  "--platform", platform_, "--output", f"spdx-json={target}", "--quiet"],
                 f"sbom {image.name} {platform_}", env=env, timeout=1800)
            if image.built_from_source:
                document = json.loads(target.read_text())
                add_built_from_source(document, image.name, image.built_from_source)
                target.write_text(json.dumps(document, indent=2) + "\n")
            written.append(target)
    return written


def add_built_from_source(document: dict[str, Any], image: str,
                          programs: Sequence[BuiltFromSource]) -> None:
    """Each program as a package the image (the document's described element) CONTAINS."""
    described = document.get("documentDescribes") or [
        r["relatedSpdxElement"] for r in document.get("relationships", ())
        if r.get("spdxElementId") == "SPDXRef-DOCUMENT"
        and r.get("relationshipType") == "DESCRIBES"]
    if not described:
        raise ReleaseError(f"sbom {image}: syft's document describes no element to add "
                           f"{', '.join(p.name for p in programs)} to")
    for program in programs:
        package = program.spdx_package(image)
        document.setdefault("packages", []).append(package)
        document.setdefault("relationships", []).append(
            {"spdxElementId": described[0], "relatedSpdxElement": package["SPDXID"],
             "relationshipType": "CONTAINS"})


# --- the chart ---------------------------------------------------------------------------


def chart(registry: str, version: str, out: Path, plain_http: bool,
          pinned_build: bool = False) -> Path:
    """`helm package` (the chart as committed: its version is VERSION, checked) and
    `helm push` to oci://<registry>/charts, so it installs as
    `helm install <release> oci://<registry>/charts/glm-operator --version <VERSION>`."""
    helm = tool("helm", pinned_build)
    out.mkdir(parents=True, exist_ok=True)
    _run([helm, "package", str(CHART), "--destination", str(out)], "helm package")
    package = out / f"glm-operator-{version}.tgz"
    if not package.exists():
        raise ReleaseError(f"helm package wrote no {package.name} in {out}")
    _run([helm, "push", str(package), f"oci://{registry}/charts",
          *(["--plain-http"] if plain_http else [])], "helm push")
    return package


# --- the local release (make release) ----------------------------------------------------


def _push(store: Any, name: str, sources: dict[str, str], target: str, out: Path,
          plain_http: bool) -> str:
    """Push `name`'s builds (platform -> local reference) to `target`: one image as it is, two
    or more as one multi-platform index (a podman manifest list, pushed with --all). Returns
    the digest pushed (the index's for several)."""
    from e2e.images_foreign import manifest_list

    digest_file = out / f"{name}.digest"
    out.mkdir(parents=True, exist_ok=True)
    tls = ["--tls-verify=false"] if plain_http else []
    if len(sources) == 1:
        (source,) = sources.values()
        store.run(store.podman("push", *tls, "--digestfile", str(digest_file), source,
                               f"docker://{target}"), f"podman push {name}", timeout=1800)
    else:
        index = f"localhost/release-index/{name}:{target.rsplit(':', 1)[1]}"
        manifest_list(store, index, [sources[p] for p in sorted(sources)])
        store.run(store.podman("manifest", "push", "--all", *tls, "--format", "oci",
                               "--digestfile", str(digest_file), index, f"docker://{target}"),
                  f"podman manifest push {name}", timeout=3600)
    return digest_file.read_text().strip()


def local(registry: str, version: str, out: Path, plain_http: bool) -> dict[str, object]:
    """Build with e2e/images.py (podman storage): this machine's platform, and linux/arm64
    for the images e2e/images_foreign.py builds; push each image (several platforms as one
    index), SBOM per platform, chart."""
    sys.path.insert(0, str(REPO))
    from e2e import images as local_images
    from e2e import images_foreign

    here = f"linux/{local_images.native_arch()}"
    released = {image.name: image for image in release_images()}
    sources: dict[str, dict[str, str]] = {}
    for built in local_images.build_all():
        if built.name in released:
            sources.setdefault(built.name, {})[here] = built.reference
    for arch in ("amd64", "arm64"):
        if f"linux/{arch}" == here:
            continue
        for built in images_foreign.build_foreign(arch, llama=True):
            if built.name in released and f"linux/{arch}" in released[built.name].platforms:
                sources.setdefault(built.name, {})[f"linux/{arch}"] = built.reference
    not_built = {name: [p for p in image.platforms if p not in sources.get(name, {})]
                 for name, image in sorted(released.items())}
    not_built = {name: platforms for name, platforms in not_built.items() if platforms}
    log("local release: " + "; ".join(f"{name} for {', '.join(sorted(platforms))}"
                                      for name, platforms in sorted(sources.items()))
        + "; not built here (the release workflow builds them with docker buildx): "
        + "; ".join(f"{name} {', '.join(platforms)}" for name, platforms in not_built.items()))
    store = local_images.Store.default()
    store.prepare()
    pushed: dict[str, dict[str, object]] = {}
    for name, platforms in sorted(sources.items()):
        target = released[name].reference(registry, version)
        for platform_, source in platforms.items():
            # This machine's build as the operator renders it; another's with `-<arch>`.
            expected = released[name].reference(source.rsplit("/", 1)[0], version)
            if source not in (expected, f"{expected}-{platform_.split('/')[1]}"):
                raise ReleaseError(f"{name}: built as {source}, not as version {version}")
        digest = _push(store, name, platforms, target, out, plain_http)
        pushed[name] = {"image": target, "digest": digest, "platforms": sorted(platforms)}
        log(f"pushed {target}@{digest} ({', '.join(sorted(platforms))})")
    sboms = [path for name, platforms in sorted(sources.items())
             for path in sbom(registry, version, [name], out / "sbom", plain_http,
                              platforms=sorted(platforms), pinned_build=True)]
    package = chart(registry, version, out, plain_http, pinned_build=True)
    summary: dict[str, object] = {
        "version": version, "images": pushed, "notBuiltHere": not_built,
        "sboms": [str(path.relative_to(out)) for path in sboms],
        "chart": f"oci://{registry}/charts/glm-operator:{version}",
        "chartPackage": str(package.relative_to(out)),
    }
    (out / f"release-{version}.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/release.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {name: sub.add_parser(name) for name in ("check", "buildx", "sbom", "chart",
                                                        "local")}
    for name, command in commands.items():
        command.add_argument("--version", required=True, help="the release version (no `v`)")
        if name == "check":
            continue
        command.add_argument("--registry", required=True,
                             help="where images go (<registry>/<name>:<version>) and the "
                                  "chart (oci://<registry>/charts)")
        if name in ("buildx", "sbom"):
            command.add_argument("--image", action="append", default=[],
                                 help="only this image (repeatable; default all)")
        if name in ("sbom", "chart", "local"):
            command.add_argument("--out", type=Path, default=DIST,
                                 help="where SBOMs, the chart package and the summary go")
            command.add_argument("--plain-http", action="store_true",
                                 help="the registry speaks HTTP (a local test registry)")
    commands["buildx"].add_argument("--push", action="store_true")
    commands["buildx"].add_argument("--dry-run", action="store_true",
                                    help="print the commands, run nothing")
    args = parser.parse_args(argv)
    try:
        if not (args.command == "buildx" and args.dry_run):
            check_version(args.version)
        registry = getattr(args, "registry", "").rstrip("/")
        if args.command == "check":
            log(f"{args.version}: pyproject, the operator and the chart agree")
        elif args.command == "buildx":
            buildx(registry, args.version, args.image, args.push, args.dry_run)
        elif args.command == "sbom":
            for path in sbom(registry, args.version, args.image, args.out / "sbom",
                             args.plain_http):
                print(path)
        elif args.command == "chart":
            print(chart(registry, args.version, args.out, args.plain_http))
        else:
            print(json.dumps(local(registry, args.version, args.out, args.plain_http),
                             indent=2))
    except ReleaseError as exc:
        log(f"FAILED: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
