"""A thin, typed wrapper over the real kubectl binary, for the e2e tests and the cluster script.

The e2e tests talk to the API server the way a user does: through kubectl, with the
kubeconfig the local control plane writes (.e2e/kubeconfig). Failures raise KubectlError
carrying the command and kubectl's own message, so a failed test says what the API server said.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

FIELD_MANAGER = "glm-e2e"

T = TypeVar("T")

Manifest = Mapping[str, Any] | Sequence[Mapping[str, Any]] | str


class KubectlError(RuntimeError):
    """kubectl exited non-zero; `stderr` holds the API server's answer."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.args_run = list(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"`kubectl {' '.join(args)}` failed (exit {returncode}): "
            f"{stderr.strip() or stdout.strip()}"
        )


class WaitTimeout(AssertionError):
    """wait_for gave up; the message says what was awaited and the last value seen."""


def to_yaml(manifest: Manifest) -> str:
    """One or many objects (dicts, or YAML text already) as a YAML stream."""
    if isinstance(manifest, str):
        return manifest
    if isinstance(manifest, Mapping):
        return yaml.safe_dump(dict(manifest), sort_keys=False)
    return yaml.safe_dump_all([dict(item) for item in manifest], sort_keys=False)


class Kubectl:
    """Runs `kubectl --kubeconfig <path> ...` with the binary built by e2e/toolchain.py."""

    def __init__(self, binary: Path, kubeconfig: Path, request_timeout: str = "30s") -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.request_timeout = request_timeout

    def env(self) -> dict[str, str]:
        """Environment for any other tool (helm, the operator) that should use this cluster."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        cmd = [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--request-timeout={self.request_timeout}",
            *args,
        ]
        result = subprocess.run(
            cmd, input=input, capture_output=True, text=True, check=False, timeout=timeout
        )
        if check and result.returncode != 0:
            raise KubectlError(args, result.returncode, result.stdout, result.stderr)
        return result

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.run(*args, input=input, check=check)

    def get_json(self, *args: str) -> dict[str, Any]:
        """`kubectl get ... -o json` parsed; raises KubectlError when the object is missing."""
        out = self.run("get", *args, "-o", "json").stdout
        data: dict[str, Any] = json.loads(out)
        return data

    def items(self, *args: str) -> list[dict[str, Any]]:
        """The `items` of a list get (`kubectl get pods -n x -l a=b`)."""
        items: list[dict[str, Any]] = self.get_json(*args).get("items", [])
        return items

    def exists(self, *args: str) -> bool:
        result = self.run("get", *args, "--ignore-not-found", "-o", "name", check=False)
        if result.returncode != 0:
            raise KubectlError(args, result.returncode, result.stdout, result.stderr)
        return bool(result.stdout.strip())

    def apply(
        self,
        manifest: Manifest,
        namespace: str | None = None,
        *,
        field_manager: str = FIELD_MANAGER,
        force_conflicts: bool = True,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Server-side apply of one object, a list of objects or YAML text."""
        args = ["apply", "--server-side", f"--field-manager={field_manager}", "-f", "-"]
        if force_conflicts:
            args.append("--force-conflicts")
        if namespace:
            args += ["-n", namespace]
        return self.run(*args, input=to_yaml(manifest), check=check)

    def apply_files(self, paths: Iterable[Path], *, field_manager: str = FIELD_MANAGER) -> str:
        args = ["apply", "--server-side", "--force-conflicts", f"--field-manager={field_manager}"]
        for path in paths:
            args += ["-f", str(path)]
        return self.run(*args, timeout=300).stdout


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 60,
    what: str = "condition",
    interval: float = 0.5,
) -> T:
    """Poll `predicate` until it returns a truthy value and return that value.

    On timeout raise WaitTimeout naming `what`, how long we waited and the last value or
    exception seen, so the failing test says what never happened.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except (KubectlError, LookupError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"timed out after {timeout:g}s waiting for {what}; last seen: {last!r}"
            )
        time.sleep(interval)
