"""Build and cache the real third-party parts of the local test environment.

Nothing here downloads a binary from a web site: every component is built from a package
registry (the Go module proxy, PyPI) and cached under a versioned directory, so a second run
builds nothing:

    ~/.cache/glm-operator/<component>-<version>/bin/...      (override: GLM_OPERATOR_CACHE)

    python -m e2e.toolchain build [component ...]   build what is missing (all by default)
    python -m e2e.toolchain path <component>        print the cached bin directory
    python -m e2e.toolchain list                    show what is cached

Versions come from e2e/versions.toml, the only place they are pinned. A full build also
installs the pinned vLLM's venv (e2e/vllm_cli.py; its version is the one the operator renders)
alongside the compiles, since it is mostly download.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from e2e.cache import build_lock, cache_root

E2E_DIR = Path(__file__).resolve().parent
VERSIONS_FILE = E2E_DIR / "versions.toml"
COMPLETE_MARKER = ".complete"


class BuildError(RuntimeError):
    """A component failed to build; the message names the component and version."""


def versions() -> dict[str, str]:
    with VERSIONS_FILE.open("rb") as handle:
        data = tomllib.load(handle)
    pinned = {name: str(table["version"]) for name, table in data.items()}
    return {**pinned, **{name: pinned[pin] for name, pin in SAME_VERSION_AS.items()}}


# Components built from a module pinned under another component's name (one pin, two caches).
SAME_VERSION_AS = {"keda_controller": "keda", "inference_extension": "epp", "epp_arm64": "epp"}


def component_dir(name: str) -> Path:
    key = BUILD_KEYS[name]() if name in BUILD_KEYS else ""
    return cache_root() / f"{name}-{versions()[name]}{'-' + key if key else ''}"


def _llama_flags_key() -> str:
    from e2e.llama_build import flags_key

    return flags_key()


def _keda_trim_key() -> str:
    from e2e.keda_build import trim_key

    return trim_key()


def _epp_patches_key() -> str:
    """The picker's patches for its pinned version (e2e/epp_build.py), hashed: none, no key."""
    import hashlib

    from e2e.epp_build import patches

    found = patches(versions()["epp"])
    return hashlib.sha256(b"".join(p.read_bytes() for p in found)).hexdigest()[:12] \
        if found else ""


# Components whose build has options beyond their version: the options' hash joins the cache
# directory name, so changing one rebuilds.
BUILD_KEYS: dict[str, Callable[[], str]] = {
    "llama_cpp_python": _llama_flags_key,
    "lws": lambda: "controller",  # the CRD alone was cached under the plain name before
    # Fewer files were cached under the plain names before (the pool CRD alone, the route's;
    # the CRDs without the picker's source).
    "inference_extension": lambda: "source",
    "gateway_api": lambda: "gateways",
    "keda_controller": _keda_trim_key,
    "epp": _epp_patches_key,
    "epp_arm64": _epp_patches_key,
}


def bin_dir(name: str) -> Path:
    return component_dir(name) / "bin"


def is_cached(name: str) -> bool:
    return (component_dir(name) / COMPLETE_MARKER).exists()


def log(message: str) -> None:
    print(f"[toolchain] {message}", file=sys.stderr, flush=True)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")
    env["GOFLAGS"] = "-mod=mod"
    env.setdefault("GOTOOLCHAIN", "local")
    return env


