"""The pinned vLLM, installed from PyPI into a cached venv of its own, to check rendered argvs.

vLLM is the version the operator renders by default (the tag of `VLLM_CUDA_IMAGE`, which
tests/images checks against the Dockerfiles): one version source. Its wheel needs torch, so
the venv is large (about 10 GB with torch's CUDA libraries) and is made once:
`~/.cache/glm-operator/vllm-<version>/` (GLM_OPERATOR_CACHE overrides the root), marked
complete only after the install and an import of vLLM's CLI succeeded. No GPU is used: the
argvs go through vLLM's command line up to the point where it would start serving
(e2e/vllm_cli_parse.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from glm_operator.planning.accelerators import VLLM_CUDA_IMAGE

from e2e.cache import build_lock, cache_root

VLLM_VERSION = VLLM_CUDA_IMAGE.rpartition(":v")[2]
DOCKERFILE = Path(__file__).resolve().parents[1] / "runtime-images" / "vllm" / "Dockerfile.cuda"
PARSE_SCRIPT = Path(__file__).resolve().parent / "vllm_cli_parse.py"
RESULT_MARK = "VLLM_CLI_PARSE_RESULT "  # the line of vllm_cli_parse.py's stdout to read
INSTALL_TIMEOUT = 1800


class VllmEnvError(RuntimeError):
    """The pinned vLLM could not be installed or run; the message says which step and why."""


def venv_dir() -> Path:
    return cache_root() / f"vllm-{VLLM_VERSION}"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ray_version() -> str:
    """The Ray the vLLM image installs (its Dockerfile's RAY_VERSION): vLLM no longer depends
    on Ray, so the venv gets this one to check the groups' `ray start` argvs."""
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("ARG RAY_VERSION="):
            return line.partition("=")[2].strip()
    raise VllmEnvError(f"{DOCKERFILE} has no ARG RAY_VERSION")


def ensure_vllm() -> Path:
    """The Python of a venv holding vllm==VLLM_VERSION and the image's Ray (installed on
    first use; a venv made for another Ray is made again)."""
    venv = venv_dir()
    marker = venv / ".complete"
    expected = f"vllm {VLLM_VERSION}\nray {ray_version()}\n"
    if marker.exists() and marker.read_text() == expected:
        return _python(venv)
    with build_lock(venv.name, lambda line: print(f"[vllm] {line}", flush=True)):
        if marker.exists() and marker.read_text() == expected:  # installed meanwhile
            return _python(venv)
        return _install(venv, marker, expected)


def _install(venv: Path, marker: Path, expected: str) -> Path:
    if venv.exists():
        shutil.rmtree(venv)  # a half-made venv from an interrupted install
    venv.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"[vllm] installing vllm=={VLLM_VERSION} into {venv} (once; about 10 GB)", flush=True)
    steps = (
        [sys.executable, "-m", "venv", str(venv)],
        [str(_python(venv)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"vllm=={VLLM_VERSION}", f"ray[cgraph]=={ray_version()}"],
        [str(_python(venv)), "-c", "import vllm.entrypoints.cli.main"],
    )
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
                                  env={**os.environ, "PIP_NO_INPUT": "1"})
        except subprocess.TimeoutExpired as exc:
            raise VllmEnvError(f"`{' '.join(step[:4])}` took over {INSTALL_TIMEOUT}s") from exc
        if done.returncode != 0:
            raise VllmEnvError(f"`{' '.join(step[:4])}` failed ({done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
    marker.write_text(expected)
    print(f"[vllm] installed in {time.monotonic() - started:.0f}s", flush=True)
    return _python(venv)


def parse_with_vllm(python: Path, cases: dict[str, list[str]]) -> dict[str, Any]:
    """Each argv through vLLM's own CLI: {"vllm": version, "serve_options": [...],
    "results": {case: {"ok", "error", "engine_args"}}}."""
    done = subprocess.run(
        [str(python), str(PARSE_SCRIPT)], input=json.dumps(cases), capture_output=True,
        text=True, timeout=600,
        # No usage reports, no plugin downloads; vLLM picks no accelerator here.
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
             "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    if done.returncode != 0:
        raise VllmEnvError(f"vllm_cli_parse.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
    marked = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if not marked:
        raise VllmEnvError(f"vllm_cli_parse.py printed no result:\n{done.stdout[-3000:]}")
    result: dict[str, Any] = json.loads(marked[-1].removeprefix(RESULT_MARK))
    return result
