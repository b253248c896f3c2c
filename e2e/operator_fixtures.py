"""Fixtures that install glm-operator's CRDs and run the real operator process.

Import them into a test module (`from e2e.operator_fixtures import glm_crds, operator`).
The operator runs as `glm-operator run` in a subprocess, exactly as in its image, against
the local control plane; its log is printed when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import recycle_released_volumes
from e2e.kubectl import Kubectl, wait_for
from e2e.ports import free_port

REPO = Path(__file__).resolve().parent.parent
CRDS = sorted((REPO / "crds").glob("*.yaml"))


@pytest.fixture(scope="session")
def glm_crds(kubectl: Kubectl) -> list[str]:
    """glm-operator's generated CRDs, applied and Established."""
    assert CRDS, "crds/ is empty: run `make crds`"
    kubectl.apply_files(CRDS, field_manager="glm-e2e-crds")
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in CRDS]
    for name in names:
        kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return names


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` in a Prometheus text exposition whose labels include
    `labels`."""
    total = 0.0
    for line in text.splitlines():
        if (line.startswith((name + "{", name + " "))
                and all(f'{k}="{v}"' in line for k, v in labels.items())):
            total += float(line.rsplit(" ", 1)[1])
    return total


class OperatorProcess:
    def __init__(self, kubectl: Kubectl, namespaces: tuple[str, ...] = ("e2e-*",),
                 extra_args: tuple[str, ...] = (), package: Path | None = None) -> None:
        # Scoped by namespace glob so the tests, the benchmark and the demo can each run an
        # operator on the shared local cluster without two of them managing one object.
        # `package`: run the operator from another copy of operator/ (a bench's baseline).
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (lives as long as the process)
            prefix="glm-operator-", suffix=".log", delete=False)
        env = kubectl.env()
        env["PYTHONUNBUFFERED"] = "1"
        if package is not None:
            env["PYTHONPATH"] = str(package)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "glm_operator.cli", "run",
             *(arg for ns in namespaces for arg in ("--namespace", ns)),
             "--kubeconfig", str(kubectl.kubeconfig),
             "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
             "--metrics-port", str(self.metrics_port), *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
        )

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"glm-operator exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as resp:
            return str(resp.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        return metric_sum(self.metrics(), name, **labels)

    def tail(self, lines: int = 80) -> str:
        text = Path(self.log.name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies or the OOM killer strikes."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_serving(process: OperatorProcess, kubectl: Kubectl, namespace: str,
                 timeout: float = 180) -> None:
    """Wait until the operator reconciles: a probe ModelVersion in `namespace` (which its
    namespace globs match) gets its fetch Job. Its liveness endpoint answers as soon as kopf
    has started, before every watch has listed; a test that starts then measures the start-up,
    not what it tests. A failure here shows the operator's log."""
    name = f"readiness-probe-{uuid.uuid4().hex[:5]}"
    kubectl.apply({
        "apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"source": {"uri": "pvc://model-store/probe.gguf"}, "format": "gguf"},
    })
    started = time.monotonic()
    try:
        wait_for(lambda: process.proc.poll() is None and kubectl.items(
                     "jobs", "-n", namespace, "-l", f"glm-operator.dev/model-version={name}"),
                 timeout=timeout, what=f"glm-operator to create the fetch Job of {name}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nglm-operator log:\n{process.tail(200)}") from exc
    finally:
        kubectl.run("delete", "modelversion", name, "-n", namespace, "--wait=false",
                    "--ignore-not-found", check=False)
    waited = time.monotonic() - started
    if waited > 30:
        print(f"[e2e] glm-operator took {waited:.0f}s to reconcile its first object")


@pytest.fixture(scope="session")
def operator(glm_crds: list[str], kubectl: Kubectl) -> Iterator[OperatorProcess]:
    """The operator, running until the end of the session, seen reconciling."""
    process = OperatorProcess(kubectl)
    probe_namespace = f"e2e-operator-ready-{uuid.uuid4().hex[:5]}"
    try:
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": probe_namespace}})
        wait_serving(process, kubectl, probe_namespace)
        kubectl.run("delete", "namespace", probe_namespace, "--wait=false", check=False)
        yield process
    finally:
        process.stop()
        if os.environ.get("GLM_E2E_OPERATOR_LOG"):
            print(process.tail(400))


@contextlib.contextmanager
def prefixed_namespace(request: pytest.FixtureRequest, kubectl: Kubectl, prefix: str,
                       on_failure: Callable[[str], None]) -> Iterator[str]:
    """A fresh namespace `<prefix><test>-<random>` for a test whose module runs an operator of
    its own on `<prefix>*`; `on_failure(name)` prints what explains a failed test. Deleted
    afterwards, without waiting."""
    slug = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:30].strip("-")
    name = f"{prefix}{slug}-{uuid.uuid4().hex[:5]}"
    # Claims of earlier tests' deleted namespaces left their PVs Released; offer them again
    # (as the `namespace` fixture does), or a module of many tests runs out of volumes.
    recycle_released_volumes(kubectl)
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(lambda: kubectl.exists("serviceaccount", "default", "-n", name), timeout=30,
             what=f"ServiceAccount default in {name}")
    yield name
    report = getattr(request.node, "_e2e_report_call", None)
    if report is not None and report.failed:
        on_failure(name)
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def report_fetched(kubectl: Kubectl, namespace: str, name: str,
                   facts: dict[str, Any] | None = None, size: int = 6_170_000_000) -> None:
    """Write what the fetch Job writes when it has verified and cached the artifact.

    The kwok pods of the fetch Job do not execute anything; the fetcher itself is tested
    against real servers in e2e/test_fetch*.py. This is its status report, byte for byte the
    shape `glm_operator.fetch.reporter` sends.
    """
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    current = kubectl.get_json("modelversion", name, "-n", namespace)
    conditions = [c for c in current.get("status", {}).get("conditions", [])
                  if c["type"] not in ("Verified", "Cached")]
    conditions += [
        {"type": "Verified", "status": "True", "reason": "Verified", "message": "sha256 ok",
         "lastTransitionTime": now},
        {"type": "Cached", "status": "True", "reason": "Downloaded", "message": "cached",
         "lastTransitionTime": now},
    ]
    status: dict[str, Any] = {"phase": "Ready", "sizeBytes": size, "conditions": conditions,
                              "sha256": "ab" * 32}
    if facts:
        status["facts"] = facts
    import json

    kubectl("patch", "modelversion", name, "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}))