def _run(cmd: Sequence[str], cwd: Path, component: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        list(cmd), cwd=cwd, env=env or _go_env(), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise BuildError(
            f"{component}: `{' '.join(cmd)}` failed (exit {result.returncode}):\n"
            f"{result.stderr[-4000:]}"
        )
    return result.stdout


def _go_build_with_progress(
    component: str,
    module_dir: Path,
    packages: Sequence[str],
    out_dir: Path,
    ldflags: str = "",
    tags: str = "",
    goarch: str | None = None,
) -> None:
    """`go build -v`, reporting how many of the dependency packages are compiled so far; for
    another architecture with `goarch` (CGO is off: no cross C compiler is needed)."""
    env = _go_env()
    if goarch:
        env["GOARCH"] = goarch
    total_text = _run(["go", "list", "-deps", *packages], module_dir, component, env)
    total = max(1, len(total_text.split()))
    cmd = ["go", "build", "-v", "-trimpath", "-o", str(out_dir) + "/"]
    if tags:
        cmd += ["-tags", tags]
    if ldflags:
        cmd += ["-ldflags", ldflags]
    cmd += list(packages)
    log(f"{component}: compiling up to {total} packages (go build -v)")
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=module_dir, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    assert proc.stderr is not None
    last_report, tail = 0.0, collections.deque[str](maxlen=60)
    for done, line in enumerate(proc.stderr, start=1):
        tail.append(line)
        now = time.monotonic()
        if now - last_report > 20:
            last_report = now
            log(f"{component}: {done}/{total} packages, {int(now - started)}s")
    if proc.wait() != 0:
        raise BuildError(f"{component}: go build failed:\n{''.join(tail)}")
    log(f"{component}: built in {int(time.monotonic() - started)}s")


def _write_module(directory: Path, module: str, go_mod_body: str, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "go.mod").write_text(f"module {module}\n\n{go_mod_body}\n")
    for name, body in files.items():
        (directory / name).write_text(body)


def _module_info(component: str, module_at_version: str, workdir: Path) -> dict[str, str]:
    out = _run(["go", "mod", "download", "-json", module_at_version], workdir, component)
    info: dict[str, str] = json.loads(out)
    if info.get("Error"):
        raise BuildError(f"{component}: cannot download {module_at_version}: {info['Error']}")
    return info


# --- components -------------------------------------------------------------------------


def build_kubernetes(version: str, out: Path, work: Path) -> None:
    """kube-apiserver, -controller-manager, -scheduler and kubectl from k8s.io/kubernetes.

    `go install k8s.io/kubernetes/...@v` is refused because k/k's go.mod replaces its staging
    modules with local paths; a wrapper module replaces each with its published v0.x version.
    """
    name = "kubernetes"
    info = _module_info(name, f"k8s.io/kubernetes@{version}", work)
    go_mod = Path(info["GoMod"]).read_text()
    staging = sorted(
        line.split("=>")[0].strip()
        for line in go_mod.splitlines()
        if "=> ./staging/src/" in line
    )
    godebug = next((ln for ln in go_mod.splitlines() if ln.startswith("godebug ")), "")
    go_line = next(ln for ln in go_mod.splitlines() if ln.startswith("go "))
    staging_version = "v0." + version.removeprefix("v1.")
    replaces = "\n".join(f"\t{mod} => {mod} {staging_version}" for mod in staging)
    body = (
        f"{go_line}\n\n{godebug}\n\nrequire k8s.io/kubernetes {version}\n\n"
        f"replace (\n{replaces}\n)\n"
    )
    module_dir = work / "k8s-wrapper"
    _write_module(module_dir, "glm-operator.dev/e2e/k8s", body, {"doc.go": "package k8s\n"})
    major, minor = version.removeprefix("v").split(".")[:2]
    stamp = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": "0000000000000000000000000000000000000000",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    ldflags = " ".join(
        f"-X {pkg}.{key}={value}"
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for key, value in stamp.items()
    )
    packages = [
        f"k8s.io/kubernetes/cmd/{cmd}"
        for cmd in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
    ]
    _go_build_with_progress(name, module_dir, packages, out, "-s -w " + ldflags, "selinux,notest")


def build_etcd(version: str, out: Path, work: Path) -> None:
    module_dir = work / "etcd-wrapper"
    main = (
        "package main\n\nimport (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\n"
        "func main() { etcdmain.Main(os.Args) }\n"
    )
    _write_module(
        module_dir, "etcd", f"go 1.24\n\nrequire go.etcd.io/etcd/server/v3 {version}\n",
        {"main.go": main},
    )
    _go_build_with_progress("etcd", module_dir, ["."], out, "-s -w")


def build_kwok(version: str, out: Path, work: Path) -> None:
    module_dir = work / "kwok-wrapper"
    _write_module(
        module_dir, "glm-operator.dev/e2e/kwok", f"go 1.24\n\nrequire sigs.k8s.io/kwok {version}\n",
        {"doc.go": "package kwok\n"},
    )
    ldflags = f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={version}"
    _go_build_with_progress(
        "kwok", module_dir, ["sigs.k8s.io/kwok/cmd/kwok", "sigs.k8s.io/kwok/cmd/kwokctl"], out,
        ldflags,
    )


