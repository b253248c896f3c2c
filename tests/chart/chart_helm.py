"""The real helm binary (built by e2e/toolchain.py) and a typed runner for it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from e2e import toolchain

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "glm-operator"

Obj = dict[str, Any]
KUBE_VERSION = toolchain.versions()["kubernetes"]


class HelmError(RuntimeError):
    def __init__(self, args: list[str], result: subprocess.CompletedProcess[str]) -> None:
        self.stderr = result.stderr
        super().__init__(f"helm {' '.join(args)} failed ({result.returncode}): "
                         f"{result.stderr.strip() or result.stdout.strip()}")


class Helm:
    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def run(self, *args: str, input: str | None = None, check: bool = True,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        # Private helm homes: no user repositories or plugins leak into a test.
        full_env = {**os.environ, "HELM_CACHE_HOME": "/tmp/glm-helm/cache",
                    "HELM_CONFIG_HOME": "/tmp/glm-helm/config",
                    "HELM_DATA_HOME": "/tmp/glm-helm/data", **(env or {})}
        result = subprocess.run([str(self.binary), *args], input=input, capture_output=True,
                                text=True, check=False, env=full_env, timeout=300)
        if check and result.returncode != 0:
            raise HelmError(list(args), result)
        return result

    def template(self, values: Mapping[str, Any] | None = None, *, release: str = "glm",
                 namespace: str = "glm-system", chart: Path = CHART) -> list[Obj]:
        # The Kubernetes version of the local control plane: helm built from its Go module
        # assumes v1.20 otherwise, below the chart's kubeVersion.
        args = ["template", release, str(chart), "--namespace", namespace,
                "--kube-version", KUBE_VERSION]
        if values:
            args += ["--values", "-"]
        result = self.run(*args, input=yaml.safe_dump(dict(values)) if values else None)
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def helm_binary() -> Path | None:
    if not toolchain.is_cached("helm"):
        return None
    binary = toolchain.bin_dir("helm") / "helm"
    return binary if binary.exists() else None
