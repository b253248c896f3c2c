"""Build llama-server (CPU) from the llama.cpp tree vendored in the llama-cpp-python sdist.

The sdist on PyPI carries the full llama.cpp source under `vendor/llama.cpp`, so the pinned
llama-cpp-python version (e2e/versions.toml) pins the llama.cpp commit too, and nothing is
fetched from GitHub.

`LLAMA_CPU_CMAKE_FLAGS` is the one list of cmake flags for a CPU llama-server. The CPU runtime
image uses the same list: `python -m e2e.llama_build flags` rewrites
runtime-images/llamacpp/cmake-flags-cpu.txt, and a test checks that the Dockerfile passes
exactly these flags, so the binary the tests start is the binary users get.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FLAGS_FILE = REPO_ROOT / "runtime-images" / "llamacpp" / "cmake-flags-cpu.txt"

# Static (BUILD_SHARED_LIBS=OFF) so the binary runs from the cache dir without libggml*.so
# next to it; GGML_NATIVE=OFF so it runs on any x86-64 CPU, not only the build host's.
LLAMA_CPU_CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    # The RPC backend: llama-server's --rpc and the ggml-rpc-server binary that multi-node
    # workers run (tools/rpc), from the same build.
    "-DGGML_RPC=ON",
)
# llama-server, and the worker of a multi-node group (its name in this llama.cpp tree).
BUILD_TARGETS: tuple[str, ...] = ("llama-server", "ggml-rpc-server")
BUILD_JOBS = 2


def flags_key() -> str:
    """A short hash of the build's flags and targets: part of the toolchain's cache directory
    name, so a changed flag rebuilds instead of reusing a binary built without it."""
    text = "\n".join((*LLAMA_CPU_CMAKE_FLAGS, *BUILD_TARGETS))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


class LlamaBuildError(RuntimeError):
    """The llama-server build failed; the message names the step and shows the log tail."""


def flags_file_text() -> str:
    header = (
        "# cmake flags for the CPU llama-server, one per line. Generated from\n"
        "# e2e/llama_build.py LLAMA_CPU_CMAKE_FLAGS (python -m e2e.llama_build flags);\n"
        "# runtime-images/llamacpp CPU Dockerfile must pass exactly these.\n"
    )
    return header + "".join(f"{flag}\n" for flag in LLAMA_CPU_CMAKE_FLAGS)


def write_flags_file(path: Path = FLAGS_FILE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(flags_file_text())


def read_flags_file(path: Path = FLAGS_FILE) -> list[str]:
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _log(message: str) -> None:
    print(f"[llama_build] {message}", file=sys.stderr, flush=True)


def _run(cmd: Sequence[str], cwd: Path, step: str) -> None:
    """Run one build step at low priority, keeping only the log tail for the error."""
    log_path = cwd / f"{step}.log"
    with log_path.open("w") as log_file:
        result = subprocess.run(
            ["nice", "-n", "10", *cmd], cwd=cwd, stdout=log_file, stderr=subprocess.STDOUT,
            check=False,
        )
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise LlamaBuildError(
            f"llama-server {step}: `{' '.join(cmd)}` failed (exit {result.returncode}):\n{tail}"
        )


def _download_sdist(version: str, work: Path) -> Path:
    _run(
        [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--dest", str(work / "sdist"), f"llama-cpp-python=={version}",
        ],
        work, "download",
    )
    archives = sorted((work / "sdist").glob("llama_cpp_python-*.tar.gz")) + sorted(
        (work / "sdist").glob("llama-cpp-python-*.tar.gz")
    )
    if not archives:
        raise LlamaBuildError(f"pip download left no llama-cpp-python {version} sdist in {work}")
    return archives[0]


def _extract(archive: Path, work: Path) -> Path:
    target = work / "src"
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    roots = [p for p in target.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise LlamaBuildError(f"unexpected sdist layout in {archive.name}: {roots}")
    llama_dir = roots[0] / "vendor" / "llama.cpp"
    if not (llama_dir / "CMakeLists.txt").exists():
        raise LlamaBuildError(f"{archive.name} has no vendor/llama.cpp/CMakeLists.txt")
    return llama_dir


def build_llama_server(version: str, out: Path, work: Path) -> None:
    """Download the sdist, build BUILD_TARGETS with LLAMA_CPU_CMAKE_FLAGS, copy them into `out`."""
    started = time.monotonic()
    _log(f"downloading llama-cpp-python {version} sdist")
    source = _extract(_download_sdist(version, work), work)
    build_dir = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _log(f"configuring {source} ({' '.join(LLAMA_CPU_CMAKE_FLAGS)})")
    _run(["cmake", "-S", str(source), "-B", str(build_dir), *generator, *LLAMA_CPU_CMAKE_FLAGS],
         work, "configure")
    targets = [arg for target in BUILD_TARGETS for arg in ("--target", target)]
    _log(f"compiling {' '.join(BUILD_TARGETS)} with -j{BUILD_JOBS} "
         "(about 10-20 minutes on 2 cores)")
    _run(["cmake", "--build", str(build_dir), *targets, "-j", str(BUILD_JOBS)], work, "compile")
    out.mkdir(parents=True, exist_ok=True)
    for target in BUILD_TARGETS:
        binary = build_dir / "bin" / target
        if not binary.exists():
            raise LlamaBuildError(f"the build finished but {binary} is missing")
        shutil.copy2(binary, out / target)
        os.chmod(out / target, 0o755)
    _log(f"{', '.join(BUILD_TARGETS)} built in {int(time.monotonic() - started)}s")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["flags"]:
        write_flags_file()
        print(FLAGS_FILE)
        return 0
    if args == ["print-flags"]:
        print(" ".join(LLAMA_CPU_CMAKE_FLAGS))
        return 0
    print("usage: python -m e2e.llama_build flags | print-flags", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