def build_helm(version: str, out: Path, work: Path) -> None:
    module_dir = work / "helm-wrapper"
    _write_module(
        module_dir, "glm-operator.dev/e2e/helm", f"go 1.24\n\nrequire helm.sh/helm/v3 {version}\n",
        {"doc.go": "package helm\n"},
    )
    ldflags = f"-s -w -X helm.sh/helm/v3/internal/version.version={version}"
    _go_build_with_progress("helm", module_dir, ["helm.sh/helm/v3/cmd/helm"], out, ldflags)


def build_minio(version: str, out: Path, work: Path) -> None:
    """The MinIO server (`minio`) from github.com/minio/minio, whose main package is the root."""
    module_dir = work / "minio-wrapper"
    _write_module(
        module_dir, "glm-operator.dev/e2e/minio",
        f"go 1.24\n\nrequire github.com/minio/minio {version}\n", {"doc.go": "package minio\n"},
    )
    _go_build_with_progress("minio", module_dir, ["github.com/minio/minio"], out, "-s -w")


def build_custom_metrics_apiserver(version: str, out: Path, work: Path) -> None:
    """`test-adapter`, the sample custom metrics API server of sigs.k8s.io/custom-metrics-apiserver
    (the library prometheus-adapter is built on): it serves the values a test POSTs to its
    :8080/write-metrics endpoint through custom.metrics.k8s.io. Its main package lives in the
    module itself, so a wrapper module requires it and builds that package."""
    module_dir = work / "custom-metrics-wrapper"
    _write_module(
        module_dir, "glm-operator.dev/e2e/custommetrics",
        f"go 1.26.0\n\nrequire sigs.k8s.io/custom-metrics-apiserver {version}\n",
        {"doc.go": "package custommetrics\n"},
    )
    _go_build_with_progress(
        "custom_metrics_apiserver", module_dir,
        ["sigs.k8s.io/custom-metrics-apiserver/test-adapter"], out, "-s -w",
    )


def _build_go_commands(component: str, module: str, version: str, packages: Sequence[str],
                       out: Path, work: Path, ldflags: str = "-s -w") -> None:
    """A module's command packages, built through a wrapper module that requires it (as helm
    and kwok are): the module's own go.mod and go.sum fix every dependency."""
    module_dir = work / f"{component}-wrapper"
    _write_module(
        module_dir, f"glm-operator.dev/e2e/{component}",
        f"go 1.24\n\nrequire {module} {version}\n", {"doc.go": f"package {component}\n"},
    )
    _go_build_with_progress(component, module_dir, packages, out, ldflags)


def build_actionlint(version: str, out: Path, work: Path) -> None:
    """actionlint, the GitHub Actions workflow linter the unit tests run on .github/workflows
    (tests/test_workflows.py)."""
    _build_go_commands(
        "actionlint", "github.com/rhysd/actionlint", version,
        ["github.com/rhysd/actionlint/cmd/actionlint"], out, work,
        f"-s -w -X github.com/rhysd/actionlint.version={version}",
    )


def build_crane(version: str, out: Path, work: Path) -> None:
    """crane from go-containerregistry: `crane registry serve` is the local OCI registry that
    e2e/test_release.py pushes a release to."""
    _build_go_commands(
        "crane", "github.com/google/go-containerregistry", version,
        ["github.com/google/go-containerregistry/cmd/crane"], out, work,
        f"-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version={version}",
    )


def build_syft(version: str, out: Path, work: Path) -> None:
    """syft, which writes the SBOM of each released image (scripts/release.py sbom)."""
    _build_go_commands(
        "syft", "github.com/anchore/syft", version, ["github.com/anchore/syft/cmd/syft"], out,
        work, f"-s -w -X main.version={version}",
    )


def _fetch_module_files(
    component: str, module: str, files: dict[str, str], out: Path, work: Path
) -> None:
    info = _module_info(component, module, work)
    source = Path(info["Dir"])
    for relative, target in files.items():
        shutil.copyfile(source / relative, out / target)


def fetch_istio(version: str, out: Path, work: Path) -> None:
    _fetch_module_files(
        "istio", f"istio.io/api@{version}",
        {"kubernetes/customresourcedefinitions.gen.yaml": "istio-crds.yaml"}, out, work,
    )


# The picker's source that tests/render/test_epp_contract.py reads: its flags
# (pkg/epp/server, pkg/common), its config API (apix/config) and every plugin's parameters
# (pkg/epp): what the operator renders is checked against the pinned release's own code.
INFERENCE_EXTENSION_SOURCE = ("cmd/epp", "pkg/epp", "pkg/common", "apix/config")


def fetch_inference_extension(version: str, out: Path, work: Path) -> None:
    """The InferencePool CRD (inference.networking.k8s.io/v1) of the Gateway API Inference
    Extension, from the same module and version as the endpoint picker (`[epp]`: the proxy
    refuses the module's version list, but serves the exact version), its InferenceObjective
    and InferenceModelRewrite CRDs, which a pool's picker watches beside its pool where they
    are served, and the Go source of the picker's flags, config API and plugins (not tests),
    under source/, for the contract test."""
    module = f"sigs.k8s.io/gateway-api-inference-extension@{version}"
    _fetch_module_files(
        "inference_extension", module,
        {"config/crd/bases/inference.networking.k8s.io_inferencepools.yaml":
             "inferencepools.yaml",
         "config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml":
             "inferenceobjectives.yaml",
         "config/crd/bases/inference.networking.x-k8s.io_inferencemodelrewrites.yaml":
             "inferencemodelrewrites.yaml"}, out, work,
    )
    source = Path(_module_info("inference_extension", module, work)["Dir"])
    for relative in INFERENCE_EXTENSION_SOURCE:
        for path in sorted((source / relative).rglob("*.go")):
            if path.name.endswith("_test.go"):
                continue
            target = out / "source" / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def fetch_gateway_api(version: str, out: Path, work: Path) -> None:
    """Gateway API's HTTPRoute CRD (standard channel), from the sigs.k8s.io/gateway-api
    module: the route an inference gateway reads (spec.routing.mode InferenceGateway); and
    its Gateway CRD, the route's parent, for the docs' example Gateway."""
    _fetch_module_files(
        "gateway_api", f"sigs.k8s.io/gateway-api@{version}",
        {"config/crd/standard/gateway.networking.k8s.io_httproutes.yaml": "httproutes.yaml",
         "config/crd/standard/gateway.networking.k8s.io_gateways.yaml": "gateways.yaml"},
        out, work,
    )


def fetch_prometheus_operator(version: str, out: Path, work: Path) -> None:
    _fetch_module_files(
        "prometheus_operator", f"github.com/prometheus-operator/prometheus-operator@{version}",
        {
            "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml":
                "servicemonitors.yaml",
        },
        out, work,
    )


def fetch_argocd(version: str, out: Path, work: Path) -> None:
    _fetch_module_files(
        "argocd", f"github.com/argoproj/argo-cd/v3@{version}",
        {"manifests/crds/application-crd.yaml": "application-crd.yaml"}, out, work,
    )


def fetch_keda(version: str, out: Path, work: Path) -> None:
    """KEDA's ScaledObject CRD, as its controller-gen wrote it, from the KEDA Go module."""
    _fetch_module_files(
        "keda", f"github.com/kedacore/keda/v2@{version}",
        {"config/crd/bases/keda.sh_scaledobjects.yaml": "keda-scaledobjects.yaml"}, out, work,
    )


def build_lws(version: str, out: Path, work: Path) -> None:
    """LeaderWorkerSet from the sigs.k8s.io/lws module: its CRD and admission webhooks as
    controller-gen wrote them, and its controller (`lws-manager`, the module's cmd package,
    built through a wrapper module like the test-adapter)."""
    _fetch_module_files(
        "lws", f"sigs.k8s.io/lws@{version}",
        {"config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml":
             "lws-leaderworkersets.yaml",
         "config/webhook/manifests.yaml": "lws-webhooks.yaml"}, out, work,
    )
    module_dir = work / "lws-wrapper"
    _write_module(module_dir, "glm-operator.dev/e2e/lws",
                  f"go 1.26.0\n\nrequire sigs.k8s.io/lws {version}\n",
                  {"doc.go": "package lws\n"})
    _go_build_with_progress("lws", module_dir, ["sigs.k8s.io/lws/cmd"], out, "-s -w")
    (out / "cmd").rename(out / "lws-manager")


def build_keda_controller(version: str, out: Path, work: Path) -> None:
    """keda-operator and keda-adapter from a trimmed copy of the KEDA module, and its CRDs:
    e2e/keda_build.py says what is cut and why."""
    from e2e.keda_build import build_keda_controller as build

    build(version, out, work)


def build_epp(version: str, out: Path, work: Path) -> None:
    """The Gateway API Inference Extension's endpoint picker (`epp`, the module's cmd/epp):
    e2e/epp_build.py says how and why it is built in a copy of the module."""
    from e2e.epp_build import build_epp as build

    build(version, out, work)


def build_epp_arm64(version: str, out: Path, work: Path) -> None:
    """The same picker cross-compiled for linux/arm64 (GOARCH=arm64), for the arm64 build of
    its image (e2e/images_foreign.py)."""
    from e2e.epp_build import build_epp as build

    build(version, out, work, goarch="arm64")


def build_llama_server(version: str, out: Path, work: Path) -> None:
    """llama-server and ggml-rpc-server (CPU) from the llama.cpp tree vendored in the
    llama-cpp-python sdist. The cmake flags are the ones runtime-images/llamacpp/Dockerfile.cpu
    uses."""
    from e2e.llama_build import build_llama_server as build

    build(version, out, work)


BUILDERS: dict[str, Callable[[str, Path, Path], None]] = {
    "kubernetes": build_kubernetes,
    "etcd": build_etcd,
    "kwok": build_kwok,
    "helm": build_helm,
    "istio": fetch_istio,
    "inference_extension": fetch_inference_extension,
    "gateway_api": fetch_gateway_api,
    "prometheus_operator": fetch_prometheus_operator,
    "argocd": fetch_argocd,
    "keda": fetch_keda,
    "keda_controller": build_keda_controller,
    "lws": build_lws,
    "llama_cpp_python": build_llama_server,
    "minio": build_minio,
    "custom_metrics_apiserver": build_custom_metrics_apiserver,
    "epp": build_epp,
    "epp_arm64": build_epp_arm64,
    "actionlint": build_actionlint,
    "crane": build_crane,
    "syft": build_syft,
}



def ensure(name: str) -> Path:
    """Build `name` unless it is cached; return its bin directory. Another process building
    it at the same time (the background build of `make test`) is waited for, not repeated."""
    if is_cached(name):
        return bin_dir(name)
    with build_lock(name, log):
        if is_cached(name):  # built by the process this one waited for
            return bin_dir(name)
        return _build(name)


def _build(name: str) -> Path:
    version = versions()[name]
    target = component_dir(name)
    log(f"building {name} {version} into {target}")
    started = time.monotonic()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix=f"glm-build-{name}-") as work:
        try:
            BUILDERS[name](version, staging / "bin", Path(work))
        except BuildError as exc:  # say which version failed, not only which component
            raise BuildError(f"{name} {version}: {exc}") from exc
        except Exception as exc:  # a builder bug still names the component
            raise BuildError(f"{name} {version}: {exc}") from exc
    elapsed = int(time.monotonic() - started)
    (staging / COMPLETE_MARKER).write_text(f"{version} built in {elapsed}s\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    log(f"{name} {version} ready ({int(time.monotonic() - started)}s)")
    return target / "bin"


# What the suite needs before its first e2e test: the control plane, the real CRDs, helm.
# `make test` builds these first and the rest (REST) in the background while the tests that
# need none of it run (e2e/conftest.py orders the tests and waits for what each one needs).
# actionlint too: a unit test (tests/test_workflows.py) runs it, and it is small (106 packages).
FIRST = ["kubernetes", "etcd", "kwok", "helm", "istio", "prometheus_operator", "argocd", "keda",
         "inference_extension", "gateway_api", "actionlint"]

# Longest first, so two builds at a time finish close together.
BUILD_ORDER = [
    "kubernetes", "minio", "llama_cpp_python", "keda_controller", "custom_metrics_apiserver",
    "syft", "lws", "epp", "epp_arm64", "kwok", "crane",
    "helm", "etcd", "actionlint",
]


def build_all(names: Sequence[str], jobs: int = 2,
              install_vllm: bool = False) -> list[BuildError]:
    """Build what is missing, `jobs` components at a time.

    Two at a time keeps both cores busy through the single-threaded phases of a build (module
    download, linking a large binary) that one build alone leaves half idle.
    """
    missing = sorted((n for n in dict.fromkeys(names) if not is_cached(n)),
                     key=lambda n: BUILD_ORDER.index(n) if n in BUILD_ORDER else -1)
    failures: list[BuildError] = []
    with ThreadPoolExecutor(max_workers=1) as downloads, \
            ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # Mostly download and unpacking, little CPU: alongside the compiles, not after them.
        side = downloads.submit(_install_vllm) if missing and install_vllm else None
        for future in [pool.submit(ensure, name) for name in missing]:
            try:
                future.result()
            except BuildError as exc:
                failures.append(exc)
        if side is not None:
            try:
                side.result()
            except BuildError as exc:
                failures.append(exc)
    return failures


def _install_vllm() -> None:
    """The pinned vLLM's venv that e2e/test_vllm_argv.py uses (else it installs it itself)."""
    from e2e.vllm_cli import VllmEnvError, ensure_vllm

    try:
        ensure_vllm()
    except VllmEnvError as exc:
        raise BuildError(f"vllm: {exc}") from exc


def _build_in_background(names: Sequence[str], jobs: int, install_vllm: bool,
                         log_path: Path) -> int:
    """Start `build` for `names` detached from this process (its own session, so it outlives
    `make`'s step), at the lowest CPU priority, so the tests running meanwhile keep theirs.
    Each component's build lock (ensure) makes a test that needs one wait for it instead of
    building it again."""
    missing = [n for n in names if not is_cached(n)]
    if not missing:  # the vLLM venv alone is left to the tests that need it (e2e/conftest.py)
        log("background build: nothing to build")
        return 0
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["nice", "-n", "19", sys.executable, "-m", "e2e.toolchain", "build",
            "--jobs", str(jobs), *([] if install_vllm else missing)]
    if install_vllm:
        argv.append("--rest")
    with log_path.open("ab") as out:
        subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         cwd=E2E_DIR.parent, start_new_session=True)
    log(f"background build started ({', '.join(missing) or 'the vLLM venv'}); log: {log_path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.toolchain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build what is missing")
    build.add_argument("components", nargs="*", help=f"any of: {', '.join(BUILDERS)}")
    build.add_argument("--jobs", type=int, default=int(os.environ.get("GLM_TOOLCHAIN_JOBS", "2")),
                       help="components built at once (default 2, env GLM_TOOLCHAIN_JOBS)")
    group = build.add_mutually_exclusive_group()
    group.add_argument("--first", action="store_true",
                       help=f"only what every e2e test needs: {', '.join(FIRST)}")
    group.add_argument("--rest", action="store_true",
                       help="everything but --first, and the vLLM venv")
    build.add_argument("--background", metavar="LOG", type=Path,
                       help="build in a detached process at nice 19, logging to LOG, and return "
                            "at once (make test: the tests run meanwhile)")
    path = sub.add_parser("path", help="print a component's bin directory")
    path.add_argument("component", choices=list(BUILDERS))
    sub.add_parser("list", help="show what is cached")
    args = parser.parse_args(argv)
    if args.command == "build":
        unknown = sorted(set(args.components) - set(BUILDERS))
        if unknown:
            parser.error(f"unknown component(s) {unknown}; choose from {sorted(BUILDERS)}")
        names = args.components or list(BUILDERS)
        if args.first or args.rest:
            names = [n for n in names if (n in FIRST) == args.first]
        install_vllm = not args.components and not args.first
        if args.background is not None:
            return _build_in_background(names, args.jobs, install_vllm, args.background)
        failures = build_all(names, jobs=args.jobs, install_vllm=install_vllm)
        for failure in failures:
            log(f"BUILD FAILED: {failure}")
        return 1 if failures else 0
    if args.command == "path":
        print(bin_dir(args.component))
        return 0
    for name, version in versions().items():
        state = "cached" if is_cached(name) else "missing"
        print(f"{name:22} {version:10} {state:8} {component_dir(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
